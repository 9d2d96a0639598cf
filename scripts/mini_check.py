"""Table 2 in miniature in a few minutes: the kept models decoded on tasks of held-out compositions.

    python scripts/mini_check.py                 # 100 tasks, tau 0.85: about 4 minutes on 2 CPU cores

The kept checkpoints of scripts/mini_study.py (reference/mini/: the adapted base model, the seed-1 Vanilla SFT and
Relay fine-tunes, bf16, each verified against its manifest) decode the first --n tasks of held-out compositions
(fastdllm.tasks.heldout_tests: rebuilt here, no corpus needed) with eval_code.py (block 32, sub-block 8, the
authors' decoding; Relay with its carry), judged in the sandbox. Prints Table 2's columns: pass@1 base / plus and
mean NFE per task. Numbers differ from the study's (fp32 checkpoints, 200 tasks per split).
"""
import argparse
import contextlib
import io
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import eval_code  # noqa: E402
from fastdllm import tasks  # noqa: E402
from fastdllm.mini_data import TEST_SEED  # noqa: E402

MODELS = (("adapt", "Fast-dLLM v2 (stage B)", False), ("sft_s1", "Vanilla SFT", False), ("relay_s1", "Relay", True))
EVAL_ARGS = ["--dataset=humaneval", "--block_size=32", "--sub_block_size=8", "--max_new_tokens=128", "--batch_size=32",
             "--dtype=float32", "--device=cpu", "--decode=authors"]


def check(kept: str, n: int, tau: float, work: str) -> list[dict]:
    """eval_code.py on each kept model; returns its results.json rows with the model's label."""
    data = os.path.join(work, "heldout.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in tasks.heldout_tests(n, random.Random(TEST_SEED)))
    rows = []
    for name, label, carry in MODELS:
        print(f"decoding {n} tasks with {label} ({kept}/{name})...", flush=True)
        log = io.StringIO()
        try:
            with contextlib.redirect_stdout(log):
                summary = eval_code.main([f"--model={os.path.join(kept, name)}", f"--data_path={data}", f"--threshold={tau}",
                                          f"--relay_carry={carry}", f"--out_dir={os.path.join(work, name)}",
                                          f"--gt_cache_dir={os.path.join(work, 'gt')}", *EVAL_ARGS])
        except SystemExit as e:
            raise SystemExit(f"mini_check.py: {label}: {e}") from None
        rows.append(dict(model=label, **{k: summary[k] for k in ("pass1_base", "pass1_plus_authors", "mean_nfe")}))
    return rows


def table(rows: list[dict], n: int, tau: float) -> str:
    lines = [f"{n} tasks of held-out compositions, tau {tau:g}:", "| model | pass@1 base | pass@1 plus | mean NFE |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {r['model']} | {r['pass1_base']:.1f} | {r['pass1_plus_authors']:.1f} | {r['mean_nfe']:.1f} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kept", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference", "mini"))
    p.add_argument("--n", type=int, default=100, help="tasks of held-out compositions (at most 200, the study's)")
    p.add_argument("--tau", type=float, default=0.85)
    args = p.parse_args(argv)
    if not 1 <= args.n <= 200:
        p.error(f"--n must be in 1..200, got {args.n}")
    if not 0 < args.tau < 1:
        p.error(f"--tau must be in (0, 1), got {args.tau}")
    missing = [name for name, _, _ in MODELS if not os.path.isfile(os.path.join(args.kept, name, "manifest.json"))]
    if missing:
        p.error(f"--kept={args.kept} lacks {', '.join(missing)}: scripts/mini_study.py keeps them there")
    with tempfile.TemporaryDirectory() as work:
        rows = check(args.kept, args.n, args.tau, work)
    print(table(rows, args.n, args.tau))
    return rows


if __name__ == "__main__":
    main()
