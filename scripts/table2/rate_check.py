"""Table 2 in miniature v2, outside its protocol: how much of Relay - SFT's NFE gap comes with each method's rate.

    python scripts/table2/rate_check.py        # after the pilot of scripts/table2/study.py --study=v2; about 8 min on one core

The protocol (docs/table2_v2_protocol.md) gives each method the learning rate of lower validation loss for its
seed-1 run: 1e-3 for Vanilla SFT, 3e-4 for Relay. Its pilot trained both methods at both rates
(runs/mini2/<objective>_s1_lr<rate>), so the rate and the objective can be told apart on seed 1: this decodes the
four step-300 checkpoints on the first --n test tasks at tau 0.85 (Relay with its carry, and Relay at 3e-4 once
more without it), as eval_code.py does for the study, and prints pass@1 and NFE with Relay - SFT per task at each
rate. One seed, so a diagnostic, not a result of the study. The per-task results are kept in --out (resumable).
"""
import argparse
import os
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import common  # noqa: E402
import configurator  # noqa: E402
import fastdllm.sandbox  # noqa: E402
from fastdllm.tasks import write_jsonl  # noqa: E402
from scripts import runs  # noqa: E402
from scripts.table2 import mini_check, mini_report_v2, store  # noqa: E402
from scripts.table2.study import Study, run_name  # noqa: E402

LRS = Study.lrs  # the pilot's rates (3e-4, 1e-3)

STEP = 300
PINS = os.path.join(ROOT, "results", "mini_study_v2", "data.json")  # the study's test.jsonl, whose first tasks these are
# (objective, learning rate, decode with the relay carry)
DECODINGS = [("sft", lr, False) for lr in LRS] + [("relay", lr, True) for lr in LRS] + [("relay", LRS[0], False)]


def label(objective: str, lr: float, carry: bool) -> str:
    return run_name(objective, 1, lr) + ("" if carry or objective == "sft" else "_nocarry")


def decode(args: argparse.Namespace) -> dict[str, dict]:
    """Each decoding's per-task record; those kept in --out (args.kept, read before any work) are not decoded again."""
    records = dict(args.kept)
    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "test.jsonl")
        write_jsonl(mini_check.v2_tasks(args.n), data)
        for objective, lr, carry in DECODINGS:
            name = label(objective, lr, carry)
            if name in records:
                continue
            print(f"decoding {args.n} test tasks with {name}...", flush=True)
            out = mini_check.decode_model(checkpoint(args.runs, objective, lr), data, args.tau, carry,
                                          os.path.join(work, name), mini_check.STUDIES["v2"]["max_new_tokens"],
                                          args.sandbox, f"rate_check.py: {name}")
            meta = dict(model=name, step=STEP, tau=args.tau, protocol="test", relay_carry=carry, learning_rate=lr,
                        device=mini_check.DEVICE, study="v2", data_file="test.jsonl", data_sha256=store.read_json(PINS, ("sha256",))["sha256"]["test.jsonl"],
                        model_digest=common.file_sha256(os.path.join(checkpoint(args.runs, objective, lr), common.MANIFEST)),
                        digest=None)
            records[name] = store.compact(out, kept_path(args, name), meta)
    return records


def kept_path(args: argparse.Namespace, name: str) -> str:
    return os.path.join(args.out, f"{name}_n{args.n}_tau_{args.tau:g}.json")


def checkpoint(runs_dir: str, objective: str, lr: float) -> str:
    return os.path.join(runs_dir, run_name(objective, 1, lr), f"ckpt-{STEP}")


def table(records: dict[str, dict], args: argparse.Namespace) -> str:
    lines = [f"Seed 1 at step {STEP}, the first {args.n} test tasks, tau {args.tau:g} (outside the protocol):", "",
             "| run | learning rate | relay carry | pass@1 base | pass@1 plus | mean NFE |",
             "|---|---|---|---|---|---|"]
    for objective, lr, carry in DECODINGS:
        name = label(objective, lr, carry)
        lines.append(f"| {name} | {lr:g} | {'yes' if carry else 'no'} | "
                     "{:.1f} | {:.1f} | {:.1f} |".format(*mini_check.columns(records[name])))
    lines += ["", "Mean NFE per task, paired on the same tasks (difference, per-task s.e.):"]
    pairs = [(f"Relay - SFT at {lr:g}", label("relay", lr, True), label("sft", lr, False)) for lr in LRS]
    pairs += [(f"the chosen runs (Relay at {LRS[0]:g}, SFT at {LRS[1]:g})", label("relay", LRS[0], True),
               label("sft", LRS[1], False)),
              (f"Relay at {LRS[0]:g}, with its carry - without", label("relay", LRS[0], True),
               label("relay", LRS[0], False))]
    for text, a, b in pairs:
        diff, se, _ = mini_report_v2.paired([(records[b]["nfe"], records[a]["nfe"])])  # a - b, task by task
        lines.append(f"- {text}: {diff:+.1f} (s.e. {se:.1f})")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--runs", default="runs/mini2", help="the study's runs folder (its pilot's four seed-1 runs)")
    p.add_argument("--n", type=int, default=100, help="the first n test tasks (at most 400)")
    p.add_argument("--tau", type=float, default=0.85)
    p.add_argument("--out", default="results/mini_study_v2_rates", help="where the per-task results are kept")
    p.add_argument("--sandbox", default="auto",
                   help="how generated programs are isolated (eval_code.py; docs/sandbox.md)")
    args = p.parse_args(argv)
    runs.need(1 <= args.n <= 400, "--n", "in 1..400", args.n)
    runs.need(0 < args.tau < 1, "--tau", "in (0, 1)", args.tau)
    runs.need(args.sandbox in fastdllm.sandbox.MODES, "--sandbox", f"one of {', '.join(fastdllm.sandbox.MODES)}",
              args.sandbox)
    runs.check_folder(args.out, "--out")
    folders = {checkpoint(args.runs, objective, lr) for objective, lr, _ in DECODINGS}
    missing = sorted(folder for folder in folders if not os.path.isdir(folder))
    if missing:
        raise SystemExit(f"rate_check.py: {', '.join(missing)} missing: the pilot of scripts/table2/study.py "
                         f"--study=v2 makes them (--runs names its folder)")
    paths = {label(*d): kept_path(args, label(*d)) for d in DECODINGS}
    args.kept = {name: read_kept(path, name, args) for name, path in paths.items() if os.path.exists(path)}
    return args


def read_kept(path: str, name: str, args: argparse.Namespace) -> dict:
    """A kept decoding, checked as every result is (store.read_kept) and against its name here: the run, the
    number of tasks and tau the file name gives, and its stamp."""
    record = store.read_kept(path, named_by_fields=False)
    problem = None
    if record["model"] != name:
        problem = f"model: {record['model']!r}, but the file is named for {name}"
    elif len(record["task_ids"]) != args.n or record["task_ids"] != [f"mini2/test/{i}" for i in range(args.n)]:
        problem = f"task_ids: {len(record['task_ids'])} tasks, not the first {args.n} test tasks its name says"
    elif abs(record["tau"] - args.tau) > 1e-9 or record["protocol"] != "test":
        problem = f"tau/protocol: {record['protocol']} at tau {record['tau']:g}, not test at {args.tau:g}"
    elif "digest" not in record:
        problem = "digest: missing (every kept result carries its digests)"
    if problem:
        raise SystemExit(f"{path}: {problem}: restore it (git checkout), or delete it and rate_check.py decodes it again")
    return record


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(1)  # as mini_check.py: a second thread slows a 2.6M model when the other core is busy
    text = table(decode(args), args)
    print(text)
    return text


if __name__ == "__main__":
    main()
