"""The data of Table 2 in miniature, v2 (docs/table2_miniature.md): the multi-step task family (fastdllm/tasks_v2.py).

    python -m fastdllm.mini_data --out_dir=data/mini                           # the corpus and its tokenizer (v1)
    python -m fastdllm.mini_data_v2 --corpus_dir=data/mini --out_dir=data/mini2

Writes into out_dir:
  adapt.jsonl       stage B's instruction mixture: docstring -> function pairs from the corpus' train split (and,
                    with --n_adapt_tasks > 0, task rows of training compositions; the default keeps the task
                    family out of B, as the paper's adaptation data is not its fine-tuning set)
  train.jsonl       stage C's fine-tuning rows: tasks of training compositions in trained wording
  val.jsonl         validation tasks (EvalPlus format): new tasks of training compositions, trained wording
  val_rows.jsonl    the first --n_val_rows validation tasks as conversations: the fixed rows of the validation loss
  test.jsonl        --n_test tasks of held-out compositions in trained wording (EvalPlus format)
  test_reworded.jsonl  the same tasks, with the same ids, in the held-out wording
  build.json        the arguments, counts and the sha256 of every file above
No program of a validation or test task is a training program; held-out pairs and wording appear in no training or
validation file (tests/test_tasks_v2.py reads them back). A second call with the same arguments does nothing.
"""
import argparse
import json
import os
import random
import sys

from tqdm import tqdm

import common
import configurator
from fastdllm import mini_corpus, tasks_v2
from fastdllm.mini_data import docstring_pairs, fits
from fastdllm.prompt import training_messages
from fastdllm.tasks import write_jsonl

SEED = 0
TEST_OFFSET = 3  # the test tasks' generator is seeded seed + TEST_OFFSET
OUTPUTS = ("adapt.jsonl", "train.jsonl", "val.jsonl", "val_rows.jsonl", "test.jsonl", "test_reworded.jsonl")


def task_rows(n: int, rng: random.Random, tokenizer, max_tokens: int, avoid: set, source: str) -> list[dict]:
    """n training conversations of training compositions in trained wording, each fitting max_tokens; each program
    goes into `avoid`, so that validation and test tasks are new programs."""
    rows, tries = [], 0
    for _ in tqdm(range(n), desc=f"{source} rows"):
        while True:
            tries += 1
            if tries > 10 * n + 100:
                raise ValueError(f"only {len(rows)} of {tries} task rows fit --max_tokens={max_tokens}: raise it")
            t = tasks_v2.draw_task(rng, heldout=False)
            row = tasks_v2.sft_row(t, rng, source)
            if fits(tokenizer, row["messages"], max_tokens):
                break
        rows.append(row)
        avoid.add(tasks_v2.code(t))
    return rows


def new_tasks(n: int, rng: random.Random, heldout: bool, avoid: set, prefix: str, split: str) -> list:
    """n (task, EvalPlus row) of held-out or training compositions whose programs are in no training row."""
    out = []
    while len(out) < n:
        t = tasks_v2.draw_task(rng, heldout=heldout)
        if tasks_v2.code(t) in avoid:
            continue
        avoid.add(tasks_v2.code(t))
        out.append((t, tasks_v2.evalplus_row(t, f"{prefix}/{len(out)}", rng, split)))
    return out


def test_tasks(n: int, seed: int = SEED) -> list:
    """The first n (task, EvalPlus row) test tasks, of held-out compositions. No training or validation program can
    be one of them (those hold no held-out pair), so they are drawn without looking at the training rows: anyone can
    rebuild them without the corpus or the tokenizer (scripts/table2/mini_check.py does)."""
    return new_tasks(n, random.Random(seed + TEST_OFFSET), True, set(), "mini2/test", "test")


def reworded(row: dict, t) -> dict:
    """The same test task (id, names, constants, example, inputs) in the held-out wording."""
    t2 = tasks_v2.reword(t, random.Random(0), "heldout")  # the held-out wording draws nothing
    return dict(row, prompt=tasks_v2.stub(t2, row["example"]), wording=list(t2.wording), split="test_reworded")


def build(args: argparse.Namespace) -> dict:
    """The files from the corpus and tokenizer of args.corpus_dir."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(args.corpus_dir, "tokenizer"))
    files = mini_corpus.read_corpus(mini_corpus.fetch_wheels(os.path.join(args.corpus_dir, "wheels")))
    return build_files(args, tokenizer, files)


def build_files(args: argparse.Namespace, tokenizer, files: list[dict]) -> dict:
    """Every file of OUTPUTS and build.json in args.out_dir; files: the corpus (split, text)."""
    os.makedirs(args.out_dir, exist_ok=True)
    rng = random.Random(args.seed)
    avoid: set = set()
    train = task_rows(args.n_train, rng, tokenizer, args.max_tokens, avoid, "tasks")
    adapt_tasks = task_rows(args.n_adapt_tasks, rng, tokenizer, args.max_tokens, avoid, "tasks")
    pairs = [{"messages": training_messages(stub, answer), "source": "docstrings"}
             for stub, answer in tqdm(docstring_pairs(files), desc="docstring pairs")]
    pairs = [p for p in pairs if fits(tokenizer, p["messages"], args.max_tokens)]
    adapt = pairs + adapt_tasks
    random.Random(args.seed + 1).shuffle(adapt)
    val = new_tasks(args.n_val, random.Random(args.seed + 2), False, avoid, "mini2/val", "val")
    val_rows = [tasks_v2.sft_row(t, random.Random(i), "val") for i, (t, _) in enumerate(val[:args.n_val_rows])]
    test = test_tasks(args.n_test, args.seed)
    files_out = {"adapt.jsonl": adapt, "train.jsonl": train, "val.jsonl": [r for _, r in val], "val_rows.jsonl": val_rows,
                 "test.jsonl": [r for _, r in test], "test_reworded.jsonl": [reworded(r, t) for t, r in test]}
    for name, rows in files_out.items():
        write_jsonl(rows, os.path.join(args.out_dir, name))
    summary = dict(args=vars(args), counts={name: len(rows) for name, rows in files_out.items()},
                   adapt_docstrings=len(pairs), adapt_tasks=len(adapt_tasks),
                   heldout_pairs=sorted(list(p) for p in tasks_v2.heldout_pairs()),
                   sha256={name: common.file_sha256(os.path.join(args.out_dir, name)) for name in OUTPUTS})
    with open(os.path.join(args.out_dir, "build.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"wrote {args.out_dir}: " + ", ".join(f"{len(rows)} {name}" for name, rows in files_out.items()))
    return summary


def parse_args(argv: list[str] | None, check_corpus: bool = True) -> argparse.Namespace:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus_dir", default="data/mini", help="python -m fastdllm.mini_data's folder (corpus, tokenizer)")
    p.add_argument("--out_dir", default="data/mini2")
    p.add_argument("--n_train", type=int, default=30000, help="stage C's rows")
    p.add_argument("--n_adapt_tasks", type=int, default=0, help="task rows in stage B's mixture (default: none)")
    p.add_argument("--n_val", type=int, default=400, help="validation tasks (training compositions)")
    p.add_argument("--n_val_rows", type=int, default=64, help="validation rows of the validation loss")
    p.add_argument("--n_test", type=int, default=400, help="test tasks of held-out compositions")
    p.add_argument("--max_tokens", type=int, default=416, help="longest conversation under the chat template")
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args(argv)
    for key, low in (("n_train", 1), ("n_adapt_tasks", 0), ("n_val", 1), ("n_val_rows", 1), ("n_test", 1),
                     ("max_tokens", 64), ("seed", 0)):
        if getattr(args, key) < low:
            raise SystemExit(f"mini_data_v2: --{key} must be >= {low}, got {getattr(args, key)}")
    if args.n_val_rows > args.n_val:
        raise SystemExit(f"mini_data_v2: --n_val_rows={args.n_val_rows} must be <= --n_val={args.n_val}")
    for key in ("tokenizer", "wheels") if check_corpus else ():
        if not os.path.isdir(os.path.join(args.corpus_dir, key)):
            raise SystemExit(f"mini_data_v2: --corpus_dir={args.corpus_dir} has no {key}/: run python -m fastdllm.mini_data first")
    problem = common.folder_problem(args.out_dir)
    if problem:
        raise SystemExit(f"mini_data_v2: --out_dir={args.out_dir} {problem}")
    return args


def built_args(path: str) -> dict:
    """The arguments build.json says the folder was built with; a damaged build.json is one line."""
    try:
        with open(path) as f:
            built = json.load(f)["args"]
        if not isinstance(built, dict):
            raise TypeError
        return built
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise SystemExit(f"mini_data_v2: {path} is damaged (no JSON object with the build's args): delete the folder "
                         "to rebuild it") from None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    done = os.path.join(args.out_dir, "build.json")
    if os.path.exists(done):
        built = built_args(done)
        if built == vars(args):
            return print(f"{args.out_dir} is built with these arguments already (build.json); nothing to do")
        key = next((k for k in sorted(set(vars(args)) | set(built)) if built.get(k) != vars(args).get(k)))
        sys.exit(f"mini_data_v2: {args.out_dir} was built with --{key}={built.get(key)!r}, not {vars(args).get(key)!r}: "
                 "use another --out_dir (or delete it to rebuild)")
    os.makedirs(args.out_dir, exist_ok=True)
    try:
        build(args)
    except ValueError as e:
        sys.exit(f"mini_data_v2: {e}")


if __name__ == "__main__":
    main()
