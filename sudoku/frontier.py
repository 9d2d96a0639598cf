"""Accuracy at matched NFE: the accuracy-compute frontier of a threshold sweep, read as the paper reads it.

A confidence threshold τ trades accuracy for forward passes, so two models are compared at the same
mean NFE, not the same τ (paper Sec. 4.1, Fig. 2). Each model's sweep gives points (mean NFE,
accuracy over n puzzles); accuracy at an NFE budget is the linear interpolation between the two sweep
points around it, and a budget outside a curve's NFE range has no value (never extrapolated).

    from sudoku.frontier import Point, accuracy_at, compare
    curve = [Point(nfe=7.4, acc=0.63, n=2000), Point(nfe=12.1, acc=0.70, n=2000)]
    accuracy_at(curve, 10.0)      # -> (acc, binomial standard error) or None
    print(compare({"MLM": mlm_curve, "Relay": relay_curve}, budgets=(15, 20, 25, 30)))
"""
import math
from dataclasses import dataclass

AUTHORS_TAUS = (0.01, 0.05, 0.10, 0.15, 0.25, 0.35, 0.45)  # the thresholds of the authors' frontier analysis
AUTHORS_BUDGETS = (15, 20, 25, 30)  # the NFE budgets they read accuracy at


@dataclass(frozen=True)
class Point:
    nfe: float  # mean forward passes per puzzle at one τ
    acc: float  # fraction of puzzles solved exactly
    n: int  # puzzles


def binomial_se(p: float, n: int) -> float:
    """Standard error of a fraction p of n independent puzzles."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else math.nan


def accuracy_at(curve: list[Point], budget: float) -> tuple[float, float] | None:
    """(accuracy, binomial s.e.) interpolated at mean NFE `budget`, or None outside the curve's NFE range.

    The points are taken in order of NFE; the s.e. is that of a fraction at the interpolated accuracy
    on the curve's n puzzles.
    """
    points = sorted(curve, key=lambda p: p.nfe)
    if not points or not points[0].nfe <= budget <= points[-1].nfe:
        return None
    for lo, hi in zip(points, points[1:] + points[-1:]):
        if lo.nfe <= budget <= hi.nfe:
            w = 0.0 if hi.nfe == lo.nfe else (budget - lo.nfe) / (hi.nfe - lo.nfe)
            acc = (1 - w) * lo.acc + w * hi.acc
            return acc, binomial_se(acc, min(lo.n, hi.n))
    return None  # unreachable: the range check above holds a bracketing pair


def shared_range(curves: list[list[Point]]) -> tuple[float, float] | None:
    """The NFE interval every curve covers, or None if they do not overlap."""
    lo = max(min(p.nfe for p in c) for c in curves)
    hi = min(max(p.nfe for p in c) for c in curves)
    return (lo, hi) if lo <= hi else None


def even_budgets(curves: list[list[Point]], k: int = 5) -> list[float]:
    """k budgets spread evenly over the NFE range all curves cover (none if they do not overlap)."""
    span = shared_range(curves)
    if span is None:
        return []
    lo, hi = span
    if k < 2 or hi == lo:
        return [lo]
    # the last one is hi itself: lo + (hi - lo) can round past hi, where a curve ending at hi has no value
    return [lo + (hi - lo) * i / (k - 1) for i in range(k - 1)] + [hi]


def across_seeds(seeds: list[list[Point]], budget: float) -> tuple[float, float] | None:
    """(mean accuracy over seeds, spread) at an NFE budget, or None if a seed's curve does not reach it.
    The spread is the sample s.d. over seeds, or, with one seed, its binomial s.e."""
    values = [accuracy_at(curve, budget) for curve in seeds]
    if not values or any(v is None for v in values):
        return None
    mean = sum(v[0] for v in values) / len(values)
    if len(values) == 1:
        return mean, values[0][1]
    return mean, math.sqrt(sum((v[0] - mean) ** 2 for v in values) / (len(values) - 1))


def compare(curves: dict[str, list[Point]], budgets: tuple[float, ...] | list[float]) -> str:
    """Markdown: accuracy ± s.e. of each curve at each budget ("outside" where a curve does not reach it),
    then, for exactly two curves, the difference (second minus first) ± its s.e."""
    names = list(curves)
    head = ["model"] + [f"NFE {b:.1f}" for b in budgets]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    values = {name: [accuracy_at(curve, b) for b in budgets] for name, curve in curves.items()}
    for name in names:
        cells = ["outside" if v is None else f"{100 * v[0]:.1f}% ± {100 * v[1]:.1f}" for v in values[name]]
        lines.append("| " + " | ".join([name] + cells) + " |")
    if len(names) == 2:
        cells = []
        for a, b in zip(values[names[0]], values[names[1]]):
            cells.append("–" if a is None or b is None
                         else f"{100 * (b[0] - a[0]):+.1f} ± {100 * math.hypot(a[1], b[1]):.1f}")
        lines.append("| " + " | ".join([f"{names[1]} − {names[0]}"] + cells) + " |")
    return "\n".join(lines)


def plot(curves: dict[str, list[list[Point]]], colors: dict[str, str], ax, budgets: int = 25) -> None:
    """One curve per model on a matplotlib axis: the mean over seeds at budgets covered by every seed, and a
    ribbon of ± one s.d. over seeds (one seed: ± its binomial s.e.); each seed's own points as dots."""
    for name, seeds in curves.items():
        grid = even_budgets(seeds, budgets)
        color = colors.get(name)
        for curve in seeds:
            ax.plot([p.nfe for p in curve], [100 * p.acc for p in curve], "o", color=color, markersize=3, alpha=0.6)
        if not grid:
            continue
        at = [across_seeds(seeds, b) for b in grid]
        mean, spread = [100 * m for m, _ in at], [100 * s for _, s in at]
        label = f"{name} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})"
        ax.plot(grid, mean, "-", color=color, label=label)
        ax.fill_between(grid, [m - s for m, s in zip(mean, spread)], [m + s for m, s in zip(mean, spread)],
                        color=color, alpha=0.2)
    ax.set(xlabel="mean NFE per puzzle (forward passes)", ylabel="exact match (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_panels(panels: dict[str, dict[str, list[list[Point]]]], colors: dict[str, str], title: str, path: str) -> None:
    """One `plot` panel per puzzle set ({panel title: {model: seeds' curves}}) in a row, saved as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (name, curves) in zip(axes[0], panels.items()):
        plot(curves, colors, ax)
        ax.set_title(name)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
