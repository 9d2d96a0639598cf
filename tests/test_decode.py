"""Decoding golden values: sudoku.decode.decode_puzzles must give the same boards and NFE as the decoding loop that
produced them, on a committed puzzle set and a fixed-seed float64 model built here.

    python -m pytest tests/test_decode.py -q
    python tests/test_decode.py --write     # re-capture the golden values (only on purpose)

The golden file tests/data/decode_golden.json was written by the sample.py decoding loop as it was
before decoding moved into relay.decode; the puzzles (tests/data/sudoku_decode_64.txt) are committed
rather than generated, so a change of the puzzle generator cannot move the golden values.
test_pin_decode_golden_boards_and_nfe is a pin: it compares the code with its own earlier output, so it
catches a change, not a wrong method; the row-by-row reference below is the evidence.
"""
import hashlib
import json
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import sudoku.decode  # noqa: E402
from model import ModelConfig, SudokuTransformer  # noqa: E402
from sudoku.board import digits_to_tokens, parse_board  # noqa: E402

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


def run_cases(device: str | torch.device = "cpu") -> dict:
    questions, model = load_questions(), golden_model().to(device)  # questions stay on the CPU: decode moves them
    out = {}
    for name, kwargs in CASES:
        res = sudoku.decode.decode_puzzles(model, questions, record_boards=True, **kwargs)
        trace = hashlib.sha256()  # every puzzle's board and commit mask after each forward
        for boards, commits in zip(res.boards, res.commits):
            trace.update(boards.numpy().astype(np.int64).tobytes())
            trace.update(commits.numpy().astype(np.uint8).tobytes())
        out[name] = {"pred": encode(res.pred), "nfe": res.nfe.tolist(), "batch_nfe": res.batch_nfe.tolist(),
                     "violations_rollout": res.violations_rollout.tolist(), "trace_sha256": trace.hexdigest()}
    return out


def test_pin_decode_golden_boards_and_nfe(device):
    """Catches any change of the decoding loop's boards, per-puzzle NFE, batch NFE, rollout violations
    or per-forward trace. Checked: fails when relay.decode skips the final-fill forward (case
    maxsteps10), when batch_nfe drops its +1, when the carry passes h=None at every step, and when
    early exit forgets to drop the finished rows' h. On CUDA the float64 model is left alone by the
    decoder's bf16 autocast (autocast never casts float64), so the CPU golden values must hold there too."""
    expected = json.load(open(GOLDEN))
    got = run_cases(device)
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


# ----------------------------------------------------------------------------- relay.decode on a generic model

import pytest  # noqa: E402

import relay  # noqa: E402


class Toy(torch.nn.Module):
    """Torch-only MDM over ids 0..5 (5 = [MASK]); logits depend on the tokens and on h."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.emb, self.mix, self.head = torch.nn.Embedding(6, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 6)
        self.relay_norm = relay.RelayLayerNorm(16)
        torch.nn.init.normal_(self.relay_norm.bias)
        self.head.weight.data.mul_(6.0)

    def forward(self, tokens, h=None, scale=None):
        x = self.emb(tokens) + self.relay_norm(torch.zeros(*tokens.shape, 16, device=tokens.device) if h is None else h)
        h_out = torch.tanh(self.mix(x + x.mean(1, keepdim=True)))
        logits = self.head(h_out)
        return (logits if scale is None else logits * scale[:, None, None]), h_out


def allow_only(step_fn, allowed, mask_id):
    """The BERT example's token filter (the step_fn is where decode's token restriction lives)."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import relay_bert
    return relay_bert.allow_only(step_fn, allowed, mask_id)


def reference_decode(model, tokens, tau, max_steps, allowed=None):
    """One row at a time, written from relay.decode's docstring: returns tokens and nfe per row."""
    out, nfe = tokens.clone(), []
    for b in range(len(tokens)):
        x, h, n = tokens[b:b + 1].clone(), None, 0
        for step in range(max_steps + 1):
            cand = x == 5
            if not cand.any():
                break
            logits, h = model(x, h)
            if allowed is not None:
                logits[..., [i for i in range(6) if i not in allowed]] = float("-inf")
            n += 1
            commit = relay.confidence_unmask(logits, cand, tau) if step < max_steps else cand
            x = torch.where(commit, logits.argmax(-1), x)
        out[b], nfe = x[0], nfe + [n]
    return out, torch.tensor(nfe, device=tokens.device)


@pytest.mark.parametrize("allowed", [None, [0, 1, 2]])
def test_decode_matches_a_row_by_row_reference(allowed, device):
    """relay.decode on a batch equals a plain one-row loop (carry, commit rule, final fill, nfe,
    allowed ids through the example's step_fn filter). Checked: fails when decode's carry passes h=None,
    when the final fill is dropped, and when the allowed restriction is not applied."""
    model = Toy().to(device).eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 5, (12, 10), generator=g)
    tokens[torch.rand(12, 10, generator=g) < 0.7] = 5
    tokens = tokens.to(device)
    for max_steps in (64, 3):
        step_fn = model if allowed is None else allow_only(model, allowed, 5)
        out = relay.decode(step_fn, tokens, mask_id=5, tau=0.2, max_steps=max_steps)
        ref_tokens, ref_nfe = reference_decode(model, tokens, 0.2, max_steps, allowed)
        assert torch.equal(out.tokens, ref_tokens) and torch.equal(out.nfe, ref_nfe)
        assert out.batch_nfe == 1 + int(out.steps.max())
        if allowed is not None:
            assert set(out.tokens[tokens == 5].tolist()) <= set(allowed)


def test_decode_hook_and_extras_follow_the_rows(device):
    """The hook sees each row once per forward it took, the last board it sees is the final one, and
    per-row extras reach step_fn in the rows' order under early exit. Checked: fails when decode
    passes the extras unsliced (shape error) or sliced by the batch order instead of `rows`."""
    model = Toy().to(device).eval()
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 5, (9, 8), generator=g)
    tokens[torch.rand(9, 8, generator=g) < torch.linspace(0.1, 0.9, 9)[:, None]] = 5  # rows finish at different steps
    tokens[:, 0], tokens[:, 1] = torch.arange(9) % 5, torch.arange(9) // 5  # given cells that name the row
    tokens, scale = tokens.to(device), torch.linspace(0.5, 2.0, 9, device=device)
    forwards, last = torch.zeros(9, dtype=torch.long, device=device), {}

    def step_fn(x, h, scale, row):
        assert torch.equal(x[:, 0], row % 5) and torch.equal(x[:, 1], row // 5), "extras rows out of order"
        return model(x, h, scale)

    def on_step(step, rows, board, committed):
        forwards[rows] += 1
        for r, b in zip(rows.tolist(), board):
            last[r] = b.clone()
        assert committed.any(1).all()

    row_ids = torch.arange(9, device=device)
    out = relay.decode(step_fn, tokens, mask_id=5, tau=0.1, extras={"scale": scale, "row": row_ids},
                       on_step=on_step)
    assert torch.equal(forwards, out.nfe)
    assert all(torch.equal(last[r], out.tokens[r]) for r in last)
    for r in range(9):  # each row alone gives the same result: its own scale reached it
        alone = relay.decode(model, tokens[r:r + 1], mask_id=5, tau=0.1, extras={"scale": scale[r:r + 1]})
        assert torch.equal(alone.tokens[0], out.tokens[r])


def test_decode_rejects_traps():
    """Trap: a restriction that still allows [MASK] can commit it forever; a model left in training
    mode decodes with dropout. Checked: fails when either check is removed (from relay.decode, and
    from the example's allow_only)."""
    model = Toy()
    tokens = torch.full((2, 4), 5)
    with pytest.raises(ValueError, match="training mode"):
        relay.decode(model, tokens, mask_id=5)
    with pytest.raises(ValueError, match="allowed contains mask_id"):
        relay.decode(allow_only(model.eval(), [0, 5], 5), tokens, mask_id=5)
    with pytest.raises(ValueError, match="allowed ids"):
        relay.decode(allow_only(model.eval(), [0, 9], 5), tokens, mask_id=5)
