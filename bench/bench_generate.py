"""Speed of Fast-dLLM v2 block-diffusion decoding: KV caches and the relay carry, as a table.

    python bench/bench_generate.py                                            # tiny random model, CPU
    python bench/bench_generate.py --shape=1.5b --device=cuda --batch_size=32 # 1.5B shape, random bf16 weights

Each row decodes the same random prompts (random weights: the text is noise, the cost is real; no row
stops early, so every row generates max_new_tokens). Columns:
  tok/s       generated tokens per second (wall clock, after one warm-up run)
  NFE         mean denoising forwards per prompt (prefill and cache-update forwards not counted)
  ms/fwd      wall time of the run / its denoising forwards (prefill and cache updates included in the time)
  vs uncached speed-up over full recomputation with the same carry setting
  same        fraction of generated tokens equal to the uncached run's (1.000 = identical outputs)
With relay carry, "same" can drop below 1 in float32 although the caches are exact: the carry makes
each forward depend on the previous one's hidden state, and this random model (initializer_range 0.5,
relay gain ~N(0, 0.5)) amplifies a last-bit difference between the cached and uncached attention by
~10x per forward until a token flips (measured: 2e-5 -> 1e-2 in four forwards). Without carry there is
no recurrence, so rounding never compounds. --dtype=float64 shows every row at 1.000 except the
sub-block cache, which is approximate by design (docs/fastdllm.md).
The targets: prefix cache >= 3x faster than uncached at equal outputs (bf16, batch 32, on a GPU with the
CUDA graph rows: fastdllm/graphs.py); relay carry <= 5% extra per forward (compare ms/fwd of "+ relay
carry" rows with the rows above them). The CUDA graph rows run on CUDA only; each timed run captures its
graphs anew (one per power-of-two row count it reaches), so the capture is part of their time.
"""
import os
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import ConfigError, load_config, print_config  # noqa: E402
from common import pick_device  # noqa: E402
from fastdllm.generate import generate  # noqa: E402
from fastdllm.model import FAST_DLLM_V2_1_5B, FastDLLM, make_tiny_fastdllm  # noqa: E402


@dataclass
class BenchConfig:
    shape: str = "tiny"  # tiny (2 layers, d 64) | 1.5b (Fast_dLLM_v2_1.5B: 28 layers, d 1536, vocab 151936)
    device: str = "auto"
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU; float64 checks that the cached outputs are exact
    batch_size: int = 4
    prompt_len: int = 100
    max_new_tokens: int = 128
    threshold: float = 0.85
    sub_block_size: int = 8
    repeats: int = 1  # timed runs per variant (the best is kept)
    seed: int = 0


VARIANTS = [  # name, prefix_cache, sub_block_cache, relay_carry, cuda_graph (rows with a CUDA graph: CUDA only)
    ("uncached", False, False, False, False),
    ("prefix cache", True, False, False, False),
    ("prefix cache + CUDA graph", True, False, False, True),
    ("prefix + sub-block cache", True, True, False, False),
    ("uncached + relay carry", False, False, True, False),
    ("prefix cache + relay carry", True, False, True, False),
    ("prefix cache + relay carry + CUDA graph", True, False, True, True),
    ("prefix + sub-block + relay carry", True, True, True, False),
]


def build(cfg: BenchConfig, device: str, dtype: torch.dtype) -> FastDLLM:
    if cfg.shape == "tiny":
        model = make_tiny_fastdllm(use_relay=True, seed=cfg.seed, initializer_range=0.5)
    elif cfg.shape == "1.5b":
        with torch.device(device):  # initialise on the device: 1.5B parameters in fp32 on CPU would take minutes
            model = make_tiny_fastdllm(use_relay=True, seed=cfg.seed, **FAST_DLLM_V2_1_5B)
    else:
        raise SystemExit(f"--shape must be tiny or 1.5b, got '{cfg.shape}'")
    with torch.no_grad():  # a non-zero relay, as after training (a zero one would cost the same anyway)
        model.relay_layer_norm.weight.normal_(0, 0.5)
    return model.to(device=device, dtype=dtype).eval()


def main(argv: list[str] | None = None) -> list[dict]:
    try:
        cfg = load_config(BenchConfig, argv)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}")
    device = pick_device(cfg.device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device=cuda but no GPU is visible; use --device=cpu")
    dtype = {"auto": torch.bfloat16 if device.startswith("cuda") else torch.float32,
             "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}.get(cfg.dtype)
    if dtype is None:
        raise SystemExit(f"--dtype must be auto, bfloat16, float32 or float64, got '{cfg.dtype}'")
    print_config(cfg)
    model = build(cfg, device, dtype)
    g = torch.Generator().manual_seed(cfg.seed)
    vocab = min(model.config.vocab_size, model.config.mask_token_id)  # ids below the mask id
    prompts = [torch.randint(0, vocab, (cfg.prompt_len,), generator=g).tolist() for _ in range(cfg.batch_size)]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def run(prefix, sub, carry, graph):
        return generate(model, prompts, max_new_tokens=cfg.max_new_tokens, threshold=cfg.threshold,
                        sub_block_size=cfg.sub_block_size, stop_token_id=-1, prefix_cache=prefix,
                        sub_block_cache=sub, relay_carry=carry, decode="batch_invariant",  # per-row max_new_tokens
                        cuda_graph=graph)

    run(True, False, True, False)  # warm-up (allocator, kernels)
    variants = [v for v in VARIANTS if device.startswith("cuda") or not v[4]]
    rows, ref = [], {}
    for name, prefix, sub, carry, graph in variants:
        best = float("inf")
        for _ in range(cfg.repeats):
            sync()
            t0 = time.perf_counter()
            out = run(prefix, sub, carry, graph)  # a graphed run captures its graphs anew: capture is timed
            sync()
            best = min(best, time.perf_counter() - t0)
        if not prefix:
            ref[carry] = (out, best)
        base, base_t = ref[carry]
        n_tok = sum(len(t) for t in out.tokens)
        same = sum(a == b for ta, tb in zip(out.tokens, base.tokens) for a, b in zip(ta, tb)) / max(n_tok, 1)
        rows.append(dict(variant=name, tok_s=n_tok / best, nfe=out.mean_nfe, ms_fwd=1000 * best / out.forwards,
                         speedup=base_t / best, same=same, seconds=best))

    print(f"\n{cfg.shape} model, {device} {str(dtype).removeprefix('torch.')}, batch {cfg.batch_size}, prompt "
          f"{cfg.prompt_len}, {cfg.max_new_tokens} new tokens, threshold {cfg.threshold}")
    print("\n| variant | tok/s | NFE | ms/fwd | vs uncached | same |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['tok_s']:.1f} | {r['nfe']:.1f} | {r['ms_fwd']:.2f} | {r['speedup']:.2f}x | {r['same']:.3f} |")
    if len(variants) < len(VARIANTS):
        print("(the CUDA graph rows need a CUDA device)")
    by = {r["variant"]: r for r in rows}
    for a, b in (("prefix cache", "prefix cache + relay carry"), ("uncached", "uncached + relay carry"),
                 ("prefix cache + CUDA graph", "prefix cache + relay carry + CUDA graph")):
        if a in by and b in by:
            print(f"relay carry cost per forward ({a}): {100 * (by[b]['ms_fwd'] / by[a]['ms_fwd'] - 1):+.1f}%")
    return rows


if __name__ == "__main__":
    main()
