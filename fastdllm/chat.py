"""Chat with a Fast-dLLM v2 checkpoint: one prompt through the chat template, decoded by
fastdllm.generate.generate (docs/fastdllm.md).

    python -m fastdllm.chat --model=DIR --relay_carry=True --prompt="Write a function that ..."
    python -m fastdllm.chat --model=tiny --max_new_tokens=64      # random tiny model, CPU smoke test
"""
from dataclasses import dataclass

import torch

import fastdllm.model
from configurator import ConfigError, load_config
from common import pick_device
from fastdllm.generate import generate


@dataclass
class ChatConfig:
    model: str = "Efficient-Large-Model/Fast_dLLM_v2_1.5B"  # hub id, checkpoint dir, or "tiny" (random, CPU smoke test)
    allow_unverified: bool = False  # load a checkpoint dir without manifest.json (else refused): its files go unchecked
    pin: str = ""  # a pin file (python -m fastdllm.model --pin=...): a hub snapshot's files must have its sha256
    prompt: str = "Write a Python function that returns the n-th Fibonacci number."
    relay_carry: bool = False  # Relay checkpoints: carry the relay state between denoising forwards
    decode: str = "authors"  # authors (paper Table 2) | batch_invariant (see docs/fastdllm.md)
    threshold: float = 0.85
    sub_block_size: int = 8
    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 0.95
    prefix_cache: bool = True
    sub_block_cache: bool = False
    cuda_graph: bool = False  # CUDA: replay the cached block forward as CUDA graphs (fastdllm/graphs.py)
    seed: int = 0
    device: str = "auto"
    dtype: str = "bfloat16"  # bfloat16 | float32 (the tiny model runs in float32)


def main(argv: list[str] | None = None) -> str:
    """One prompt through the chat template, decoded; prints the answer and its NFE."""
    try:
        cfg = load_config(ChatConfig, argv)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}")
    device = pick_device(cfg.device)
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    if cfg.dtype not in dtypes:
        raise SystemExit(f"--dtype must be one of {list(dtypes)}, got '{cfg.dtype}'")
    try:
        if cfg.model == "tiny":
            model, tok = fastdllm.model.make_tiny_fastdllm(use_relay=cfg.relay_carry, seed=cfg.seed), fastdllm.model.make_tiny_tokenizer()
        else:
            model, tok = fastdllm.model.load_fastdllm(cfg.model, dtype=dtypes[cfg.dtype], device=device,
                                                      allow_unverified=cfg.allow_unverified, pin=cfg.pin or None)
        text = tok.apply_chat_template([{"role": "user", "content": cfg.prompt}], tokenize=False, add_generation_prompt=True)
        torch.manual_seed(cfg.seed)
        out = generate(model.to(device).eval(), [tok(text, add_special_tokens=False)["input_ids"]],
                       max_new_tokens=cfg.max_new_tokens, threshold=cfg.threshold, sub_block_size=cfg.sub_block_size,
                       temperature=cfg.temperature, top_p=cfg.top_p, stop_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                       prefix_cache=cfg.prefix_cache, sub_block_cache=cfg.sub_block_cache, relay_carry=cfg.relay_carry,
                       progress=True, decode=cfg.decode, cuda_graph=cfg.cuda_graph)
    except ValueError as e:
        raise SystemExit(str(e))
    answer = tok.decode(out.tokens[0], skip_special_tokens=True)
    print(answer)
    print(f"[{len(out.tokens[0])} tokens, NFE {out.nfe[0]}, {'stopped at <|im_end|>' if out.stopped[0] else 'hit max_new_tokens'}]")
    return answer


if __name__ == "__main__":
    main()
