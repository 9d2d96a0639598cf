"""Stage A of Table 2 in miniature: a small Qwen2 pretrained autoregressively on real code (the stand-in for
Qwen2.5; docs/table2_miniature.md).

    python -m fastdllm.mini_data --out_dir=data/mini                          # corpus, tokenizer, tasks
    python scripts/table2/pretrain_ar.py --data_dir=data/mini --out_dir=runs/mini/pretrain
    python scripts/table2/pretrain_ar.py --data_dir=data/mini --out_dir=runs/mini/pretrain --resume=True

Next-token cross-entropy on random windows of the corpus token stream (nanoGPT's sampling), AdamW, linear
warm-up then cosine decay. Every eval_interval steps: the held-out split's loss and perplexity (all of it,
in whole windows) into metrics.jsonl, and the resume state (weights, optimizer, step, RNG; manifest with the
sha256 of every file). At the end, out_dir/model/: a Fast-dLLM v2 checkpoint directory (config.json with
bd_size and mask_token_id, model.safetensors, the corpus tokenizer, manifest.json) that
`train_fastdllm.py --init_from=out_dir/model` adapts to block diffusion (stage B).
"""
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import common  # noqa: E402
from configurator import ConfigError, config_to_dict, load_config, print_config  # noqa: E402
from fastdllm.model import DEFAULT_BD_SIZE, MASK_TOKEN, FastDLLM, save_fastdllm  # noqa: E402

RUN_FILES = ("resume", "resume.tmp", "resume.old", "metrics.jsonl", "model", "model.tmp")
RESUME_RULES = common.ResumeRules(may_change=("max_iters", "eval_interval"),
                                  not_compared=("out_dir", "resume", "overwrite", "allow_config_change", "log_interval",
                                                "device"),
                                  fixed=("data_dir", "n_layer", "n_embd", "n_head", "n_kv_head", "d_ff", "seq_len"))


@dataclass
class PretrainConfig:
    data_dir: str = "data/mini"  # train.bin, heldout.bin, tokenizer/ (python -m fastdllm.mini_data)
    out_dir: str = "runs/mini/pretrain"
    resume: bool = False  # continue from out_dir/resume
    overwrite: bool = False  # start afresh in an out_dir that holds a run
    allow_config_change: bool = False
    # model: Qwen2 (RMSNorm, RoPE, SwiGLU, grouped KV heads, tied embeddings), 2.6M parameters with a 4,096 vocabulary
    n_layer: int = 4
    n_embd: int = 192
    n_head: int = 4
    n_kv_head: int = 2
    d_ff: int = 576
    seq_len: int = 256
    # optimisation: 4,000 steps x 16 x 256 = 16.4M tokens, about one pass over the train split
    batch_size: int = 16
    max_iters: int = 4000
    learning_rate: float = 2e-3
    min_lr: float = 2e-4
    warmup_iters: int = 200
    weight_decay: float = 0.1
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_interval: int = 500  # held-out perplexity and the resume state
    log_interval: int = 50
    seed: int = 0
    device: str = "cpu"  # cpu | cuda; fp32 on either (--device=cuda on a GPU)


def build_model(cfg: PretrainConfig, tokenizer) -> FastDLLM:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=cfg.n_embd, intermediate_size=cfg.d_ff,
                         num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
                         max_position_embeddings=1024, rope_theta=10_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                         bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
                         mask_token_id=ids(MASK_TOKEN), bd_size=DEFAULT_BD_SIZE, use_relay=False, relay_layer=-1)
    config._attn_implementation = "sdpa"
    torch.manual_seed(cfg.seed)
    return FastDLLM(Qwen2ForCausalLM(config), use_relay=False)


def lr_at(step: int, cfg: PretrainConfig) -> float:
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / cfg.warmup_iters
    progress = min(1.0, (step - cfg.warmup_iters) / max(1, cfg.max_iters - cfg.warmup_iters))
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


def causal_loss(model: FastDLLM, x: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over windows x (B, T+1): a causal mask, not the block-causal one."""
    T = x.shape[1] - 1
    mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()[None, None]
    logits = model(x[:, :-1], attention_mask=mask).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def random_windows(tokens: np.ndarray, batch_size: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=gen).tolist()
    return torch.stack([torch.from_numpy(tokens[s:s + seq_len + 1].astype(np.int64)) for s in starts])


@torch.no_grad()
def heldout_loss(model: FastDLLM, tokens: np.ndarray, seq_len: int, batch_size: int = 32) -> float:
    """Mean next-token loss over the held-out stream cut into whole windows (every token scored once)."""
    model.eval()
    n = (len(tokens) - 1) // seq_len
    total, count = 0.0, 0
    for start in range(0, n, batch_size):
        rows = range(start, min(n, start + batch_size))
        x = torch.stack([torch.from_numpy(tokens[r * seq_len:(r + 1) * seq_len + 1].astype(np.int64)) for r in rows])
        total += float(causal_loss(model, x.to(next(model.parameters()).device))) * len(rows)
        count += len(rows)
    model.train()
    return total / count


def save_state(cfg: PretrainConfig, model, optimizer, step: int, gen: torch.Generator, run_config: dict) -> None:
    """out_dir/resume/ written beside, its manifest last, then swapped in (common.swap_in)."""
    final = os.path.join(cfg.out_dir, "resume")
    tmp = final + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "data_rng": gen.get_state(), "torch_rng": torch.get_rng_state()}, os.path.join(tmp, "state.pt"))
    common.write_manifest(tmp, {"step": step, "world": 1, "config": run_config})
    common.swap_in(tmp, final)


def load_state(cfg: PretrainConfig, model, optimizer, gen: torch.Generator) -> tuple[int, dict]:
    path = os.path.join(cfg.out_dir, "resume")
    try:
        manifest = common.read_manifest(path)
        if manifest is None:
            raise common.CheckpointError(f"{path} has no {common.MANIFEST}; start afresh with --overwrite=True")
        common.verify_manifest(path, manifest)
    except common.CheckpointError as e:
        raise SystemExit(f"resume: {e}") from None
    run_config = common.resume_config(manifest["config"], config_to_dict(cfg), config_to_dict(PretrainConfig()),
                                      manifest["step"], RESUME_RULES, cfg.allow_config_change, path)
    state = torch.load(os.path.join(path, "state.pt"), weights_only=False, map_location=cfg.device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    gen.set_state(state["data_rng"].cpu())
    torch.set_rng_state(state["torch_rng"].cpu())
    common.drop_records_after(os.path.join(cfg.out_dir, "metrics.jsonl"), state["step"])
    print(f"resumed from {path} at step {state['step']}")
    return state["step"], run_config


def save_model(cfg: PretrainConfig, model, tokenizer, step: int) -> None:
    """out_dir/model/: the Fast-dLLM v2 checkpoint stage B starts from, with its manifest."""
    final = os.path.join(cfg.out_dir, "model")
    tmp = final + ".tmp"
    save_fastdllm(model, tokenizer, tmp, info={"step": step})
    common.swap_in(tmp, final)
    print(f"saved {final}")


def check(cfg: PretrainConfig) -> None:
    """Every input, in one line each, before any work."""
    for key in ("n_layer", "n_embd", "n_head", "n_kv_head", "d_ff", "seq_len", "batch_size", "max_iters",
                "eval_interval", "log_interval", "seed"):
        low = 0 if key == "seed" else 1  # torch takes a negative seed, but the study's runs are seeded 0, 1, ...
        if not getattr(cfg, key) >= low:
            raise SystemExit(f"pretrain_ar.py: {key} must be >= {low}, got {getattr(cfg, key)!r}")
    if cfg.n_embd % cfg.n_head or cfg.n_head % cfg.n_kv_head:
        raise SystemExit(f"pretrain_ar.py: n_embd ({cfg.n_embd}) must be a multiple of n_head ({cfg.n_head}), "
                         f"and n_head of n_kv_head ({cfg.n_kv_head})")
    if not 0 < cfg.min_lr <= cfg.learning_rate < math.inf:
        raise SystemExit(f"pretrain_ar.py: need 0 < min_lr <= learning_rate, got {cfg.min_lr} and {cfg.learning_rate}")
    if not (0 <= cfg.warmup_iters and 0 <= cfg.weight_decay < math.inf and 0 <= cfg.beta2 < 1 and 0 < cfg.grad_clip):
        raise SystemExit("pretrain_ar.py: warmup_iters >= 0, weight_decay >= 0, beta2 in [0, 1) and grad_clip > 0 are needed")
    if cfg.device not in ("cpu", "cuda") or (cfg.device == "cuda" and not torch.cuda.is_available()):
        raise SystemExit(f"pretrain_ar.py: device must be cpu or cuda (with a GPU), got {cfg.device!r}")
    for name in ("train.bin", "heldout.bin", "tokenizer"):
        if not os.path.exists(os.path.join(cfg.data_dir, name)):
            raise SystemExit(f"pretrain_ar.py: {cfg.data_dir}/{name} not found; build it with "
                             f"python -m fastdllm.mini_data --out_dir={cfg.data_dir}")
    check_token_files(cfg)


def check_token_files(cfg: PretrainConfig) -> None:
    """train.bin and heldout.bin are whole uint16 streams, each long enough for one window of seq_len + 1 tokens
    (the training draws a random start below len - seq_len - 1; the held-out loss averages whole windows)."""
    for name, least in (("train.bin", cfg.seq_len + 2), ("heldout.bin", cfg.seq_len + 1)):
        path = os.path.join(cfg.data_dir, name)
        size = os.path.getsize(path)
        if size % 2:
            raise SystemExit(f"pretrain_ar.py: {path} has {size} bytes, not a whole number of uint16 tokens: "
                             "build it again with python -m fastdllm.mini_data")
        if size // 2 < least:
            raise SystemExit(f"pretrain_ar.py: {path} holds {size // 2} tokens, too few for one window at "
                             f"seq_len={cfg.seq_len} (needs {least}): lower seq_len or give more data")


def check_token_ids(tokens: np.ndarray, vocab_size: int, path: str) -> None:
    """Every id must index the embedding: a stream written with another tokenizer stops here in one line, not as
    an index error inside the first step (a device-side assert on CUDA)."""
    top = int(tokens.max())
    if top >= vocab_size:
        raise SystemExit(f"pretrain_ar.py: {path} holds token id {top}, outside the tokenizer's {vocab_size} ids: "
                         "build the stream and the tokenizer together (python -m fastdllm.mini_data)")


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = load_config(PretrainConfig, argv)
    except ConfigError as e:
        raise SystemExit(f"pretrain_ar.py: {e}")
    check(cfg)
    with common.hold(cfg.out_dir, RUN_FILES, cfg.resume, cfg.overwrite, os.path.join(cfg.out_dir, "resume")):
        train(cfg)


def train(cfg: PretrainConfig) -> None:
    from transformers import AutoTokenizer
    print_config(cfg)
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(cfg.data_dir, "tokenizer"))
    train_tokens = np.memmap(os.path.join(cfg.data_dir, "train.bin"), dtype=np.uint16, mode="r")
    heldout_tokens = np.memmap(os.path.join(cfg.data_dir, "heldout.bin"), dtype=np.uint16, mode="r")
    for name, tokens in (("train.bin", train_tokens), ("heldout.bin", heldout_tokens)):
        check_token_ids(tokens, len(tokenizer), os.path.join(cfg.data_dir, name))
    model = build_model(cfg, tokenizer).to(cfg.device)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters; {len(train_tokens) / 1e6:.2f}M train "
          f"tokens, {len(heldout_tokens) / 1e6:.2f}M held out; {cfg.max_iters * cfg.batch_size * cfg.seq_len / 1e6:.1f}M "
          "tokens to train on")
    decay = [p for p in model.parameters() if p.dim() >= 2]  # no decay on norms and biases, as nanoGPT
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                                  lr=cfg.learning_rate, betas=(0.9, cfg.beta2))
    gen = torch.Generator().manual_seed(cfg.seed)
    step, run_config = 0, config_to_dict(cfg)
    if cfg.resume:
        step, run_config = load_state(cfg, model, optimizer, gen)
    elif cfg.overwrite:
        common.remove_run_files(cfg.out_dir, RUN_FILES)
    os.makedirs(cfg.out_dir, exist_ok=True)
    log_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    model.train()
    t0, cpu0, last = time.time(), time.process_time(), step
    bar = tqdm(total=cfg.max_iters, initial=step, desc="pretrain")
    while step < cfg.max_iters:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = causal_loss(model, random_windows(train_tokens, cfg.batch_size, cfg.seq_len, gen).to(cfg.device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        bar.update(1)
        evaluate = step % cfg.eval_interval == 0 or step == cfg.max_iters
        if step % cfg.log_interval == 0 or evaluate:
            cpu = time.process_time() - cpu0
            record = {"step": step, "loss": round(loss.item(), 4), "lr": optimizer.param_groups[0]["lr"],
                      "tokens_per_cpu_s": round((step - last) * cfg.batch_size * cfg.seq_len / cpu, 1),
                      "tokens_per_s": round((step - last) * cfg.batch_size * cfg.seq_len / (time.time() - t0), 1)}
            bar.set_postfix(loss=record["loss"])
            if evaluate:
                record["heldout_loss"] = round(heldout_loss(model, heldout_tokens, cfg.seq_len), 4)
                record["heldout_ppl"] = round(math.exp(record["heldout_loss"]), 2)
                tqdm.write(f"step {step}: train loss {record['loss']:.3f}, held-out loss {record['heldout_loss']:.3f} "
                           f"(perplexity {record['heldout_ppl']:.1f})")
            common.append_record(log_path, record)
            t0, cpu0, last = time.time(), time.process_time(), step
        if evaluate:
            save_state(cfg, model, optimizer, step, gen, run_config)
    bar.close()
    save_model(cfg, model, tokenizer, step)


if __name__ == "__main__":
    main()
