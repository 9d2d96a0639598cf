"""An offline stand-in for Sudoku-Extreme's composition (prepare_data.py --source=standin).

The paper's Table 1 trains on Sudoku-Extreme as published: about 1.1M easy puzzles (Kaggle, unbiased,
17-clue lists) and 3.1M hard ones (Top1465, the forum's hardest lists, ph_2010), with a test split of
the same mix (App. A.1). Without the hub, this module gives each split the same proportions: 26% easy
puzzles from this repository's generator (17-45 clues) and 74% hard ones from larsdoku (split by
symmetry class, sudoku/hard.py), or from the generator's hard mode where larsdoku is not installed.

Every puzzle carries a rating that works on any source: the backtracks of this repository's exact
solver (`sudoku.board.rate`: naked and hidden singles propagated to a fixpoint, then depth-first search
on the first cell with the fewest candidates, digits in increasing order, counting every guess whose
propagation fails, until a second solution is ruled out). It plays the role of the tdoku backtrack
count in Sudoku-Extreme's `rating` column, on another scale: the two solvers propagate and branch
differently, so only the ordering of puzzles, not the numbers, carries over.
"""
from collections.abc import Callable

import numpy as np
import pandas as pd

import sudoku.board
import sudoku.hard

VERSION = 1  # recorded in meta.json: data built by another version is rebuilt, never reused
HARD_SHARE = 0.74  # 3.1M hard / 4.2M puzzles in Sudoku-Extreme's train split (App. A.1)
DEFAULT_TRAIN = 200_000  # 32 MB of arrays: enough for the CPU study (3M puzzle draws), small enough to carry
HARD_COHORT_QUANTILE = 0.87  # the test split's hard cohort: its top 13% by rating (the authors' `hard` is ~13%)
# Sudoku-Extreme's test split as its authors describe it (tdoku backtracks, not this solver's scale)
PUBLISHED_QUANTILES = {90: 51, 95: 64, 99: 100}
BANDS = (0, 1, 4, 11, 31, 101, 301)  # rating histogram bands: 0, 1-3, 4-10, 11-30, 31-100, 101-300, 301+


def hard_source() -> str:
    """'larsdoku' when the package is installed, else 'generator' (the license-free hard mode)."""
    try:
        sudoku.hard.larsdoku_file("puzzle_collection.json.gz")
        return "larsdoku"
    except sudoku.hard.MissingPackage:
        return "generator"


def shares(sizes: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """Split sizes -> (easy sizes, hard sizes), hard = round(74%) of each."""
    hard = {split: int(round(HARD_SHARE * n)) for split, n in sizes.items()}
    return {split: n - hard[split] for split, n in sizes.items()}, hard


def rate_question(question: str) -> int:
    """The rating of one 81-character puzzle: this solver's backtracks (module docstring)."""
    return sudoku.board.rate(sudoku.board.parse_board(question))


def rated(splits: dict[str, pd.DataFrame], rate_all: Callable[..., list]) -> dict[str, pd.DataFrame]:
    """Every puzzle rated by the same solver, whatever its source recorded (larsdoku records none).

    rate_all(questions, desc=...) maps rate_question over a list (prepare_data.pool_map: worker processes)."""
    out = {}
    for split, frame in splits.items():
        frame = frame.copy()
        frame["rating"] = np.asarray(rate_all(list(frame["question"]), desc=f"rating {split}"), dtype=np.int64)
        out[split] = frame
    return out


def share_of(source: pd.Series) -> pd.Series:
    """'easy' or 'hard' per puzzle, from its source label."""
    hard = source.str.startswith("larsdoku/") | source.str.startswith("generated-hard")
    return pd.Series(np.where(hard, "hard", "easy"), index=source.index)


def hard_cohort(test: pd.DataFrame) -> pd.DataFrame:
    """The test split's hard cohort: puzzles rated at or above the split's 87th percentile, in split order."""
    threshold = np.quantile(test["rating"].to_numpy(), HARD_COHORT_QUANTILE, method="lower")
    return test[test["rating"] >= threshold].reset_index(drop=True)


def _histogram(rating: np.ndarray) -> str:
    edges = list(BANDS) + [np.inf]
    cells = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        label = (f"{lo}" if hi == lo + 1 else f"{lo}+" if hi == np.inf else f"{lo}-{int(hi) - 1}")
        cells.append(f"{label}: {100 * np.mean((rating >= lo) & (rating < hi)):.0f}%")
    return "  ".join(cells)


def composition_lines(splits: dict[str, pd.DataFrame], top1465: pd.DataFrame | None) -> list[str]:
    """Per split: puzzles per source, the rating quantiles and histogram; then how they compare with
    Sudoku-Extreme's published quantiles (another solver: the scales differ) and with Top1465."""
    lines = ["composition and rating (backtracks of this repository's solver, sudoku/standin.py):"]
    for split, frame in splits.items():
        if not len(frame):
            continue
        counts = frame["source"].value_counts()
        share = share_of(frame["source"]).value_counts(normalize=True)
        rating = frame["rating"].to_numpy()
        q = {p: np.percentile(rating, p) for p in (50, 87, 90, 95, 99)}
        lines.append(f"  {split}: {len(frame)} puzzles, {100 * share.get('easy', 0):.0f}% easy / "
                     f"{100 * share.get('hard', 0):.0f}% hard (" + ", ".join(f"{s} {n}" for s, n in counts.items())
                     + ")")
        lines.append(f"    rating p50 {q[50]:.0f}, p87 {q[87]:.0f}, p90 {q[90]:.0f}, p95 {q[95]:.0f}, "
                     f"p99 {q[99]:.0f}; {_histogram(rating)}")
    published = ", ".join(f"p{p} {v}" for p, v in PUBLISHED_QUANTILES.items())
    lines.append(f"  Sudoku-Extreme's test split, as published: {published} (tdoku backtracks: another solver, "
                 "so compare orderings, not numbers)")
    if top1465 is not None and "rating" in top1465:
        r = top1465["rating"].to_numpy()
        lines.append(f"  Top1465 (one of Sudoku-Extreme's hard sources) on this scale: p50 {np.percentile(r, 50):.0f}, "
                     f"p90 {np.percentile(r, 90):.0f}, p99 {np.percentile(r, 99):.0f}")
    return lines
