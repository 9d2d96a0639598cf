"""SFT data for the Fast-dLLM v2 adaptation: the c40m60 code/math mixture and ChatML tokenisation.

    python -m fastdllm.data                                                      # c40m60 from the hub (24k code + 36k math)
    python -m fastdllm.data --source=my_data.jsonl                               # your own {prompt, answer} or {messages} rows
    python -m fastdllm.data --source=toy --tokenizer=tiny --out_dir=data/sft_toy  # CPU smoke data

Writes <out_dir>/train.jsonl (one {"messages": [...], "source": ..., "tokenized_chat_len": n} per line)
and <out_dir>/prep_summary.json. train_fastdllm.py tokenises train.jsonl with the model's own
tokenizer at start-up (tokenize_conversation), as the authors' LMFlow pipeline did.

Mixture recipe (docs/fastdllm.md, "Data"; the authors' prep script): code rows from
nvidia/OpenCodeInstruct (answer contains "def ", unit tests parse, average_test_score >= 1, every
test passed), math rows from nvidia/OpenMathInstruct-2 train_1M (problem <= 4000 chars, solution
<= 6000 chars), a case-insensitive benchmark-leak filter on both, dedup by a hash of the
normalised prompt shared across sources, and the rendered conversation <= 2048 tokens.
"""
import argparse
import ast
import hashlib
import json
import os
import random
import re
from typing import Iterable, Iterator

import torch
from tqdm import tqdm

import common
import configurator
from fastdllm.model import CHAT_TEMPLATE, HUB_ID

LEAK_PATTERNS = ("humaneval", "human_eval", "mbpp", "evalplus", "math-500", "math500")
CODE_DATASET, CODE_SPLIT = "nvidia/OpenCodeInstruct", "train"
MATH_DATASET, MATH_SPLIT = "nvidia/OpenMathInstruct-2", "train_1M"

# -----------------------------------------------------------------------------
# row filters (each returns (prompt, answer) or None)


def is_leak(text: str) -> bool:
    """True if the text names an evaluation benchmark (held-out contamination)."""
    low = text.lower()
    return any(p in low for p in LEAK_PATTERNS)


def prompt_key(prompt: str) -> str:
    """Dedup key: sha1 of the lowercased, whitespace-collapsed prompt."""
    return hashlib.sha1(re.sub(r"\s+", " ", prompt.lower()).strip().encode()).hexdigest()


def _as_list(value) -> list | None:
    if isinstance(value, list):
        return value
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
        return value if isinstance(value, list) else None
    return None


def filter_code_row(row: dict, require_code_def: bool = True) -> tuple[str, str] | None:
    """OpenCodeInstruct row -> (prompt, answer) if it passes every code filter, else None."""
    prompt, answer = (row.get("input") or "").strip(), (row.get("output") or "").strip()
    if not prompt or not answer:
        return None
    if require_code_def and "def " not in answer:
        return None
    tests = _as_list(row.get("unit_tests"))
    if not tests:  # must parse to a non-empty list
        return None
    try:
        if float(row.get("average_test_score")) < 1.0:
            return None
    except (TypeError, ValueError):
        return None
    status = row.get("tests_execution_status")
    if status is not None:
        status = _as_list(status)
        if status is None or any(str(s).strip().lower() != "pass" for s in status):
            return None
    if is_leak(prompt + "\n" + answer):
        return None
    return prompt, answer


def filter_math_row(row: dict, max_problem_chars: int = 4000, max_solution_chars: int = 6000) -> tuple[str, str] | None:
    """OpenMathInstruct-2 row -> (prompt, answer) if it passes the math filters, else None."""
    prompt = (row.get("problem") or "").strip()
    answer = (row.get("generated_solution") or row.get("solution") or "").strip()
    if not prompt or not answer or len(prompt) > max_problem_chars or len(answer) > max_solution_chars:
        return None
    if is_leak(prompt + "\n" + answer):
        return None
    return prompt, answer


# -----------------------------------------------------------------------------
# ChatML tokenisation


def to_messages(prompt: str, answer: str) -> list[dict]:
    # no system turn: the template inserts "You are a helpful assistant."
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


def tokenize_conversation(tokenizer, messages: list[dict], max_length: int = 2048) -> tuple[list[int], list[bool]]:
    """ChatML ids and the supervision mask (assistant content + "<|im_end|>\\n", not the role header).

    Longer conversations lose their beginning (left truncation, as the authors' runs did), so the
    answer survives."""
    enc = tokenizer.apply_chat_template(messages, chat_template=CHAT_TEMPLATE, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    ids, sup = list(enc["input_ids"]), [bool(a) for a in enc["assistant_masks"]]
    return ids[-max_length:], sup[-max_length:]


def collate(rows: list[tuple[list[int], list[bool]]], pad_id: int, bd_size: int,
            length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to `length` (default: the batch's longest row), rounded up to a multiple of bd_size.

    The authors pad every row to 2048. Block-causal attention makes that identical for the loss:
    a block made only of padding is never seen by an earlier block, and the padding inside the last
    partly filled block is the same either way. Returns x0 (B, L) long, maskable (B, L) bool."""
    L = max([len(ids) for ids, _ in rows] + [length or 0])
    L = -(-L // bd_size) * bd_size
    x0 = torch.full((len(rows), L), pad_id, dtype=torch.long)
    maskable = torch.zeros((len(rows), L), dtype=torch.bool)
    for i, (ids, sup) in enumerate(rows):
        x0[i, : len(ids)] = torch.as_tensor(ids)
        maskable[i, : len(sup)] = torch.as_tensor(sup)
    return x0, maskable


# -----------------------------------------------------------------------------
# sources


def read_jsonl(path: str) -> list[list[dict]]:
    """Conversations from a JSONL of {"messages": [...]} or {"prompt": ..., "answer": ...} rows."""
    convs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {n}: not valid JSON ({e.msg})") from None
            if isinstance(row, dict) and isinstance(row.get("messages"), list):
                msgs = row["messages"]
                if not msgs or not all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in msgs):
                    raise ValueError(f"{path} line {n}: every message needs 'role' and 'content'")
                if msgs[-1]["role"] != "assistant":
                    raise ValueError(f"{path} line {n}: the last message must be the assistant's answer")
                convs.append(msgs)
            elif isinstance(row, dict) and isinstance(row.get("prompt"), str) and isinstance(row.get("answer"), str):
                convs.append(to_messages(row["prompt"], row["answer"]))
            else:
                raise ValueError(f"{path} line {n}: expected {{\"messages\": [...]}} or {{\"prompt\": ..., \"answer\": ...}}")
    if not convs:
        raise ValueError(f"{path} holds no conversations")
    return convs


def toy_conversations(n: int, seed: int = 0) -> list[list[dict]]:
    """Small synthetic code/math chats (a CPU smoke test of the whole pipeline, not a benchmark)."""
    rng = random.Random(seed)
    convs = []
    for i in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        if i % 5 < 2:  # 40% "code"
            convs.append(to_messages(f"Write add{a}(x) returning x + {a}.", f"def add{a}(x):\n    return x + {a}"))
        else:
            convs.append(to_messages(f"What is {a} + {b}?", f"{a} + {b} = {a + b}."))
    return convs


def stream_hub(name: str, split: str, seed: int, buffer_size: int) -> Iterator[dict]:
    """Shuffled streaming rows of a hub dataset; one clear line when the hub cannot be reached."""
    import datasets
    try:
        ds = datasets.load_dataset(name, split=split, streaming=True)
        yield from ds.shuffle(seed=seed, buffer_size=buffer_size)
    except Exception as e:
        if isinstance(e, (KeyboardInterrupt, GeneratorExit)):
            raise
        raise ValueError(f"cannot stream {name} ({split}) from the Hugging Face hub ({type(e).__name__}); "
                         "run where there is internet, or pass --source=FILE.jsonl with your own rows") from None


def select(rows: Iterable[dict], row_filter, want: int, tokenizer, max_tokens: int, seen: set, source: str,
           stats: dict) -> list[dict]:
    """Take the first `want` rows that pass `row_filter`, are new (prompt dedup shared through `seen`)
    and render to <= max_tokens tokens."""
    out = []
    bar = tqdm(total=want, desc=f"select {source}", unit="row")
    for row in rows:
        stats["seen"] += 1
        pair = row_filter(row)
        if pair is None:
            stats["filtered"] += 1
            continue
        key = prompt_key(pair[0])
        if key in seen:
            stats["duplicate"] += 1
            continue
        messages = to_messages(*pair)
        n = len(tokenize_conversation(tokenizer, messages, max_length=10 ** 9)[0])
        if n > max_tokens:
            stats["too_long"] += 1
            continue
        seen.add(key)
        out.append({"messages": messages, "source": source, "tokenized_chat_len": n})
        bar.update(1)
        if len(out) == want:
            break
    bar.close()
    if len(out) < want:
        raise ValueError(f"only {len(out)} {source} rows passed the filters, {want} wanted")
    return out


def build_mixture(code_rows: Iterable[dict], math_rows: Iterable[dict], tokenizer, n_code: int = 24000, n_math: int = 36000,
                  max_tokens: int = 2048, require_code_def: bool = True, seed: int = 42) -> tuple[list[dict], dict]:
    """The c40m60 mixture: code first, then math (sharing the dedup set), then one shuffle."""
    seen: set = set()
    stats = {s: {"seen": 0, "filtered": 0, "duplicate": 0, "too_long": 0} for s in ("code", "math")}
    code = select(code_rows, lambda r: filter_code_row(r, require_code_def), n_code, tokenizer, max_tokens, seen, "code", stats["code"])
    math = select(math_rows, filter_math_row, n_math, tokenizer, max_tokens, seen, "math", stats["math"])
    rows = code + math
    random.Random(seed).shuffle(rows)
    return rows, {"code_rows": len(code), "math_rows": len(math), "max_tokens": max_tokens, "stats": stats}


def load_tokenizer(name: str):
    if name == "tiny":
        from fastdllm.model import make_tiny_tokenizer
        return make_tiny_tokenizer()
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as e:
        raise ValueError(f"cannot load the tokenizer '{name}' ({type(e).__name__}); pass a local checkpoint "
                         "directory or --tokenizer=tiny") from None


def main(argv: list[str] | None = None) -> None:
    p = configurator.ArgumentParser(description="Build the Fast-dLLM v2 SFT data.")
    p.add_argument("--out_dir", default="data/sft")
    p.add_argument("--source", default="hub", help="hub (c40m60 mixture) | toy | path to a JSONL of {messages} or {prompt, answer}")
    p.add_argument("--tokenizer", default=HUB_ID, help="tokenizer for the length filter (hub id, local dir, or tiny)")
    p.add_argument("--code_rows", type=int, default=24000)
    p.add_argument("--math_rows", type=int, default=36000)
    p.add_argument("--toy_rows", type=int, default=512)
    p.add_argument("--max_tokens", type=int, default=2048)
    p.add_argument("--no_require_code_def", action="store_true", help="keep code answers without 'def '")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    for key, low in (("code_rows", 0), ("math_rows", 0), ("toy_rows", 1), ("max_tokens", 1), ("seed", 0)):
        if getattr(args, key) < low:
            p.error(f"--{key} must be >= {low}, got {getattr(args, key)}")
    if args.source == "hub" and args.code_rows + args.math_rows == 0:
        p.error("--code_rows and --math_rows are both 0: no rows to build")
    problem = common.folder_problem(args.out_dir)
    if problem:
        p.error(f"--out_dir={args.out_dir} {problem}")
    try:
        tokenizer = load_tokenizer(args.tokenizer)
        if args.source == "hub":
            code = stream_hub(CODE_DATASET, CODE_SPLIT, seed=42, buffer_size=100_000)
            math = stream_hub(MATH_DATASET, MATH_SPLIT, seed=43, buffer_size=50_000)
            rows, summary = build_mixture(code, math, tokenizer, args.code_rows, args.math_rows, args.max_tokens,
                                          not args.no_require_code_def, args.seed)
        else:
            convs = toy_conversations(args.toy_rows, args.seed) if args.source == "toy" else read_jsonl(args.source)
            rows, seen, stats = [], set(), {"seen": len(convs), "leak": 0, "duplicate": 0, "too_long": 0}
            for msgs in tqdm(convs, desc="tokenise", unit="row"):
                text = "\n".join(m["content"] for m in msgs)
                key = prompt_key("\n".join(m["content"] for m in msgs[:-1]))
                n = len(tokenize_conversation(tokenizer, msgs, max_length=10 ** 9)[0])
                if args.source != "toy" and is_leak(text):
                    stats["leak"] += 1
                elif args.source != "toy" and key in seen:
                    stats["duplicate"] += 1
                elif n > args.max_tokens:
                    stats["too_long"] += 1
                else:
                    seen.add(key)
                    rows.append({"messages": msgs, "source": args.source if args.source == "toy" else "local", "tokenized_chat_len": n})
            summary = {"rows": len(rows), "max_tokens": args.max_tokens, "stats": stats}
    except (ValueError, OSError) as e:
        raise SystemExit(f"fastdllm/data.py: {e}")
    if not rows:
        raise SystemExit("fastdllm/data.py: no rows left after filtering")
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "train.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    summary.update(source=args.source, tokenizer=args.tokenizer, n=len(rows))
    with open(os.path.join(args.out_dir, "prep_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"wrote {len(rows)} conversations to {os.path.join(args.out_dir, 'train.jsonl')}")


if __name__ == "__main__":
    main()
