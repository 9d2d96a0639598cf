"""Sudoku board logic shared by data preparation, training, sampling and tests.

Boards are 81 cells in row-major order. The token vocabulary is the one of the
paper's code (xlm-core's SimpleSpaceTokenizer for numbers, 17 ids):

    [PAD]=0 [CLS]=1 [MASK]=2 [EOS]=3 [BOS]=4 [SEP]=5 [UNK]=6 '0'..'9' = 7..16

Blank cells become [MASK] directly, so the ids that actually occur are 2 and 8..16.

Besides the vocabulary this module holds parsing/printing, legality and violation
counts (numpy, vectorised over leading dimensions; the batch count also takes torch
tensors), an exact solver and a puzzle generator. The solver keeps one 9-bit candidate mask per cell, propagates naked and
hidden singles, and searches depth-first on the cell with the fewest candidates; it
is plain Python but fast enough to generate tens of thousands of minimal puzzles.

    from sudoku.board import parse_board, solve, pretty_board
    print(pretty_board(solve(parse_board("4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......"))))
"""
import sys
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # annotations only
    import torch

PAD, CLS, MASK, EOS, BOS, SEP, UNK = 0, 1, 2, 3, 4, 5, 6
DIGIT0 = 7  # id of the digit '0'; digit d has id DIGIT0 + d
VOCAB_SIZE = 17
N_CELLS = 81


def digits_to_tokens(digits: np.ndarray) -> np.ndarray:
    """Digits 0..9 (0 = blank), any shape -> token ids (blank -> [MASK]) as int64."""
    digits = np.asarray(digits)
    return np.where(digits == 0, MASK, digits + DIGIT0).astype(np.int64)


def tokens_to_digits(tokens: np.ndarray) -> np.ndarray:
    """Token ids -> digits 1..9, with 0 for [MASK] and any non-digit id (as the paper's legality check)."""
    tokens = np.asarray(tokens)
    digits = tokens.astype(np.int64) - DIGIT0
    return np.where((digits >= 1) & (digits <= 9), digits, 0)


# -----------------------------------------------------------------------------
# geometry: the 27 units (9 rows, 9 columns, 9 boxes) and each cell's 20 peers

ROWS = [[9 * r + c for c in range(9)] for r in range(9)]
COLS = [[9 * r + c for r in range(9)] for c in range(9)]
BOXES = [[9 * (3 * br + r) + 3 * bc + c for r in range(3) for c in range(3)] for br in range(3) for bc in range(3)]
UNITS = np.array(ROWS + COLS + BOXES, dtype=np.int64)  # (27, 9) cell indices
_UNITS = [tuple(u) for u in UNITS.tolist()]
_PEERS = [tuple(sorted({p for u in _UNITS if cell in u for p in u} - {cell})) for cell in range(N_CELLS)]


# -----------------------------------------------------------------------------
# parsing and printing

def parse_board(text: str) -> np.ndarray:
    """81 cells ('1'..'9', '.' or '0' for blank; whitespace such as 9x9 layouts ignored) -> (81,) int8 digits."""
    if not isinstance(text, str):
        raise ValueError(f"a board must be a string, got {type(text).__name__}")
    cells = "".join(text.split())
    if len(cells) != N_CELLS:
        raise ValueError(f"wrong length: a board has 81 cells, got {len(cells)}")
    raw = np.frombuffer(cells.encode("utf-8", errors="replace"), dtype=np.uint8)
    if raw.size != N_CELLS:  # a non-ASCII character took several bytes
        bad = next(ch for ch in cells if not ch.isascii())
        raise ValueError(f"bad character {bad!r}: cells are '1'-'9', '.' or '0' for blank")
    digits = raw.astype(np.int16) - ord("0")
    digits[raw == ord(".")] = 0
    bad = np.flatnonzero((digits < 0) | (digits > 9))
    if bad.size:
        raise ValueError(f"bad character {cells[bad[0]]!r} at cell {bad[0]}: cells are '1'-'9', '.' or '0' for blank")
    return digits.astype(np.int8)


def _as_board(digits) -> np.ndarray:
    digits = np.asarray(digits)
    if digits.shape[-1:] != (N_CELLS,):
        raise ValueError(f"a board is an array of 81 digits in its last dimension, got shape {digits.shape}")
    if digits.size and (digits.min() < 0 or digits.max() > 9):
        raise ValueError("board digits must lie in 0..9 (0 = blank); convert token ids with tokens_to_digits first")
    return digits


def format_board(digits) -> str:
    """(81,) digits -> 81-character string with '.' for blanks (the hub's question format)."""
    digits = _as_board(digits)
    return "".join("." if d == 0 else chr(48 + int(d)) for d in digits.reshape(N_CELLS))


def pretty_board(digits, highlight: set[int] | None = None) -> str:
    """A 9x9 grid with box separators for the terminal; cells in `highlight` (indices 0..80) shown as [d]."""
    digits = _as_board(digits).reshape(N_CELLS)
    highlight = highlight or set()
    lines = []
    for r in range(9):
        if r in (3, 6):
            lines.append("+".join(["-" * 9] * 3))
        parts = []
        for c in range(9):
            i = 9 * r + c
            s = "." if digits[i] == 0 else str(int(digits[i]))
            parts.append(f"[{s}]" if i in highlight else f" {s} ")
            if c in (2, 5):
                parts.append("|")
        lines.append("".join(parts))
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# legality and violations

def count_violations_batch(digits: "np.ndarray | torch.Tensor") -> "np.ndarray | torch.Tensor":
    """(N, 81) digits -> (N,) sum over the 27 units of (#filled - #distinct filled); 0 is blank.

    The one violation count of the repository. A numpy array (checked to hold 0..9) gives a numpy
    array; a torch tensor gives a tensor on its own device and is not value-checked (that would copy
    every decoding step's boards to the host; map token ids to digits first).
    """
    torch = sys.modules.get("torch")  # a tensor implies torch is loaded; numpy callers never import it
    if torch is not None and isinstance(digits, torch.Tensor):
        if digits.dim() != 2 or digits.size(1) != N_CELLS:
            raise ValueError(f"count_violations_batch expects shape (N, 81), got {tuple(digits.shape)}")
        units = digits[:, torch.as_tensor(UNITS, device=digits.device)]  # (N, 27, 9)
    else:
        digits = _as_board(digits)
        if digits.ndim != 2:
            raise ValueError(f"count_violations_batch expects shape (N, 81), got {digits.shape}")
        units = digits[:, UNITS]  # (N, 27, 9)
    filled = (units > 0).sum(-1)
    distinct = sum((units == d).any(-1) for d in range(1, 10))
    return (filled - distinct).sum(-1)


def count_violations(digits):
    """Sum over the 27 units of (#filled - #distinct filled): int for one board, array for shape (..., 81)."""
    digits = _as_board(digits)
    flat = count_violations_batch(digits.reshape(-1, N_CELLS))
    return int(flat[0]) if digits.ndim == 1 else flat.reshape(digits.shape[:-1])


def is_legal_partial(digits) -> bool:
    """No row, column or box repeats a filled digit (blanks allowed)."""
    return count_violations(np.asarray(digits).reshape(N_CELLS)) == 0


def is_legal_solution(digits) -> bool:
    """Fully filled with 1..9 and no repeats in any unit."""
    digits = _as_board(digits).reshape(N_CELLS)
    return bool((digits > 0).all()) and count_violations(digits) == 0


# -----------------------------------------------------------------------------
# exact solver: 9-bit candidate masks, naked + hidden singles, most-constrained-cell DFS

ALL = 0x1FF  # candidates 1..9 as bits 0..8
_POPCOUNT = [bin(m).count("1") for m in range(512)]
_DIGIT = {1 << d: d + 1 for d in range(9)}  # single bit -> digit


def _propagate(cand: list[int], stack: list[int]) -> bool:
    """Make `cand` consistent: singles leave their peers, digits with one place in a unit go there.

    `stack` holds cells that just became single. Returns False on a contradiction.
    """
    while True:
        while stack:
            cell = stack.pop()
            bit = cand[cell]
            for p in _PEERS[cell]:
                m = cand[p]
                if m & bit:
                    m ^= bit
                    if not m:
                        return False
                    cand[p] = m
                    if not m & (m - 1):
                        stack.append(p)
        # hidden singles: per unit, digits seen exactly once must sit in that cell
        for unit in _UNITS:
            once = twice = 0
            for i in unit:
                m = cand[i]
                twice |= once & m
                once |= m
            if once != ALL:
                return False  # some digit has no place left in this unit
            only = once & ~twice
            if only:
                for i in unit:
                    m = cand[i]
                    hit = m & only
                    if hit and m != hit:
                        if hit & (hit - 1):
                            return False  # two digits can only go in this one cell
                        cand[i] = hit
                        stack.append(i)
        if not stack:
            return True


_CELL_UNITS = [(i // 9, 9 + i % 9, 18 + 3 * (i // 27) + (i % 9) // 3) for i in range(N_CELLS)]


def _initial(digits) -> list[int] | None:
    """Candidate masks after placing the clues and propagating, or None if the clues contradict."""
    digits = digits.tolist() if isinstance(digits, np.ndarray) else list(digits)
    used = [0] * 27  # digits already placed in each unit
    for i, d in enumerate(digits):
        if d:
            bit = 1 << (d - 1)
            for u in _CELL_UNITS[i]:
                if used[u] & bit:
                    return None  # the same digit twice in a unit
                used[u] |= bit
    cand = [0] * N_CELLS
    stack = []
    for i, d in enumerate(digits):
        if d:
            cand[i] = 1 << (d - 1)
        else:
            r, c, b = _CELL_UNITS[i]
            m = ALL & ~(used[r] | used[c] | used[b])
            if not m:
                return None
            cand[i] = m
            if not m & (m - 1):
                stack.append(i)  # clues' peers already exclude them; only new singles need spreading
    if not _propagate(cand, stack):
        return None
    return cand


def _branch_cell(cand: list[int]) -> int:
    """The open cell with the fewest candidates (the first with two, if any), or -1 when all are single."""
    best, best_n = -1, 10
    for i in range(N_CELLS):
        n = _POPCOUNT[cand[i]]
        if 1 < n < best_n:
            best, best_n = i, n
            if n == 2:
                break
    return best


def _search(cand: list[int], limit: int, out: list, stats: list[int]) -> int:
    """Count solutions of a propagated state up to `limit`; appends found solutions to `out`.

    stats[0] counts backtracks (guesses that led to a contradiction).
    """
    best = _branch_cell(cand)
    if best < 0:  # every cell single and consistent: a solution
        out.append(cand)
        return 1
    found = 0
    m = cand[best]
    bits = [b for b in _BITS if m & b]
    for bit in bits:
        child = cand[:]
        child[best] = bit
        if _propagate(child, [best]):
            found += _search(child, limit - found, out, stats)
            if found >= limit:
                return found
        else:
            stats[0] += 1
    return found


_BITS = [1 << d for d in range(9)]


def _to_digits(cand: list[int]) -> np.ndarray:
    return np.array([_DIGIT[m] for m in cand], dtype=np.int8)


def analyse(digits) -> tuple[int, np.ndarray | None, int]:
    """(number of solutions, counting stops at 2; the first solution or None; backtracks of the search)."""
    cand = _initial(_as_board(digits).reshape(N_CELLS))
    if cand is None:
        return 0, None, 0
    out: list = []
    stats = [0]
    n = _search(cand, 2, out, stats)
    return n, (_to_digits(out[0]) if out else None), stats[0]


def count_solutions(digits, limit: int = 2) -> int:
    """Number of solutions of the puzzle, counting stops at `limit` (so 2 means 'several')."""
    cand = _initial(_as_board(digits).reshape(N_CELLS))
    if cand is None:
        return 0
    return _search(cand, limit, [], [0])


def solve(digits) -> np.ndarray | None:
    """One solution as (81,) int8 digits (the first in search order), or None if there is none."""
    cand = _initial(_as_board(digits).reshape(N_CELLS))
    if cand is None:
        return None
    out: list = []
    _search(cand, 1, out, [0])
    return _to_digits(out[0]) if out else None


def singles_solve(digits) -> bool:
    """Do naked and hidden singles alone (no guessing, no pairs or fish) finish the puzzle?"""
    cand = _initial(_as_board(digits).reshape(N_CELLS))
    return cand is not None and all(not m & (m - 1) for m in cand)


def rate(digits) -> int:
    """Difficulty: backtracks of this solver while proving the solution unique (0 = singles alone solve it).

    Same idea as the tdoku backtrack count in Sudoku-Extreme's `rating`, but not the same scale.
    """
    return analyse(digits)[2]


# -----------------------------------------------------------------------------
# generator

# Recorded with generated data so that data from an older generator is rebuilt, never silently reused.
# 1: one fixed digit order per grid (a learnable shortcut); 2: fresh order at every branch + random symmetry.
GENERATOR_VERSION = 2


def random_grid(rng: np.random.Generator) -> np.ndarray:
    """A random complete grid with no preferred digit, cell or layout; deterministic for a given `rng` state.

    Depth-first search from the empty board that shuffles the candidate digits afresh at every
    branch, so no digit is favoured anywhere, then a random symmetry of the grid (digit relabelling,
    rows within bands, bands, columns within stacks, stacks, transposition) so the search's fixed
    cell order leaves no trace either. (A search that tries the digits in one fixed order is not
    enough, even under random symmetries: every grid is then the first completion under that order,
    a family a network learns to guess from; tests/test_generator.py checks the difference.)
    """
    grid = _to_digits(_random_completion([ALL] * N_CELLS, rng)).reshape(9, 9)
    relabel = np.concatenate([[0], rng.permutation(9) + 1]).astype(np.int8)
    rows = np.concatenate([3 * band + rng.permutation(3) for band in rng.permutation(3)])
    cols = np.concatenate([3 * stack + rng.permutation(3) for stack in rng.permutation(3)])
    grid = relabel[grid][rows][:, cols]
    if rng.random() < 0.5:
        grid = grid.T
    return np.ascontiguousarray(grid).reshape(N_CELLS)


def _random_completion(cand: list[int], rng: np.random.Generator) -> list[int] | None:
    """First completion of a propagated state, trying each branch's candidates in a fresh random order."""
    best = _branch_cell(cand)
    if best < 0:
        return cand
    bits = [b for b in _BITS if cand[best] & b]
    for k in rng.permutation(len(bits)).tolist():
        child = cand[:]
        child[best] = bits[k]
        if _propagate(child, [best]):
            done = _random_completion(child, rng)
            if done is not None:
                return done
    return None


def _unique_without(clues: list[int], cell: int, solution: np.ndarray) -> bool:
    """Is the puzzle still unique once `cell` is blanked? True iff no solution puts another digit there."""
    seen = 0
    for p in _PEERS[cell]:
        if clues[p]:
            seen |= 1 << (clues[p] - 1)
    if _POPCOUNT[seen] == 8:
        return True  # the peers' clues leave one digit: a naked single, no search needed
    probe = list(clues)
    probe[cell] = 0
    cand = _initial(probe)
    if cand is None:
        return True
    other = cand[cell] & ~(1 << (int(solution[cell]) - 1))
    if not other:
        return True  # the clues already force this cell
    cand[cell] = other
    if not other & (other - 1):
        if not _propagate(cand, [cell]):
            return True
    elif not _propagate(cand, []):
        return True
    return _search(cand, 1, [], [0]) == 0


def generate_puzzle(rng: np.random.Generator, n_clues: int) -> tuple[np.ndarray, np.ndarray, int]:
    """A puzzle with a unique solution and `n_clues` clues on a fresh `random_grid`: (puzzle, solution, rating)."""
    solution = random_grid(rng)
    puzzle = remove_clues(rng, solution, n_clues)
    return puzzle, solution, rate(puzzle)


def remove_clues(rng: np.random.Generator, solution: np.ndarray, n_clues: int) -> np.ndarray:
    """Blank cells of a complete grid in random order while the solution stays unique, down to `n_clues`.

    One pass over all 81 cells leaves a minimal puzzle (removing a clue never makes a non-unique
    puzzle unique again), so fewer clues than a grid allows give that minimal puzzle instead.
    """
    if not 0 <= n_clues <= N_CELLS:
        raise ValueError(f"n_clues must be in 0..81, got {n_clues}")
    if not is_legal_solution(solution):
        raise ValueError("remove_clues needs a complete, legal grid")
    clues = np.asarray(solution).reshape(N_CELLS).tolist()
    n = N_CELLS
    for cell in rng.permutation(N_CELLS).tolist():
        if n <= n_clues:
            break
        if _unique_without(clues, cell, solution):
            clues[cell] = 0
            n -= 1
    return np.array(clues, dtype=np.int8)
