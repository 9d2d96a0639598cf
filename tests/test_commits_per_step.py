"""scripts/sudoku/commits_per_step.py: the cells each forward commits, averaged by hand and counted on a model
whose every confidence is known."""
import numpy as np
import pytest
import torch

from helpers import constant_checkpoint
from scripts.sudoku import commits_per_step as C
from sudoku.board import format_board, random_grid


def test_a_finished_puzzle_counts_zero():
    """Puzzle A commits 3 then 2 cells, B 1, 1, 1: forward 3 averages B's 1 with A's 0. Fails if the mean
    is taken over the puzzles still running (1.0) or if a forward past the last is dropped (checked)."""
    a = torch.tensor([[1] * 3 + [0] * 78, [1] * 2 + [0] * 79], dtype=torch.bool)
    b = torch.tensor([[1] + [0] * 80] * 3, dtype=torch.bool)
    assert C.commits_per_forward([a, b], 3) == pytest.approx([2.0, 1.5, 0.5])
    assert C.commits_per_forward([a, b], 4) == pytest.approx([2.0, 1.5, 0.5, 0.0])


def test_matched_nfe_compares_the_sweeps_where_both_reach():
    """MLM at NFE 2 and 4 solves 50% and 90%, Relay at 3 and 4 solves 20% and 80%: budgets 3, 3.25, 3.5,
    3.75, 4; at 3 MLM 70% (halfway along its sweep) against Relay's 20%, at 4 90% against 80%. Fails with
    the two checkpoints' τs mixed into one curve, or with two runs' files of one name merged (checked)."""
    rows = [dict(ckpt="runs/a/mlm.safetensors", nfe=4.0, exact=0.9), dict(ckpt="runs/a/mlm.safetensors", nfe=2.0, exact=0.5),
            dict(ckpt="runs/b/relay.safetensors", nfe=3.0, exact=0.2), dict(ckpt="runs/b/relay.safetensors", nfe=4.0, exact=0.8)]
    table = C.matched_nfe_table(rows, 100).splitlines()
    assert table[0] == "| model | NFE 3.0 | NFE 3.2 | NFE 3.5 | NFE 3.8 | NFE 4.0 |"
    assert table[2].startswith("| mlm.safetensors | 70.0% ± 4.6 |") and table[3].startswith("| relay.safetensors | 20.0% ±")
    cells = table[4].split("|")
    assert cells[1].strip() == "relay.safetensors − mlm.safetensors"
    assert cells[2].strip().startswith("-50.0") and cells[6].strip().startswith("-10.0")
    same_name = [dict(r, ckpt="runs/a/relay.safetensors") for r in rows[:2]] + rows[2:]
    assert "runs/a/relay.safetensors" in C.matched_nfe_table(same_name, 100)  # two runs' relay.safetensors: full paths
    assert "widen --taus" in C.matched_nfe_table(rows[:1] + [dict(ckpt="x", nfe=9.0, exact=1.0)], 100)


def test_cells_committed_by_a_model_of_known_confidence(tmp_path, capsys):
    """Every cell at confidence 0.9: u = 0.1 per cell, and at τ = 0.25 the rule commits the cells whose
    cumulative u stays below τ, two per forward. Blanks 5 and 3 (76 and 78 clues): forwards commit 2, 2, 1
    and 2, 1, so the means are 2, 1.5, 0.5; a 41-clue puzzle is left out by --clues=70-81."""
    grid = random_grid(np.random.default_rng(3))
    rows = ["question,answer"]
    for blanks in (5, 3, 40):
        q = grid.copy()
        q.flat[:blanks] = 0
        rows.append(f"{format_board(q)},{format_board(grid)}")
    (tmp_path / "p.csv").write_text("\n".join(rows) + "\n")
    ckpt = constant_checkpoint(tmp_path / "c.pt", digit=5, conf=0.9)
    out = C.main([f"--ckpt={ckpt}", f"--data={tmp_path}/p.csv", "--clues=70-81", "--taus=0.25", "--steps=3"])
    assert len(out) == 1 and out[0]["commits"] == pytest.approx([2.0, 1.5, 0.5])
    assert "2 puzzles with 70-81 clues (mean 4.0 blank cells)" in capsys.readouterr().out


@pytest.mark.parametrize("arg, message", [("--clues=45", "--clues must look like 31-45"),
                                          ("--clues=50-40", "within 0-81"), ("--taus=a", "--taus must be"),
                                          ("--taus=0.1,-1", "finite thresholds >= 0"), ("--taus=nan", ">= 0")])
def test_bad_arguments_are_one_line(tmp_path, arg, message):
    with pytest.raises(SystemExit, match=message):
        C.main(["--ckpt=x", arg])
