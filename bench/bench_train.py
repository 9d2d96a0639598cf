"""Training-step cost of the four objectives, measured in one run, as a table.

    python bench/bench_train.py                                                   # paper model, batch 512, auto device
    python bench/bench_train.py --device=cuda --compile=True                      # GPU: bf16 autocast + compile
    python bench/bench_train.py --device=cpu --dtype=bfloat16 --batch_size=64     # CPU
    python bench/bench_train.py --n_embd=128 --n_head=4 --d_ff=512 --batch_size=128 --dtype=bfloat16  # CPU preset

A step is what train_sudoku.py does per optimizer step: the loss (MLM: one forward; rollout
objectives: K forwards through the rollout buffer), backward, clip, AdamW, EMA update. The data
is synthetic (random boards): step cost does not depend on the digits. The last column projects
max_iters steps at the measured speed.
"""
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import ConfigError, load_config  # noqa: E402
from model import ModelConfig, SudokuTransformer  # noqa: E402
from relay import RolloutBuffer, mlm_loss, rollout_loss, threshold_policy  # noqa: E402
from sudoku import MASK  # noqa: E402
from train_sudoku import EMA, optimizer_groups, pick_device  # noqa: E402


@dataclass
class BenchConfig:
    objectives: str = "mlm,rollout,relay_sg,relay"
    device: str = "auto"
    dtype: str = "auto"  # auto: bf16 autocast on CUDA, fp32 elsewhere | bfloat16 | float32
    compile: bool = False
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
    seed: int = 0


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def bench(cfg: BenchConfig, objective: str, device: str, amp) -> float:
    """Seconds per optimizer step for one objective."""
    torch.manual_seed(cfg.seed)
    relay = objective in ("relay_sg", "relay")
    raw = SudokuTransformer(ModelConfig(cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.d_ff, cfg.dropout, relay=relay)).to(device)
    model = torch.compile(raw) if cfg.compile else raw
    opt = torch.optim.AdamW(optimizer_groups(raw, 0.01), lr=5e-4, fused=device.startswith("cuda"))
    ema = EMA(raw, 0.9999)
    B = cfg.batch_size
    x0 = torch.randint(8, 17, (B, 81), device=device)
    maskable = torch.rand(B, 81, device=device) > 0.3
    buffer = RolloutBuffer(B, MASK)
    policy = threshold_policy(0.15, 0.1)

    def step_fn(z, h):
        with amp:
            return model(z, h)

    def one_step() -> None:
        if objective == "mlm":
            loss = mlm_loss(step_fn, x0, maskable=maskable, mask_id=MASK)
        else:
            buffer.refill(x0, maskable)
            if relay and buffer.h is None:
                buffer.h = torch.zeros(B, 81, cfg.n_embd, device=device)
            loss = rollout_loss(step_fn, buffer, K=cfg.K, variant=objective, policy=policy).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(raw.parameters(), 0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema.update(raw)

    for _ in range(cfg.warmup):
        one_step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(cfg.steps):
        one_step()
    sync(device)
    return (time.perf_counter() - t0) / cfg.steps


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = load_config(BenchConfig, argv)
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    objectives = cfg.objectives.split(",")
    bad = [o for o in objectives if o not in ("mlm", "rollout", "relay_sg", "relay")]
    if bad:
        raise SystemExit(f"unknown objective(s) {bad}; choose from mlm, rollout, relay_sg, relay")
    device = pick_device(cfg.device)
    device_type = device.split(":")[0]
    bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device_type == "cuda")
    amp = torch.autocast(device_type, dtype=torch.bfloat16) if bf16 else nullcontext()
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{device}, {torch.get_num_threads()} threads"
    print(f"device: {name} | torch {torch.__version__} | {'bf16 autocast' if bf16 else 'fp32'} | "
          f"compile={cfg.compile} | batch {cfg.batch_size} | d={cfg.n_embd} L={cfg.n_layer} ffn={cfg.d_ff} | "
          f"K={cfg.K} | {cfg.steps} timed steps after {cfg.warmup} warm-up")
    times = {o: bench(cfg, o, device, amp) for o in objectives}
    base = times.get("mlm")
    print(f"\n| objective | ms/step | puzzles/s | vs MLM | {cfg.max_iters:,} steps |")
    print("|---|---|---|---|---|")
    for o, t in times.items():
        ratio = f"{t / base:.2f}x" if base else "-"
        print(f"| {o} | {1000 * t:.1f} | {cfg.batch_size / t:,.0f} | {ratio} | {t * cfg.max_iters / 3600:.2f} h |")


if __name__ == "__main__":
    main()
