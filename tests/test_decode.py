"""Decoding golden values: sample.decode must give the same boards and NFE as the decoding loop that
produced them, on a committed puzzle set and a fixed-seed float64 model built here.

    python -m pytest tests/test_decode.py -q
    python tests/test_decode.py --write     # re-capture the golden values (only on purpose)

The golden file tests/data/decode_golden.json was written by the sample.py decoding loop as it was
before decoding moved into relay.decode; the puzzles (tests/data/sudoku_decode_64.txt) are committed
rather than generated, so a change of the puzzle generator cannot move the golden values.
"""
import hashlib
import json
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import sample  # noqa: E402
from model import ModelConfig, SudokuTransformer  # noqa: E402
from sudoku import digits_to_tokens, parse_board  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data")
PUZZLES = os.path.join(DATA, "sudoku_decode_64.txt")
GOLDEN = os.path.join(DATA, "decode_golden.json")
HEX = "0123456789abcdefg"  # token ids 0..16, one character per cell

# (name, decode keyword arguments): several thresholds, batch sizes that split the 64 puzzles
# differently (batch NFE, early exit), no carry, and a max_steps small enough to need the final fill
CASES = [
    ("tau0.15_bs16", dict(tau=0.15, batch_size=16)),
    ("tau0.05_bs64", dict(tau=0.05, batch_size=64)),
    ("tau0.25_bs7_nocarry", dict(tau=0.25, batch_size=7, relay_carry=False)),
    ("tau0.15_bs32_maxsteps10", dict(tau=0.15, batch_size=32, max_steps=10)),
]


def load_questions() -> torch.Tensor:
    rows = [line.split() for line in open(PUZZLES) if line.strip() and not line.startswith("#")]
    return torch.as_tensor(np.stack([digits_to_tokens(parse_board(q)) for q, _ in rows]))


def golden_model() -> SudokuTransformer:
    """A small relay model from seed 0 in float64 whose predictions are confident enough to commit
    several cells per step: digit rows of the head scaled up, special-token rows down, and a learned-
    looking relay LayerNorm (beta != 0, so R(0) = beta matters, and gamma != 1)."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, d_ff=64, dropout=0.0, relay=True, pos_emb=True)
    model = SudokuTransformer(cfg).double().eval()
    with torch.no_grad():
        model.head.weight[8:].mul_(16.0)
        model.head.weight[:8].mul_(0.5)
        model.relay_norm.bias.normal_(0.0, 1.0)
        model.relay_norm.weight.normal_(1.0, 0.5)
    return model


def encode(tokens: torch.Tensor) -> list[str]:
    return ["".join(HEX[t] for t in row.tolist()) for row in tokens]


def run_cases() -> dict:
    questions, model = load_questions(), golden_model()
    out = {}
    for name, kwargs in CASES:
        res = sample.decode(model, questions, record_boards=True, **kwargs)
        trace = hashlib.sha256()  # every puzzle's board and commit mask after each forward
        for boards, commits in zip(res.boards, res.commits):
            trace.update(boards.numpy().astype(np.int64).tobytes())
            trace.update(commits.numpy().astype(np.uint8).tobytes())
        out[name] = {"pred": encode(res.pred), "nfe": res.nfe.tolist(), "batch_nfe": res.batch_nfe.tolist(),
                     "violations_rollout": res.violations_rollout.tolist(), "trace_sha256": trace.hexdigest()}
    return out


def test_decode_matches_the_golden_boards_and_nfe():
    """Catches any change of the decoding loop's boards, per-puzzle NFE, batch NFE, rollout violations
    or per-forward trace. Checked: fails when relay.decode skips the final-fill forward (case
    maxsteps10), when batch_nfe drops its +1, when the carry passes h=None at every step, and when
    early exit forgets to drop the finished rows' h."""
    expected = json.load(open(GOLDEN))
    got = run_cases()
    assert set(got) == set(expected)
    for name in expected:
        for key in ("nfe", "batch_nfe", "violations_rollout", "pred", "trace_sha256"):
            assert got[name][key] == expected[name][key], f"case {name}: {key} differs from the golden values"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/test_decode.py --write   (re-captures the golden values)")
    with open(GOLDEN, "w") as f:
        json.dump(run_cases(), f, indent=0)
    print(f"wrote {GOLDEN}")
