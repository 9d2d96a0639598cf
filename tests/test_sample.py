"""Tests of sample.py: the unmasking policy seen through decode, NFE accounting, relay carry, metrics, CLI.

    python -m pytest tests/test_sample.py -q

Most tests use scripted models (logits built from a rule, so confidences are exact and known);
a few use a tiny real SudokuTransformer.
"""
import contextlib
import json
import os

import numpy as np
import pytest
import torch
import torch.nn as nn

import sample
import sudoku.decode
import sudoku.report
from common import load_model
from scripts import runs
from sudoku.board import DIGIT0, MASK, count_violations_batch, digits_to_tokens, random_grid, tokens_to_digits
from helpers import ScriptedDenoiser, constant_checkpoint, fixed_rule, make_puzzles, one_puzzle, puzzle_csv, tiny_sudoku


# ----------------------------------------------------------------------------- helpers

def hashed_rule(tokens, h):
    """Row-wise deterministic, varied confidences: depends only on the row's own board."""
    i = torch.arange(81, dtype=torch.float64, device=tokens.device)
    n_filled = (tokens != MASK).sum(1, keepdim=True).double()
    frac = torch.frac(torch.sin(i * 12.9898 + n_filled * 78.233 + tokens.double() * 3.7).abs() * 43758.5453)
    conf = 0.5 + 0.5 * frac  # in [0.5, 1)
    digit = 1 + (torch.arange(81, device=tokens.device) + n_filled.long()) % 9
    return conf, digit, torch.zeros(*tokens.shape, 2, device=tokens.device)


class DigitsOnly(nn.Module):
    """A tiny real model whose non-digit logits are pushed down, so decoding fills every cell.
    fp32=True runs it outside the decoder's CUDA bf16 autocast."""

    def __init__(self, model, fp32: bool = False):
        super().__init__()
        self.model, self.config, self.fp32 = model, model.config, fp32

    def forward(self, tokens, h=None):
        with torch.autocast(tokens.device.type, enabled=False) if self.fp32 else contextlib.nullcontext():
            logits, h_out = self.model(tokens, h)
        return logits.index_fill(-1, torch.arange(DIGIT0 + 1, device=logits.device), -1e4), h_out


# ----------------------------------------------------------------------------- the policy through decode

def test_three_cells_of_u_0p1_at_tau_0p15_commit_one_per_step(device):
    q, a, sol = one_puzzle([3, 40, 77])
    q = q.to(device)  # a parameter-free model decodes on the questions' device
    conf = torch.full((81,), 0.9, device=device)  # u = 0.1 each: 0.1 < 0.15 but 0.1 + 0.1 is not
    model = ScriptedDenoiser(fixed_rule(conf, torch.as_tensor(sol, dtype=torch.long, device=device)))
    res = sudoku.decode.decode_puzzles(model, q, tau=0.15, record_boards=True)
    assert res.nfe.tolist() == [3] and res.batch_nfe.tolist() == [4]
    assert [int(c.sum()) for c in res.commits[0]] == [1, 1, 1]
    assert torch.equal(res.pred, a)
    # u = 0.1 x 3 = 0.3 < 0.35: all three in one forward
    res = sudoku.decode.decode_puzzles(model, q, tau=0.35)
    assert res.nfe.tolist() == [1] and torch.equal(res.pred, a)


def test_nothing_qualifying_forces_the_most_confident_cell(device):
    q, a, sol = one_puzzle([3, 40, 77])
    q = q.to(device)
    conf = torch.full((81,), 0.99)
    conf[3], conf[40], conf[77] = 0.5, 0.7, 0.6  # every u >= 0.3 > tau
    model = ScriptedDenoiser(fixed_rule(conf.to(device), torch.as_tensor(sol, dtype=torch.long, device=device)))
    res = sudoku.decode.decode_puzzles(model, q, tau=0.15, record_boards=True)
    order = [c.nonzero().flatten().tolist() for c in res.commits[0]]
    assert order == [[40], [77], [3]]  # one cell per step, most confident first
    assert res.nfe.tolist() == [3] and torch.equal(res.pred, a)


def test_tau_zero_commits_one_cell_per_step(device):
    q, _ = make_puzzles(3, seed=5)
    res = sudoku.decode.decode_puzzles(ScriptedDenoiser(hashed_rule), q.to(device), tau=0.0)
    assert torch.equal(res.nfe, (q == MASK).sum(1))


# ----------------------------------------------------------------------------- NFE accounting, early exit, batching

# the tiny model in fp32: in bf16 a row's logits may depend on the batch's shape (CUDA picks kernels by shape)
@pytest.mark.parametrize("make_model", [lambda: ScriptedDenoiser(hashed_rule), lambda: DigitsOnly(tiny_sudoku(relay=True), fp32=True)])
def test_early_exit_batching_and_invariants(make_model, device):
    model = make_model().to(device)
    q, _ = make_puzzles(10, seed=2)
    qd = q.to(device)
    ref = sudoku.decode.decode_puzzles(model, qd, tau=0.3, batch_size=4, record_boards=True)
    assert ref.nfe.min() < ref.nfe.max()  # puzzles finish at different steps: early exit matters
    # the paper's count: 1 + the slowest puzzle of each batch of 4
    for s in range(0, 10, 4):
        assert (ref.batch_nfe[s:s + 4] == 1 + ref.nfe[s:s + 4].max()).all()
    for kwargs in (dict(batch_size=4, early_exit=False), dict(batch_size=1), dict(batch_size=10), dict(batch_size=3)):
        other = sudoku.decode.decode_puzzles(model, qd, tau=0.3, record_boards=True, **kwargs)
        assert torch.equal(other.pred, ref.pred), kwargs
        assert torch.equal(other.nfe, ref.nfe), kwargs
        assert torch.equal(other.violations_rollout, ref.violations_rollout), kwargs
        for b1, b2 in zip(ref.boards, other.boards):
            assert torch.equal(b1, b2), kwargs
    # clues never change, committed cells never change, the boards and commit masks agree
    for i in range(10):
        prev = q[i]
        assert len(ref.boards[i]) == ref.nfe[i]
        for board, commit in zip(ref.boards[i], ref.commits[i]):
            assert torch.equal(board[prev != MASK], prev[prev != MASK])
            assert torch.equal(board != prev, commit & (board != MASK))
            assert commit.any() and not commit[prev != MASK].any()
            prev = board
        assert torch.equal(prev, ref.pred[i])
    assert (ref.pred != MASK).all()


def test_early_exit_skips_forwards_on_finished_puzzles(device):
    q, _ = make_puzzles(6, seed=3)
    counted = {}
    for early in (True, False):
        model = ScriptedDenoiser(hashed_rule)
        res = sudoku.decode.decode_puzzles(model, q.to(device), tau=0.3, batch_size=6, early_exit=early)
        counted[early] = sum(t.size(0) for t, _ in model.calls)
    assert counted[True] == res.nfe.sum()  # exactly one row-forward per puzzle step
    assert counted[False] == 6 * (res.batch_nfe[0] - 1)  # every row on every loop iteration


def test_max_steps_then_one_final_forward_fills_the_rest(device):
    q, _ = make_puzzles(3, seed=4)
    res = sudoku.decode.decode_puzzles(ScriptedDenoiser(hashed_rule), q.to(device), tau=0.0, max_steps=5, record_boards=True)
    assert res.nfe.tolist() == [6, 6, 6] and res.batch_nfe.tolist() == [6, 6, 6]
    assert (res.pred != MASK).all()
    assert [int(c.sum()) for c in res.commits[0]][:5] == [1] * 5


# ----------------------------------------------------------------------------- relay carry

def test_relay_state_is_carried_row_by_row(device):
    """h starts as None; each later call gets exactly the h_out of the same puzzle's previous forward."""
    def rule(tokens, h):
        B = tokens.size(0)
        if h is None:  # first step: remember the question in the state, counter 0
            h = torch.stack([tokens.double(), torch.zeros(B, 81, dtype=torch.float64, device=tokens.device)], -1)
        else:  # the carried question must be this row's own puzzle: its clues are still on the board
            clues = h[..., 0] != MASK
            assert torch.equal(tokens[clues], h[..., 0].long()[clues]), "h came from another puzzle"
        k = h[..., 1]  # forwards this puzzle had before this one
        conf = torch.where(k >= 2, 1 - 1e-4, 0.5)  # two single-cell steps, then everything
        h_out = torch.stack([h[..., 0], k + 1], -1)
        return conf, 1 + torch.arange(81, device=tokens.device).expand(B, 81) % 9, h_out

    q, _ = make_puzzles(7, seed=6)
    n_blank = (q == MASK).sum(1)
    q = q.to(device)
    for bs, early in ((7, True), (3, True), (3, False), (1, True)):
        model = ScriptedDenoiser(rule, relay=True)
        res = sudoku.decode.decode_puzzles(model, q, tau=0.15, batch_size=bs, early_exit=early)
        assert torch.equal(res.nfe, n_blank.clamp(max=3)), (bs, early)
        assert model.calls[0][1] is None
    # without carry every step looks like the first: one cell per step
    res = sudoku.decode.decode_puzzles(ScriptedDenoiser(rule, relay=True), q, tau=0.15, relay_carry=False)
    assert torch.equal(res.nfe, n_blank)


def test_zeroed_relay_layernorm_decodes_like_the_plain_model(device):
    plain, relay = tiny_sudoku(relay=False, seed=0), tiny_sudoku(relay=True, seed=1)
    missing, unexpected = relay.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("relay_norm") for k in missing)
    with torch.no_grad():
        relay.relay_norm.weight.zero_()
        relay.relay_norm.bias.zero_()
    plain, relay = plain.to(device), relay.to(device)  # on CUDA under the decoder's bf16 autocast
    q, _ = make_puzzles(6, seed=7)
    a = sudoku.decode.decode_puzzles(DigitsOnly(plain), q, tau=0.2, batch_size=4, record_boards=True)
    b = sudoku.decode.decode_puzzles(DigitsOnly(relay), q, tau=0.2, batch_size=4, record_boards=True)
    assert torch.equal(a.pred, b.pred) and torch.equal(a.nfe, b.nfe)
    assert all(torch.equal(x, y) for x, y in zip(a.boards, b.boards))
    # and a live relay does change the decode (the test above is not vacuous)
    with torch.no_grad():
        relay.relay_norm.weight.fill_(3.0)
    c = sudoku.decode.decode_puzzles(DigitsOnly(relay), q, tau=0.2, batch_size=4)
    assert not (torch.equal(a.pred, c.pred) and torch.equal(a.nfe, c.nfe))


def test_decode_restores_training_mode_and_rejects_bad_questions():
    model = tiny_sudoku(relay=True).train()
    q, _ = make_puzzles(2)
    sudoku.decode.decode_puzzles(DigitsOnly(model), q, tau=0.5)
    assert model.training
    with pytest.raises(ValueError, match="81"):
        sudoku.decode.decode_puzzles(model, q[:, :80])
    with pytest.raises(ValueError, match="MASK"):
        sudoku.decode.decode_puzzles(model, q.clamp(max=3))
    with pytest.raises(ValueError, match="integer"):
        sudoku.decode.decode_puzzles(model, q.float())


# ----------------------------------------------------------------------------- metrics

def test_count_violations_on_hand_made_boards_and_against_sudoku_py(device):
    sol = random_grid(np.random.default_rng(0))
    board = torch.tensor(digits_to_tokens(sol))[None]
    assert sudoku.decode.token_violations(board).tolist() == [0] and sample.is_legal(board).tolist() == [True]
    two = board.clone()
    two[0, 1] = two[0, 0]  # same row and box, different column: row +1, box +1, column 1 gets a 2nd copy: +1
    assert sudoku.decode.token_violations(two).tolist() == [3]
    blank = board.clone()
    blank[0, 5] = MASK
    assert sudoku.decode.token_violations(blank).tolist() == [0] and sample.is_legal(blank).tolist() == [False]
    rng = np.random.default_rng(1)
    digits = rng.integers(0, 10, size=(200, 81))
    mine = sudoku.decode.token_violations(torch.tensor(digits_to_tokens(digits), device=device)).cpu().numpy()
    assert np.array_equal(mine, count_violations_batch(digits))


def test_score_on_hand_made_boards(device):
    q, a = make_puzzles(2, seed=8)
    pred = a.clone()
    blanks = (q[1] == MASK).nonzero().flatten()
    wrong = blanks[:2]
    pred[1, wrong] = DIGIT0 + torch.as_tensor(tokens_to_digits(a[1, wrong].numpy()) % 9 + 1)  # another digit
    res = sudoku.decode.DecodeResult(pred=pred.to(device), nfe=torch.tensor([2, 4], device=device),
                                     batch_nfe=torch.tensor([5, 5], device=device),
                                     violations_rollout=torch.tensor([1, 6], device=device),
                                     cells_per_step=torch.tensor([10.0, 5.0], device=device))  # q and a stay on the CPU
    m = sample.score(q, a, res)
    assert m["exact_match"] == 0.5
    assert m["token_accuracy"] == pytest.approx((1 + (len(blanks) - 2) / len(blanks)) / 2)
    assert m["legal_rate"] == 0.5
    assert m["violations_final"] == pytest.approx(sudoku.decode.token_violations(pred[1:]).item() / 2)
    assert m["violations_final"] > 0
    assert (m["mean_nfe"], m["batch_nfe"], m["violations_rollout"], m["cells_per_step"], m["n"]) == (3, 5, 3.5, 7.5, 2)
    assert sample.score(q, None, res)["exact_match"] is None


def test_violations_rollout_sums_the_boards_after_each_forward(device):
    q, _ = make_puzzles(4, seed=9)
    res = sudoku.decode.decode_puzzles(ScriptedDenoiser(hashed_rule), q.to(device), tau=0.3, record_boards=True)
    for i in range(4):
        assert res.violations_rollout[i] == sudoku.decode.token_violations(res.boards[i]).sum()
    assert res.violations_rollout.sum() > 0  # hashed_rule ignores Sudoku rules: it does make violations


def test_table_and_plot(tmp_path):
    def entry(obj, tied, seed, em):
        m = {k: 1.0 for k in sample.METRIC_KEYS} | {"exact_match": em, "mean_nfe": 10 - 10 * em, "n": 5}
        res = {sudoku.report.tau_key(t): m | {"exact_match": em + t} for t in sample.TAUS}
        return {"path": f"{obj}{seed}", "config": {"objective": obj, "tie_embeddings": tied, "seed": seed},
                "results": {"all": res}}
    entries = [entry("mlm", False, 0, 0.1), entry("relay", False, 0, 0.4), entry("mlm", False, 1, 0.3)]
    table = sudoku.report.format_table(entries, 0.15)
    rows = [r for r in table.splitlines() if r.startswith("| MLM")]
    assert len(rows) == 1 and "| 2 |" in rows[0]
    em = [25.0, 45.0]  # (0.1 + 0.15, 0.3 + 0.15) in %
    assert f"{np.mean(em):.2f} ± {np.std(em, ddof=1):.2f}" in rows[0]
    assert "Relay" in table and "deduction" not in table
    sudoku.report.plot_pareto(entries, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_method_styles_one_colour_per_objective():
    def group(obj):
        return [{"config": {"objective": obj}}]
    groups = {"MLM": group("mlm"), "Relay": group("relay"), "Relay (staggered)": group("relay"),
              "mine": group("my_objective"), "mine too": group("my_objective")}
    styles = sudoku.report.method_styles(groups)
    assert styles["MLM"] == ("C0", "-") and styles["Relay"] == ("C3", "-")
    assert styles["Relay (staggered)"] == ("C3", "--")  # same objective: same colour, another line style
    assert styles["mine"] == ("C4", "-") and styles["mine too"] == ("C4", "--")


# ----------------------------------------------------------------------------- command line

def test_cli_writes_json_table_plot_and_dump(tmp_path, capsys):
    ckpts = [constant_checkpoint(tmp_path / f"{o}{s}.pt", objective=o, seed=s) for o in ("mlm", "relay") for s in (0, 1)]
    data = puzzle_csv(tmp_path / "p.csv")
    out, dump, plot = tmp_path / "r.json", tmp_path / "d.jsonl", tmp_path / "p.png"
    sample.main([f"--ckpt={','.join(ckpts)}", f"--data={data}", "--n=4", "--taus=0.05,0.3", "--tau=0.15",
                 f"--out={out}", f"--dump={dump}", f"--plot={plot}", "--table", "--batch_size=3"])
    res = json.loads(out.read_text())
    assert [e["path"] for e in res["checkpoints"]] == ckpts
    for e in res["checkpoints"]:
        assert e["config"]["objective"] in ("mlm", "relay")
        assert set(e["results"]) == {"all"} and set(e["results"]["all"]) == {"0.05", "0.15", "0.30"}
        for m in e["results"]["all"].values():
            assert set(sample.METRIC_KEYS) <= set(m) and m["n"] == 4
    lines = [json.loads(line) for line in dump.read_text().splitlines()]
    assert len(lines) == 4 * 4 and {x["tau"] for x in lines} == {0.15}
    first = lines[0]
    assert len(first["prediction"]) == 81 and len(first["boards"]) == first["nfe"] and first["boards"][-1] == first["prediction"]
    assert first["question"] == open(data).read().splitlines()[1].split(",")[0]
    assert plot.stat().st_size > 1000
    table = capsys.readouterr().out
    # a constant digit never makes a legal board: these stand-ins are flagged as collapsed
    assert "| MLM | untied | 2 (2 collapsed) |" in table and "| Relay | untied | 2 (2 collapsed) |" in table


def test_per_puzzle_records_hand_counted_outcomes(tmp_path):
    """A model that writes 5 everywhere solves a puzzle iff every blank's answer is 5 and fills right the
    share of blanks whose answer is 5 (both counted here from the answers); each puzzle's batch-1 NFE is
    that of decoding it alone."""
    from sudoku.board import format_board
    sol = random_grid(np.random.default_rng(3))
    only_fives = np.where(sol == 5, 0, sol)  # its blanks are exactly the 5s: solved by the constant model
    rows = [(format_board(only_fives), format_board(sol))]
    q, a = make_puzzles(5, seed=12)
    rows += [(format_board(tokens_to_digits(x.numpy())), format_board(tokens_to_digits(y.numpy()))) for x, y in zip(q, a)]
    data = tmp_path / "p.csv"
    data.write_text("question,answer\n" + "".join(f"{x},{y}\n" for x, y in rows))
    ckpt, out = constant_checkpoint(tmp_path / "c.pt", digit=5, conf=0.9), tmp_path / "r.json"
    sample.main([f"--ckpt={ckpt}", f"--data={data}", "--taus=0.15,0.95", "--per_puzzle=True", f"--out={out}"])
    questions = [np.array([int(c) if c != "." else 0 for c in x]) for x, _ in rows]
    answers = [np.array([int(c) for c in y]) for _, y in rows]
    model, _ = load_model(ckpt)
    for tau, m in json.loads(out.read_text())["checkpoints"][0]["results"]["all"].items():
        pp = m["per_puzzle"]
        fives = [float(np.mean(ans[qq == 0] == 5)) for qq, ans in zip(questions, answers)]
        assert pp["solved"] == "".join("1" if f == 1 else "0" for f in fives) and pp["solved"][0] == "1"
        assert pp["blank_right"] == [round(f, 3) for f in fives]
        alone = [sudoku.decode.decode_puzzles(model, torch.tensor(digits_to_tokens(qq))[None], tau=float(tau))
                 .batch1_nfe.item() for qq in questions]
        assert pp["batch1_nfe"] == alone and np.mean(alone) == pytest.approx(m["batch1_nfe"])


def test_cli_merges_earlier_results_without_decoding_again(tmp_path, capsys):
    data = puzzle_csv(tmp_path / "p.csv")
    common = [f"--data={data}", "--n=4", "--taus=0.05,0.15", "--batch_size=3"]
    for seed in (0, 1):  # one file per seed, as when seeds are evaluated as they finish
        ckpts = [constant_checkpoint(tmp_path / f"{o}{seed}.pt", objective=o, seed=seed) for o in ("mlm", "relay")]
        sample.main([f"--ckpt={','.join(ckpts)}", *common, f"--out={tmp_path / f's{seed}.json'}"])
    both = json.loads((tmp_path / "s0.json").read_text())["checkpoints"] + json.loads((tmp_path / "s1.json").read_text())["checkpoints"]
    capsys.readouterr()
    merged = tmp_path / "all.json"
    sample.main([f"--results={tmp_path / 's0.json'},{tmp_path / 's1.json'}", *common, f"--out={merged}", "--table",
                 f"--plot={tmp_path / 'p.png'}"])
    out = capsys.readouterr().out
    assert json.loads(merged.read_text())["checkpoints"] == both  # copied, not recomputed
    assert "| MLM | untied | 2 (2 collapsed) |" in out and "| Relay | untied | 2 (2 collapsed) |" in out and (tmp_path / "p.png").exists()
    with pytest.raises(SystemExit, match="n=4 but this run has n=3"):
        sample.main([f"--results={merged}", f"--data={data}", "--n=3", "--taus=0.05,0.15"])
    with pytest.raises(SystemExit, match="batch_size=3 but this run has batch_size=512"):
        sample.main([f"--results={merged}", *common[:2], "--taus=0.05,0.15"])  # batch_nfe depends on the batch
    with pytest.raises(SystemExit, match="no results at τ = 0.25"):
        sample.main([f"--results={merged}", *common[:2], "--taus=0.15,0.25", "--batch_size=3"])
    with pytest.raises(SystemExit, match="give --ckpt"):
        sample.main(["--table"])
    with pytest.raises(SystemExit, match="--dump need --ckpt"):
        sample.main([f"--results={merged}", *common, f"--dump={tmp_path / 'd.jsonl'}"])


def test_cli_puzzle_prints_the_board_filling_in(tmp_path, capsys):
    ckpt = constant_checkpoint(tmp_path / "c.pt", digit=5, conf=0.9)
    sol = random_grid(np.random.default_rng(3))
    fives = np.flatnonzero(sol == 5)[:3]
    q = sol.copy()
    q[fives] = 0
    from sudoku.board import format_board
    sample.main([f"--ckpt={ckpt}", f"--puzzle={format_board(q)}"])
    out = capsys.readouterr().out
    assert out.count("cell committed") == 3 and "forward 4" not in out
    assert "legal: a solution" in out and "unique solution, so this is it" in out
    q[np.flatnonzero(sol == 7)[0]] = 0  # the model writes 5 where 7 belongs
    sample.main([f"--ckpt={ckpt}", f"--puzzle={format_board(q)}"])
    assert "NOT legal" in capsys.readouterr().out


def test_cli_deduction_only_cohort_filters_then_takes_the_first_n(tmp_path, capsys):
    q, a = make_puzzles(6, seed=12)
    from sudoku.board import format_board
    strategies = [["Brute Force", "Naked Pairs"], ["Naked Pairs"], ["Single Position"], ["X-Wings"], ["Hidden Triples"], []]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"question": format_board(tokens_to_digits(x.numpy())),
                                        "answer": format_board(tokens_to_digits(y.numpy())), "strategies_used": s}) + "\n"
                            for x, y, s in zip(q, a, strategies)))
    out, dump = tmp_path / "r.json", tmp_path / "d.jsonl"
    sample.main([f"--ckpt={constant_checkpoint(tmp_path / 'c.pt')}", f"--data={path}", "--n=2", "--taus=0.15",
                 "--cohort=all,deduction_only", f"--out={out}", f"--dump={dump}", "--table"])
    res = json.loads(out.read_text())["checkpoints"][0]["results"]
    assert res["all"]["0.15"]["n"] == 2 and res["deduction_only"]["0.15"]["n"] == 2
    rows = [json.loads(line) for line in dump.read_text().splitlines()]
    picked = [r["question"] for r in rows if r["cohort"] == "deduction_only"]
    assert picked == [format_board(tokens_to_digits(q[i].numpy())) for i in (1, 3)]  # rows 0 (brute force), 2 (easy) out
    assert "Acc (%) deduction-only" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--ckpt={tmp}/missing.pt"], "no checkpoint"),
    (["--ckpt={tmp}/junk.pt"], "cannot read"),
    (["--ckpt={ckpt}", "--puzzle=12345"], "--puzzle: wrong length"),
    (["--ckpt={ckpt}", "--puzzle=" + "11" + "." * 79], "repeat a digit"),
    (["--ckpt={ckpt}", "--data={data}", "--cohort=deduction_only"], "strategies_used"),
    (["--ckpt={ckpt}", "--data={data}", "--cohort=hard"], "unknown cohort"),
    (["--ckpt={ckpt}", "--data={tmp}/nope.csv"], "no split or file"),
    (["--ckpt={ckpt}", "--data={data}", "--taus=nan"], "finite thresholds"),  # was a traceback
    (["--ckpt={ckpt}", "--data={data}", "--tau=inf"], "finite thresholds"),
])
def test_cli_bad_input_gives_one_line(tmp_path, args, message):
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    fill = dict(tmp=tmp_path, ckpt=constant_checkpoint(tmp_path / "c.pt"), data=puzzle_csv(tmp_path / "p.csv"))
    with pytest.raises(SystemExit) as e:
        sample.main([a.format(**fill) for a in args])
    text = str(e.value.code)
    assert message in text and "\n" not in text


# ----------------------------------------------------------------------------- experiment drivers

def test_budget_study_integrates_training_time_from_the_metrics_log(tmp_path):
    from scripts.sudoku.budget_study import at_minute, curve, report
    records = [{"step": 10, "loss": 2.0, "ms_per_step": 100.0}, {"step": 20, "loss": 1.9, "ms_per_step": 200.0},
               {"step": 20, "val/exact": 0.1, "val/nfe": 30.0, "val/batch_nfe": 40.0},
               {"step": 25, "val/exact": 0.2, "val/nfe": 20.0, "val/batch_nfe": 30.0},  # mid-interval
               {"step": 30, "loss": 1.5, "ms_per_step": 300.0},
               {"step": 40, "loss": 1.4, "ms_per_step": 300.0, "train_seconds": 99.0},  # logged time wins
               {"step": 40, "val/exact": 0.5, "val/nfe": 10.0}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    points = curve(str(path))
    assert [p["step"] for p in points] == [20, 25, 40]
    # 10 steps at 0.1 s + 10 at 0.2 s; then 5 more steps of the interval ending at 30 (0.3 s each)
    assert [p["minutes"] * 60 for p in points] == pytest.approx([3.0, 4.5, 99.0])
    assert at_minute(points, 0.06)["step"] == 20 and at_minute(points, 0.01) is None
    table = report({"Relay, cold": points}, [0.06])
    assert "| Relay, cold | 10.0% / 30.0 | 50.0% / 10.0 (1.6 min, step 40) |" in table
    # minutes the run has not trained yet (it stopped at 1.65 min) stay empty instead of repeating its last point
    assert "| Relay, cold | 50.0% / 10.0 | – | 50.0% / 10.0 (1.6 min, step 40) |" in report({"Relay, cold": points}, [2.5, 3.0])


def test_budget_study_plots_several_seeds_each_from_its_own_runs(tmp_path, capsys):
    """--seed=1,2 --plot_only: one curve per (objective, seed), read from that seed's run directory
    (fails if every seed reads the first seed's directory, or if MLM is not put on the compute axis 1x)."""
    from scripts.sudoku import budget_study
    for name, exact in (("mlm_s1", 0.1), ("mlm_s2", 0.2), ("relay_cold_s1", 0.3), ("relay_cold_s2", 0.4)):
        (tmp_path / name).mkdir()
        records = [{"step": 10, "loss": 1.0, "ms_per_step": 100.0}, {"step": 10, "val/exact": exact, "val/nfe": 5.0}]
        (tmp_path / name / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    budget_study.main(["--iters=10", "--objectives=mlm,relay", "--buffers=cold", "--seed=1,2", f"--runs={tmp_path}",
                       "--plot_only"])
    curves = json.loads((tmp_path / "budget.json").read_text())
    assert {k: (v[0]["exact"], v[0]["compute"]) for k, v in curves.items()} == {
        "MLM, seed 1": (0.1, 10), "MLM, seed 2": (0.2, 10), "Relay, cold, seed 1": (0.3, 20),
        "Relay, cold, seed 2": (0.4, 20)}
    assert (tmp_path / "budget.png").exists()


@pytest.mark.slow
def test_reproduce_cpu_smoke_runs_end_to_end(tmp_path):
    """Data, four trainings, evaluation, table and figure at a toy size (~2 minutes)."""
    from scripts.sudoku import reproduce_cpu
    reproduce_cpu.main(["--smoke", f"--runs={tmp_path / 'runs'}", f"--data_dir={tmp_path / 'data'}"])
    results = json.loads((tmp_path / "runs" / "results.json").read_text())
    assert [e["config"]["objective"] for e in results["checkpoints"]] == list(sudoku.report.OBJECTIVE_NAMES)
    assert (tmp_path / "runs" / "pareto.png").exists() and "| Relay |" in (tmp_path / "runs" / "table.md").read_text()


@pytest.mark.slow
def test_compare_adaptation_reuses_parents_and_matches_compute(tmp_path):
    """Smoke run trains parents; a second run adapts those parents: the MLM child gets 2x the K = 2 steps."""
    from scripts.sudoku import compare_adaptation
    data = f"--data_dir={tmp_path / 'data'}"
    compare_adaptation.main(["--smoke", "--objectives=relay", f"--runs={tmp_path / 'a'}", data])
    compare_adaptation.main(["--smoke", "--objectives=mlm,relay", f"--runs={tmp_path / 'b'}", data,
                             f"--parent_from={tmp_path / 'a'}/s{{seed}}/parent_mlm"])
    assert not (tmp_path / "b" / "s1" / "parent_mlm").exists()  # reused, not retrained
    steps = {o: runs.checkpoint_step(str(tmp_path / "b" / "s1" / o)) for o in ("mlm", "relay")}
    assert steps == {"mlm": 40, "relay": 20}
    labels = [e["label"] for e in json.loads((tmp_path / "b" / "results.json").read_text())["checkpoints"]]
    assert "MLM (30 steps MLM +40 steps)" in labels and "Relay (30 steps MLM +20 steps)" in labels


def test_driver_resumes_an_interrupted_run_and_skips_a_finished_one(tmp_path, monkeypatch):
    """runs.train: killed mid-run -> the same command resumes from ckpt.pt; finished -> skipped;
    another command -> refused, a fresh run with replace=True. Training is faked: only the driver's bookkeeping is under test."""
    calls = []

    def fake_sh(cmd, log=None, echo=True):
        calls.append(cmd)
        open(os.path.join(out, "ckpt.pt"), "w").close()
        if len(calls) == 1:
            raise SystemExit("killed")

    monkeypatch.setattr(runs, "sh", fake_sh)
    out = str(tmp_path / "relay_s1")
    with pytest.raises(SystemExit):
        runs.train("relay", out, 1, ["--max_minutes=60"])
    assert not os.path.exists(os.path.join(out, "DONE.json"))
    runs.train("relay", out, 1, ["--max_minutes=60"])
    assert calls[1] == calls[0] + ["--resume=True"]
    runs.train("relay", out, 1, ["--max_minutes=60"])
    assert len(calls) == 2  # finished: skipped
    with pytest.raises(SystemExit, match="holds a run of another command"):  # never deleted silently
        runs.train("relay", out, 1, ["--max_minutes=30"])
    runs.train("relay", out, 1, ["--max_minutes=30"], replace=True)
    assert calls[2][-1] == "--max_minutes=30" and "--resume=True" not in calls[2]
