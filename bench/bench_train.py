"""Training-step speed of the four objectives: train_sudoku.py's own step, timed, as Markdown on stdout.

    python bench/bench_train.py                                              # paper model, batch 512, auto device
    python bench/bench_train.py --device=cuda --compile=True                 # GPU: bf16 autocast, step compiled as one graph
    python bench/bench_train.py --device=cuda --compile=True --profile=True  # + the top 15 GPU kernels per objective
    python bench/bench_train.py --device=cpu --n_embd=64 --n_head=4 --n_layer=2 --batch_size=16 --steps=3 --warmup=1

A step is train_sudoku.train_step on a SudokuRun that train_sudoku.setup builds, exactly what training runs
per optimizer step: the batch's host-to-device copy, the loss (MLM: one forward; rollout objectives:
buffer refill and K forwards), backward, clip, AdamW, EMA. The data is synthetic (random digit boards
with 60% blanks, validation off): the step's cost does not depend on the digits. Columns:
  ms/step, steps/s   mean over the timed steps (after the warm-up steps, which include compilation)
  vs MLM             ms/step over MLM's
  step               eager, compiled, CUDA graph or compiled+CUDA graph
  TFLOP/s            step_flops / step time: the model's matmuls and attention (see flops_per_step)
  MFU                TFLOP/s over the GPU's dense bf16 peak (PEAK_TFLOPS by name, or --peak_tflops; '-' else)
  peak mem           torch.cuda.max_memory_allocated over the objective's steps ('-' off CUDA)
  graphs             torch.compile graphs built for the objective (1 = one graph, never recompiled)
  syncs/step         host syncs in one extra step under torch.cuda.set_sync_debug_mode ('-' off CUDA)
                     (expected 0: the step copies its batch pinned and non-blocking and reads nothing back)
  <max_iters> steps  the run time projected at this speed
Everything else (setup's own printout) goes to stderr, so stdout is the report.
"""
import contextlib
import os
import sys
import tempfile
import time
import types
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch._dynamo.utils import counters

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train_sudoku as ts  # noqa: E402
from configurator import ConfigError, load_config  # noqa: E402
from common import uses_bf16  # noqa: E402
from sudoku.board import MASK  # noqa: E402

L, VOCAB = 81, 17  # Sudoku: 81 cells, 17 token ids
# dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' data sheets, for the MFU column
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}


def peak_tflops(cfg: "BenchConfig", device_name: str) -> float | None:
    """--peak_tflops, else the data-sheet peak of a GPU this table knows by name, else None (no MFU)."""
    if cfg.peak_tflops > 0:
        return cfg.peak_tflops
    return next((v for k, v in PEAK_TFLOPS.items() if k in device_name), None)


@dataclass
class BenchConfig:
    objectives: str = "mlm,rollout,relay_sg,relay"
    device: str = "auto"
    dtype: str = "auto"  # auto: bf16 autocast on CUDA, fp32 elsewhere | bfloat16 | float32
    compile: bool = False  # train_sudoku's compile=True: the step's loss region as one graph
    cuda_graph: bool = False  # train_sudoku's cuda_graph=True: the whole step replayed as one CUDA graph
    peak_tflops: float = 0.0  # the device's dense bf16 peak for the MFU column; 0 = known GPUs by name (PEAK_TFLOPS)
    batch_size: int = 512
    n_layer: int = 4
    n_head: int = 6
    n_embd: int = 384
    d_ff: int = 1536
    dropout: float = 0.1
    K: int = 2
    warmup: int = 5  # untimed steps (compile, allocator, caches)
    steps: int = 20  # timed steps per objective
    max_iters: int = 300_000  # for the projected run time
    profile: bool = False  # torch.profiler over profile_steps more steps: the top 15 per objective
    profile_steps: int = 3
    seed: int = 0


def flops_per_step(n_layer: int, n_embd: int, d_ff: int, batch_size: int, forwards: int,
                   length: int = L, vocab: int = VOCAB) -> float:
    """Matmul FLOPs of one training step (2 per multiply-add). Per token and forward, each layer has
    the QKV projection 2*3d^2, the output projection 2*d^2, the FFN 2*2*d*d_ff and attention
    2*2*length*d (scores QK^T and the weighted sum of V); the head adds 2*d*vocab. Backward costs twice
    the forward (gradients of inputs and of weights), so a step is 3x its forwards: 1 for MLM, K for
    the rollout objectives (one backward through all K). Embedding, norms, softmax and the optimizer
    are left out, as is usual for model FLOPs."""
    d = n_embd
    per_token = n_layer * (2 * 3 * d * d + 2 * d * d + 2 * 2 * d * d_ff + 2 * 2 * length * d) + 2 * d * vocab
    return 3.0 * forwards * batch_size * length * per_token


def step_flops(cfg: BenchConfig, objective: str) -> float:
    return flops_per_step(cfg.n_layer, cfg.n_embd, cfg.d_ff, cfg.batch_size, 1 if objective == "mlm" else cfg.K)


def synthetic_boards(n: int, seed: int) -> types.SimpleNamespace:
    rng = np.random.default_rng(seed)
    answer = rng.integers(8, 17, size=(n, L)).astype(np.uint8)  # digit tokens
    question = np.where(rng.random((n, L)) < 0.6, MASK, answer).astype(np.uint8)
    return types.SimpleNamespace(question=question, answer=answer)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def train_config(cfg: BenchConfig, objective: str) -> ts.TrainConfig:
    """train_sudoku's config for this objective (out_dir is never written: no checkpoint, no log)."""
    tcfg = ts.TrainConfig(objective=objective, device=cfg.device, dtype=cfg.dtype, compile=cfg.compile,
                          cuda_graph=cfg.cuda_graph,
                          batch_size=cfg.batch_size, n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                          d_ff=cfg.d_ff, dropout=cfg.dropout, K=cfg.K, seed=cfg.seed, eval_puzzles=0,
                          out_dir=os.path.join(tempfile.gettempdir(), "bench_train_unused"))
    try:
        ts.check_config(tcfg)
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    return tcfg


def make_run(cfg: BenchConfig, objective: str) -> ts.SudokuRun:
    """train_sudoku's SudokuRun for this objective on synthetic data (its printout goes to stderr)."""
    with contextlib.redirect_stdout(sys.stderr):
        return ts.setup(train_config(cfg, objective), synthetic_boards(max(4 * cfg.batch_size, 64), cfg.seed))


SYNC_EVENT = "called a synchronizing CUDA operation"  # torch's warning for each sync in debug mode


def sync_events(messages: list[str]) -> int:
    """How many of the recorded warnings report a host sync. torch also warns once per process that the
    debug mode "is a prototype feature" (it says "Synchronization"): not a sync, and not counted."""
    return sum(SYNC_EVENT in m for m in messages)


def count_syncs(run: ts.SudokuRun) -> int:
    """Host syncs in one step, as torch.cuda's sync debug mode reports them (warnings). The mode is set
    before the warnings are recorded, so its own notice falls outside them (and sync_events skips it)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ts.train_step(run)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sync_events([str(w.message) for w in caught])


def bench(cfg: BenchConfig, objective: str) -> dict:
    """Time train_step for one objective; returns the row's numbers (and the run, for profiling)."""
    device = ts.pick_device(cfg.device)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    graphs_before = counters["stats"]["unique_graphs"]
    run = make_run(cfg, objective)
    run.model.train()
    for _ in range(cfg.warmup):
        ts.train_step(run)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(cfg.steps):
        ts.train_step(run)
    sync(device)
    seconds = (time.perf_counter() - t0) / cfg.steps
    return {"seconds": seconds, "run": run, "tflops": step_flops(cfg, objective) / seconds / 1e12,
            "peak": torch.cuda.max_memory_allocated(device) if cuda else None,
            "graphs": counters["stats"]["unique_graphs"] - graphs_before if cfg.compile else None,
            "syncs": count_syncs(run) if cuda else None}


def profile_table(run: ts.SudokuRun, steps: int) -> tuple[str, list[str]]:
    """Over `steps` steps: how busy the device was (its ops' self time against the wall clock of the
    profiled steps: far below 100% on a GPU means the host, launching or waiting, sets the pace), and
    Markdown rows of the top 15 by self time: on CUDA the GPU kernels and copies (named as launched:
    aten kernels eagerly, triton_* kernels when compiled), elsewhere the aten ops."""
    cuda = run.device.startswith("cuda")
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            ts.train_step(run)
        sync(run.device)
        wall_ms = 1000 * (time.perf_counter() - t0) / steps
    events = prof.key_averages()
    if cuda:  # the GPU's own events (kernels, copies): aten ops also carry their kernels' time, which would count twice
        events = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                  and not getattr(e, "is_user_annotation", False)]

    def self_us(e) -> float:
        return (getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)) if cuda \
            else e.self_cpu_time_total
    total = sum(self_us(e) for e in events) or 1.0
    what = "GPU" if cuda else "CPU"
    busy_ms = total / 1000 / steps
    busy = f"{what} ops busy {busy_ms:.1f} ms of each {wall_ms:.1f} ms profiled step ({100 * busy_ms / wall_ms:.0f}%)"
    rows = [f"| op | calls/step | self {what} ms/step | share of {what} time |", "|---|---|---|---|"]
    for e in sorted(events, key=self_us, reverse=True)[:15]:
        name = e.key.replace("|", "/")
        name = name if len(name) <= 80 else name[:77] + "..."
        rows.append(f"| `{name}` | {e.count / steps:g} | {self_us(e) / 1000 / steps:.3f} | {100 * self_us(e) / total:.1f}% |")
    return busy, rows


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = load_config(BenchConfig, argv)
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    objectives = cfg.objectives.split(",")
    bad = [o for o in objectives if o not in ts.OBJECTIVES]
    if bad:
        raise SystemExit(f"unknown objective(s) {bad}; choose from {', '.join(ts.OBJECTIVES)}")
    if cfg.steps < 1 or cfg.warmup < 0 or cfg.profile_steps < 1:
        raise SystemExit("need steps >= 1, warmup >= 0 and profile_steps >= 1")
    for o in objectives:
        train_config(cfg, o)  # every setting checked before any work: one line, no traceback
    device = ts.pick_device(cfg.device)
    device_type = device.split(":")[0]
    bf16 = uses_bf16(cfg.dtype, device_type)
    name = torch.cuda.get_device_name(device) if device_type == "cuda" else f"{device}, {torch.get_num_threads()} threads"
    cuda_version = f" | CUDA {torch.version.cuda}" if device_type == "cuda" else ""
    print(f"device: {name} | torch {torch.__version__}{cuda_version} | {'bf16 autocast' if bf16 else 'fp32'} | "
          f"compile={cfg.compile} | batch {cfg.batch_size} | d={cfg.n_embd} L={cfg.n_layer} ffn={cfg.d_ff} | "
          f"K={cfg.K} | {cfg.steps} timed steps after {cfg.warmup} warm-up")
    rows = {}
    for o in objectives:
        rows[o] = bench(cfg, o)
        if not cfg.profile:
            rows[o].pop("run")  # frees the model and its optimizer before the next objective
    base = rows["mlm"]["seconds"] if "mlm" in rows else None
    peak = peak_tflops(cfg, name) if device_type == "cuda" else None
    mode = "+".join(m for m, on in (("compiled", cfg.compile), ("CUDA graph", cfg.cuda_graph)) if on) or "eager"
    print(f"\n| objective | step | ms/step | steps/s | vs MLM | puzzles/s | TFLOP/s | MFU | peak mem | graphs | "
          f"syncs/step | {cfg.max_iters:,} steps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for o, r in rows.items():
        t = r["seconds"]
        ratio = f"{t / base:.2f}x" if base else "-"
        mem = f"{r['peak'] / 2**30:.2f} GiB" if r["peak"] is not None else "-"
        graphs = str(r["graphs"]) if r["graphs"] is not None else "-"
        syncs = str(r["syncs"]) if r["syncs"] is not None else "-"
        mfu = f"{100 * r['tflops'] / peak:.1f}%" if peak else "-"
        print(f"| {o} | {mode} | {1000 * t:.1f} | {1 / t:.1f} | {ratio} | {cfg.batch_size / t:,.0f} | {r['tflops']:.3g} | "
              f"{mfu} | {mem} | {graphs} | {syncs} | {t * cfg.max_iters / 3600:.2f} h |")
    if cfg.profile:
        for o, r in rows.items():
            busy, table = profile_table(r.pop("run"), cfg.profile_steps)
            print(f"\n### Profile: {o}\n\n{cfg.profile_steps} steps after the timed ones: {busy}; the top 15 by "
                  f"self {'GPU' if device_type == 'cuda' else 'CPU'} time\n")
            print("\n".join(table))


if __name__ == "__main__":
    main()
