"""The training step as one compiled graph (compile=True): no graph break, no host sync, no recompile.

    python -m pytest tests/test_compile_step.py -q            # relay: ~30 s on a 2-core CPU (compiling), ~4 s with a warm inductor cache
    python -m pytest tests/test_compile_step.py -q -m slow    # mlm and staggered rollout too
"""
import types
from functools import partial

import numpy as np
import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import relay
import train_sudoku as ts
from model import ModelConfig, SudokuTransformer
from sudoku.board import MASK

TINY = dict(n_layer=1, n_head=2, n_embd=32, d_ff=64, batch_size=16, dropout=0.0, eval_puzzles=0,
            dtype="float32", warmup_iters=1, learning_rate=3e-3)


def random_boards(n: int = 64, seed: int = 0) -> types.SimpleNamespace:
    """Answers of random digit tokens and questions with about half the cells blank: the step's code and
    cost do not depend on the boards being valid Sudoku."""
    rng = np.random.default_rng(seed)
    answer = rng.integers(8, 17, size=(n, 81)).astype(np.uint8)
    question = np.where(rng.random((n, 81)) < 0.5, MASK, answer).astype(np.uint8)
    return types.SimpleNamespace(question=question, answer=answer)


def run_steps(objective: str, compile: bool, tmp_path, n: int = 3, device: str = "cpu",
              **extra) -> tuple[list, list, ts.SudokuRun]:
    """n train_step calls; returns each step's loss and the gradients the optimizer saw, and the SudokuRun."""
    cfg = ts.TrainConfig(objective=objective, compile=compile, out_dir=str(tmp_path / f"{objective}-{compile}"),
                         train_tau_sigma=0.3, device=device, **TINY, **extra)
    run = ts.setup(cfg, random_boards())
    torch.backends.cuda.matmul.allow_tf32 = False  # setup turns TF32 on for CUDA; compared here: compiled vs eager
    grads, step = [], run.optimizer.step

    def spy_step(*a, **k):  # the gradients of this step, as the optimizer receives them
        grads.append([p.grad.clone() for p in run.raw_model.parameters()])
        return step(*a, **k)
    run.optimizer.step = spy_step
    losses = [ts.train_step(run)[1] for _ in range(n)]
    return losses, grads, run


def check_compiled_equals_eager(objective: str, tmp_path, device: str = "cpu", **extra) -> ts.SudokuRun:
    torch._dynamo.reset()
    counters.clear()
    eager_losses, eager_grads, eager = run_steps(objective, False, tmp_path, device=device, **extra)
    with torch._dynamo.config.patch(error_on_recompile=True):  # a second compile raises
        losses, grads, run = run_steps(objective, True, tmp_path, device=device, **extra)
    assert counters["stats"]["unique_graphs"] == 1  # the whole loss region, once
    assert not counters["graph_break"]
    for step in range(3):
        # inductor reorders fp32 reductions: agreement to ~1e-6, far below any real difference
        torch.testing.assert_close(losses[step], eager_losses[step], rtol=1e-5, atol=1e-5)
        for g, g_eager in zip(grads[step], eager_grads[step]):
            torch.testing.assert_close(g, g_eager, rtol=1e-4, atol=1e-6)
    if run.buffer is not None:  # the buffer updates made inside the graph are kept, exactly as eagerly
        assert torch.equal(run.buffer.z, eager.buffer.z) and torch.equal(run.buffer.x0, eager.buffer.x0)
    return run


def test_compiled_relay_step_is_one_graph_and_matches_eager(tmp_path, device):
    """compile=True compiles refill + the K = 2 relay rollout + its loss as ONE fullgraph region that
    runs 3 steps with 6 different thresholds without recompiling, with the eager step's loss and
    gradients (to 1e-5 / 1e-4 relative); a bad target is still an error inside the graph.

    Catches (each tried, each fails here): the threshold drawn with .item() inside the region (a policy
    drawing its own threshold per call: a graph break, an error under fullgraph); the per-step target check
    `bool((...).any())` of relay._check_tokens put back (a data-dependent branch: graph break); the
    taus passed as Python floats (a recompile at the next step: error_on_recompile); the buffer's z
    and h written in place (copy_) at the end of rollout_loss, the rollout working on clones (eagerly
    right; compiled, the backward read the rewritten state: relay LayerNorm gradients off by 5%)."""
    taus = relay.draw_taus(6, 0.15, 0.3, torch.Generator().manual_seed(1))
    assert len(set(taus.tolist())) == 6  # the loop's first 3 steps draw these: all different
    run = check_compiled_equals_eager("relay", tmp_path, str(device))
    if device.type == "cuda":  # a further compiled step makes no host sync (an error in this mode if it did)
        torch.cuda.set_sync_debug_mode("error")
        try:
            ts.train_step(run)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return  # on CUDA the bad-target assert below would end the process's CUDA context
    x0, maskable = torch.full((16, 81), 9, dtype=torch.uint8), torch.ones(16, 81, dtype=torch.bool)
    x0[3, 5] = MASK  # a target of [MASK] at a cell to fill: the same graph asserts (RuntimeError on the CPU)
    with pytest.raises(RuntimeError, match="holds mask_id"):
        run.loss_fn(x0, maskable, taus[:2])


@pytest.mark.slow
@pytest.mark.parametrize("objective,extra", [("mlm", {}), ("rollout", {"buffer_init": "staggered"})])
def test_compiled_mlm_and_staggered_rollout_steps(tmp_path, objective, extra):
    """As above for the MLM step (masks drawn on the host) and a staggered buffer (start masks drawn on
    the host). Catches (tried, both fail): the MLM masks drawn inside the region (masked=None: another
    random stream, the losses differ); the staggered start drawn from a generator inside the region
    (dynamo cannot trace it: an error under fullgraph)."""
    check_compiled_equals_eager(objective, tmp_path, **extra)


def test_training_data_with_mask_targets_is_a_one_line_error(tmp_path):
    """The data is checked once at load (the per-step check is then sync-free on GPUs). Catches: the
    load-time check removed (the run would start and fail later, or on CUDA with a device assert);
    tried, fails."""
    data = random_boards()
    data.answer[7, np.flatnonzero(data.question[7] == MASK)[0]] = MASK
    cfg = ts.TrainConfig(objective="relay", out_dir=str(tmp_path / "bad"), **TINY)
    with pytest.raises(SystemExit, match="answer row 7 holds \\[MASK\\]") as e:
        ts.setup(cfg, data)
    assert "\n" not in str(e.value)


def drawing_policy(gen: torch.Generator, tau: float = 0.15, sigma: float = 0.5):
    """The reference, written here by hand: a policy that draws its own threshold at each call,
    max(0, tau + sigma * eps) with one scalar draw from gen, as eager code would."""
    def policy(logits, candidates):
        eps = torch.randn((), generator=gen).item()
        return relay.confidence_unmask(logits, candidates, max(0.0, tau + sigma * eps))
    return policy


def rollout_run(model, x0, maskable, host_drawn: bool) -> tuple[list, torch.Tensor]:
    """Three K = 3 relay windows on a staggered buffer, with the noise drawn as eager code draws it
    (inside drawing_policy and refill) or on the host beforehand; returns the outputs and the
    generator's final state."""
    gen = torch.Generator().manual_seed(3)
    ones = torch.ones(8, 81, dtype=torch.bool)

    def refill(buf, x0, maskable):
        if host_drawn:
            buf.refill(x0, maskable, start_masked=relay.mlm_masking(maskable=ones, generator=gen))
        else:
            buf.refill(x0, maskable, gen)

    buf = relay.RolloutBuffer(8, MASK, init="staggered")
    if host_drawn:
        buf.allocate(81, state_dim=16)
    refill(buf, x0, maskable)
    if not host_drawn:
        buf.h = torch.zeros(8, 81, 16)
    outs = []
    for _ in range(3):
        if host_drawn:
            policy = [partial(relay.confidence_unmask, tau=t) for t in relay.draw_taus(3, 0.15, 0.5, gen)]
        else:
            policy = drawing_policy(gen)
        with torch.no_grad():
            out = relay.rollout_loss(model, **buf.inputs(), K=3, variant="relay", policy=policy)
        buf.update(out)
        refill(buf, x0.flip(0), maskable.flip(0))
        outs += [out.loss, out.z, out.h, buf.z]
    return outs, gen.get_state()


def test_host_drawn_noise_equals_the_eager_draws():
    """The pieces a compiled step uses give exactly the eager results, from the same generator state:
    draw_taus(K) + one policy per step == a policy drawing per call (loss, tokens, h and the
    generator's state after), refill(start_masked=) == the staggered draw inside refill, and
    allocate() + refill == the first refill of an empty buffer. A policy list of the wrong length is an
    error; draw_taus equals tau = max(0, 0.15 + 0.5 eps) computed by hand. Catches (tried, each fails):
    draw_taus without the clamp at 0; the per-step policies applied in reverse order; allocate() leaving
    its slots unfinished (z all [MASK], maskable all True: the first refill then takes no row)."""
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(n_layer=1, n_head=2, n_embd=16, d_ff=32, dropout=0.0, relay=True)).eval()
    with torch.no_grad():
        model.head.weight.mul_(8.0)  # confident predictions: tau decides how many cells a step commits
    g = torch.Generator().manual_seed(0)
    x0 = torch.randint(8, 17, (8, 81), generator=g)
    maskable = torch.rand(8, 81, generator=g) < 0.6
    eager, eager_gen = rollout_run(model, x0, maskable, host_drawn=False)
    host, host_gen = rollout_run(model, x0, maskable, host_drawn=True)
    assert all(torch.equal(a, b) for a, b in zip(eager, host)) and torch.equal(eager_gen, host_gen)
    g = torch.Generator().manual_seed(5)
    by_hand = [max(0.0, 0.15 + 0.5 * torch.randn((), generator=g).item()) for _ in range(20)]
    taus = relay.draw_taus(20, 0.15, 0.5, torch.Generator().manual_seed(5))
    assert taus.tolist() == by_hand and min(by_hand) == 0.0  # clamped at 0, as the paper's code
    buf = relay.RolloutBuffer(8, MASK)
    buf.allocate(81, state_dim=16)
    assert buf.finished().all() and torch.equal(buf.h, torch.zeros(8, 81, 16))
    buf.refill(x0, maskable)  # every slot takes its row, all of its cells to fill masked (cold start)
    assert torch.equal(buf.x0, x0) and torch.equal(buf.z, torch.where(maskable, MASK, x0))
    with pytest.raises(ValueError, match="2 policies for K=3"):
        relay.rollout_loss(model, **buf.inputs(), K=3, policy=[drawing_policy(g)] * 2)
