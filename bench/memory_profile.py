"""Memory of one training micro-step, vanilla SFT vs Relay (paper Fig. 3 / App. "memory profiling").

    python bench/memory_profile.py                                   # 1.5B, T=2048, batch 2, one CUDA GPU
    python bench/memory_profile.py --init_from=random-1.5b           # same shapes, random weights, no download
    python bench/memory_profile.py --init_from=tiny --seq_len=256    # CPU smoke run (see below)

Protocol as in the paper: one micro-step (gradient accumulation 1), the optimizer step replaced by
a no-op (no optimizer state is ever allocated), gradient checkpointing on, eager attention
kernels (SDPA with a dense mask; no torch.compile, no FlashAttention-2). Every decoder layer gets
a forward hook and, through its output tensor, a backward hook; each hook logs live memory
(torch.cuda.memory_allocated) and the within-step high-water mark (max_memory_allocated, reset once
at the start of the step). Phases: fwd (the only forward of SFT; forward 1 of Relay), fwd2 (Relay's
second forward), bwd (backward, including checkpoint recomputation).

Differences from the paper's setup, so compare shapes rather than absolute GiB:
  - one process without ZeRO-3 (the paper: 2 GPUs, ZeRO-3 shards weights and gradients), so the
    whole bf16 model and its gradients are resident;
  - our losses upcast only the supervised rows of the logits to fp32 (the paper's HF loss upcast the
    whole B x T x V tensor), so the lm_head backward spike is smaller than the paper's 4.6 / 2.3 GiB.
On CPU there is no allocator statistic: the script then logs the process's resident memory (RSS,
/proc/self/statm) and its peak (ru_maxrss). Those include the Python runtime and memory the
allocator keeps after a free, and ru_maxrss never resets, so CPU numbers only show the event
order and coarse growth, not the paper's quantities. Prints a table; writes a PNG and a CSV.
"""
import csv
import os
import resource
import sys
from dataclasses import dataclass
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from configurator import ConfigError, load_config
from fastdllm.model import FAST_DLLM_V2_1_5B, HUB_ID, load_fastdllm, make_tiny_fastdllm
from relay import RolloutBuffer, block_confidence_unmask, rollout_loss
from train_fastdllm import make_step_fn, sft_loss


@dataclass
class Config:
    init_from: str = HUB_ID  # checkpoint dir, hub id, "random-1.5b" (the 1.5B shapes, random weights) or "tiny"
    allow_unverified: bool = False  # load a checkpoint dir without manifest.json (else refused): its files go unchecked
    pin: str = ""  # a pin file (python -m fastdllm.model --pin=...): a hub snapshot's files must have its sha256
    regimes: str = "sft,relay"  # comma-separated objectives to profile (sft, rollout, relay_sg, relay)
    seq_len: int = 2048
    batch_size: int = 2
    response_frac: float = 0.75  # share of each sequence that is response (maskable) tokens
    device: str = "auto"
    dtype: str = "bfloat16"
    gradient_checkpointing: bool = True
    seed: int = 0
    out: str = "bench/memory_profile"  # writes <out>.png and <out>.csv


MiB = 2 ** 20


class Recorder:
    """Hooks on every decoder layer; records (phase, event, live, peak) in bytes."""

    def __init__(self, model, device: str):
        self.cuda = device.startswith("cuda")
        self.phase, self.events, self.handles = "fwd", [], []
        for i, layer in enumerate(model.model.layers):
            self.handles.append(layer.register_forward_hook(partial(self._fwd, i)))

    def measure(self) -> tuple[float, float]:
        if self.cuda:
            return torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def log(self, name: str) -> None:
        live, peak = self.measure()
        self.events.append((self.phase, name, live, peak))

    def _fwd(self, i, module, inputs, output):
        out = output[0] if isinstance(output, tuple) else output
        self.log(f"layer{i}_fwd")
        if out.requires_grad and self.phase != "bwd":  # recomputation under checkpointing is part of bwd
            out.register_hook(lambda g: self.log(f"layer{i}_bwd"))

    def remove(self):
        for h in self.handles:
            h.remove()


def profile(cfg: Config, model, regime: str, device: str) -> list[tuple]:
    g = torch.Generator().manual_seed(cfg.seed)
    B, L, bd = cfg.batch_size, cfg.seq_len, model.config.bd_size
    x0 = torch.randint(0, min(model.config.vocab_size, model.mask_token_id), (B, L), generator=g).to(device)  # no MASK in x0
    maskable = torch.zeros(B, L, dtype=torch.bool, device=device)
    maskable[:, int(L * (1 - cfg.response_frac)):] = True
    model.zero_grad(set_to_none=True)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    rec = Recorder(model, device)
    rec.log("start")
    if regime == "sft":
        loss = sft_loss(model, x0, maskable, bd, model.mask_token_id, g) / maskable.sum()
    else:
        buf = RolloutBuffer(B, mask_id=model.mask_token_id)
        buf.refill(x0, maskable)
        inner = make_step_fn(model, buf, bd, model.config.hidden_size, use_relay=regime != "rollout")
        calls = []

        def step_fn(z, h):
            rec.phase = "fwd" if not calls else "fwd2"
            calls.append(1)
            return inner(z, h)
        policy = partial(block_confidence_unmask, threshold=0.85, block_size=bd)
        loss = rollout_loss(step_fn, **buf.inputs(), K=2, variant=regime, policy=policy).loss
    rec.log(f"{rec.phase}_end")
    rec.phase = "bwd"
    loss.backward()
    rec.log("bwd_end")
    # the optimizer step is a no-op: nothing to do
    rec.remove()
    model.zero_grad(set_to_none=True)
    return rec.events


def main(argv: list[str] | None = None) -> dict:
    try:
        cfg = load_config(Config, argv)
    except ConfigError as e:
        raise SystemExit(f"memory_profile.py: {e}")
    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    regimes = cfg.regimes.split(",")
    if not set(regimes) <= {"sft", "rollout", "relay_sg", "relay"}:
        raise SystemExit(f"memory_profile.py: regimes must be among sft, rollout, relay_sg, relay; got {cfg.regimes!r}")
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(cfg.dtype)
    if dtype is None:
        raise SystemExit(f"memory_profile.py: dtype must be bfloat16 or float32, got {cfg.dtype!r}")
    what = "CUDA allocator (memory_allocated / max_memory_allocated)" if device.startswith("cuda") else \
        "CPU process RSS / ru_maxrss: NOT the paper's quantities (see the module docstring)"
    print(f"device {device}, measuring {what}")
    traces = {}
    for regime in regimes:
        try:
            relay = regime in ("relay", "relay_sg")
            if cfg.init_from == "tiny":
                model = make_tiny_fastdllm(use_relay=relay, seed=cfg.seed, bd_size=min(32, cfg.seq_len)).to(dtype)
            elif cfg.init_from == "random-1.5b":
                with torch.device(device):  # initialise on the GPU: 1.5B random weights on CPU take minutes
                    model = make_tiny_fastdllm(use_relay=relay, seed=cfg.seed, **FAST_DLLM_V2_1_5B).to(dtype)
            else:
                model, _ = load_fastdllm(cfg.init_from, use_relay=relay, dtype=dtype,
                                         allow_unverified=cfg.allow_unverified, pin=cfg.pin or None)
        except ValueError as e:
            raise SystemExit(f"memory_profile.py: {e}")
        if cfg.seq_len % model.config.bd_size:
            raise SystemExit(f"memory_profile.py: seq_len must be a multiple of the block size {model.config.bd_size}")
        model.to(device).train()
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        traces[regime] = profile(cfg, model, regime, device)
        del model
    print("\n| regime | events | peak MiB | live MiB at fwd_end | at fwd2_end | at bwd_end |\n|---|---|---|---|---|---|")
    for regime, ev in traces.items():
        live = {name: l for _, name, l, _ in ev}
        peak = max(p for *_, p in ev)
        f = lambda k: f"{live[k] / MiB:.0f}" if k in live else "-"
        print(f"| {regime} | {len(ev)} | {peak / MiB:.0f} | {f('fwd_end')} | {f('fwd2_end')} | {f('bwd_end')} |")
    os.makedirs(os.path.dirname(cfg.out) or ".", exist_ok=True)
    with open(cfg.out + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["regime", "index", "phase", "event", "live_bytes", "peak_bytes", "device"])
        for regime, ev in traces.items():
            for i, (phase, name, live, peak) in enumerate(ev):
                w.writerow([regime, i, phase, name, int(live), int(peak), device])
    plot(traces, cfg.out + ".png", device)
    print(f"wrote {cfg.out}.csv and {cfg.out}.png")
    return traces


def plot(traces: dict, path: str, device: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (regime, ev), color in zip(traces.items(), ("tab:blue", "tab:red", "tab:green", "tab:purple")):
        live = [e[2] / 2 ** 30 for e in ev]
        peak = [e[3] / 2 ** 30 for e in ev]
        running = [max(peak[: i + 1]) for i in range(len(peak))]
        ax.plot(live, color=color, label=f"{regime} live")
        ax.plot(running, color=color, linestyle="--", label=f"{regime} high-water mark")
        for phase in ("fwd", "fwd2", "bwd"):
            idx = [i for i, e in enumerate(ev) if e[0] == phase]
            if idx:
                ax.annotate(phase, (idx[len(idx) // 2], running[idx[len(idx) // 2]]), color=color, fontsize=8,
                            textcoords="offset points", xytext=(0, 4))
    ax.set_xlabel("hook event (not comparable across regimes)")
    ax.set_ylabel("GiB" + ("" if device.startswith("cuda") else " (CPU RSS)"))
    ax.set_title("memory during one training micro-step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
