"""Sampler knobs (confidence temperature, noise on the carried state, k samples with pass@k) and the
matched-NFE readout of sample.py (--frontier). The paper's decoding is temperature 1, no noise, one sample:
the defaults, pinned by tests/test_decode.py and tests/test_pin_reference_models.py.

    python -m pytest tests/test_sampler_knobs.py -q
"""
import json
import math

import pytest
import torch

import sample
import sudoku.decode
import sudoku.report
from helpers import (ScriptedDenoiser, constant_checkpoint, fixed_rule, make_puzzles, one_puzzle, puzzle_csv, tiny_sudoku,
                     write_checkpoint)


# ----------------------------------------------------------------------------- temperature

def test_temperature_changes_the_confidences_the_threshold_rule_reads(device):
    """Three blanks at confidence 0.99 (the other 16 ids share 0.01). T = 1: u = 0.01 each, 0.03 < τ = 0.15,
    one forward. T = 2: softmax(logits / 2) gives c = sqrt(.99) / (sqrt(.99) + 16 sqrt(.01 / 16)) = 0.713,
    u = 0.287 > τ, one forced cell per forward: three forwards, same digits (the argmax does not move).
    Catches: the temperature not applied to the confidences (tried: fails)."""
    q, a, sol = one_puzzle([3, 40, 77])
    conf = torch.full((81,), 0.99, device=device)
    model = ScriptedDenoiser(fixed_rule(conf, torch.as_tensor(sol, dtype=torch.long, device=device)))
    by_hand = math.sqrt(0.99) / (math.sqrt(0.99) + 16 * math.sqrt(0.01 / 16))
    assert 1 - by_hand > 0.15
    for T, forwards in ((1.0, 1), (2.0, 3), (0.5, 1)):
        res = sudoku.decode.decode_puzzles(model, q.to(device), tau=0.15, temperature=T)
        assert res.nfe.tolist() == [forwards] and res.batch1_nfe.tolist() == [forwards + 1], T
        assert torch.equal(res.pred.cpu(), a), T


def test_default_knobs_run_the_unwrapped_model():
    """At the paper's defaults the decoder gets the model itself, so the default decode is the paper's
    bit for bit (the golden boards of tests/test_decode.py pin it); any knob wraps it.
    Catches: the wrapper installed at the defaults too (tried: fails)."""
    model = tiny_sudoku(relay=True)
    assert sudoku.decode.sampler_knobs(model) is model
    assert sudoku.decode.sampler_knobs(model, temperature=1.5) is not model
    assert sudoku.decode.sampler_knobs(model, state_noise=0.1) is not model


# ----------------------------------------------------------------------------- noise on the carried state

def test_state_noise_is_added_to_the_carried_state_only(device):
    """Every forward after the first gets the previous h_out of its puzzle plus sigma * N(0, 1) drawn from
    the given generator, in order; the first forward gets h = None (h_0 = 0, no noise). Replayed by hand
    with a generator of the same seed. Catches: noise on the first step too, noise drawn from the global
    generator (not reproducible), and the noise left out (each tried: fails)."""
    q, _ = make_puzzles(3, seed=7)
    q = q.to(device)

    def rule(tokens, h):
        B = tokens.size(0)
        h_out = (tokens.double() / 17)[..., None].repeat(1, 1, 2)  # a state fixed by the board
        return torch.full((B, 81), 0.5, device=tokens.device), torch.ones(B, 81, dtype=torch.long,
                                                                          device=tokens.device), h_out
    model = ScriptedDenoiser(rule, relay=True)
    gen = torch.Generator(device=device).manual_seed(3)
    sudoku.decode.decode_puzzles(model, q, tau=0.0, max_steps=4, state_noise=0.5, generator=gen)
    replay = torch.Generator(device=device).manual_seed(3)
    assert model.calls[0][1] is None
    for (prev_tokens, _), (_, h) in zip(model.calls, model.calls[1:]):
        carried = (prev_tokens.double() / 17)[..., None].repeat(1, 1, 2)
        noise = torch.randn(carried.shape, generator=replay, device=carried.device, dtype=carried.dtype)
        torch.testing.assert_close(h, carried + 0.5 * noise)


def test_knobs_refuse_bad_values_in_one_line(tmp_path):
    """Bad knob values are one-line errors, in the library and on the command line: a temperature that is
    not > 0, negative noise, noise on a model that carries no state, k > 1 samples without noise.
    Catches: state noise silently ignored on a plain model (tried: no error, no effect)."""
    model = tiny_sudoku(relay=False)
    q, _ = make_puzzles(1)
    for kwargs, message in (({"temperature": 0.0}, "temperature must be"), ({"state_noise": -1.0}, "state_noise must"),
                            ({"state_noise": 0.1}, "carries none")):
        with pytest.raises(ValueError, match=message):
            sudoku.decode.decode_puzzles(model, q, **kwargs)
    ckpt, data = constant_checkpoint(tmp_path / "c.pt"), puzzle_csv(tmp_path / "p.csv")
    for args, message in ((["--temperature=0"], "--temperature must"), (["--state_noise=nan"], "--state_noise must"),
                          (["--samples_per_puzzle=2"], "needs --state_noise > 0"),
                          (["--state_noise=0.5"], "carries no relay state"), (["--samples_per_puzzle=0"], ">= 1")):
        with pytest.raises(SystemExit) as e:
            sample.main([f"--ckpt={ckpt}", f"--data={data}", *args])
        assert message in str(e.value.code) and "\n" not in str(e.value.code), args


# ----------------------------------------------------------------------------- k samples: pass@k and avg@k

def fake_result(pred: torch.Tensor, batch1: list[int]) -> sudoku.decode.DecodeResult:
    n = pred.size(0)
    zeros = torch.zeros(n, dtype=torch.long)
    return sudoku.decode.DecodeResult(pred, torch.tensor(batch1), torch.tensor(batch1), zeros, zeros.float(),
                                      violating_snapshots=zeros, batch1_nfe=torch.tensor(batch1))


def test_pass_at_k_and_avg_at_k_by_hand():
    """3 puzzles, 2 samples: sample 1 solves puzzle 0, sample 2 solves puzzles 0 and 1. pass@2 = 2/3 (puzzles
    0, 1), avg@2 = 3/6, exact_match = the mean over samples = avg@2; pass@2 costs the two samples' batch-1
    counts: 2 * mean(4, 6, 5, 7, 5, 9) / 2. Catches: pass@k as "every sample right" (1/3), and its cost
    given as one sample's NFE (both tried: fail)."""
    q, a = make_puzzles(3, seed=9)
    wrong = a.clone()
    wrong[:, 0] = (wrong[:, 0] % 9) + 8  # another digit id (8..16) at cell 0
    s1 = torch.stack([a[0], wrong[1], wrong[2]])
    s2 = torch.stack([a[0], a[1], wrong[2]])
    m = sample.score_samples(q, a, [fake_result(s1, [4, 6, 5]), fake_result(s2, [7, 5, 9])])
    assert m["k"] == 2 and m["pass_at_k"] == pytest.approx(2 / 3) and m["avg_at_k"] == pytest.approx(0.5)
    assert m["exact_match"] == pytest.approx(0.5) and m["n"] == 3
    assert m["batch1_nfe"] == pytest.approx(6.0) and m["pass_at_k_nfe"] == pytest.approx(12.0)
    one = sample.score_samples(q, a, [fake_result(s1, [4, 6, 5])])
    assert "pass_at_k" not in one and one == sample.score(q, a, fake_result(s1, [4, 6, 5]))


def test_cli_samples_per_puzzle_with_state_noise(tmp_path, capsys):
    """--state_noise with --samples_per_puzzle=3 on a relay checkpoint: the metrics line shows pass@3,
    avg@3 and NFE@3; --out records the knobs per checkpoint, and merged with a decode at the paper's
    settings the same checkpoint is another row of the table, never another seed of the same row.
    Catches: the knobs left out of the method grouping (tried: one row "2 seeds"; fails)."""
    ckpt = write_checkpoint(tmp_path / "r.pt", tiny_sudoku(relay=True, seed=2))
    data, out = puzzle_csv(tmp_path / "p.csv"), tmp_path / "r.json"
    common = [f"--data={data}", "--n=3", "--taus=2.0", "--tau=2.0", "--device=cpu"]
    sample.main([f"--ckpt={ckpt}", *common, "--state_noise=1", "--samples_per_puzzle=3", f"--out={out}"])
    text = capsys.readouterr().out
    assert "pass@3" in text and "avg@3" in text and "NFE@3" in text
    saved = json.loads(out.read_text())["checkpoints"][0]
    assert saved["sampler"] == {"temperature": 1.0, "state_noise": 1.0, "samples_per_puzzle": 3, "seed": 0}
    m = saved["results"]["all"]["2.00"]
    assert m["k"] == 3 and m["pass_at_k_nfe"] == pytest.approx(3 * m["batch1_nfe"])
    sample.main([f"--ckpt={ckpt}", f"--results={out}", *common, "--table"])
    table = capsys.readouterr().out
    # an untrained model: no legal board, hence flagged as collapsed
    assert "| Relay | untied | 1 (1 collapsed) |" in table
    assert "| Relay [noise 1 seed 0, k=3] | untied | 1 (1 collapsed) |" in table


# ----------------------------------------------------------------------------- accuracy at matched NFE

def sweep_entry(path: str, seed: int, points: dict[str, tuple[float, float, float]]) -> dict:
    """points: {τ key: (exact match, batch-1 count, batch count)} over 100 puzzles."""
    results = {t: {"exact_match": em, "batch1_nfe": b1, "batch_nfe": b, "n": 100} for t, (em, b1, b) in points.items()}
    return {"path": path, "label": "", "config": {"objective": "relay", "tie_embeddings": True, "seed": seed},
            "results": {"all": results}}


def test_frontier_reads_accuracy_at_budgets_on_the_batch1_count():
    """format_frontier reads each checkpoint's τ sweep on Table 1's batch-1 count: at NFE 15 between
    (10, 20%) and (20, 60%) -> 40.0% ± sqrt(.4 * .6 / 100); 25 is beyond the curve: "outside", and the
    sweep's NFE range is printed. Catches: the sweep read on the batch count (here 30..40, so every
    budget would be outside; tried: fails)."""
    entries = [sweep_entry("a", 1, {"0.45": (0.2, 10.0, 30.0), "0.01": (0.6, 20.0, 40.0)}),
               sweep_entry("b", 2, {"0.45": (0.5, 12.0, 30.0), "0.01": (0.7, 22.0, 40.0)})]
    text = sudoku.report.format_frontier(entries, (15, 25))
    rows = text.splitlines()
    assert rows[3] == "| Relay, tied (seed 1) | 40.0% ± 4.9 | outside |"
    assert rows[4] == "| Relay, tied (seed 2) | 56.0% ± 5.0 | outside |"  # 0.5 + 0.2 * 3 / 10
    assert rows[5] == "| Relay, tied (seed 2) − Relay, tied (seed 1) | +16.0 ± 7.0 | – |"
    assert "Relay, tied (seed 1): NFE 10.00 (τ 0.45) to 20.00 (τ 0.01)" in rows[6]


def test_cli_frontier_is_one_command_over_the_authors_thresholds(tmp_path, capsys):
    """sample.py --frontier sweeps the authors' seven thresholds and prints accuracy at their budgets."""
    from sudoku.frontier import AUTHORS_TAUS
    ckpts = [constant_checkpoint(tmp_path / f"c{s}.pt", objective="relay", seed=s) for s in (0, 1)]
    out = tmp_path / "r.json"
    sample.main([f"--ckpt={','.join(ckpts)}", f"--data={puzzle_csv(tmp_path / 'p.csv')}", "--n=3", "--frontier",
                 "--tau=0.15", f"--out={out}"])
    text = capsys.readouterr().out
    taus = json.loads(out.read_text())["checkpoints"][0]["results"]["all"]
    assert sorted(float(t) for t in taus) == sorted(AUTHORS_TAUS)
    assert "| model | NFE 15.0 | NFE 20.0 | NFE 25.0 | NFE 30.0 |" in text
    assert "Accuracy at matched NFE, unfiltered, on the mean NFE, batch-1 count (Table 1's)" in text
    assert "Accuracy at matched NFE, unfiltered, on the mean NFE, batch-512 count" in text
    with pytest.raises(SystemExit, match="--frontier_nfe: give one or more of"):
        sample.main([f"--ckpt={ckpts[0]}", "--frontier", "--frontier_nfe=nfe"])
