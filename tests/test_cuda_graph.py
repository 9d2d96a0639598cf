"""sudoku/cuda_graph.py on the CPU: the graphed step's body, run eagerly (what a CUDA graph would replay),
against train_sudoku's own step, for MLM and the rollout objectives: the same losses, weights and EMA
within float tolerance, and the rollout buffer's state kept in the same storage every step (what makes a
replay see the state the previous step left). The capture itself needs a GPU: scripts/gpu/gpu_check.py."""
import pytest
import torch

import train_sudoku as ts
from configurator import load_config
from helpers import TINY, TRAIN, VAL
from sudoku.cuda_graph import BUFFER_STATE, GraphedStep

STEPS = 6


def run_steps(tmp_path, objective: str, graphed: bool, extra=()) -> tuple[list[float], ts.SudokuRun, list]:
    cfg = load_config(ts.TrainConfig, TINY + [f"--out_dir={tmp_path}", f"--objective={objective}", "--eval_interval=0",
                                              "--dropout=0.0", "--grad_clip=0.05", *extra])
    run = ts.setup(cfg, TRAIN, VAL)
    if graphed:
        run.graphed = GraphedStep(run, capture=False)
    losses, storage = [], []
    for _ in range(STEPS):
        _, loss, _ = ts.train_step(run)
        losses.append(loss.item())
        if run.buffer is not None:
            storage.append({k: getattr(run.buffer, k).data_ptr() for k in BUFFER_STATE
                            if getattr(run.buffer, k) is not None})
    return losses, run, storage


@pytest.mark.parametrize("objective,extra", [("mlm", ()), ("relay", ()), ("rollout", ("--buffer_init=staggered",))])
def test_graphed_body_matches_the_eager_step(tmp_path, objective, extra):
    """Bugs checked: the buffer's new state not copied back (the storage changed, and a replay would roll
    out the first window again), the EMA's decay frozen at its first value (the shadow weights differ)."""
    plain, a, _ = run_steps(tmp_path / "a", objective, False, extra)
    graphed, b, storage = run_steps(tmp_path / "b", objective, True, extra)
    assert graphed == pytest.approx(plain, rel=1e-5, abs=1e-6)
    for (name, p), q in zip(a.raw_model.named_parameters(), b.raw_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=name)
    for name, shadow in a.ema.shadow.items():
        torch.testing.assert_close(shadow, b.ema.shadow[name], rtol=1e-4, atol=1e-6, msg=name)
    b.graphed.before_host_reads()
    assert b.ema.num_updates == a.ema.num_updates == STEPS
    if objective != "mlm":
        assert all(s == storage[0] for s in storage)  # every step's state in the storage the graph reads
        assert torch.equal(a.buffer.z, b.buffer.z)


def test_cuda_graph_needs_a_cuda_device():
    with pytest.raises(ts.ConfigError, match="cuda_graph=True needs a CUDA device"):
        ts.check_config(load_config(ts.TrainConfig, ["--cuda_graph=True", "--device=cpu"]))
