"""Everything Table 2 in miniature trains and tests on, from pinned registry files (docs/table2_miniature.md).

    python -m fastdllm.mini_data --out_dir=data/mini          # about 2 minutes on 2 cores

Writes into out_dir:
  corpus.json, tokenizer/, train.bin, heldout.bin   the code corpus and its BPE (fastdllm/mini_corpus.py): stage A
  adapt.jsonl       stage B's instruction mixture: docstring -> function pairs from the corpus' train split, plus
                    task rows of the training compositions (fastdllm/tasks.py)
  tasks_train.jsonl stage C's fine-tuning data: task rows of the training compositions
  test.jsonl        the held-out test tasks in EvalPlus format: first the held-out compositions, then new tasks
                    of the training compositions (`eval_code.py --data_path`; --limit=100 gives held-out ones only)
  build.json        the arguments, counts and the sha256 of every file above
Every conversation fits in max_tokens under the chat template (train_fastdllm.py pads a run to its longest row).
A second call with the same arguments does nothing; with other arguments it refuses (they change the files).
"""
import argparse
import ast
import json
import os
import random
import sys
import textwrap

from tqdm import tqdm

import common
import configurator
from fastdllm import mini_corpus, tasks
from fastdllm.prompt import training_messages

SEED = 0  # the default --seed; the test tasks come from their own generator, seeded seed + TEST_OFFSET
TEST_OFFSET = 2
TEST_SEED = SEED + TEST_OFFSET  # the study's test tasks (scripts/table2/mini_check.py rebuilds the held-out ones)
MAX_VOCAB = 2 ** 16  # train.bin and heldout.bin hold uint16 token ids
OUTPUTS = ("adapt.jsonl", "tasks_train.jsonl", "test.jsonl", "train.bin", "heldout.bin", "corpus.json")


def docstring_pairs(files: list[dict]) -> list[tuple[str, str]]:
    """(stub, function) for every top-level function with a docstring in the corpus' train split, at most 25
    lines: the stub is its signature and docstring, the answer the whole function without the docstring."""
    pairs = []
    for f in files:
        if f["split"] != "train":
            continue
        try:
            tree = ast.parse(f["text"])
        except (SyntaxError, ValueError):
            continue
        lines = f["text"].splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not ast.get_docstring(node) or node.decorator_list:
                continue
            if node.end_lineno - node.lineno > 25 or len(node.body) < 2:
                continue
            doc = node.body[0]
            head = lines[node.lineno - 1:node.body[0].lineno - 1]
            if not head or not head[-1].rstrip().endswith(":"):
                continue  # a signature sharing its line with the docstring
            stub = "\n".join(head + lines[doc.lineno - 1:doc.end_lineno]) + "\n"
            answer = "\n".join(head + lines[node.body[1].lineno - 1:node.end_lineno]) + "\n"
            pairs.append((textwrap.dedent(stub), textwrap.dedent(answer)))
    return pairs


def fits(tokenizer, messages: list[dict], max_tokens: int) -> bool:
    from fastdllm.data import tokenize_conversation
    return len(tokenize_conversation(tokenizer, messages, max_length=10 ** 6)[0]) <= max_tokens


def task_rows(n: int, comps: list, rng: random.Random, tokenizer, max_tokens: int, avoid: set) -> list[dict]:
    """n training conversations of the given compositions, each fitting max_tokens; the code of each is added to
    `avoid` (so that the test's tasks of seen compositions are new functions)."""
    rows, tries = [], 0
    bar = tqdm(total=n, desc="task rows")
    while len(rows) < n:
        tries += 1
        if tries > 10 * n + 100:
            raise ValueError(f"only {len(rows)} of {tries} task rows fit --max_tokens={max_tokens}: raise it")
        t = tasks.draw_task(rng.choice(comps), rng)
        row = tasks.sft_row(t, rng)
        if fits(tokenizer, row["messages"], max_tokens):
            rows.append(row)
            avoid.add(tasks.code(t))
            bar.update(1)
    bar.close()
    return rows


def test_rows(n_each: int, train_comps: list, seed: int, avoid: set) -> list[dict]:
    """n_each tasks of held-out compositions (tasks.heldout_tests: the same on every machine, whatever the
    tokenizer), then n_each of training compositions whose function appears in no training row."""
    rng = random.Random(seed)
    rows = tasks.heldout_tests(n_each, rng)
    made = 0
    while made < n_each:
        t = tasks.draw_task(rng.choice(train_comps), rng)
        if tasks.code(t) in avoid:
            continue
        avoid.add(tasks.code(t))
        rows.append(tasks.evalplus_row(t, f"mini/seen/{made}", rng, "seen"))
        made += 1
    return rows


def build(args: argparse.Namespace) -> dict:
    """The corpus and tokenizer (once), then the task files."""
    from transformers import AutoTokenizer
    corpus = os.path.join(args.out_dir, "corpus.json")
    if not os.path.exists(corpus):
        mini_corpus.build(args.out_dir, args.vocab_size)
    with open(corpus) as f:
        if json.load(f)["vocab_size"] != args.vocab_size:
            raise ValueError(f"{corpus} has another vocabulary size than --vocab_size={args.vocab_size}: use another --out_dir")
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(args.out_dir, "tokenizer"))
    files = mini_corpus.read_corpus(mini_corpus.fetch_wheels(os.path.join(args.out_dir, "wheels")))
    return build_tasks(args, tokenizer, files)


def build_tasks(args: argparse.Namespace, tokenizer, files: list[dict]) -> dict:
    """adapt.jsonl, tasks_train.jsonl, test.jsonl and build.json in args.out_dir; files: the corpus (split, text)."""
    out = args.out_dir
    rng = random.Random(args.seed)
    heldout = sorted(tasks.heldout_compositions())
    train_comps = [c for c in tasks.compositions() if c not in set(heldout)]
    avoid = set()
    tuning = task_rows(args.n_tasks_train, train_comps, rng, tokenizer, args.max_tokens, avoid)
    adapt_tasks = task_rows(args.n_adapt_tasks, train_comps, rng, tokenizer, args.max_tokens, avoid)
    pairs = [{"messages": training_messages(stub, answer), "source": "docstrings"}
             for stub, answer in tqdm(docstring_pairs(files), desc="docstring pairs")]
    pairs = [p for p in pairs if fits(tokenizer, p["messages"], args.max_tokens)]
    adapt = pairs + adapt_tasks
    random.Random(args.seed + 1).shuffle(adapt)
    test = test_rows(args.n_test_each, train_comps, args.seed + TEST_OFFSET, avoid)
    tasks.write_jsonl(tuning, os.path.join(out, "tasks_train.jsonl"))
    tasks.write_jsonl(adapt, os.path.join(out, "adapt.jsonl"))
    tasks.write_jsonl(test, os.path.join(out, "test.jsonl"))
    summary = dict(args=vars(args), counts=dict(tasks_train=len(tuning), adapt_docstrings=len(pairs),
                                                adapt_tasks=len(adapt_tasks), test=len(test)),
                   heldout_compositions=[list(c) for c in heldout],
                   sha256={name: common.file_sha256(os.path.join(out, name)) for name in OUTPUTS
                           if os.path.exists(os.path.join(out, name))})
    with open(os.path.join(out, "build.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"wrote {out}: {len(tuning)} tuning rows, {len(pairs)} docstring pairs + {len(adapt_tasks)} task rows to "
          f"adapt on, {len(test)} test tasks ({args.n_test_each} of held-out compositions first)")
    return summary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out_dir", default="data/mini")
    p.add_argument("--vocab_size", type=int, default=4096)
    p.add_argument("--n_tasks_train", type=int, default=20000, help="stage C's rows")
    p.add_argument("--n_adapt_tasks", type=int, default=8000, help="task rows in stage B's mixture")
    p.add_argument("--n_test_each", type=int, default=200, help="test tasks of held-out and of seen compositions, each")
    p.add_argument("--max_tokens", type=int, default=256, help="longest conversation under the chat template")
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args(argv)
    for key, low in (("vocab_size", 300), ("n_tasks_train", 1), ("n_adapt_tasks", 1), ("n_test_each", 1),
                     ("max_tokens", 64), ("seed", 0)):
        if getattr(args, key) < low:
            raise SystemExit(f"mini_data: --{key} must be >= {low}, got {getattr(args, key)}")
    if args.vocab_size > MAX_VOCAB:
        raise SystemExit(f"mini_data: --vocab_size must be <= {MAX_VOCAB} (train.bin holds uint16 ids), got {args.vocab_size}")
    problem = common.folder_problem(args.out_dir)
    if problem:  # checked here, not when the first file is written after minutes of building
        raise SystemExit(f"mini_data: --out_dir={args.out_dir} {problem}")
    return args


def built_args(path: str) -> dict:
    """The arguments recorded in a finished build's build.json (one line naming the file when it is broken)."""
    try:
        with open(path) as f:
            return json.load(f)["args"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise SystemExit(f"mini_data: {path} is cut short or not a build record ({type(e).__name__}: {e}): "
                         "delete it to build again") from None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    done = os.path.join(args.out_dir, "build.json")
    if os.path.exists(done):
        built = built_args(done)
        if built == vars(args):
            print(f"{args.out_dir} is built with these arguments already (build.json); nothing to do")
            return
        key = next(k for k in sorted(set(built) | set(vars(args))) if built.get(k) != vars(args).get(k))
        sys.exit(f"mini_data: {args.out_dir} was built with --{key}={built.get(key)!r}, not {vars(args).get(key)!r}: "
                 "use another --out_dir (or delete it to rebuild)")
    os.makedirs(args.out_dir, exist_ok=True)
    try:
        build(args)
    except ValueError as e:
        sys.exit(f"mini_data: {e}")


if __name__ == "__main__":
    main()
