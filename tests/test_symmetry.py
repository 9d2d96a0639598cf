"""The symmetry group behind augmentation and leak-free splits (sudoku/symmetry.py).

Planted bugs each test was seen to catch: equivalent() without its transpose branch (transposed
copies missed); invariant keys from the row counts alone in one orientation (transposed copies get
another key); a relabelling that is not one-to-one accepted (a non-equivalent puzzle called a copy).
"""
import numpy as np

import sudoku.board
import sudoku.symmetry as Y

NORVIG_HARD = "4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......"


def puzzles(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    pairs = [sudoku.board.generate_puzzle(rng, 24)[:2] for _ in range(n)]
    return np.stack([p for p, _ in pairs]), np.stack([s for _, s in pairs])


def test_symmetries_map_puzzles_to_puzzles_with_the_mapped_solution():
    questions, answers = puzzles(4)
    rng = np.random.default_rng(1)
    for q, a in zip(questions, answers):
        sym = Y.random_symmetry(rng)
        q2, a2 = Y.apply_symmetry(q, sym), Y.apply_symmetry(a, sym)
        assert sudoku.board.is_legal_solution(a2) and (q2 > 0).sum() == (q > 0).sum()
        assert sudoku.board.count_solutions(q2) == 1 and np.array_equal(sudoku.board.solve(q2), a2)


def test_transpose_and_relabel_by_hand():
    board = np.arange(81) % 9 + 1  # row r holds 1..9; hand-built, not a valid grid, only for the mapping
    relabel = np.array([0, 2, 3, 4, 5, 6, 7, 8, 9, 1])  # d -> d + 1, 9 -> 1
    same = np.arange(9)
    out = Y.apply_symmetry(board, (relabel, same, same, True)).reshape(9, 9)
    assert out[0].tolist() == [2] * 9 and out[:, 0].tolist() == list(range(2, 10)) + [1]


def test_copies_share_a_key_and_are_equivalent_others_are_not():
    questions, _ = puzzles(6, seed=2)
    rng = np.random.default_rng(3)
    copies = np.stack([Y.apply_symmetry(q, Y.random_symmetry(rng)) for q in questions])
    transposed = np.stack([Y.apply_symmetry(q, (np.arange(10), np.arange(9), np.arange(9), True)) for q in questions])
    keys = Y.invariant_keys(questions)
    assert keys == Y.invariant_keys(copies) == Y.invariant_keys(transposed)
    assert len(set(keys)) == len(keys)
    for i, q in enumerate(questions):
        assert Y.equivalent(q, copies[i]) and Y.equivalent(q, transposed[i]) and Y.equivalent(copies[i], q)
        assert not any(Y.equivalent(q, copies[j]) for j in range(len(questions)) if j != i)


def test_same_clue_cells_with_other_digits_are_not_equivalent():
    q = sudoku.board.parse_board(NORVIG_HARD).reshape(81)
    swapped = q.copy()
    first_row = np.arange(9)
    ones, twos = first_row[q[:9] == 4], first_row[q[:9] == 8]  # swap two digits in the first row only
    swapped[ones], swapped[twos] = 8, 4
    assert (swapped > 0).sum() == (q > 0).sum()
    assert not Y.equivalent(q, swapped)
    assert Y.equivalent(q, Y.apply_symmetry(q, (np.array([0, 2, 1, 3, 4, 5, 6, 7, 8, 9]), np.arange(9), np.arange(9),
                                                False)))


def test_cross_split_copies_finds_planted_copies():
    questions, _ = puzzles(8, seed=4)
    rng = np.random.default_rng(5)
    held_out = questions[:3]
    mixed = np.concatenate([questions[3:], Y.apply_symmetry(questions[1], Y.random_symmetry(rng))[None]])
    assert Y.cross_split_copies(mixed, held_out).tolist() == [False] * 5 + [True]
