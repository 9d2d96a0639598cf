"""Table 2 in miniature in a few minutes: the kept models decoded on tasks of held-out compositions.

    python scripts/table2/mini_check.py                 # 100 tasks, tau 0.85: about 2 minutes on one CPU core

The kept checkpoints of scripts/table2/mini_study.py (reference/mini/: the adapted base model and the seed-1 Vanilla SFT
and Relay fine-tunes, bf16, each verified against its manifest) decode the first --n tasks of held-out
compositions (fastdllm.tasks.heldout_tests: rebuilt here, no corpus needed) with eval_code.py (block 32,
sub-block 8, the authors' decoding; Relay with its carry), judged in the sandbox. Prints Table 2's columns
(pass@1 base / plus, mean NFE per task) and, beside them, what the study measured on the same tasks with the
fp32 checkpoints the bf16 copies were made from (results/mini_study/), so the two can be compared.
"""
import argparse
import contextlib
import io
import json
import os
import random
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import eval_code  # noqa: E402
import fastdllm.sandbox  # noqa: E402
from fastdllm import tasks  # noqa: E402
from fastdllm.mini_data import TEST_SEED  # noqa: E402
from scripts import runs  # noqa: E402
from scripts.table2 import mini_report  # noqa: E402

# (kept directory, label, decode with the relay carry, the study's result for it at tau: model, step)
MODELS = (("adapt", "Fast-dLLM v2 (stage B)", False, ("base", 0)), ("sft_s1", "Vanilla SFT", False, ("sft_s1", 200)),
          ("relay_s1", "Relay", True, ("relay_s1", 200)))
EVAL_ARGS = ["--dataset=humaneval", "--block_size=32", "--sub_block_size=8", "--max_new_tokens=128", "--batch_size=32",
             "--dtype=float32", "--device=cpu", "--decode=authors"]


def decode(kept: str, n: int, tau: float, work: str, sandbox: str = "auto") -> dict[str, dict]:
    """eval_code.py on each kept model: {label: per-task record (mini_report.compact: task_ids, base, plus, nfe)}."""
    data = os.path.join(work, "heldout.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in tasks.heldout_tests(n, random.Random(TEST_SEED)))
    records = {}
    for name, label, carry, _ in MODELS:
        print(f"decoding {n} tasks with {label} ({os.path.join(kept, name)})...", flush=True)
        out = os.path.join(work, name)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                eval_code.main([f"--model={os.path.join(kept, name)}", f"--data_path={data}", f"--threshold={tau}",
                                f"--relay_carry={carry}", f"--out_dir={out}", f"--gt_cache_dir={os.path.join(work, 'gt')}",
                                f"--sandbox={sandbox}", *EVAL_ARGS])
        except SystemExit as e:
            raise SystemExit(f"mini_check.py: {label}: {e}") from None
        records[label] = mini_report.compact(out, os.path.join(work, f"{name}.json"), {"model": label})
    return records


def study_record(results: str, model: str, step: int, tau: float, task_ids: list[str]) -> dict | None:
    """The study's per-task results for model at step and tau (full protocol) on task_ids, or None if not kept."""
    path = mini_report.result_path(results, model, step, tau, "full")
    if not os.path.isfile(path):
        return None
    kept = mini_report.read_kept(path)
    where = {t: i for i, t in enumerate(kept["task_ids"])}
    if not all(t in where for t in task_ids):
        return None
    return {k: [kept[k][where[t]] for t in task_ids] for k in ("base", "plus", "nfe")} | {"task_ids": task_ids}


def columns(r: dict) -> tuple[float, float, float]:
    """pass@1 base and plus (%) and mean NFE per task."""
    return mini_report.rate(r, "all", "base"), mini_report.rate(r, "all"), mini_report.mean(r["nfe"])


def table(records: dict[str, dict], study: dict[str, dict | None], n: int, tau: float) -> str:
    lines = [f"{n} tasks of held-out compositions, tau {tau:g}; decoded here from reference/mini/ (bf16 weights, fp32 "
             "compute), and the study's fp32 checkpoints on the same tasks (results/mini_study/):", "",
             "| model | pass@1 base | pass@1 plus | mean NFE | study: base | plus | NFE |", "|---|---|---|---|---|---|---|"]
    for label, r in records.items():
        here = "{:.1f} | {:.1f} | {:.1f}".format(*columns(r))
        there = "{:.1f} | {:.1f} | {:.1f}".format(*columns(study[label])) if study.get(label) else "- | - | -"
        lines.append(f"| {label} | {here} | {there} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--kept", default=os.path.join(ROOT, "reference", "mini"), help="the kept checkpoint directories")
    p.add_argument("--results", default=os.path.join(ROOT, "results", "mini_study"), help="the study's kept results")
    p.add_argument("--n", type=int, default=100, help="tasks of held-out compositions (at most 200, the study's)")
    p.add_argument("--tau", type=float, default=0.85)
    p.add_argument("--sandbox", default="auto", help="how generated programs are isolated (eval_code.py; docs/sandbox.md)")
    args = p.parse_args(argv)
    runs.need(1 <= args.n <= 200, "--n", "in 1..200", args.n)
    runs.need(0 < args.tau < 1, "--tau", "in (0, 1)", args.tau)
    runs.need(args.sandbox in fastdllm.sandbox.MODES, "--sandbox", f"one of {', '.join(fastdllm.sandbox.MODES)}",
              args.sandbox)
    missing = [name for name, _, _, _ in MODELS if not os.path.isfile(os.path.join(args.kept, name, "manifest.json"))]
    if missing:
        raise SystemExit(f"--kept={args.kept} lacks {', '.join(missing)}: scripts/table2/mini_study.py keeps them there")
    check_results(args.results, args.tau)
    return args


def check_results(results: str, tau: float) -> None:
    """The study's kept results this check reads after decoding (minutes), read now: a folder, and each of its
    JSONs for the three models whole (mini_report.read_kept names a broken one). A result not kept is a "-"."""
    if not os.path.isdir(results):
        raise SystemExit(f"--results={results} is not a folder of the study's kept results (results/mini_study)")
    for _, _, _, (model, step) in MODELS:
        path = mini_report.result_path(results, model, step, tau, "full")
        if os.path.isfile(path):
            mini_report.read_kept(path)


def main(argv: list[str] | None = None) -> tuple[dict[str, dict], dict[str, dict | None]]:
    args = parse_args(argv)
    # one thread: a 2.6M model's forwards gain little from a second, and where the other core is busy two threads
    # made decoding 10 times slower (156 s against 16 s for 100 tasks, the 2-core AMD EPYC during the study)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as work:
        records = decode(args.kept, args.n, args.tau, work, args.sandbox)
    ids = next(iter(records.values()))["task_ids"]
    study = {label: study_record(args.results, model, step, args.tau, ids) for _, label, _, (model, step) in MODELS}
    print(table(records, study, args.n, args.tau))
    return records, study


if __name__ == "__main__":
    main()
