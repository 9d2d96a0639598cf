"""Board logic: parsing, violations, the exact solver (against a naive one) and the generator."""
import numpy as np
import pytest

import sudoku.board

# Well-known puzzles: Gordon Royle's collection of 17-clue puzzles (first entry) and one of
# Peter Norvig's "hard" examples (a 17-clue puzzle that needs search).
ROYLE_17 = "000000010400000000020000000000050407008000300001090000300400200050100000000806000"
NORVIG_HARD = "4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......"


def naive_count(digits, limit=10**6):
    """Reference solver: plain backtracking on the first blank cell, no propagation."""
    board = [int(d) for d in digits]
    count = 0

    def ok(i, d):
        r, c = divmod(i, 9)
        for j in range(9):
            if board[9 * r + j] == d or board[9 * j + c] == d:
                return False
        br, bc = 3 * (r // 3), 3 * (c // 3)
        return all(board[9 * (br + a) + bc + b] != d for a in range(3) for b in range(3))

    def rec():
        nonlocal count
        try:
            i = board.index(0)
        except ValueError:
            count += 1
            return
        for d in range(1, 10):
            if ok(i, d):
                board[i] = d
                rec()
                board[i] = 0
                if count >= limit:
                    return

    if sudoku.board.count_violations(np.array(board)) == 0:
        rec()
    return count


def test_tokens_round_trip_and_vocabulary():
    digits = np.arange(10).repeat(9)[:81]
    tokens = sudoku.board.digits_to_tokens(digits)
    assert tokens.dtype == np.int64
    assert (tokens[digits == 0] == sudoku.board.MASK).all() and (tokens[digits == 5] == sudoku.board.DIGIT0 + 5).all()
    assert (sudoku.board.tokens_to_digits(tokens) == digits).all()
    assert tokens.max() < sudoku.board.VOCAB_SIZE


def test_parse_board_formats_agree():
    dots = sudoku.board.parse_board(NORVIG_HARD)
    zeros = sudoku.board.parse_board(NORVIG_HARD.replace(".", "0"))
    grid = "\n".join(" ".join(NORVIG_HARD[9 * r:9 * r + 9]) for r in range(9))  # a 9x9 layout
    assert dots.dtype == np.int8 and dots.shape == (81,)
    assert (dots == zeros).all() and (sudoku.board.parse_board(grid) == dots).all()
    assert sudoku.board.format_board(dots) == NORVIG_HARD
    assert (dots > 0).sum() == 17


@pytest.mark.parametrize("text, message", [
    (NORVIG_HARD[:80], "wrong length"),
    (NORVIG_HARD + "1", "wrong length"),
    ("x" + NORVIG_HARD[1:], "bad character 'x'"),
    ("é" + NORVIG_HARD[1:], "bad character"),
])
def test_parse_board_errors(text, message):
    with pytest.raises(ValueError, match=message):
        sudoku.board.parse_board(text)


def test_pretty_board_shows_every_cell_and_highlights():
    digits = sudoku.board.parse_board(NORVIG_HARD)
    text = sudoku.board.pretty_board(digits, highlight={0, 80})
    lines = text.splitlines()
    assert len(lines) == 11 and lines[3] == lines[7] and set(lines[3]) == {"-", "+"}
    assert lines[0].startswith("[4]") and lines[-1].endswith("[.]")
    back = "".join(ch for ch in text if ch in ".0123456789")
    assert back == NORVIG_HARD


def test_count_violations_by_hand():
    board = np.zeros(81, dtype=int)
    assert sudoku.board.count_violations(board) == 0
    board[0] = board[1] = 5  # same row and same box
    assert sudoku.board.count_violations(board) == 2
    board[8] = 5  # a third 5 in row 0 (not in the box)
    assert sudoku.board.count_violations(board) == 3
    board[0] = 0
    assert sudoku.board.count_violations(board) == 1
    assert not sudoku.board.is_legal_partial(board)
    assert sudoku.board.is_legal_partial(sudoku.board.parse_board(NORVIG_HARD))


def test_count_violations_batch_matches_definition():
    rng = np.random.default_rng(0)
    boards = rng.integers(0, 10, (200, 81))
    expected = [sum(int((b[u] > 0).sum()) - len(set(b[u][b[u] > 0].tolist())) for u in sudoku.board.UNITS) for b in boards]
    assert (sudoku.board.count_violations_batch(boards) == np.array(expected)).all()
    nd = sudoku.board.count_violations(boards[:6].reshape(2, 3, 81))
    assert nd.shape == (2, 3) and (nd.reshape(-1) == expected[:6]).all()
    with pytest.raises(ValueError, match="0..9"):
        sudoku.board.count_violations(boards[0] + 7)  # token ids, not digits


def test_count_violations_batch_takes_torch_tensors():
    """The torch path of the one violation count (used on every decoding step) equals the plain-loop
    definition on int8 tensors and returns a tensor; a wrong shape is a ValueError. Fails if a digit three
    times in a unit counts once instead of twice (checked by crediting such digits one more distinct) and
    if the unit index takes the boards' dtype (checked with digits.new_tensor(UNITS): int8 indices)."""
    torch = pytest.importorskip("torch")
    boards = np.random.default_rng(1).integers(0, 10, (200, 81))
    expected = [sum(int((b[u] > 0).sum()) - len(set(b[u][b[u] > 0].tolist())) for u in sudoku.board.UNITS) for b in boards]
    got = sudoku.board.count_violations_batch(torch.as_tensor(boards, dtype=torch.int8))
    assert isinstance(got, torch.Tensor) and got.tolist() == expected
    with pytest.raises(ValueError, match="shape"):
        sudoku.board.count_violations_batch(torch.zeros(2, 80, dtype=torch.long))

def test_solver_on_known_puzzles():
    for text in (ROYLE_17, NORVIG_HARD):
        puzzle = sudoku.board.parse_board(text)
        solution = sudoku.board.solve(puzzle)
        assert sudoku.board.is_legal_solution(solution)
        clues = puzzle > 0
        assert (solution[clues] == puzzle[clues]).all()
        assert sudoku.board.count_solutions(puzzle) == 1
        n, first, backtracks = sudoku.board.analyse(puzzle)
        assert n == 1 and (first == solution).all() and backtracks == sudoku.board.rate(puzzle) >= 0


def test_count_solutions_stops_at_limit():
    empty = np.zeros(81, dtype=np.int8)
    assert sudoku.board.count_solutions(empty) == 2
    assert sudoku.board.count_solutions(empty, limit=7) == 7
    assert sudoku.board.count_solutions(sudoku.board.parse_board("11" + "." * 79)) == 0  # contradicting clues
    unsolvable = sudoku.board.parse_board("12345678." + "........9" + "." * 63)  # cell 8 has no digit left
    assert sudoku.board.is_legal_partial(unsolvable)
    assert sudoku.board.count_solutions(unsolvable) == 0 and sudoku.board.solve(unsolvable) is None


def test_solver_matches_naive_backtracking():
    rng = np.random.default_rng(1)
    for trial in range(60):
        grid = sudoku.board.random_grid(rng)
        board = grid.copy()
        board[rng.choice(81, size=int(rng.integers(10, 36)), replace=False)] = 0
        if trial % 3 == 0:  # also boards with a wrong clue: no or other solutions
            i = rng.choice(np.flatnonzero(board))
            board[i] = board[i] % 9 + 1
        expected = naive_count(board)
        assert sudoku.board.count_solutions(board, limit=10**6) == expected
        solution = sudoku.board.solve(board)
        assert (solution is None) == (expected == 0)
        if solution is not None:
            assert sudoku.board.is_legal_solution(solution) and (solution[board > 0] == board[board > 0]).all()


def test_random_grid_is_a_solution_and_seeded():
    a = sudoku.board.random_grid(np.random.default_rng(5))
    assert sudoku.board.is_legal_solution(a)
    assert (a == sudoku.board.random_grid(np.random.default_rng(5))).all()
    assert not (a == sudoku.board.random_grid(np.random.default_rng(6))).all()


@pytest.mark.parametrize("n_clues", [45, 36, 30])
def test_generate_puzzle_hits_clue_count(n_clues):
    rng = np.random.default_rng(n_clues)
    for _ in range(3):
        puzzle, solution, rating = sudoku.board.generate_puzzle(rng, n_clues)
        assert (puzzle > 0).sum() == n_clues
        assert sudoku.board.count_solutions(puzzle) == 1 and sudoku.board.is_legal_solution(solution)
        assert (solution[puzzle > 0] == puzzle[puzzle > 0]).all() and rating == sudoku.board.rate(puzzle)


def test_generate_puzzle_below_reach_gives_minimal_puzzle():
    puzzle, solution, _ = sudoku.board.generate_puzzle(np.random.default_rng(0), 17)
    assert sudoku.board.count_solutions(puzzle) == 1 and (solution[puzzle > 0] == puzzle[puzzle > 0]).all()
    assert 17 <= (puzzle > 0).sum() <= 30
    for i in np.flatnonzero(puzzle):  # minimal: every clue is needed
        fewer = puzzle.copy()
        fewer[i] = 0
        assert sudoku.board.count_solutions(fewer) == 2


def test_generate_puzzle_deterministic_and_checked():
    a = sudoku.board.generate_puzzle(np.random.default_rng(3), 28)
    b = sudoku.board.generate_puzzle(np.random.default_rng(3), 28)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="n_clues"):
        sudoku.board.generate_puzzle(np.random.default_rng(0), 82)


def test_legal_solution_rejects_blanks_and_repeats():
    solution = sudoku.board.solve(sudoku.board.parse_board(ROYLE_17))
    assert sudoku.board.is_legal_solution(solution)
    holed = solution.copy()
    holed[40] = 0
    assert not sudoku.board.is_legal_solution(holed) and sudoku.board.is_legal_partial(holed)
    swapped = solution.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # rows still fine, columns now repeat
    assert not sudoku.board.is_legal_solution(swapped)
