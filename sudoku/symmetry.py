"""The Sudoku symmetry group: random symmetries for augmentation, and equivalence for leak-free splits.

A symmetry maps every valid puzzle to a valid puzzle with the same difficulty: relabel the digits,
permute the rows within each band, the bands, the columns within each stack, the stacks, and
optionally transpose (9! x 2 x 6^8, about 1.2e12 maps). Sudoku-Extreme-style pipelines multiply a
pool of hard puzzles this way; the same group decides when two puzzles are "the same puzzle", so a
test puzzle and a relabelled, transposed copy of it never sit in two splits.

    invariant_keys(boards)   one key per puzzle, equal for equivalent puzzles (cheap, numpy)
    equivalent(a, b)         the exact check behind two equal keys
    cross_split_copies(...)  which puzzles of one set are equivalent to a puzzle of another
"""
import hashlib
import itertools
from collections import defaultdict

import numpy as np

# the 1296 band-preserving row orders (bands permuted, rows permuted within each band); columns alike
_BLOCK_ORDERS = np.array([np.concatenate([3 * b + np.array(p) for b, p in zip(bands, within)])
                          for bands in itertools.permutations(range(3))
                          for within in itertools.product(itertools.permutations(range(3)), repeat=3)])


def random_symmetry(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(digit relabelling (10,) with 0 -> 0, row order (9,), column order (9,), transpose)."""
    relabel = np.concatenate([[0], rng.permutation(9) + 1])
    rows = np.concatenate([3 * band + rng.permutation(3) for band in rng.permutation(3)])
    cols = np.concatenate([3 * stack + rng.permutation(3) for stack in rng.permutation(3)])
    return relabel, rows, cols, bool(rng.random() < 0.5)


def apply_symmetry(boards: np.ndarray, symmetry: tuple) -> np.ndarray:
    """The same symmetry applied to (..., 81) digit boards (use it on a puzzle and its solution alike)."""
    relabel, rows, cols, transpose = symmetry
    grid = np.asarray(boards).reshape(*np.shape(boards)[:-1], 9, 9)
    grid = relabel.astype(grid.dtype)[grid][..., rows, :][..., :, cols]
    if transpose:
        grid = np.swapaxes(grid, -1, -2)
    return np.ascontiguousarray(grid).reshape(np.shape(boards))


# -----------------------------------------------------------------------------
# equivalence

def _clue_codes(grid: np.ndarray, transpose: bool) -> np.ndarray:
    """Per clue: clues in its row, column and box, and clues of its digit in the grid, its band and its
    stack, as one code; sorted, blanks 0."""
    n = len(grid)
    filled = grid > 0
    row = filled.sum(2, keepdims=True).repeat(9, 2)
    col = filled.sum(1, keepdims=True).repeat(9, 1)
    box = filled.reshape(n, 3, 3, 3, 3).sum((2, 4), keepdims=True)
    box = np.broadcast_to(box, (n, 3, 3, 3, 3)).reshape(n, 9, 9)
    onehot = grid[..., None] == np.arange(10)  # (n, 9, 9, 10)
    # clues of the cell's digit: in the whole grid, in its band (its rows' block), in its stack
    digit = np.take_along_axis(onehot.sum((1, 2)), grid.reshape(n, 81), 1).reshape(n, 9, 9)
    in_band = onehot.reshape(n, 3, 27, 10).sum(2)[:, np.arange(9) // 3]  # (n, 9 rows, 10)
    in_stack = onehot.reshape(n, 9, 3, 3, 10).sum((1, 3))[:, np.arange(9) // 3]  # (n, 9 columns, 10)
    band = np.take_along_axis(in_band, grid, 2)  # (n, 9, 9): per cell, by its row's band
    stack = np.take_along_axis(in_stack, grid.transpose(0, 2, 1), 2).transpose(0, 2, 1)
    first, second, third, fourth = (col, row, stack, band) if transpose else (row, col, band, stack)
    code = ((((first * 10 + second) * 10 + box) * 10 + digit) * 4 + third) * 4 + fourth
    return np.sort(np.where(filled, code, 0).reshape(n, 81), axis=1).astype(np.int32)


def invariant_keys(boards: np.ndarray, chunk: int = 1 << 16) -> list[bytes]:
    """A key per (N, 81) digit puzzle that every symmetry preserves (equal keys: maybe equivalent).

    Built from each clue's row, column, box and digit counts, taken in both orientations (the smaller
    of the two, so a transposed copy gets the same key). Digit relabelling and the row/column/band/stack
    permutations only move these counts around, and the multiset is sorted.
    """
    keys = []
    for start in range(0, len(boards), chunk):
        grid = np.asarray(boards[start:start + chunk], dtype=np.int64).reshape(-1, 9, 9)
        plain, flipped = _clue_codes(grid, False), _clue_codes(grid, True)
        for a, b in zip(plain, flipped):
            a, b = a.tobytes(), b.tobytes()
            keys.append(hashlib.blake2b(min(a, b), digest_size=12).digest())
    return keys


def _profile_matches(counts_from: np.ndarray, counts_to: np.ndarray) -> np.ndarray:
    """The row (or column) orders under which one puzzle's clue counts per line become the other's."""
    return _BLOCK_ORDERS[(counts_from[_BLOCK_ORDERS] == counts_to).all(1)]


def equivalent(a: np.ndarray, b: np.ndarray) -> bool:
    """Is digit puzzle b (81,) the image of a under some Sudoku symmetry? Exact: searches the group.

    Only row and column orders that carry a's clue counts per line onto b's are tried, and for each
    surviving pair the relabelling must be a bijection; a few ms for the candidates invariant_keys leaves.
    """
    a, b = np.asarray(a).reshape(9, 9), np.asarray(b).reshape(9, 9)
    if (a > 0).sum() != (b > 0).sum():
        return False
    for grid in (a, a.T):
        mask, target = grid > 0, b > 0
        row_orders = _profile_matches(mask.sum(1), target.sum(1))
        col_orders = _profile_matches(mask.sum(0), target.sum(0))
        for rows in row_orders:
            moved = grid[rows]
            images = moved[:, col_orders].transpose(1, 0, 2)  # (orders, 9, 9)
            hits = ((images > 0) == target).all((1, 2))
            for image in images[hits]:
                if _relabels_onto(image, b):
                    return True
    return False


def _relabels_onto(image: np.ndarray, target: np.ndarray) -> bool:
    """Do the clue digits of `image` map one-to-one onto those of `target` (same clue cells)?"""
    clues = image > 0
    pairs = set(zip(image[clues].tolist(), target[clues].tolist()))
    return len({p for p, _ in pairs}) == len(pairs) == len({q for _, q in pairs})


def cross_split_copies(boards: np.ndarray, held_out: np.ndarray) -> np.ndarray:
    """Boolean mask over `boards` (N, 81): True where the puzzle is equivalent to one in `held_out`."""
    by_key = defaultdict(list)
    for i, key in enumerate(invariant_keys(held_out)):
        by_key[key].append(i)
    hit = np.zeros(len(boards), dtype=bool)
    for i, key in enumerate(invariant_keys(boards)):
        for j in by_key.get(key, ()):
            if equivalent(held_out[j], boards[i]):
                hit[i] = True
                break
    return hit
