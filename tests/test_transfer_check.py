"""scripts/sudoku/transfer_check.py: twins from the independent sampler, and exact match per clue bucket."""
import numpy as np

import sudoku.board
from scripts.sudoku.transfer_check import exact_by_bucket, independent_twins, table


def test_twins_keep_clue_counts_and_have_unique_solutions():
    """Fails if twins get another clue count (e.g. a fixed one) or a solution other than their grid."""
    rng = np.random.default_rng(0)
    own = np.stack([sudoku.board.generate_puzzle(rng, k)[0] for k in (24, 30, 36, 44)])
    q, a = independent_twins(sudoku.board.digits_to_tokens(own), seed=0)
    assert ((q != sudoku.board.MASK).sum(1) == (own > 0).sum(1)).all()
    for puzzle, answer in zip(sudoku.board.tokens_to_digits(q), sudoku.board.tokens_to_digits(a)):
        assert sudoku.board.count_solutions(puzzle) == 1
        assert (sudoku.board.solve(puzzle) == answer).all()
    again, _ = independent_twins(sudoku.board.digits_to_tokens(own), seed=0)
    assert (again == q).all()


def test_exact_by_bucket_hand_computed():
    """Three puzzles with 24, 25 and 40 clues; the first and last solved: 24-27 -> 1/2, 40+ -> 1/1, all -> 2/3."""
    answers = sudoku.board.digits_to_tokens(np.stack([sudoku.board.random_grid(np.random.default_rng(i)) for i in range(3)]))
    questions = answers.copy()
    for row, blanks in zip(questions, (81 - 24, 81 - 25, 81 - 40)):
        row[:blanks] = sudoku.board.MASK
    pred = answers.copy()
    pred[1, 0] = sudoku.board.DIGIT0 + (pred[1, 0] - sudoku.board.DIGIT0) % 9 + 1  # one wrong cell in the 25-clue puzzle
    out = exact_by_bucket(questions, answers, pred)
    assert out["24-27"] == {"exact": 0.5, "n": 2}
    assert out["40+"] == {"exact": 1.0, "n": 1}
    assert abs(out["all"]["exact"] - 2 / 3) < 1e-9 and out["all"]["n"] == 3
    assert "28-31" not in out
    assert "| MLM | own | 50.0% (2) | 100.0% (1) | 66.7% (3) |" in table({"MLM": {"own": out}})


def test_bad_flags_are_refused_before_any_work(tmp_path):
    """A negative --seed (numpy's generator raised a traceback after the model had loaded) and an --out that
    is a directory (written only after the whole evaluation): one line naming the flag. Failed before the
    checks (checked)."""
    import pytest
    from scripts.sudoku import transfer_check
    for argv, flag in ((["--seed=-1"], "--seed"), ([f"--out={tmp_path}"], "--out")):
        with pytest.raises(SystemExit) as e:
            transfer_check.main(["--ckpt=nothing.pt", f"--data_dir={tmp_path / 'none'}", *argv])
        assert flag in str(e.value.code) and "\n" not in str(e.value.code), e.value.code
