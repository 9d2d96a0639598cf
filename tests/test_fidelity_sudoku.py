"""Fidelity tests for the Sudoku side: each one pins a fact of the paper's model, loss or training loop
against an independent reference (a float64 forward written from the equations, hand-computed losses,
spies on what the training loop actually feeds the model and the optimizer).

    python -m pytest tests/test_fidelity_sudoku.py -q

Every test names in its docstring the bug it catches; each bug was introduced once in the code, the
test was seen to fail, and the code was restored.
"""
import json
import math
import os
import types
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn as nn

import relay
import sudoku.step
import train_sudoku as ts
from configurator import load_config
from model import ModelConfig, SudokuTransformer
from sudoku.board import DIGIT0, MASK, digits_to_tokens
from helpers import random_grids

V = 17
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--d_ff=64", "--batch_size=16", "--log_interval=1",
        "--device=cpu", "--warmup_iters=2", "--learning_rate=3e-3", "--dropout=0.0"]


# ----------------------------------------------------------------------------- a float64 reference forward

def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(biased variance + eps) * gamma + beta over the last dim."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * gamma + beta


def rotate(x: torch.Tensor) -> torch.Tensor:
    """RoPE on (L, D): pair i = (dim i, dim i + D/2) at position p turns by p * 10000^(-2i/D)."""
    L, D = x.shape
    out = torch.empty_like(x)
    for i in range(D // 2):
        angle = torch.arange(L, dtype=torch.float64) * 10000.0 ** (-2 * i / D)
        a, b = x[:, i], x[:, i + D // 2]
        out[:, i] = a * torch.cos(angle) - b * torch.sin(angle)
        out[:, i + D // 2] = b * torch.cos(angle) + a * torch.sin(angle)
    return out


def reference_forward(P: dict, tokens: torch.Tensor, h: torch.Tensor | None, n_layer: int, n_head: int,
                      relay_model: bool, eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """The xtiny Transformer of App. A.1, one sequence at a time, from the weights P (float64).

    x = Emb(tokens) (+ LN_relay(h) before layer zero, h = 0 when absent); per pre-norm block:
    x += W_o [softmax(rope(q) rope(k)^T / sqrt(D)) v]_heads with [q k v] = LN1(x) W_qkv (no biases),
    x += W_2 relu(W_1 LN2(x) + b_1) + b_2; logits = W_head LN_f(x); h_out = x (before LN_f).
    """
    C = P["tok_emb.weight"].shape[1]
    D = C // n_head
    logits_all, h_all = [], []
    for b in range(tokens.shape[0]):
        x = P["tok_emb.weight"][tokens[b]]
        if relay_model:
            state = torch.zeros_like(x) if h is None else h[b]
            x = x + layer_norm(state, P["relay_norm.weight"], P["relay_norm.bias"], eps)
        for layer in range(n_layer):
            p = f"blocks.{layer}."
            a = layer_norm(x, P[p + "norm1.weight"], P[p + "norm1.bias"], eps)
            qkv = a @ P[p + "attn.qkv.weight"].T
            q, k, v = qkv[:, :C], qkv[:, C:2 * C], qkv[:, 2 * C:]
            heads = []
            for hd in range(n_head):
                cols = slice(hd * D, (hd + 1) * D)
                scores = rotate(q[:, cols]) @ rotate(k[:, cols]).T / math.sqrt(D)
                weights = torch.exp(scores - scores.max(-1, keepdim=True).values)
                heads.append((weights / weights.sum(-1, keepdim=True)) @ v[:, cols])
            x = x + torch.cat(heads, -1) @ P[p + "attn.proj.weight"].T
            f = layer_norm(x, P[p + "norm2.weight"], P[p + "norm2.bias"], eps)
            hidden = torch.clamp(f @ P[p + "ffn.fc1.weight"].T + P[p + "ffn.fc1.bias"], min=0.0)
            x = x + hidden @ P[p + "ffn.fc2.weight"].T + P[p + "ffn.fc2.bias"]
        h_all.append(x)
        logits_all.append(layer_norm(x, P["final_norm.weight"], P["final_norm.bias"], eps) @ P["head.weight"].T)
    return torch.stack(logits_all), torch.stack(h_all)


def small_stream_weights(model: SudokuTransformer, seed: int) -> None:
    """Weights that keep the residual stream at ~1e-3 (variance ~1e-6, below LayerNorm's eps = 1e-5), so
    every LayerNorm's eps changes the output visibly; gammas and betas are random, not 1 and 0."""
    g = torch.Generator().manual_seed(seed)
    C, F = model.config.n_embd, model.config.d_ff

    def rand(*shape, std=1.0, mean=0.0):
        return (mean + std * torch.randn(*shape, generator=g)).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "final_norm.weight":
                p.copy_(rand(C, std=0.3, mean=1.0))
            elif name.endswith("norm1.bias") or name.endswith("norm2.bias") or name == "final_norm.bias":
                p.copy_(rand(C, std=0.1))
            elif name.startswith("relay_norm"):
                p.copy_(rand(C, std=1e-3))  # its output joins the stream: keep it small
            elif name == "tok_emb.weight":
                p.copy_(rand(*p.shape, std=1e-3))
            elif name.endswith("qkv.weight") or name.endswith("fc1.weight"):
                p.copy_(rand(*p.shape, std=C ** -0.5))
            elif name.endswith("fc1.bias"):
                p.copy_(rand(F, std=0.1))
            elif name.endswith("proj.weight") or name.endswith("fc2.weight"):
                p.copy_(rand(*p.shape, std=1e-3 * p.shape[1] ** -0.5))  # adds ~1e-3 to the stream
            elif name.endswith("fc2.bias"):
                p.copy_(rand(C, std=1e-3))
            elif name == "head.weight":
                p.copy_(rand(*p.shape))
            else:
                raise AssertionError(f"unexpected parameter {name}: update the reference forward")


@pytest.mark.parametrize("relay_model,tie", [(False, False), (True, False), (True, True)])
def test_forward_matches_float64_reference_of_the_paper_architecture(relay_model, tie, device):
    """The model equals a float64 forward written from App. A.1 and the architecture facts, with
    inputs on the scale where LayerNorm's eps matters.

    Catches (each tried once, test failed, code restored): the relay added after block 0 instead of
    to the input embedding; LayerNorm eps 1e-5 -> 1e-6 in a block norm and in the final norm; h_out
    taken after the final LayerNorm; q/k/v split order swapped; RoPE on v as well; a causal mask.
    """
    n_layer, n_head = 2, 2
    cfg = ModelConfig(n_layer=n_layer, n_head=n_head, n_embd=8, d_ff=16, dropout=0.0, relay=relay_model,
                      tie_embeddings=tie)
    torch.manual_seed(0)
    model = SudokuTransformer(cfg).double().eval()
    small_stream_weights(model, seed=1)
    P = {n: p.detach() for n, p in model.state_dict().items()}
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(2, V, (2, 81), generator=g)
    states = [None] + ([1e-3 * torch.randn(2, 81, 8, generator=g).double()] if relay_model else [])
    model.to(device)  # the model runs on the device, the reference on the CPU
    for h in states:
        with torch.no_grad():
            logits, h_out = model(tokens.to(device), None if h is None else h.to(device))
        logits, h_out = logits.cpu(), h_out.cpu()
        ref_logits, ref_h = reference_forward(P, tokens, h, n_layer, n_head, relay_model)
        torch.testing.assert_close(h_out, ref_h, rtol=1e-6, atol=1e-10)
        scale = ref_logits.abs().max()  # the tied head is the small embedding: logits ~1e-3
        torch.testing.assert_close(logits, ref_logits, rtol=1e-6, atol=1e-6 * scale)
        # the test's power: LayerNorm's eps moves the logits by far more than the tolerance
        other, _ = reference_forward(P, tokens, h, n_layer, n_head, relay_model, eps=1e-6)
        assert (other - ref_logits).abs().max() > 0.05 * scale


# ----------------------------------------------------------------------------- dropout placement

def test_ffn_dropout_is_applied_to_the_ffn_output_only(device):
    """In train mode the FFN's contribution is each element of W2 relu(W1 LN2(x) + b1) + b2 either dropped
    or scaled by 1/(1-p): dropout on the FFN output, none inside it, none on the embedding.

    Catches: the FFN output dropout removed (no element is ever zero); dropout moved between fc1 and fc2
    (elements are no longer 0 or eval/(1-p)). Both tried, both fail.
    """
    p = 0.5
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(n_layer=1, n_head=2, n_embd=16, d_ff=32, dropout=p)).to(device)
    with torch.no_grad():
        model.blocks[0].attn.proj.weight.zero_()  # attention adds exactly 0: only the FFN path is left
    tokens = torch.randint(2, V, (4, 81), generator=torch.Generator().manual_seed(1)).to(device)
    emb = model.tok_emb.weight[tokens].detach()
    model.eval()
    with torch.no_grad():
        eval_delta = model(tokens)[1] - emb
    model.train()
    torch.manual_seed(3)
    with torch.no_grad():
        train_delta = model(tokens)[1] - emb
    dropped = train_delta.abs() < 1e-7
    assert 0.4 < dropped.float().mean() < 0.6
    torch.testing.assert_close(train_delta, torch.where(dropped, 0.0, eval_delta / (1 - p)), rtol=1e-5, atol=1e-6)


def test_attention_dropout_on_probabilities_and_on_the_output_projection(device):
    """With one head, identical tokens (so every v is the same vector v0) and the FFN zeroed, the
    attention output of cell i in train mode is proj_drop(W_o s_i v0), where s_i = the sum of cell i's
    attention probabilities after dropout. So per cell the kept elements are W_o v0 times one common
    factor s_i / (1-p), about half are dropped, and s_i differs between cells.

    Catches: the output-projection dropout removed (no zeros); attention-probability dropout removed
    (every factor is exactly 1/(1-p)); dropout before instead of after the projection (kept elements no
    longer share one factor per cell). Each tried once, each fails.
    """
    p = 0.5
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(n_layer=1, n_head=1, n_embd=16, d_ff=32, dropout=p)).to(device)
    with torch.no_grad():
        model.blocks[0].ffn.fc2.weight.zero_()
        model.blocks[0].ffn.fc2.bias.zero_()
    tokens = torch.full((1, 81), DIGIT0 + 5, device=device)
    emb = model.tok_emb.weight[tokens].detach()
    model.eval()
    with torch.no_grad():
        c = (model(tokens)[1] - emb)[0]  # (81, 16): W_o v0 at every cell
    torch.testing.assert_close(c, c[:1].expand_as(c))
    model.train()
    torch.manual_seed(5)
    with torch.no_grad():
        delta = (model(tokens)[1] - emb)[0]
    ratio = delta / c[0]
    kept = delta.abs() > 1e-7
    assert 0.35 < kept.float().mean() < 0.65
    factors = []
    for i in range(81):
        r = ratio[i][kept[i]]
        if r.numel():
            torch.testing.assert_close(r, r[:1].expand_as(r), rtol=1e-4, atol=1e-5)
            factors.append(r[0].item())
    factors = torch.tensor(factors) * (1 - p)  # = s_i
    assert factors.std() > 0.05 and (factors - 1).abs().max() > 0.1


# ----------------------------------------------------------------------------- the rollout loss by hand

class FixedLogits(nn.Module):
    """step_fn whose logits do not depend on the board: log of the given per-cell target probability,
    the rest spread evenly over the other 16 ids (so the max probability is the target's when >= 1/17)."""

    def __init__(self, targets: torch.Tensor, p_target: torch.Tensor):
        super().__init__()
        probs = ((1 - p_target) / (V - 1))[..., None].repeat(1, 1, V)
        probs.scatter_(-1, targets[..., None], p_target[..., None])
        self.logits = probs.log()

    def forward(self, z, h=None):
        return self.logits.clone(), torch.zeros(*z.shape, 2, device=z.device)


def test_rollout_loss_by_hand_with_revealed_cells_k2(device):
    """K = 2 rollout loss on two 4-cell rows, computed by hand: L = L_1 + L_2, each L_k the cross-entropy
    averaged over the still-masked, non-clue cells of the whole batch (paper Eq. 5;
    the authors' code sums the per-step token means). Row 0 has a clue and an already revealed cell.

    Catches: the loss taken over all maskable cells (revealed ones included); clues scored; L_1 and L_2
    averaged instead of summed; a per-row mean instead of one pooled token mean. Each tried, each fails.
    """
    x0 = torch.tensor([[8, 9, 10, 11], [8, 9, 10, 11]])
    maskable = torch.tensor([[False, True, True, True], [False, True, True, True]])
    z = torch.tensor([[8, 9, MASK, MASK], [8, MASK, MASK, MASK]])  # row 0: cell 1 already revealed
    p = torch.tensor([[0.1, 0.9, 0.5, 0.25], [0.1, 0.8, 0.5, 0.25]])  # probability of the true digit
    x0, maskable, z, p = x0.to(device), maskable.to(device), z.to(device), p.to(device)
    step = FixedLogits(x0, p)
    # tau = 0.15 and every u = 1 - c >= 0.2: nothing qualifies, so each row commits its most confident cell
    out = relay.rollout_loss(step, x0=x0, z=z, maskable=maskable, h=None, mask_id=MASK, K=2, variant="rollout",
                             policy=partial(relay.confidence_unmask, tau=0.15))
    ln = math.log
    # step 1: row 0 scores cells 2, 3; row 1 cells 1, 2, 3 -> one mean over 5 tokens; commits (0,2), (1,1)
    L1 = (-ln(0.5) - ln(0.25) - ln(0.8) - ln(0.5) - ln(0.25)) / 5
    # step 2: row 0 scores cell 3; row 1 cells 2, 3 -> mean over 3 tokens; commits (0,3), (1,2)
    L2 = (-ln(0.25) - ln(0.5) - ln(0.25)) / 3
    assert [s.item() for s in out.step_losses] == pytest.approx([L1, L2], rel=1e-6)
    assert out.loss.item() == pytest.approx(L1 + L2, rel=1e-6)
    assert out.z.tolist() == [[8, 9, 10, 11], [8, 9, 10, MASK]]  # teacher forced with the true digits


# ----------------------------------------------------------------------------- the training loop

def fixed_clue_puzzles(n: int, n_clues: int, seed: int) -> types.SimpleNamespace:
    """Puzzles whose clues are always the first n_clues cells (valid grids from a shuffled pattern)."""
    solution = random_grids(n, np.random.default_rng(seed))
    question = solution.copy()
    question[:, n_clues:] = 0
    return types.SimpleNamespace(question=digits_to_tokens(question), answer=digits_to_tokens(solution))


DATA = fixed_clue_puzzles(64, 30, seed=0)


def train(tmp, *args, val=None, device="cpu") -> dict:
    """A tiny run; on a non-CPU device with the default dtype=auto (bf16 autocast on CUDA)."""
    cfg = load_config(ts.TrainConfig, TINY + [f"--out_dir={tmp}", "--eval_interval=0", f"--device={device}", *args])
    ts.train(cfg, DATA, val)
    return torch.load(os.path.join(tmp, "ckpt.pt"), map_location="cpu", weights_only=True)


def test_training_loss_is_the_sum_of_the_k_step_losses(tmp_path, monkeypatch, device):
    """The loss the loop logs (and backpropagates) for a rollout objective is L_1 + L_2, the sum of the
    step losses rollout_loss returns (checked by hand in test_rollout_loss_by_hand_with_revealed_cells_k2).

    Catches: `loss = out.loss / cfg.K` (the K step losses averaged) in sudoku/step.py. Tried, fails.
    """
    seen = []

    def spy(*a, **k):
        out = relay.rollout_loss(*a, **k)
        seen.append([s.item() for s in out.step_losses])
        return out
    monkeypatch.setattr(sudoku.step, "rollout_loss", spy)
    train(tmp_path, "--objective=relay", "--max_iters=2", "--eval_puzzles=0", device=device)
    logged = [json.loads(line)["loss"] for line in open(tmp_path / "metrics.jsonl")]
    assert len(seen) == 2 and all(len(s) == 2 for s in seen)
    assert logged == pytest.approx([sum(s) for s in seen], abs=2e-5)


def test_training_tau_is_noisy_per_step_and_fixed_without_sigma(tmp_path, monkeypatch, device):
    """The loop's unmasking threshold is tau = max(0, 0.15 + 0.1 eps), a new eps per inner step
    (App. A.1: perturbed by N(0, 0.1^2) during training); with train_tau_sigma = 0 it is 0.15 (float32 on a GPU).

    Catches: the training policy built with sigma = 0 (noise switched off), and a policy that ignores
    the configured sigma. Both tried, both fail.
    """
    taus = []

    def spy(logits, candidates, tau):
        taus.append(float(tau))
        return confidence_unmask(logits, candidates, tau)
    confidence_unmask = relay.confidence_unmask
    monkeypatch.setattr(relay, "confidence_unmask", spy)
    train(tmp_path / "noisy", "--objective=rollout", "--max_iters=4", "--eval_puzzles=0", device=device)
    assert len(taus) == 8 and len(set(taus)) == 8  # K = 2 draws per optimizer step, all different
    spread = np.abs(np.array(taus) - 0.15)
    assert 0.01 < spread.mean() < 0.3 and min(taus) >= 0.0
    taus.clear()
    train(tmp_path / "fixed", "--objective=rollout", "--max_iters=4", "--eval_puzzles=0", "--train_tau_sigma=0.0",
          device=device)
    exact = 0.15 if device.type == "cpu" else float(torch.tensor(0.15))  # a GPU draws tau in float32 (relay.draw_taus)
    assert taus == [exact] * 8


def test_mlm_training_never_masks_clues(tmp_path, monkeypatch, device):
    """Every input the MLM loop feeds the model keeps the clue cells (here always the first 30 cells)
    and masks each other cell with a per-puzzle probability t ~ U(0, 1).

    Catches: MLM masks drawn over all 81 cells (mlm_masking given no clues) in sudoku/step.py. Tried, fails.
    """
    inputs = []
    forward = SudokuTransformer.forward

    def spy(self, tokens, h=None):
        inputs.append(tokens.detach().clone())
        return forward(self, tokens, h)
    monkeypatch.setattr(SudokuTransformer, "forward", spy)
    train(tmp_path, "--objective=mlm", "--max_iters=8", "--eval_puzzles=0", device=device)
    x = torch.cat(inputs).cpu()
    assert x.shape == (8 * 16, 81)
    assert not (x[:, :30] == MASK).any()
    frac = (x[:, 30:] == MASK).float().mean(1)
    assert frac.min() < 0.25 and frac.max() > 0.75 and 0.3 < frac.mean() < 0.7


class SpyAdamW(torch.optim.AdamW):
    norms: list[float] = []

    def step(self, closure=None):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        SpyAdamW.norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())
        return super().step(closure)


def test_gradient_is_clipped_to_grad_clip_global_norm(tmp_path, monkeypatch, device):
    """The gradient the optimizer sees has global norm grad_clip whenever it was larger (App. A.1:
    clipping at global Frobenius norm 0.5; here 1e-3 so that every step clips).

    Catches: gradient clipping removed from the training loop. Tried, fails.
    """
    monkeypatch.setattr(torch.optim, "AdamW", SpyAdamW)
    SpyAdamW.norms = []
    train(tmp_path / "off", "--objective=relay", "--max_iters=2", "--eval_puzzles=0", "--grad_clip=0.0", device=device)
    assert min(SpyAdamW.norms) > 1e-2  # unclipped gradients are far larger than 1e-3
    SpyAdamW.norms = []
    train(tmp_path / "on", "--objective=relay", "--max_iters=2", "--eval_puzzles=0", "--grad_clip=1e-3", device=device)
    assert SpyAdamW.norms == pytest.approx([1e-3, 1e-3], rel=1e-3)


def test_validation_uses_the_ema_weights(tmp_path, monkeypatch, device):
    """The model validated during training carries the EMA weights (what the authors evaluated), not
    the raw ones; the two differ after a few steps.

    Catches: evaluate() validating raw_model instead of the EMA copy. Tried, fails.
    """
    validated = []
    validate = ts.validate

    def spy(model, questions, answers, cfg):
        validated.append({n: p.detach().cpu().clone() for n, p in model.named_parameters()})
        return validate(model, questions, answers, cfg)
    monkeypatch.setattr(ts, "validate", spy)
    val = fixed_clue_puzzles(8, 40, seed=1)
    ckpt = train(tmp_path, "--objective=relay", "--max_iters=3", "--eval_puzzles=8", val=val, device=device)
    assert len(validated) == 1
    shadow, raw = ckpt["ema"]["shadow"], ckpt["model"]
    assert any(not torch.equal(shadow[n], raw[n]) for n in shadow)
    for n, p in validated[0].items():
        assert torch.equal(p, shadow[n]), n


class Oracle(nn.Module):
    """Predicts `boards` (N, 81): finds the row's puzzle by its filled cells, puts ~all mass on its digits."""

    def __init__(self, boards: torch.Tensor):
        super().__init__()
        self.boards = boards
        self.config = types.SimpleNamespace(relay=False)
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, tokens, h=None):
        agree = (tokens[:, None, :] == self.boards[None]) | (tokens[:, None, :] == MASK)  # (B, N, 81)
        which = agree.all(-1).float().argmax(-1)
        h = torch.zeros(*tokens.shape, 2, device=tokens.device)
        return 20.0 * nn.functional.one_hot(self.boards[which], V).float(), h


def test_validation_exact_match_and_token_accuracy_per_puzzle(device):
    """Validation of 4 puzzles, 3 solved and 1 with one wrong blank: exact match 3/4 (every cell of a
    puzzle right, averaged over puzzles) and token accuracy = mean over puzzles of right/blank cells.

    Catches: exact match reduced over the wrong axis (right.all(0): cells right in every puzzle, here
    80/81) and token accuracy pooled over cells. Tried, fails.
    """
    data = fixed_clue_puzzles(4, 30, seed=2)
    q, a = torch.as_tensor(data.question), torch.as_tensor(data.answer)
    q[0, 30:60] = a[0, 30:60]  # puzzle 0: 21 blanks, the others 51 (so a pooled mean would differ)
    pred = a.clone()
    pred[3, 50] = DIGIT0 + (a[3, 50] - DIGIT0) % 9 + 1  # another digit in one blank cell
    metrics = ts.validate(Oracle(pred.to(device)).to(device), q, a, ts.TrainConfig(eval_batch_size=3))
    assert metrics["exact"] == 0.75
    assert metrics["token_acc"] == pytest.approx((3 + 50 / 51) / 4)
    assert (3 + 50 / 51) / 4 != pytest.approx(173 / 174)  # the pooled value
