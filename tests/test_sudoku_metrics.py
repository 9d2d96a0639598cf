"""The paper's Sudoku metrics in sample.py: the authors' violating-snapshot count, the batch-1 NFE of the
deduction-only column, and --table's column order (definitions: docs/sudoku_metrics.md).

    python -m pytest tests/test_sudoku_metrics.py -q
"""
import json

import numpy as np
import pytest
import torch
import torch.nn as nn

import sample
import sudoku.decode
import sudoku.report
from sudoku.board import DIGIT0, MASK, digits_to_tokens, random_grid

V = 17


class FixedModel(nn.Module):
    """Every forward: confidence conf[i] for digit digits[i] at cell i (other ids share the rest)."""

    def __init__(self, conf: torch.Tensor, digits: torch.Tensor):
        super().__init__()
        probs = ((1 - conf) / (V - 1))[:, None].repeat(1, V)
        probs[torch.arange(81), DIGIT0 + digits] = conf
        self.logits, self.config = probs.log(), type("C", (), {"relay": False})()

    def forward(self, tokens, h=None):
        logits = self.logits.to(tokens.device)  # a parameter-free model decodes on the questions' device
        return logits.expand(tokens.size(0), 81, V).clone(), torch.zeros(*tokens.shape, 2, device=tokens.device)


def solved(seed: int = 0) -> np.ndarray:
    return random_grid(np.random.default_rng(seed))


def test_violating_snapshots_counts_boards_not_violations():
    """A trajectory [legal start, a board with 3 violations, a legal board, an illegal final board twice]
    has 3 violating snapshots but 9 violations in all.
    Catches: summing count_violations instead of counting boards with any (tried, fails)."""
    sol = torch.tensor(digits_to_tokens(solved()))
    bad = sol.clone()
    bad[1] = bad[0]  # row, box and column each get one repeat
    assert sudoku.decode.token_violations(bad[None]).item() == 3
    start = sol.clone()
    start[:2] = MASK
    trajectory = torch.stack([start, bad, sol, bad, bad])
    assert sample.violating_snapshots(trajectory).item() == 3
    assert sample.violating_snapshots(trajectory[None].repeat(2, 1, 1)).tolist() == [3, 3]  # batched


def test_decode_counts_the_authors_snapshots_by_hand(device):
    """Two blanks in one row, both predicted as the same digit, one cell per forward (τ = 0):
    snapshots = [question (legal), after forward 1 (legal), after forward 2 (3 violations), final fill
    (the same board)] -> 2 violating snapshots; violations summed over the boards after each forward = 3;
    NFE per puzzle 2, batch-1 NFE 2 + 1 = 3.
    Catches: the final-fill snapshot left out, the initial board left out when it is illegal, and the
    batch-1 NFE without its final forward (each tried, each fails)."""
    sol = solved(1)
    q = digits_to_tokens(sol)
    q[[0, 1]] = MASK
    digits = torch.full((81,), int(sol[0]))
    conf = torch.full((81,), 0.5)
    conf[0], conf[1] = 0.9, 0.8
    res = sudoku.decode.decode_puzzles(FixedModel(conf, digits), torch.tensor(q, device=device)[None], tau=0.0,
                               record_boards=True)
    assert res.nfe.tolist() == [2] and res.batch1_nfe.tolist() == [3]
    assert res.violations_rollout.tolist() == [3] and res.violating_snapshots.tolist() == [2]
    # a repeated clue: every snapshot violates, the question included -> 4
    q2 = q.copy()
    q2[2] = q2[3]
    res2 = sudoku.decode.decode_puzzles(FixedModel(conf, digits), torch.tensor(q2, device=device)[None], tau=0.0)
    assert res2.violating_snapshots.tolist() == [4]


def hashed_model():
    """Board-dependent confidences and digits that ignore Sudoku rules: many violating boards."""
    class Hashed(nn.Module):
        config = type("C", (), {"relay": False})()

        def forward(self, tokens, h=None):
            i = torch.arange(81, dtype=torch.float64, device=tokens.device)
            n = (tokens != MASK).sum(1, keepdim=True).double()
            frac = torch.frac(torch.sin(i * 12.9898 + n * 78.233 + tokens.double() * 3.7).abs() * 43758.5453)
            conf = (0.5 + 0.5 * frac).float()
            digit = 1 + (torch.arange(81, device=tokens.device) + n.long()) % 9
            probs = ((1 - conf) / (V - 1))[..., None].repeat(1, 1, V)
            probs.scatter_(-1, (DIGIT0 + digit)[..., None], conf[..., None])
            return probs.log(), torch.zeros(*tokens.shape, 2, device=tokens.device)
    return Hashed()


@pytest.mark.parametrize("max_steps", [64, 3])
def test_decode_snapshots_equal_the_pure_function_on_the_recorded_trajectory(max_steps, device):
    """Per puzzle, decode's count equals violating_snapshots([question, boards after each loop forward,
    final board]), also when max_steps cuts the loop and the final forward fills the rest.
    Catches: the in-loop count drifting from the definition (e.g. counting the final-fill board twice, or
    counting the final-fill forward as a loop step: tried when merging the decode loop into relay.decode)."""
    rng = np.random.default_rng(3)
    qs = []
    for _ in range(6):
        q = solved(int(rng.integers(1000))).copy()
        q[rng.random(81) < 0.5] = 0
        qs.append(digits_to_tokens(q))
    q = torch.tensor(np.array(qs))
    res = sudoku.decode.decode_puzzles(hashed_model(), q.to(device), tau=0.3, max_steps=max_steps, batch_size=4,
                               record_boards=True)
    for i in range(len(q)):
        loop_boards = res.boards[i][:max_steps]  # the final-fill board, if any, comes after max_steps loop boards
        trajectory = torch.cat([q[i:i + 1], loop_boards, res.pred[i:i + 1]])
        assert res.violating_snapshots[i] == sample.violating_snapshots(trajectory), i
    assert res.violating_snapshots.sum() > 0
    assert (res.batch1_nfe == res.nfe.clamp(max=max_steps) + 1).all()  # own loop steps + 1 final forward
    if max_steps == 3:
        assert (res.nfe == 4).any()  # some puzzles needed the final fill


def test_batch1_nfe_equals_the_batch_count_of_one_puzzle_at_a_time(device):
    """batch1_nfe from one batched decode equals batch_nfe of decoding each puzzle alone (batch size 1,
    the authors' deduction-only runs), and differs from the batch-4 count.
    Catches: batch1_nfe taken as the per-puzzle nfe or as the batch count (both tried)."""
    rng = np.random.default_rng(4)
    qs = []
    for k in range(8):
        q = solved(k + 10).copy()
        q[rng.random(81) < (0.2 + 0.08 * k)] = 0
        qs.append(digits_to_tokens(q))
    q = torch.tensor(np.array(qs)).to(device)
    model = hashed_model()
    res = sudoku.decode.decode_puzzles(model, q, tau=0.3, batch_size=4)
    alone = torch.cat([sudoku.decode.decode_puzzles(model, q[i:i + 1], tau=0.3, batch_size=1).batch_nfe for i in range(len(q))])
    assert torch.equal(res.batch1_nfe, alone)
    assert not torch.equal(res.batch1_nfe, res.batch_nfe) and not torch.equal(res.batch1_nfe, res.nfe)


def table_entry(path="r", seed=1, all_=(0.6, 7.0, 5.0, 9.0), ded=(0.75, 8.0, 6.0, 10.0), legal=0.5):
    def metrics(em, bnfe, b1nfe, b512):
        return {k: 0.5 for k in sample.METRIC_KEYS} | {"exact_match": em, "batch_nfe": bnfe, "batch1_nfe": b1nfe,
                                                       "batch512_nfe": b512, "mean_nfe": 1.0, "legal_rate": legal,
                                                       "violating_snapshots": 0.9, "violations_rollout": 2.5, "n": 2000}
    return {"path": path, "config": {"objective": "relay", "tie_embeddings": True, "seed": seed},
            "results": {"all": {"0.15": metrics(*all_)}, "deduction_only": {"0.15": metrics(*ded)}}}


def table_cells(entries, batch_size=512):
    head, _, row = sudoku.report.format_table(entries, 0.15, batch_size).splitlines()[:3]
    cols = [c.strip() for c in head.strip("|").split("|")]
    return cols, [c.strip() for c in row.strip("|").split("|")]


def test_table_columns_follow_table_1():
    """--table starts with Table 1's columns in its order (Acc and Mean NFE unfiltered, then deduction-only),
    both NFE columns on Table 1's basis, the batch-1 count (the authors decoded one puzzle at a time); the
    batch-512 count of their validation logs, the authors' violating snapshots and our summed violations
    follow under their own names.
    Catches: the columns in another order or a Mean NFE column on the wrong basis (tried: the unfiltered
    column on the batch count at --batch_size, as before this basis was settled; fails)."""
    cols, cells = table_cells([table_entry()])
    assert cols[:7] == ["Objective", "Tying", "seeds", "Acc (%) unfiltered", "Mean NFE unfiltered (batch-1 count)",
                        "Acc (%) deduction-only", "Mean NFE deduction-only (batch-1 count)"]
    assert cells[:7] == ["Relay", "tied", "1", "60.00", "5.00", "75.00", "6.00"]
    named = dict(zip(cols, cells))
    assert named["NFE unfiltered (batch-512 count)"] == "9.00" and named["NFE deduction-only (batch-512 count)"] == "10.00"
    assert named["Violating snapshots deduction-only"] == "0.90"
    assert named["Violations summed over boards deduction-only"] == "2.50"
    assert named["Legal (%) deduction-only"] == "50.00"


def test_table_reads_older_results_and_flags_collapsed_seeds():
    """A results file older than the batch512_nfe key shows its batch count as the batch-512 count only if it
    was decoded at batch 512 (n/a otherwise); a seed with exact match and legal rate 0 is counted as
    collapsed in the seeds cell and named below the table (still in the means).
    Catches: an older file's batch-64 count shown as the batch-512 count, and a collapsed seed not flagged
    (is_collapsed reading only the exact match, so a 0%-accurate but legal seed is flagged: both tried, fail)."""
    old = table_entry()
    for r in old["results"].values():
        del r["0.15"]["batch512_nfe"]
    assert dict(zip(*table_cells([old], 512)))["NFE unfiltered (batch-512 count)"] == "7.00"
    assert dict(zip(*table_cells([old], 64)))["NFE unfiltered (batch-512 count)"] == "n/a"
    down = table_entry("runs/s2", 2, (0.0, 64.0, 65.0, 65.0), (0.0, 64.0, 65.0, 65.0), legal=0.0)
    poor = table_entry("runs/s3", 3, (0.0, 64.0, 65.0, 65.0), (0.0, 64.0, 65.0, 65.0), legal=0.1)
    table = sudoku.report.format_table([table_entry(), down, poor], 0.15)
    assert "| Relay | tied | 3 (1 collapsed) |" in table
    assert table.splitlines()[-1] == "COLLAPSED (exact match 0 and legal rate 0, included in the means): runs/s2"


# ----------------------------------------------------------------------------- Table 1's batch-1 count

def plain_one_puzzle_loop(model, question: torch.Tensor, tau: float, max_steps: int) -> tuple[torch.Tensor, int]:
    """The independent reference: one puzzle decoded alone, written from the paper's rule (Sec. 4.1,
    App. A.1.3) with Python lists: sort the masked cells' 1 - c ascending, commit while the inclusive
    running sum stays strictly below τ, else the single most confident cell; write the argmax over the
    whole vocabulary; carry h. Returns (final board, the authors' count = loop steps + 1 final forward)."""
    x, h, steps = question.clone(), None, 0
    with torch.no_grad():
        for _ in range(max_steps):
            masked = [i for i in range(81) if x[i] == MASK]
            if not masked:
                break
            logits, h = model(x[None], h if model.config.relay else None)
            probs = logits[0].double().softmax(-1)
            conf = {i: probs[i].max().item() for i in masked}
            chosen, total = [], 0.0
            for i in sorted(masked, key=lambda i: 1 - conf[i]):
                total += 1 - conf[i]
                if total >= tau:
                    break
                chosen.append(i)
            chosen = chosen or [max(masked, key=lambda i: conf[i])]
            for i in chosen:
                x[i] = logits[0, i].argmax()
            steps += 1
        if (x == MASK).any():
            logits, _ = model(x[None], h if model.config.relay else None)
            x = torch.where(x == MASK, logits[0].argmax(-1), x)
    return x, steps + 1


def real_puzzles(n: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    qs = []
    for k in range(n):
        q = solved(seed + k).copy()
        q[rng.random(81) < rng.uniform(0.1, 0.5)] = 0
        qs.append(digits_to_tokens(q))
    return torch.tensor(np.array(qs))


def tiny_relay(seed: int = 0):
    from model import ModelConfig, SudokuTransformer
    torch.manual_seed(seed)
    return SudokuTransformer(ModelConfig(n_layer=2, n_head=2, n_embd=32, d_ff=64, dropout=0.0, relay=True)).eval()


def test_batch1_count_equals_a_plain_one_puzzle_at_a_time_loop():
    """Table 1's NFE (both columns) is per puzzle at batch 1. sample.score's batch1_nfe, from one batched
    decode at batch size 3 (early exit, relay carry), equals the mean count of a plain loop that decodes
    each puzzle alone, and so do the boards. τ = 2.5 makes a real tiny relay model (confidences ~ 0.1)
    commit a varying number of cells per step.
    Catches: batch1_nfe without its final forward, the batch-3 count in its place, and a relay carry that
    mixes rows (each tried: fails)."""
    model, q = tiny_relay(), real_puzzles(7, 20)
    tau, max_steps = 2.5, 64
    res = sudoku.decode.decode_puzzles(model, q, tau=tau, max_steps=max_steps, batch_size=3, dtype="float32")
    alone = [plain_one_puzzle_loop(model, q[i], tau, max_steps) for i in range(len(q))]
    assert torch.equal(res.pred, torch.stack([board for board, _ in alone]))
    assert res.batch1_nfe.tolist() == [count for _, count in alone]
    assert len({count for _, count in alone}) > 2  # the puzzles differ, so a batch count would not match
    m = sample.score(q, None, res)
    assert m["batch1_nfe"] == pytest.approx(np.mean([count for _, count in alone]))


def test_batch_level_count_from_batch1_counts_equals_the_measured_one():
    """batch_level_nfe(batch1 counts, b) equals the batch count decode measures at batch size b (every
    puzzle charged 1 + the slowest loop of its b consecutive puzzles); score's batch512_nfe is that at 512.
    Catches: the max taken over all puzzles instead of per batch (tried: fails)."""
    model, q = hashed_model(), real_puzzles(10, 40)
    alone = sudoku.decode.decode_puzzles(model, q, tau=0.3, batch_size=1)
    for b in (3, 4):
        measured = sudoku.decode.decode_puzzles(model, q, tau=0.3, batch_size=b).batch_nfe
        assert torch.equal(sudoku.decode.batch_level_nfe(alone.batch1_nfe, b), measured), b
    assert len(set(sudoku.decode.batch_level_nfe(alone.batch1_nfe, 4).tolist())) > 1
    expect = sudoku.decode.decode_puzzles(model, q, tau=0.3, batch_size=512).batch_nfe.float().mean().item()
    assert sample.score(q, None, alone)["batch512_nfe"] == pytest.approx(expect)


def test_table_nfe_columns_do_not_change_with_batch_size(tmp_path, capsys):
    """sample.py --table prints the same Table 1 NFE (batch-1 count) and batch-512 count at --batch_size=1
    and --batch_size=4, while the measured batch count (bNFE) does change with it.
    Catches: the table's Mean NFE column read from the batch count at --batch_size (tried: fails)."""
    from helpers import write_checkpoint
    ckpt = write_checkpoint(tmp_path / "relay.pt", tiny_relay(1))
    q = real_puzzles(6, 60)
    from sudoku.board import format_board, tokens_to_digits
    data = tmp_path / "p.csv"
    data.write_text("question\n" + "".join(format_board(tokens_to_digits(x.numpy())) + "\n" for x in q))
    tables, jsons = [], []
    for b in (1, 4):
        out = tmp_path / f"r{b}.json"
        sample.main([f"--ckpt={ckpt}", f"--data={data}", "--n=6", "--taus=2.5", "--tau=2.5", f"--batch_size={b}",
                     "--table", "--device=cpu", f"--out={out}"])
        text = capsys.readouterr().out
        tables.append(text[text.index("| Objective"):].splitlines()[2])
        jsons.append(json.loads(out.read_text())["checkpoints"][0]["results"]["all"]["2.50"])
    assert tables[0] == tables[1]
    assert jsons[0]["batch_nfe"] != jsons[1]["batch_nfe"]
