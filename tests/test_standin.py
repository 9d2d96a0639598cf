"""prepare_data.py --source=standin (sudoku/standin.py): Sudoku-Extreme's easy/hard composition offline,
split hold-outs with copies planted in both shares, and the rating against a plain reference solver."""
import os

import numpy as np
import pandas as pd

import prepare_data as P
import sudoku.board
import sudoku.data as D
import sudoku.hard
import sudoku.puzzle_files as F
import sudoku.standin
import sudoku.symmetry as Y
from helpers import NORVIG_HARD, fake_larsdoku, transformed

# -----------------------------------------------------------------------------
# the rating: backtracks of the documented search, against a plain re-implementation

PEERS = [{p for p in range(81) if p != c and (p // 9 == c // 9 or p % 9 == c % 9 or
                                              (p // 27 == c // 27 and p % 9 // 3 == c % 9 // 3))} for c in range(81)]
UNITS = [list(u) for u in sudoku.board.UNITS.tolist()]


def ref_propagate(cands: list[set]) -> bool:
    """Naked and hidden singles to a fixpoint on a list of candidate sets; False on a contradiction."""
    changed = True
    while changed:
        changed = False
        for c in range(81):
            if not cands[c]:
                return False
            if len(cands[c]) == 1:
                d = next(iter(cands[c]))
                for p in PEERS[c]:
                    if d in cands[p]:
                        cands[p] = cands[p] - {d}
                        changed = True
                        if not cands[p]:
                            return False
        for unit in UNITS:
            for d in range(1, 10):
                places = [c for c in unit if d in cands[c]]
                if not places:
                    return False
                if len(places) == 1 and len(cands[places[0]]) > 1:
                    cands[places[0]] = {d}
                    changed = True
    return True


def ref_rate(puzzle) -> int:
    """Guesses whose propagation fails, searching the first cell with the fewest candidates, digits in
    increasing order, until a second solution is ruled out (the rule sudoku/standin.py documents)."""
    cands = [{int(d)} if d else set(range(1, 10)) for d in puzzle]
    if not ref_propagate(cands):
        return 0
    backtracks, solutions = 0, 0

    def search(cands):
        nonlocal backtracks, solutions
        open_cells = [c for c in range(81) if len(cands[c]) > 1]
        if not open_cells:
            solutions += 1
            return
        fewest = min(len(cands[c]) for c in open_cells)
        cell = next(c for c in open_cells if len(cands[c]) == fewest)
        for d in sorted(cands[cell]):
            child = list(cands)
            child[cell] = {d}
            if not ref_propagate(child):
                backtracks += 1
                continue
            search(child)
            if solutions >= 2:
                return
    search(cands)
    return backtracks


def test_rating_is_zero_when_singles_finish_the_puzzle():
    solution = sudoku.board.solve(sudoku.board.parse_board(NORVIG_HARD))
    one_blank = solution.copy()
    one_blank[40] = 0
    assert sudoku.standin.rate_question(sudoku.board.format_board(one_blank)) == 0
    rng = np.random.default_rng(0)
    easy, _, _ = sudoku.board.generate_puzzle(rng, 50)  # 50 clues: singles finish it
    assert sudoku.board.singles_solve(easy) and sudoku.standin.rate_question(sudoku.board.format_board(easy)) == 0


def test_rating_of_a_traced_puzzle():
    """Traced by hand: after singles 11 cells stay open, each with two or three of 1, 2, 7. The first cell
    with the fewest candidates is r1c2 with {1, 7}. 1 comes first: singles then fill every cell, the
    solution. 7 (tried to rule out a second solution) forces r3c9 = 2 (row 3 gets 1 from r3c3) and r5c9 = 2
    (row 5 gets 1 from r5c2): two 2s in column 9, a failed guess. One backtrack."""
    puzzle = sudoku.board.parse_board(TRACED)
    assert sudoku.board.count_solutions(puzzle) == 1 and not sudoku.board.singles_solve(puzzle)
    assert sudoku.standin.rate_question(TRACED) == ref_rate(puzzle) == TRACED_BACKTRACKS


def test_rating_matches_a_plain_reference_on_hard_puzzles():
    """Generated minimal puzzles and Top1465 puzzles, with backtrack counts from 0 to dozens."""
    rng = np.random.default_rng(4)
    puzzles = [sudoku.board.remove_clues(rng, sudoku.board.random_grid(rng), 0) for _ in range(12)]
    puzzles.append(sudoku.board.parse_board(NORVIG_HARD))
    counts = [ref_rate(p) for p in puzzles]
    assert [sudoku.board.rate(p) for p in puzzles] == counts
    assert max(counts) >= 5 and min(counts) == 0  # the cases cover both kinds


# -----------------------------------------------------------------------------
# the build: composition, cohort, and copies planted in the easy and the hard share


def planted_build(tmp_path, monkeypatch) -> tuple[str, dict]:
    """Build a small stand-in from a fake larsdoku, with copies planted in each share's train split: a
    relabelled, transposed copy of that share's first test puzzle, of its first val puzzle and of a
    Top1465 puzzle. Returns (out_dir, planted questions per share)."""
    fake_larsdoku(tmp_path, monkeypatch, classes=40, copies=2, top_puzzles=3)
    top = sudoku.hard.read_top1465()
    planted = {}

    def plant(splits: dict, share: str, seed: int) -> dict:
        copies = [transformed(splits[s]["question"].iloc[0], splits[s]["answer"].iloc[0], seed + i)
                  for i, s in enumerate(("test", "val"))]
        copies.append(transformed(top["question"].iloc[1], top["answer"].iloc[1], seed + 2))
        planted[share] = [q for q, _ in copies]
        rows = pd.DataFrame([{"source": splits["train"]["source"].iloc[0], "question": q, "answer": a, "rating": -1}
                             for q, a in copies])
        return {**splits, "train": pd.concat([rows, splits["train"]], ignore_index=True)}

    real_generate, real_split = P.generate_splits, sudoku.hard.split_by_class
    monkeypatch.setattr(P, "generate_splits", lambda *a, **k: (plant(real_generate(*a, **k)[0], "easy", 10), 0))
    monkeypatch.setattr(sudoku.hard, "split_by_class", lambda *a, **k: plant(real_split(*a, **k), "hard", 20))
    return build(tmp_path, n_train=60, n_val=8, n_test=20), planted


def build(tmp_path, n_train: int, n_val: int, n_test: int) -> str:
    """prepare_data.py --source=standin from the fake larsdoku's two collections; returns the out_dir."""
    out = str(tmp_path / "standin")
    try:
        P.main(["--source=standin", "--collections=fn_fc_day1,killer_combo", "--out_dir=" + out,
                f"--n_train={n_train}", f"--n_val={n_val}", f"--n_test={n_test}", "--workers=1"])
    finally:
        sudoku.hard.read_top1465.cache_clear()
    return out


def test_planted_copies_leave_train_in_both_shares(tmp_path, monkeypatch, capsys):
    out, planted = planted_build(tmp_path, monkeypatch)
    train = set(pd.read_parquet(os.path.join(out, "train.parquet"))["question"])
    for share, questions in planted.items():
        assert not set(questions) & train, share
    frames = {s: F.load_puzzles(s, out) for s in D.SPLITS}
    boards = {s: sudoku.board.tokens_to_digits(frames[s].question) for s in D.SPLITS}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not any(Y.equivalent(p, q) for p in boards[a] for q in boards[b]), (a, b)
    assert "symmetric copies" in capsys.readouterr().out


def test_composition_rating_and_hard_cohort(tmp_path, monkeypatch, capsys):
    fake_larsdoku(tmp_path, monkeypatch, classes=40, copies=2, top_puzzles=2)
    out = build(tmp_path, n_train=50, n_val=10, n_test=40)
    text = capsys.readouterr().out
    test = pd.read_parquet(os.path.join(out, "test.parquet"))
    hard = sudoku.standin.share_of(test["source"]) == "hard"
    assert hard.sum() == round(0.74 * 40)
    assert set(test["source"][hard]) <= {"larsdoku/fn_fc_day1", "larsdoku/killer_combo"}
    n_easy = int((~hard).sum())
    assert hard.iloc[:n_easy].any()  # shuffled: the first rows are not the easy share
    assert test["rating"].tolist() == [sudoku.board.rate(sudoku.board.parse_board(q)) for q in test["question"]]
    cohort = pd.read_parquet(os.path.join(out, "test_hard.parquet"))
    assert cohort["question"].tolist() == sudoku.standin.hard_cohort(test)["question"].tolist()
    assert "Sudoku-Extreme's test split, as published: p90 51" in text and "74% hard" in text


def test_hard_cohort_is_the_top_13_percent_by_rating():
    """Ratings 0..99 shuffled: the 87th percentile is 86 (lowest value with 87% of the split below or at
    it, by hand), so the cohort is the 14 puzzles rated 86-99, in split order."""
    ratings = np.random.default_rng(0).permutation(100)
    frame = pd.DataFrame({"question": [f"q{r}" for r in ratings], "rating": ratings})
    cohort = sudoku.standin.hard_cohort(frame)
    assert cohort["rating"].tolist() == [r for r in ratings if r >= 86]


def test_without_larsdoku_the_hard_share_is_generated(tmp_path, monkeypatch):
    monkeypatch.setattr(sudoku.hard.importlib.util, "find_spec", lambda name: None)
    out = str(tmp_path / "standin")
    P.main(["--source=standin", "--out_dir=" + out, "--n_train=20", "--n_val=4", "--n_test=8", "--workers=1",
            "--augment=2"])
    sources = set(pd.read_parquet(os.path.join(out, "train.parquet"))["source"])
    assert sources == {"generated-seed0", "generated-hard-seed0"}
    assert not os.path.exists(os.path.join(out, "top1465.parquet"))


TRACED = "6.835..9425914638743.89.65.54.983.769..46583.386271945793624518824519763165738429"
TRACED_BACKTRACKS = 1
