"""Table 2 in miniature in a few minutes: the kept models decoded on tasks of held-out compositions.

    python scripts/table2/mini_check.py                 # v2's kept models on 100 test tasks: about 2 minutes

The kept checkpoints of the v2 miniature study (scripts/table2/study.py --study=v2, reference/mini2/: the adapted
base model and the seed-1 Vanilla SFT and Relay fine-tunes, bf16, each verified against its manifest) decode the
first --n test tasks of held-out compositions (fastdllm.mini_data_v2.test_tasks, rebuilt here, no corpus needed)
with eval_code.py (block 32, sub-block 8, the authors' decoding; Relay with its carry), judged in the sandbox. Prints Table 2's columns (pass@1 base / plus, mean NFE per task) and, beside them, what
the study measured on the same tasks (its results/ folder), so the two can be compared.
"""
import argparse
import contextlib
import io
import json
import os
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import configurator  # noqa: E402
import common  # noqa: E402
import eval_code  # noqa: E402
import fastdllm.sandbox  # noqa: E402
from fastdllm import mini_data_v2  # noqa: E402
from scripts import runs  # noqa: E402
from scripts.table2 import mini_report_v2, store  # noqa: E402

# (kept directory, label, decode with the relay carry)
MODELS = (("adapt", "Fast-dLLM v2 (stage B)", False), ("sft_s1", "Vanilla SFT", False), ("relay_s1", "Relay", True))
DEVICE = "cpu"  # the check is the README's, on the machine a user first has
EVAL_ARGS = ["--dataset=humaneval", "--block_size=32", "--sub_block_size=8", "--batch_size=32", "--dtype=float32",
             f"--device={DEVICE}", "--decode=authors"]


def v2_tasks(n: int) -> list[dict]:
    return [row for _, row in mini_data_v2.test_tasks(n)]


# the study's kept models, kept results, test tasks, decoding length, how many tasks it decoded, its protocol name
# for these tasks, and the step of each model's result (None: the kept manifest's step, the fine-tunes' step of
# lowest validation loss)
STUDIES = {
    "v2": dict(kept="reference/mini2", results="results/mini_study_v2", tasks=v2_tasks, max_new_tokens=224,
               n_max=400, protocol="test", steps={"adapt": ("base", 0), "sft_s1": ("sft_s1", None),
                                                   "relay_s1": ("relay_s1", None)}),
}


def decode(study: dict, kept: str, n: int, tau: float, work: str, sandbox: str = "auto") -> dict[str, dict]:
    """eval_code.py on each kept model: {label: per-task record (store.compact: task_ids, base, plus, nfe)}."""
    data = os.path.join(work, "heldout.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in study["tasks"](n))
    records = {}
    for name, label, carry in MODELS:
        print(f"decoding {n} tasks with {label} ({os.path.join(kept, name)})...", flush=True)
        out = decode_model(os.path.join(kept, name), data, tau, carry, os.path.join(work, name), study["max_new_tokens"],
                           sandbox, f"mini_check.py: {label}")
        records[label] = store.compact(out, os.path.join(work, f"{name}.json"), {"model": label})
    return records


def decode_model(model: str, data: str, tau: float, carry: bool, out: str, max_new_tokens: int, sandbox: str,
                 who: str) -> str:
    """eval_code.py on one model with the studies' decoding (EVAL_ARGS), its printing held back; returns out (its
    out_dir; the ground truths are cached beside it). A failure stops in one line that starts with who."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            eval_code.main([f"--model={model}", f"--data_path={data}", f"--threshold={tau}", f"--relay_carry={carry}",
                            f"--out_dir={out}", f"--gt_cache_dir={os.path.join(os.path.dirname(out), 'gt')}",
                            f"--sandbox={sandbox}", f"--max_new_tokens={max_new_tokens}", *EVAL_ARGS])
    except SystemExit as e:
        raise SystemExit(f"{who}: {e}") from None
    return out


def result_paths(study: dict, kept: str, results: str, tau: float) -> dict[str, str]:
    """{label: the study's kept result for that model on these tasks at tau} (the file may not exist)."""
    paths = {}
    for name, label, _ in MODELS:
        model, step = study["steps"][name]
        if step is None:
            step = kept_step(os.path.join(kept, name))
        paths[label] = store.result_path(results, model, step, tau, study["protocol"])
    return paths


def kept_step(folder: str) -> int:
    """The step in a kept directory's manifest, read by the verifying reader."""
    try:
        manifest = common.read_manifest(folder, fields=("files", "step"), way_out="restore it (git checkout)")
    except common.CheckpointError as e:
        raise SystemExit(str(e)) from None
    if manifest is None:
        raise SystemExit(f"{os.path.join(folder, common.MANIFEST)} is missing: restore it (git checkout)")
    return manifest["step"]


def study_record(path: str, task_ids: list[str]) -> dict | None:
    """The study's per-task results in the kept JSON at path on task_ids, or None if it is not kept."""
    if not os.path.isfile(path):
        return None
    kept = store.read_kept(path)
    where = {t: i for i, t in enumerate(kept["task_ids"])}
    if not all(t in where for t in task_ids):
        return None
    return {k: [kept[k][where[t]] for t in task_ids] for k in ("base", "plus", "nfe")} | {"task_ids": task_ids}


def columns(r: dict) -> tuple[float, float, float]:
    """pass@1 base and plus (%) and mean NFE per task."""
    return mini_report_v2.rate(r, "all", "base"), mini_report_v2.rate(r, "all"), mini_report_v2.mean(r["nfe"])


def table(records: dict[str, dict], study: dict[str, dict | None], args: argparse.Namespace) -> str:
    lines = [f"{args.n} tasks of held-out compositions, tau {args.tau:g}; decoded here from {rel(args.kept)}/ (bf16 "
             f"weights, fp32 compute), and as the study measured them ({rel(args.results)}/):", "",
             "| model | pass@1 base | pass@1 plus | mean NFE | study: base | plus | NFE |", "|---|---|---|---|---|---|---|"]
    for label, r in records.items():
        here = "{:.1f} | {:.1f} | {:.1f}".format(*columns(r))
        there = "{:.1f} | {:.1f} | {:.1f}".format(*columns(study[label])) if study.get(label) else "- | - | -"
        lines.append(f"| {label} | {here} | {there} |")
    return "\n".join(lines)


def rel(path: str) -> str:
    return os.path.relpath(path, ROOT) if os.path.abspath(path).startswith(ROOT + os.sep) else path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--study", choices=sorted(STUDIES), default="v2", help="which miniature study's kept models")
    p.add_argument("--kept", default=None, help="the kept checkpoint directories (default: the study's)")
    p.add_argument("--results", default=None, help="the study's kept results (default: the study's)")
    p.add_argument("--n", type=int, default=100, help="test tasks of held-out compositions (at most the study's)")
    p.add_argument("--tau", type=float, default=0.85)
    p.add_argument("--sandbox", default="auto", help="how generated programs are isolated (eval_code.py; docs/sandbox.md)")
    args = p.parse_args(argv)
    study = STUDIES[args.study]
    args.kept = args.kept or os.path.join(ROOT, study["kept"])
    args.results = args.results or os.path.join(ROOT, study["results"])
    runs.need(1 <= args.n <= study["n_max"], "--n", f"in 1..{study['n_max']}", args.n)
    runs.need(0 < args.tau < 1, "--tau", "in (0, 1)", args.tau)
    runs.need(args.sandbox in fastdllm.sandbox.MODES, "--sandbox", f"one of {', '.join(fastdllm.sandbox.MODES)}",
              args.sandbox)
    missing = [name for name, _, _ in MODELS if not os.path.isfile(os.path.join(args.kept, name, "manifest.json"))]
    if missing:
        raise SystemExit(f"--kept={args.kept} lacks {', '.join(missing)}: the study's driver "
                         "(scripts/table2/study.py --study=v2) keeps them there")
    if not os.path.isdir(args.results):
        raise SystemExit(f"--results={args.results} is not a folder of the study's kept results ({study['results']})")
    args.result_paths = result_paths(study, args.kept, args.results, args.tau)
    for path in args.result_paths.values():  # read after minutes of decoding, so read now: a broken one is named
        if os.path.isfile(path):
            store.read_kept(path)
    return args


def main(argv: list[str] | None = None) -> tuple[dict[str, dict], dict[str, dict | None]]:
    args = parse_args(argv)
    # one thread: a 2.6M model's forwards gain little from a second, and where the other core is busy two threads
    # made decoding 10 times slower (156 s against 16 s for 100 tasks, the 2-core AMD EPYC during the study)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as work:
        records = decode(STUDIES[args.study], args.kept, args.n, args.tau, work, args.sandbox)
    ids = next(iter(records.values()))["task_ids"]
    study = {label: study_record(path, ids) for label, path in args.result_paths.items()}
    print(table(records, study, args))
    return records, study


if __name__ == "__main__":
    main()
