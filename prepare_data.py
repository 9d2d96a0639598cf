"""Prepare the Sudoku data: one array file per split for training, plus a parquet file with every column.

    python prepare_data.py                                   # offline default: generate 50k/1k/2k puzzles (~4 min, 2 cores)
    python prepare_data.py --derive                          # + Tim Vink's solver fields: trajectory, num_steps, strategies_used
    python prepare_data.py --source=hf                       # the paper's data set from the Hugging Face hub
    python prepare_data.py --source=file --path=my.csv       # your puzzles: CSV / parquet / JSONL / text, one puzzle a line
    python prepare_data.py --source=larsdoku --out_dir=data/sudoku-hard   # hard puzzles (pip install larsdoku, AGPL)
    python prepare_data.py --hard --out_dir=data/sudoku-gen-hard         # license-free: the generator's hard mode
    python prepare_data.py --source=standin --out_dir=data/sudoku-standin   # offline stand-in for Sudoku-Extreme's mix

Output (default data/sudoku/):
  {train,val,test}.npy      (N, 2, 81) uint8 question / answer digits, what training reads (sudoku/data.py)
  {train,val,test}.parquet  columns source, question, answer, rating (+ trajectory, num_steps,
                            strategies_used, derive_status after --derive): the cohorts and inspection
  top1465.parquet           Top1465, an evaluation set only (when larsdoku is installed): `sample.py --data=...`
  test_hard.parquet         --source=standin: the test split's hard cohort (rating at or above its 87th percentile)
  meta.json                 the arguments: the same arguments again reuse the data instead of rebuilding it

No puzzle, and no symmetric copy of one (digit relabelling, row/column/band/stack permutations,
transposition: sudoku/symmetry.py), sits in two splits; later splits win (test, then val). Train and val
also lose every symmetric copy of a Top1465 puzzle, so Top1465 stays a clean test set. The one exception
is the hub (--source=hf): the paper's Sudoku-Extreme is kept exactly as published, since Table 1 reads
its test split as it is ("the first 2,000 test puzzles"; Top1465 is one of its sources); the overlaps
are counted and printed, and --drop_overlap drops them as for every other source.

The steps, in the order main() runs them: the arguments' cache key; the splits from the source
(generate_splits / load_hub_splits / a checked file, sudoku/puzzle_files.py); the solver fields
(sudoku/solver_fields.py) with --derive; the files. (The Fast-dLLM v2 SFT data has its own script,
fastdllm/data.py.)
"""
import argparse
import functools
import json
import math
import multiprocessing
import os
import sys
import time
from collections import Counter, defaultdict

import numpy as np
import pandas as pd
from tqdm import tqdm

import common
import configurator
import sudoku.board
import sudoku.hard
import sudoku.standin
from sudoku.puzzle_files import check_puzzles, read_puzzle_file, solve_row, strings_to_digits
from sudoku.puzzle_files import load_puzzles  # noqa: F401  (evaluation scripts load puzzles through prepare_data)
from sudoku.solver_fields import DERIVED_COLUMNS, TIERS, deduction_only_mask, derive_one, hardest_tier
from sudoku.data import DATA_DIR, SPLITS, save_split, split_path
from sudoku.symmetry import equivalent, invariant_keys

HUB_DATASET = "brozonoyer/sapientinc-sudoku-extreme-timvink-sudoku-solver"  # the paper's data (sapientinc + Tim's solver)
DEFAULT_SIZES = {"train": 50_000, "val": 1_000, "test": 2_000}  # generate: ~4 min on 2 cores, fits the CPU presets
# 2: splits disjoint up to symmetry, and Top1465's symmetric copies dropped from train and val
SPLIT_RULES_VERSION = 2


def pool_map(fn, items: list, workers: int, desc: str, chunksize: int = 64) -> list:
    """fn over items in order, in `workers` processes, with a progress bar; the order makes results worker-count independent."""
    if workers <= 1 or len(items) < 2 * chunksize:
        return [fn(x) for x in tqdm(items, desc=desc, disable=len(items) < 100, leave=False)]
    with multiprocessing.Pool(workers) as pool:
        return list(tqdm(pool.imap(fn, items, chunksize=chunksize), total=len(items), desc=desc, leave=False))


# -----------------------------------------------------------------------------
# arguments and the cache key

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = configurator.ArgumentParser(description="Prepare the Sudoku data (see the module docstring).",
                                  epilog="The Fast-dLLM v2 SFT data: python -m fastdllm.data -h")
    p.add_argument("--source", choices=["generate", "hf", "file", "larsdoku", "standin"], default="generate",
                   help="standin: Sudoku-Extreme's easy/hard mix offline (sudoku/standin.py)")
    p.add_argument("--collections", default=",".join(sudoku.hard.LARSDOKU_COLLECTIONS),
                   help="larsdoku: comma-separated sub-collections (default: all)")
    p.add_argument("--path", help="--source=file: CSV / parquet / JSONL / text file of puzzles")
    p.add_argument("--out_dir", default=DATA_DIR)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hard", action="store_true", help="generate: minimal puzzles that singles cannot finish, "
                   "train multiplied by --augment symmetric copies (val and test: one per seed)")
    p.add_argument("--augment", type=int, default=10, help="generate --hard: copies of each train seed (1 = none)")
    p.add_argument("--min_clues", type=int, default=17, help="generate: fewest clues; below ~22 a puzzle stops at minimal")
    p.add_argument("--max_clues", type=int, default=45, help="generate: most clues (targets are uniform in between)")
    p.add_argument("--n_train", type=int, help=f"default {DEFAULT_SIZES['train']} (generate), "
                   f"{sudoku.standin.DEFAULT_TRAIN:,} (standin) / all (hf, file, larsdoku)")
    p.add_argument("--n_val", type=int, help=f"default {DEFAULT_SIZES['val']} (file: at most a tenth)")
    p.add_argument("--n_test", type=int, help=f"default {DEFAULT_SIZES['test']} (hf: the whole test split; file: at most a tenth)")
    p.add_argument("--derive", action="store_true", help="add trajectory, num_steps, strategies_used with Tim Vink's solver")
    p.add_argument("--derive_splits", default=",".join(SPLITS),
                   help="--derive: which of train, val, test, top1465 (the hard corpus' train split takes days)")
    p.add_argument("--derive_timeout", type=float, default=10.0, help="seconds per puzzle before it counts as brute force")
    p.add_argument("--skip_invalid", action="store_true", help="drop bad rows (counted per reason) instead of stopping")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--force", action="store_true", help="rebuild even if out_dir holds data made with the same arguments")
    p.add_argument("--drop_overlap", action="store_true", help="--source=hf: drop repeated puzzles and symmetric "
                   "copies of later splits' and Top1465's puzzles, as every other source does (default: the hub's "
                   "splits exactly as published, the overlaps reported)")
    args, unknown = p.parse_known_args(argv)
    if unknown:  # --task=sft was this script's way to the Fast-dLLM data before it got its own
        sft = "; the Fast-dLLM v2 SFT data: python -m fastdllm.data" if any(a.startswith("--task") for a in unknown) else ""
        p.error(f"unrecognized arguments: {' '.join(unknown)}{sft}")
    if not 0 <= args.min_clues <= args.max_clues <= sudoku.board.N_CELLS:
        p.error(f"need 0 <= --min_clues <= --max_clues <= 81, got {args.min_clues} and {args.max_clues}")
    for key in ("n_train", "n_val", "n_test"):
        if getattr(args, key) is not None and getattr(args, key) < 0:
            p.error(f"--{key} must be >= 0")
    if args.source == "standin" and args.n_test == 0:
        p.error("--n_test must be >= 1 with --source=standin (test_hard.parquet is its test split's hard cohort)")
    if args.seed < 0:
        p.error(f"--seed must be >= 0 (it seeds numpy's generators), got {args.seed}")
    if args.source == "file" and not args.path:
        p.error("--source=file needs --path=<csv / parquet / jsonl / txt file>")
    if args.path and args.source != "file":
        p.error(f"--path is read by --source=file only (--source={args.source} would ignore your puzzles)")
    if args.path and not os.path.isfile(args.path):
        p.error(f"--path={args.path}: no such file")
    problem = common.folder_problem(args.out_dir)
    if problem:
        p.error(f"--out_dir={args.out_dir} {problem}")
    if args.drop_overlap and args.source != "hf":
        p.error("--drop_overlap is for --source=hf: every other source always drops overlaps")
    if args.hard and args.source != "generate":
        p.error("--hard is a mode of --source=generate (--source=standin uses it for its hard share without larsdoku)")
    if args.augment < 1:
        p.error("--augment must be >= 1")
    collections = [c.strip() for c in args.collections.split(",") if c.strip()]
    if not collections or set(collections) - set(sudoku.hard.LARSDOKU_COLLECTIONS):
        p.error(f"--collections: choose from {', '.join(sudoku.hard.LARSDOKU_COLLECTIONS)}, got {args.collections}")
    args.derive_splits = [x.strip() for x in args.derive_splits.split(",") if x.strip()]
    if not args.derive_splits or set(args.derive_splits) - {*SPLITS, "top1465"}:
        p.error(f"--derive_splits: choose from train, val, test, top1465, got {','.join(args.derive_splits)}")
    if not 0 < args.derive_timeout < math.inf:
        p.error(f"--derive_timeout must be a finite number of seconds > 0, got {args.derive_timeout}")
    if args.workers < 1:
        p.error(f"--workers must be >= 1, got {args.workers}")
    return args


def _cache_key(args: argparse.Namespace) -> dict:
    """Everything that changes the puzzles (not --derive, which only adds columns, nor speed settings)."""
    key = {k: getattr(args, k) for k in ("source", "seed", "n_train", "n_val", "n_test", "skip_invalid")}
    key["split_rules"] = SPLIT_RULES_VERSION
    if args.source in ("larsdoku", "standin"):
        key["collections"] = args.collections
    if args.source == "standin":
        key.update(min_clues=args.min_clues, max_clues=args.max_clues, generator=sudoku.board.GENERATOR_VERSION,
                   standin=sudoku.standin.VERSION, hard_source=sudoku.standin.hard_source())
        if key["hard_source"] == "generator":  # the hard share then holds --augment copies of each train seed
            key["augment"] = args.augment
    if args.source == "generate":
        key.update(min_clues=args.min_clues, max_clues=args.max_clues, generator=sudoku.board.GENERATOR_VERSION)
        if args.hard:
            key.update(hard=True, augment=args.augment)
    if args.source == "hf":
        key["dataset"] = os.environ.get("RELAY_SUDOKU_HF_DATASET") or HUB_DATASET
        key["hub_splits"] = "overlaps dropped" if args.drop_overlap else "as published"
    if args.source == "file":
        st = os.stat(args.path)
        key.update(path=os.path.abspath(args.path), size=st.st_size, mtime_ns=st.st_mtime_ns)
    return key


def _derived_splits(meta: dict) -> set[str]:
    """The splits that carry the solver fields (older meta.json files say True for all three)."""
    derived = meta.get("derived")
    return set(SPLITS) if derived is True else set(derived or ())


def _read_meta(out_dir: str) -> dict | None:
    try:
        with open(os.path.join(out_dir, "meta.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# -----------------------------------------------------------------------------
# sources

def generate_one(seed: int, stream: int, index: int, min_clues: int, max_clues: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Puzzle `index` of random stream `stream` (the splits use 0, 1, 2): (puzzle, solution, rating),
    digits with 0 = blank, and a clue count uniform in [min_clues, max_clues]. One generator per
    (seed, stream, index), so a data set does not depend on the worker count."""
    rng = np.random.default_rng([seed, stream, index])
    return sudoku.board.generate_puzzle(rng, int(rng.integers(min_clues, max_clues + 1)))


def _generate_one(job: tuple) -> tuple[str, str, int]:
    puzzle, solution, rating = generate_one(*job)
    return sudoku.board.format_board(puzzle), sudoku.board.format_board(solution), rating


def generate_splits(seed: int, sizes: dict[str, int], min_clues: int, max_clues: int,
                    workers: int) -> tuple[dict[str, pd.DataFrame], int]:
    """Fresh puzzles for each split with no puzzle in two splits; also returns how many duplicates were replaced.

    Each split has its own random stream, so the test set stays the same when --n_train changes.
    """
    seen: set[str] = set()
    frames, duplicates = {}, 0
    for stream, split in reversed(list(enumerate(SPLITS))):  # test first: it never loses a puzzle to train
        rows, start = [], 0
        while len(rows) < sizes[split]:
            need = sizes[split] - len(rows)
            jobs = [(seed, stream, i, min_clues, max_clues) for i in range(start, start + need)]
            start += need
            for question, answer, rating in pool_map(_generate_one, jobs, workers, f"generating {split}", chunksize=16):
                if question in seen:
                    duplicates += 1
                    continue
                seen.add(question)
                rows.append((f"generated-seed{seed}", question, answer, rating))
        frames[split] = pd.DataFrame(rows, columns=["source", "question", "answer", "rating"])
    return {s: frames[s] for s in SPLITS}, duplicates


def _caused_by(e: BaseException | None, kind: type) -> bool:
    while e is not None:
        if isinstance(e, kind):
            return True
        e = e.__cause__ or e.__context__
    return False


def load_hub_splits(name: str | None = None) -> dict[str, pd.DataFrame]:
    """The hub data set's train and test splits as frames (a local directory of its files works too, also offline)."""
    name = name or os.environ.get("RELAY_SUDOKU_HF_DATASET") or HUB_DATASET
    import datasets  # slow import, only needed here

    try:
        try:
            ds = datasets.load_dataset(name)
        except Exception as e:
            if not _caused_by(e, OverflowError):
                raise
            # sapientinc/sudoku-extreme is CSV: its 81-digit answers look like integers to the type
            # inference and overflow, so read its four columns as declared text instead
            text = datasets.Value("string")
            features = datasets.Features(source=text, question=text, answer=text, rating=datasets.Value("int64"))
            ds = datasets.load_dataset(name, features=features)
    except Exception as e:  # offline, unknown id, no access: all end the same way for the user
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise SystemExit(f"could not load the Sudoku data set '{name}' ({type(e).__name__}: {first}); "
                         "offline, use --source=generate (the default) or --source=file --path=<your puzzles>") from None
    missing = [s for s in ("train", "test") if s not in ds]
    if missing:
        raise SystemExit(f"data set '{name}' has no {' or '.join(missing)} split (it has: {', '.join(ds)})")
    return {split: ds[split].to_pandas() for split in ("train", "test")}


def _split_in_order(frame: pd.DataFrame, sizes: dict[str, int | None]) -> dict[str, pd.DataFrame]:
    """test = last n_test rows, val = the n_val rows before them, train = the first n_train of the rest."""
    n_val, n_test = sizes["val"], sizes["test"]
    if n_val + n_test >= len(frame):
        raise SystemExit(f"only {len(frame)} puzzles: not enough for --n_val={n_val} and --n_test={n_test} plus training")
    rest = len(frame) - n_val - n_test
    n_train = rest if sizes["train"] is None else min(sizes["train"], rest)
    return {"train": frame.iloc[:n_train], "val": frame.iloc[rest:rest + n_val], "test": frame.iloc[rest + n_val:]}


def _drop_overlap(splits: dict[str, pd.DataFrame], held_out: pd.DataFrame | None = None, drop: bool = True) -> list[str]:
    """Remove puzzles repeated within a split, and from train/val every puzzle that is a symmetric copy
    of one in a later split (test wins) or in `held_out` (Top1465), and from test its copies of held_out.
    Returns what was dropped, as notes; drop=False only counts them (the hub's splits as published)."""
    notes = []
    later = defaultdict(list)  # invariant key -> digit boards of the later splits (and held_out)
    if held_out is not None:
        boards = strings_to_digits(held_out["question"])
        for key, board in zip(invariant_keys(boards), boards):
            later[key].append(board)
    for split in reversed(SPLITS):
        frame = splits[split]
        boards = strings_to_digits(frame["question"])
        keys = invariant_keys(boards)
        repeated = frame["question"].duplicated().to_numpy()
        copy = np.array([any(equivalent(b, board) for b in later.get(key, ())) for key, board in zip(keys, boards)],
                        dtype=bool)
        verb = "dropped" if drop else "kept (as published; --drop_overlap drops them)"
        if repeated.any():
            notes.append(f"{split}: {int(repeated.sum())} repeated puzzles, {verb}")
        if copy.any():
            what = "Top1465's" if split == SPLITS[-1] else ("a later split's" + (" or Top1465's" if held_out is not None
                                                                                 else ""))
            notes.append(f"{split}: {int(copy.sum())} symmetric copies of {what} puzzles, {verb}")
        keep = ~(repeated | copy) if drop else np.ones(len(frame), dtype=bool)
        splits[split] = frame[keep].reset_index(drop=True)
        if split != SPLITS[0]:  # nothing comes before train: its puzzles need not be remembered
            for key, board in zip(np.array(keys, dtype=object)[keep], boards[keep]):
                later[key].append(board)
    return notes


def top1465_if_installed() -> pd.DataFrame | None:
    """Top1465 with solutions when larsdoku is installed, else None (the splits are then not checked against it)."""
    try:
        return sudoku.hard.read_top1465()
    except sudoku.hard.MissingPackage:
        return None


def generate_hard_splits(seed: int, sizes: dict[str, int], augment: int, workers: int) -> dict[str, pd.DataFrame]:
    """Hard seeds (sudoku.hard.hard_seed) drawn per split from its own stream until there are enough:
    val and test one puzzle per seed, train `augment` symmetric copies of each."""
    frames = {}
    for stream, split in enumerate(SPLITS):
        copies = augment if split == "train" else 1
        need, rows, start = -(-sizes[split] // copies), [], 0
        while len(rows) < need:
            jobs = [(seed, 100 + stream, i) for i in range(start, start + 2 * (need - len(rows)) + 16)]
            start += len(jobs)
            found = pool_map(sudoku.hard._hard_seed_job, jobs, workers, f"hard {split} seeds", chunksize=16)
            rows += [r for r in found if r is not None]
            if start > 50 * need + 1000 and len(rows) < need / 10:  # about 60% of minimal puzzles qualify
                raise SystemExit(f"the hard generator found {len(rows)} hard seeds in {start} tries: a bug, not bad luck")
        seeds = pd.DataFrame(rows[:need], columns=["question", "answer", "rating"])
        frame = sudoku.hard.augment(seeds, copies, seed).iloc[:sizes[split]]
        frame.insert(0, "source", f"generated-hard-seed{seed}")
        frames[split] = frame.reset_index(drop=True)
    return frames


def generated_splits(args: argparse.Namespace) -> tuple[dict[str, pd.DataFrame], list[str]]:
    sizes = {s: DEFAULT_SIZES[s] if getattr(args, f"n_{s}") is None else getattr(args, f"n_{s}") for s in SPLITS}
    if args.hard:
        splits = generate_hard_splits(args.seed, sizes, args.augment, args.workers)
        return splits, [f"hard: minimal puzzles that singles cannot finish; train = {args.augment} symmetric copies "
                        "of each seed, val and test one puzzle per seed"]
    splits, dups = generate_splits(args.seed, sizes, args.min_clues, args.max_clues, args.workers)
    return splits, [f"{dups} generated puzzles repeated an earlier one and were replaced"] if dups else []


def hub_splits(args: argparse.Namespace) -> tuple[dict[str, pd.DataFrame], list[str]]:
    name = os.environ.get("RELAY_SUDOKU_HF_DATASET") or HUB_DATASET
    hub = load_hub_splits(name)
    n_val = DEFAULT_SIZES["val"] if args.n_val is None else args.n_val
    if n_val >= len(hub["train"]):
        raise SystemExit(f"the hub train split has {len(hub['train'])} rows: --n_val={n_val} leaves none for training")
    rest = len(hub["train"]) - n_val
    n_train = rest if args.n_train is None else min(args.n_train, rest)
    # val is held out from the END of the hub's train split; test is the hub's test split in its order
    # (the paper's evaluation slices are its first rows)
    raw = {"train": hub["train"].iloc[:n_train], "val": hub["train"].iloc[rest:],
           "test": hub["test"] if args.n_test is None else hub["test"].iloc[:args.n_test]}
    notes = [f"val = the last {n_val} rows of {name} [train]; test = the first {len(raw['test'])} rows of [test]"]
    splits = {}
    for split, frame in raw.items():
        # trusted source (sapientinc: every puzzle unique): cheap checks only, the solver would take hours here
        where = [f"row {i + 1}" for i in range(len(frame))]
        splits[split], dropped = check_puzzles(frame.reset_index(drop=True), where, f"{name} [{split}]",
                                               args.skip_invalid)
        if "answer" not in splits[split] or splits[split]["answer"].isna().any():
            raise SystemExit(f"{name} [{split}] has puzzles without an answer: use --source=file, which solves them")
        notes += [f"dropped from {split}: {n} x {r}" for r, n in dropped.items()]
    return splits, notes


def file_splits(args: argparse.Namespace) -> tuple[dict[str, pd.DataFrame], list[str]]:
    try:
        frame, where = read_puzzle_file(args.path)
        solve_all = functools.partial(pool_map, solve_row, workers=args.workers, desc="solving")
        frame, dropped = check_puzzles(frame, where, args.path, args.skip_invalid, solve_all)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    notes = [f"dropped {n} x {r}" for r, n in dropped.items()]
    if "source" not in frame:
        frame.insert(0, "source", os.path.basename(args.path))
    frame = frame.drop_duplicates("question").reset_index(drop=True)  # counted in build, with the split overlap
    tenth = max(1, len(frame) // 10)
    sizes = {"train": args.n_train,
             "val": min(DEFAULT_SIZES["val"], tenth) if args.n_val is None else args.n_val,
             "test": min(DEFAULT_SIZES["test"], tenth) if args.n_test is None else args.n_test}
    notes.append(f"split in file order: train = first rows, val = next {sizes['val']}, test = last {sizes['test']}")
    return _split_in_order(frame, sizes), notes


def larsdoku_splits(args: argparse.Namespace) -> tuple[dict[str, pd.DataFrame], list[str]]:
    collections = tuple(c.strip() for c in args.collections.split(",") if c.strip())
    frame = sudoku.hard.read_larsdoku(collections)
    sizes = {"train": args.n_train, "val": DEFAULT_SIZES["val"] if args.n_val is None else args.n_val,
             "test": DEFAULT_SIZES["test"] if args.n_test is None else args.n_test}
    splits = sudoku.hard.split_by_class(frame, sizes, args.seed)
    return splits, [f"larsdoku {','.join(collections)}: {len(frame)} puzzles, split by symmetry class "
                    f"(val and test: one puzzle per class)"]


def standin_splits(args: argparse.Namespace) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Sudoku-Extreme's composition (sudoku/standin.py): each split about 26% easy generated puzzles and 74%
    hard ones (larsdoku split by symmetry class, or the generator's hard mode), shuffled, every puzzle rated."""
    sizes = {"train": sudoku.standin.DEFAULT_TRAIN if args.n_train is None else args.n_train,
             "val": DEFAULT_SIZES["val"] if args.n_val is None else args.n_val,
             "test": DEFAULT_SIZES["test"] if args.n_test is None else args.n_test}
    easy_sizes, hard_sizes = sudoku.standin.shares(sizes)
    easy, _ = generate_splits(args.seed, easy_sizes, args.min_clues, args.max_clues, args.workers)
    if sudoku.standin.hard_source() == "larsdoku":
        collections = tuple(c.strip() for c in args.collections.split(",") if c.strip())
        hard = sudoku.hard.split_by_class(sudoku.hard.read_larsdoku(collections), hard_sizes, args.seed)
        where = f"larsdoku {','.join(collections)}, split by symmetry class"
    else:
        hard = generate_hard_splits(args.seed, hard_sizes, args.augment, args.workers)
        where = f"the generator's hard mode (larsdoku not installed), train {args.augment} copies of each seed"
    splits = {}
    for stream, split in enumerate(SPLITS):
        frame = pd.concat([easy[split], hard[split]], ignore_index=True)
        order = np.random.default_rng([args.seed, 200 + stream]).permutation(len(frame))  # any prefix has the mix
        splits[split] = frame.iloc[order].reset_index(drop=True)
    rate = functools.partial(pool_map, sudoku.standin.rate_question, workers=args.workers, chunksize=256)
    splits = sudoku.standin.rated(splits, rate)
    share = 100 * sudoku.standin.HARD_SHARE
    return splits, [f"standin: {100 - share:.0f}% easy ({args.min_clues}-{args.max_clues} clues, the generator) + "
                    f"{share:.0f}% hard ({where}) per split"]


SOURCES = {"generate": generated_splits, "hf": hub_splits, "file": file_splits, "larsdoku": larsdoku_splits,
           "standin": standin_splits}


def build(args: argparse.Namespace) -> tuple[dict[str, pd.DataFrame], list[str], pd.DataFrame | None]:
    """The three splits for the chosen source, notes for the summary (what was dropped and why) and Top1465
    (None without larsdoku). The source comes first: a bad file fails before Top1465 is solved."""
    splits, notes = SOURCES[args.source](args)
    top1465 = top1465_if_installed()
    notes += _drop_overlap(splits, top1465, drop=args.source != "hf" or args.drop_overlap)
    if top1465 is None:
        notes.append("larsdoku not installed: the splits were not checked against Top1465")
    return splits, notes, top1465


# -----------------------------------------------------------------------------
# the solver fields, the files, the summary

def derive(frame: pd.DataFrame, workers: int, time_limit: float, desc: str = "deriving") -> pd.DataFrame:
    """Frame + trajectory, num_steps, strategies_used, derive_status, with Tim Vink's solver."""
    jobs = [(q, a, time_limit) for q, a in zip(frame["question"], frame["answer"])]
    rows = pool_map(derive_one, jobs, workers, desc, chunksize=8)
    out = frame.copy()
    for col in DERIVED_COLUMNS:
        out[col] = [r[col] for r in rows]
    return out


def _write_splits(splits: dict[str, pd.DataFrame], out_dir: str, meta: dict, top1465: pd.DataFrame | None) -> None:
    os.makedirs(out_dir, exist_ok=True)
    meta_path = os.path.join(out_dir, "meta.json")
    if os.path.exists(meta_path):
        os.remove(meta_path)  # the data is only complete (and reusable) once meta.json is back
    for split, frame in splits.items():
        path = os.path.join(out_dir, f"{split}.parquet")
        frame.to_parquet(path + ".tmp", index=False)
        os.replace(path + ".tmp", path)
        save_split(split_path(out_dir, split), strings_to_digits(frame["question"]), strings_to_digits(frame["answer"]))
    if top1465 is not None:
        top1465.to_parquet(os.path.join(out_dir, "top1465.parquet"), index=False)
    if meta["key"]["source"] == "standin":
        sudoku.standin.hard_cohort(splits["test"]).to_parquet(os.path.join(out_dir, "test_hard.parquet"), index=False)
    with open(meta_path + ".tmp", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(meta_path + ".tmp", meta_path)


def summarize(splits: dict[str, pd.DataFrame]) -> str:
    """Counts, clue and rating statistics per split, a clue histogram and, if derived, cohort sizes."""
    lines = [f"{'split':<6} {'puzzles':>8} {'clues min/mean/max':>19} {'rating mean/max':>16}"]
    clues_all = []
    for split, frame in splits.items():
        clues = (strings_to_digits(frame["question"]) > 0).sum(axis=1) if len(frame) else np.zeros(1, dtype=int)
        clues_all.append(clues[: len(frame)])
        rating = frame["rating"].to_numpy(dtype=float) if "rating" in frame and len(frame) else np.zeros(1)
        lines.append(f"{split:<6} {len(frame):>8} {clues.min():>7} /{clues.mean():>5.1f} /{clues.max():>3}"
                     f" {np.nanmean(rating):>9.1f} /{np.nanmax(rating):>5.0f}")
    clues = np.concatenate(clues_all)
    if clues.size:
        counts = np.bincount(clues, minlength=sudoku.board.N_CELLS + 1)
        lines.append("clue histogram (all splits):")
        top = counts.max()
        for c in range(clues.min(), clues.max() + 1):
            lines.append(f"  {c:>2} clues {counts[c]:>7}  {'#' * int(round(40 * counts[c] / top))}")
    return "\n".join(lines + cohort_lines(splits))


def cohort_lines(frames: dict[str, pd.DataFrame]) -> list[str]:
    """Per derived frame: deduction-only count, puzzles per hardest strategy tier, solver steps, failures."""
    lines = []
    derived = {split: frame for split, frame in frames.items() if "strategies_used" in frame}
    if derived:
        lines.append(f"{'split':<7} {'deduction_only':>14}  hardest strategy tier: " + " / ".join(TIERS)
                     + "   num_steps mean/max   not derived (timeout / stuck / error)")
        for split, frame in derived.items():
            tiers = Counter(hardest_tier(v) for v in frame["strategies_used"])
            status = Counter(str(s).split(":")[0] for s in frame.get("derive_status", []))
            steps = frame["num_steps"].to_numpy(dtype=float) if len(frame) else np.zeros(1)
            lines.append(f"{split:<7} {int(deduction_only_mask(frame).sum()):>14}  "
                         + " / ".join(str(tiers[t]) for t in TIERS)
                         + f"   {steps.mean():.1f} / {steps.max():.0f}"
                         + f"   {status['timeout']} / {status['stuck']} / {status['error']}")
    return lines


# -----------------------------------------------------------------------------
# main

def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    t0 = time.time()
    key = _cache_key(args)
    meta = _read_meta(args.out_dir)
    same_puzzles = meta is not None and meta.get("key") == key and not args.force
    have_arrays = all(os.path.exists(split_path(args.out_dir, s)) for s in SPLITS)
    wanted = set(args.derive_splits) if args.derive else set()
    if same_puzzles and have_arrays and wanted <= _derived_splits(meta):
        print(f"{args.out_dir}: reusing the data built on {meta['built']} with the same arguments "
              "(--force rebuilds it)")
        print(meta["summary"])
        return
    top1465 = None  # written only with freshly built splits
    if same_puzzles:  # only the derived columns, or the .npy files of an older prepare_data.py, are missing
        adding = "the derived fields" if not wanted <= _derived_splits(meta) else "the .npy files"
        print(f"{args.out_dir}: reusing the puzzles built on {meta['built']}, adding {adding}")
        splits = {s: pd.read_parquet(os.path.join(args.out_dir, f"{s}.parquet")) for s in SPLITS}
        notes = meta["notes"]
        top_path = os.path.join(args.out_dir, "top1465.parquet")
        if "top1465" in wanted and os.path.exists(top_path):
            top1465 = pd.read_parquet(top_path)
    else:
        if meta is not None and meta.get("key") != key:
            print(f"{args.out_dir}: holds data built with other arguments (see its meta.json): rebuilding it")
        splits, notes, top1465 = build(args)
    if "top1465" in wanted and top1465 is None:
        raise SystemExit("--derive_splits=top1465: no Top1465 here; " + sudoku.hard.INSTALL)
    frames = {**splits, **({"top1465": top1465} if top1465 is not None else {})}
    for split in sorted(wanted, key=list(frames).index):
        if not {"trajectory", "num_steps", "strategies_used"} <= set(frames[split].columns):
            frames[split] = derive(frames[split], args.workers, args.derive_timeout, f"deriving {split}")
        elif split in SPLITS and not same_puzzles:
            notes.append(f"{split}: the source already has trajectory / num_steps / strategies_used: kept as they are")
    splits, top1465 = {s: frames[s] for s in SPLITS}, frames.get("top1465")
    derived = sorted(s for s, f in frames.items() if "strategies_used" in f)
    composition = sudoku.standin.composition_lines(splits, top1465) if args.source == "standin" else []
    summary = "\n".join([*notes, summarize(splits), *composition,
                         *cohort_lines({"top1465": top1465} if top1465 is not None else {})])
    meta = {"key": key, "derived": derived, "notes": notes, "summary": summary,
            "built": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(time.time() - t0, 1)}
    _write_splits(splits, args.out_dir, meta, top1465)
    print(summary)
    print(f"wrote {', '.join(f'{s}.npy' for s in SPLITS)} (+ .parquet with every column) to {args.out_dir} "
          f"in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
