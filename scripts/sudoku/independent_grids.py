"""A second, independently written sampler of complete Sudoku grids, for checking the production generator.

Plain backtracking over the cells in row-major order with a fresh random digit order at every
cell: no candidate propagation, no cell heuristic, no symmetry step, nothing shared with
`sudoku.board.random_grid` beyond the rules of the game. Its grids are not exactly uniform either, but
any structure a network could learn from `random_grid` and not from these shows up as a
difference between the two (tests/test_generator.py), and puzzles built on these grids measure
whether a trained model transfers beyond its own generator (scripts/sudoku/transfer_check.py).
"""
import numpy as np


def _allowed(grid: list[int], cell: int) -> list[int]:
    """Digits not yet used in the cell's row, column and box."""
    r, c = divmod(cell, 9)
    used = set(grid[9 * r:9 * r + 9]) | set(grid[c::9])
    br, bc = 3 * (r // 3), 3 * (c // 3)
    used |= {grid[9 * (br + i) + bc + j] for i in range(3) for j in range(3)}
    return [d for d in range(1, 10) if d not in used]


def independent_grid(rng: np.random.Generator) -> np.ndarray:
    """One complete grid as (81,) int8 digits."""
    grid = [0] * 81

    def fill(cell: int) -> bool:
        if cell == 81:
            return True
        options = _allowed(grid, cell)
        for k in rng.permutation(len(options)).tolist():
            grid[cell] = options[k]
            if fill(cell + 1):
                return True
        grid[cell] = 0
        return False

    fill(0)
    return np.array(grid, dtype=np.int8)
