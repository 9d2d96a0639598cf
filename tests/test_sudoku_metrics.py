"""The paper's Sudoku metrics in sample.py: the authors' violating-snapshot count, the batch-1 NFE of the
deduction-only column, and --table's column order (definitions: docs/sudoku_metrics.md).

    python -m pytest tests/test_sudoku_metrics.py -q
"""
import numpy as np
import pytest
import torch
import torch.nn as nn

import sample
import sudoku_decode
import sudoku_report
from sudoku import DIGIT0, MASK, digits_to_tokens, random_grid

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
    assert sudoku_decode.token_violations(bad[None]).item() == 3
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
    res = sudoku_decode.decode(FixedModel(conf, digits), torch.tensor(q, device=device)[None], tau=0.0,
                               record_boards=True)
    assert res.nfe.tolist() == [2] and res.batch1_nfe.tolist() == [3]
    assert res.violations_rollout.tolist() == [3] and res.violating_snapshots.tolist() == [2]
    # a repeated clue: every snapshot violates, the question included -> 4
    q2 = q.copy()
    q2[2] = q2[3]
    res2 = sudoku_decode.decode(FixedModel(conf, digits), torch.tensor(q2, device=device)[None], tau=0.0)
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
    res = sudoku_decode.decode(hashed_model(), q.to(device), tau=0.3, max_steps=max_steps, batch_size=4,
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
    res = sudoku_decode.decode(model, q, tau=0.3, batch_size=4)
    alone = torch.cat([sudoku_decode.decode(model, q[i:i + 1], tau=0.3, batch_size=1).batch_nfe for i in range(len(q))])
    assert torch.equal(res.batch1_nfe, alone)
    assert not torch.equal(res.batch1_nfe, res.batch_nfe) and not torch.equal(res.batch1_nfe, res.nfe)


def test_table_columns_follow_table_1():
    """--table starts with Table 1's columns in its order (Acc and Mean NFE unfiltered, then deduction-only),
    the unfiltered NFE on the batch-512 count and the deduction-only NFE on the batch-1 count; the
    authors' violating snapshots and our summed violations follow under their own names.
    Catches: the columns in another order or a Mean NFE column on the wrong basis (tried: swapped bases)."""
    def metrics(em, bnfe, b1nfe):
        return {k: 0.5 for k in sample.METRIC_KEYS} | {"exact_match": em, "batch_nfe": bnfe, "batch1_nfe": b1nfe,
                                                       "mean_nfe": 1.0, "violating_snapshots": 0.9,
                                                       "violations_rollout": 2.5, "n": 2000}
    entry = {"path": "r", "config": {"objective": "relay", "tie_embeddings": True, "seed": 1},
             "results": {"all": {"0.15": metrics(0.6, 7.0, 5.0)}, "deduction_only": {"0.15": metrics(0.75, 8.0, 6.0)}}}
    head, _, row = sudoku_report.format_table([entry], 0.15).splitlines()[:3]
    cols = [c.strip() for c in head.strip("|").split("|")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cols[:7] == ["Objective", "Tying", "seeds", "Acc (%) unfiltered", "Mean NFE unfiltered (batch-512 count)",
                        "Acc (%) deduction-only", "Mean NFE deduction-only (batch-1 count)"]
    assert cells[:7] == ["Relay", "tied", "1", "60.00", "7.00", "75.00", "6.00"]
    named = dict(zip(cols, cells))
    assert named["Violating snapshots deduction-only"] == "0.90"
    assert named["Violations summed over boards deduction-only"] == "2.50"
    assert named["Legal (%) deduction-only"] == "50.00"
