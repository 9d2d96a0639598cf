"""Accuracy at matched NFE (sudoku/frontier.py), against values computed by hand.

Planted bugs each test was seen to catch: the interpolation weight taken from the wrong end
(acc 0.5 instead of 0.3 at NFE 12.5); a budget past the last point answered with the last point's
accuracy (extrapolation); the difference row as first minus second.
"""
import math

import sudoku.frontier as F

MLM = [F.Point(nfe=20.0, acc=0.60, n=100), F.Point(nfe=10.0, acc=0.20, n=100)]  # deliberately out of NFE order
RELAY = [F.Point(nfe=8.0, acc=0.30, n=400), F.Point(nfe=16.0, acc=0.70, n=400), F.Point(nfe=24.0, acc=0.80, n=400)]


def test_interpolates_between_the_bracketing_points():
    acc, se = F.accuracy_at(MLM, 12.5)
    assert math.isclose(acc, 0.30) and math.isclose(se, math.sqrt(0.3 * 0.7 / 100))
    assert math.isclose(F.accuracy_at(RELAY, 20.0)[0], 0.75)
    assert math.isclose(F.accuracy_at(MLM, 10.0)[0], 0.20) and math.isclose(F.accuracy_at(MLM, 20.0)[0], 0.60)


def test_never_extrapolates():
    assert F.accuracy_at(MLM, 20.5) is None and F.accuracy_at(MLM, 9.9) is None and F.accuracy_at([], 1.0) is None


def test_shared_range_and_even_budgets():
    assert F.shared_range([MLM, RELAY]) == (10.0, 20.0)
    assert F.even_budgets([MLM, RELAY], k=3) == [10.0, 15.0, 20.0]
    assert F.shared_range([MLM, [F.Point(30.0, 0.9, 10)]]) is None


def test_even_budgets_end_inside_every_curve():
    """lo + (hi - lo) rounds to 28.136000000000003 for this range: a last budget past the curve's end would
    have no accuracy there."""
    curves = [[F.Point(nfe=13.506, acc=0.1, n=10), F.Point(nfe=30.0, acc=0.2, n=10)],
              [F.Point(nfe=10.0, acc=0.1, n=10), F.Point(nfe=28.136, acc=0.3, n=10)]]
    budgets = F.even_budgets(curves, k=4)
    assert budgets[0] == 13.506 and budgets[-1] == 28.136
    assert all(F.accuracy_at(c, b) is not None for c in curves for b in budgets)


def test_compare_table_with_difference():
    text = F.compare({"MLM": MLM, "Relay": RELAY}, budgets=(15.0, 22.0))
    rows = text.splitlines()
    assert rows[2] == "| MLM | 40.0% ± 4.9 | outside |"  # sqrt(.4 * .6 / 100) = 0.049
    assert rows[3] == "| Relay | 65.0% ± 2.4 | 77.5% ± 2.1 |"  # 0.3 + 0.4 * 7 / 8; sqrt(.65 * .35 / 400)
    assert rows[4] == "| Relay − MLM | +25.0 ± 5.4 | – |"  # hypot(4.90, 2.38)


def test_across_seeds_mean_and_spread():
    other = [F.Point(nfe=10.0, acc=0.40, n=100), F.Point(nfe=20.0, acc=0.80, n=100)]
    mean, sd = F.across_seeds([MLM, other], 15.0)  # 0.40 and 0.60
    assert math.isclose(mean, 0.50) and math.isclose(sd, math.sqrt(0.02))
    assert F.across_seeds([MLM, RELAY], 22.0) is None  # MLM's curve ends at 20
    assert F.across_seeds([MLM], 15.0) == F.accuracy_at(MLM, 15.0)
