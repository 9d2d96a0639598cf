"""Relay on models we did not write: relay.py copied alone into an empty folder, and the
transformers BERT example at tiny size.

    python -m pytest tests/test_examples.py -q
"""
import os
import shutil
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

# A torch-only MDM that is not ours (nn.TransformerEncoder), trained and decoded through relay.py's
# public API only. Task: reverse a sequence of 6 symbols (ids 0..3), [MASK] = 4; the first half is
# given, the second half is filled in.
STANDALONE = r'''
import torch, torch.nn as nn
from functools import partial
from relay import RelayLayerNorm, RolloutBuffer, check_step_fn, confidence_unmask, decode, draw_taus, rollout_loss

class Net(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.emb, self.pos = nn.Embedding(5, d), nn.Parameter(torch.randn(12, d))
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.enc, self.head = nn.TransformerEncoder(layer, 2), nn.Linear(d, 5)
        self.relay_norm = RelayLayerNorm(d)
    def forward(self, tokens, h=None):
        x = self.emb(tokens) + self.pos + self.relay_norm(torch.zeros(*tokens.shape, 32) if h is None else h)
        h_out = self.enc(x)
        return self.head(h_out), h_out

torch.manual_seed(0)
def batch(n):
    first = torch.randint(0, 4, (n, 6))
    x0 = torch.cat([first, first.flip(1)], 1)
    maskable = torch.zeros(n, 12, dtype=torch.bool); maskable[:, 6:] = True
    return x0, maskable
model = Net()
check_step_fn(model.eval(), batch(3)[0], d=32)
model.train()
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
buffer = RolloutBuffer(64, mask_id=4)
losses = []
for step in range(250):
    buffer.refill(*batch(64))
    policy = [partial(confidence_unmask, tau=t) for t in draw_taus(2, 0.15, 0.1)]
    out = rollout_loss(model, **buffer.inputs(), K=2, variant="relay", policy=policy)
    buffer.update(out)
    loss = out.loss
    opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
x0, maskable = batch(200)
out = decode(model.eval(), torch.where(maskable, 4, x0), mask_id=4, tau=0.15)
exact = (out.tokens == x0).all(1).float().mean().item()
print(f"loss {sum(losses[:20]) / 20:.3f} -> {sum(losses[-20:]) / 20:.3f}; exact {exact:.2f}; nfe {out.nfe.float().mean():.2f}")
assert (out.tokens != 4).all() and out.nfe.min() >= 1
assert sum(losses[-20:]) < 0.5 * sum(losses[:20]), "the rollout loss did not fall"
assert exact > 0.5, exact
'''


def test_relay_py_alone_trains_and_decodes_a_torch_model_that_is_not_ours(tmp_path):
    """relay.py copied alone, with PYTHONPATH cleared and cwd an empty folder: a torch.nn.Transformer
    MDM passes check_step_fn, trains with rollout_loss and decodes with decode. Checked: fails when
    relay.py imports a project module (e.g. `from sudoku.board import MASK`), and when the relay variant's
    loss does not reach the model (loss_k.detach() in rollout_loss)."""
    shutil.copy(os.path.join(ROOT, "relay.py"), tmp_path / "relay.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-s", "-c", STANDALONE], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [f for f in os.listdir(tmp_path) if f.endswith(".py")] == ["relay.py"]
    print(proc.stdout)


def test_bert_example_runs_end_to_end_at_tiny_size(capsys):
    """examples/relay_bert.py at tiny size: trains MLM and Relay, decodes both, prints the table.
    Checked: fails when the example's decode step_fn allows [MASK] (allow_only(model, SYMBOLS + [MASK], MASK)
    is an error)."""
    import relay_bert
    relay_bert.main(["--steps=3", "--batch_size=8", "--d=16", "--layers=1", "--n_test=8", "--taus=0.15"])
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith(("MLM", "Relay"))]
    assert [r[0] for r in rows] == ["MLM", "Relay"]
    for r in rows:
        assert 0.0 <= float(r[5]) <= 100.0 and float(r[6]) >= 1.0  # exact %, mean NFE


def test_bert_example_relay_starts_as_a_no_op():
    """Trap: the from-scratch advice (gamma = 1) makes a Hugging Face backbone, whose embeddings have
    std 0.02, learn nothing: R(h) drowns the token identity. The example must start R at zero, so
    at init the relay model computes exactly what plain BERT does for any h, and h=None equals
    h=zeros. Checked: fails when the example builds RelayLayerNorm without zero_init=True."""
    import relay
    import relay_bert
    from transformers import BertConfig
    cfg = BertConfig(vocab_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=4,
                     intermediate_size=32, max_position_embeddings=25, type_vocab_size=1)
    torch.manual_seed(0)
    model = relay_bert.RelayBert(cfg, relay=True).eval()
    tokens = torch.randint(2, 8, (3, 25))
    plain = model.bert(input_ids=tokens).logits
    with torch.no_grad():
        logits, _ = model(tokens, torch.randn(3, 25, 16))
    torch.testing.assert_close(logits, plain)
    relay.check_step_fn(model, tokens, d=16)
