"""The report of Table 2 in miniature v2 and v3 (scripts/table2/study.py), from the kept result JSONs
alone; v3's part T has its own (trajectory_report).

    python scripts/table2/study.py --study=v2 --report_only  # same as: python scripts/table2/mini_report_v2.py results/mini_study_v2
    python scripts/table2/study.py --study=v3,v3t --report_only

The outcomes are the ones fixed before the seeds ran (docs/table2_v2_protocol.md, docs/table2_v3_protocol.md):
- primary: mean NFE per test task at tau 0.85, Relay - SFT, its 95% interval over the seed pairs (a t interval of the
  per-seed differences; seed s of both methods starts from the same model and reads the rows in the same order);
  decisive when the interval's half-width is under 10% of SFT's mean NFE, a verdict read at PAIRS seed pairs (before,
  the line says where the interval stands, marked interim);
- secondary: pass@1 plus at tau 0.85 (Relay non-inferior when the interval's lower end is above -5 points), and
  pass@1 plus at matched NFE along the tau sweep (per-task paired s.e., seed s.d.).
Also: the same at tau 0.85 in the held-out wording, validation pass@1, the chosen steps, the cost per step and the
share of clipped steps, where NFE differences come from, rows seen, B3's trace and regime check (v3), and the
accuracy-NFE frontier figure.
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
from scripts.table2 import store  # noqa: E402

TAU = 0.85
MARGIN = 5.0  # non-inferiority margin of pass@1, points
DECISIVE = 0.10  # the primary interval's half-width, as a share of SFT's mean NFE
PAIRS = 6  # the seed pairs the protocol reads its verdict at (fewer give an interim line, never a verdict)
TASKS = {"test": 400, "reworded": 400, "val": 200}  # the tasks each protocol decodes (v2 and v3)
METHODS = {"base": "Fast-dLLM v2 (stage B)", "sft": "Vanilla SFT", "relay": "Relay", "rollout": "Rollout",
           "relay_sg": "Relay (sg)"}
# two-sided 95% quantiles of Student's t, by degrees of freedom (tests/test_mini_study_v2.py integrates the density)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086}


# -----------------------------------------------------------------------------
# per-task values, curves over tau and matched NFE


def select(r: dict, split: str, key: str) -> list[float]:
    """The per-task values of `key` ("base", "plus", "nfe") over one split ("all" = every task)."""
    return [v for t, v in zip(r["task_ids"], r[key]) if split == "all" or t.split("/")[1] == split]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def sd(values: list[float]) -> float:
    if len(values) < 2:
        return math.nan
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def rate(r: dict, split: str, key: str = "plus") -> float:
    return 100 * mean(select(r, split, key))


def method_of(model: str) -> str:
    return model.rsplit("_s", 1)[0] if "_s" in model and model.rsplit("_s", 1)[1].isdigit() else model


def curves(results: list[dict], protocol: str) -> dict[tuple[str, int], list[dict]]:
    """{(model, step): its results of one protocol, ordered by tau}."""
    out: dict[tuple[str, int], list[dict]] = {}
    for r in results:
        if r["protocol"] == protocol:
            out.setdefault((r["model"], r["step"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["tau"]) for k, v in out.items()}


def at_nfe(curve: list[dict], split: str, budget: float, key: str = "plus") -> list[float] | None:
    """Per-task scores at mean NFE `budget`: between the two taus whose mean NFE brackets it, each task's verdict
    weighted as the curve's mean is (so their mean is the curve's linear interpolation); None outside the curve."""
    points = sorted(curve, key=lambda r: mean(select(r, split, "nfe")))
    nfes = [mean(select(r, split, "nfe")) for r in points]
    if not points or not nfes[0] <= budget <= nfes[-1]:
        return None
    for i in range(len(points)):
        j = min(i + 1, len(points) - 1)
        if nfes[i] <= budget <= nfes[j]:
            w = 0.0 if nfes[j] == nfes[i] else (budget - nfes[i]) / (nfes[j] - nfes[i])
            return [(1 - w) * a + w * b for a, b in zip(select(points[i], split, key), select(points[j], split, key))]
    return None


def nfe_range(curve: list[dict], split: str) -> tuple[float, float]:
    nfes = [mean(select(r, split, "nfe")) for r in curve]
    return min(nfes), max(nfes)


def paired(pairs: list[tuple[list[float], list[float]]]) -> tuple[float, float, float]:
    """(mean difference b - a, its per-task paired s.e., the s.d. of the seeds' differences) over seed pairs of
    per-task values on the same tasks: each task's difference is averaged over the seeds first."""
    per_seed = [[b - a for a, b in zip(x, y)] for x, y in pairs]
    per_task = [mean(list(d)) for d in zip(*per_seed)]
    return mean(per_task), sd(per_task) / math.sqrt(len(per_task)), sd([mean(d) for d in per_seed])


def seed_pairs(found: dict, step: int | None, a: str, b: str) -> list[tuple[list[dict], list[dict]]]:
    """(curve of a, curve of b) for every seed both have (at `step`, or each one's last step)."""
    def last(model: str) -> list[dict] | None:
        steps = sorted(s for m, s in found if m == model)
        chosen = step if step is not None else (steps[-1] if steps else None)
        return found.get((model, chosen))
    seeds = sorted({int(m.rsplit("_s", 1)[1]) for m, _ in found if method_of(m) == a})
    return [(last(f"{a}_s{s}"), last(f"{b}_s{s}")) for s in seeds if last(f"{a}_s{s}") and last(f"{b}_s{s}")]


def matched_budgets(pairs: list, split: str, k: int = 4) -> list[float]:
    """k budgets spread over the NFE range every curve of every pair covers."""
    ranges = [nfe_range(c, split) for pair in pairs for c in pair]
    lo, hi = max(r[0] for r in ranges), min(r[1] for r in ranges)
    if lo > hi:
        return []
    return [lo + (hi - lo) * i / (k - 1) for i in range(k)] if k > 1 and hi > lo else [lo]


def matched_rows(pairs: list, split: str, key: str = "plus") -> list[tuple]:
    """(budget, pass@1 of a, of b, difference, paired s.e., seed s.d.) at each matched budget."""
    rows = []
    for budget in matched_budgets(pairs, split):
        scored = [(at_nfe(x, split, budget, key), at_nfe(y, split, budget, key)) for x, y in pairs]
        d, se, spread = paired(scored)
        rows.append((budget, 100 * mean([mean(x) for x, _ in scored]), 100 * mean([mean(y) for _, y in scored]),
                     100 * d, 100 * se, 100 * spread))
    return rows


def one(value: float) -> str:
    """One decimal, or "-" where there is no value (a seed s.d. from one seed)."""
    return "-" if math.isnan(value) else f"{value:.1f}"


def fmt(values: list[float], digits: int = 1) -> str:
    if not values:
        return "-"
    return f"{mean(values):.{digits}f}" + (f" ± {sd(values):.{digits}f}" if len(values) > 1 else "")


# -----------------------------------------------------------------------------
# the report


def interval(diffs: list[float]) -> tuple[float, float, float]:
    """(mean, lower, upper): the 95% t interval of the mean of the per-seed differences (nan below two seeds)."""
    if len(diffs) < 2:
        return mean(diffs), math.nan, math.nan
    half = T975[min(len(diffs) - 1, max(T975))] * sd(diffs) / math.sqrt(len(diffs))
    return mean(diffs), mean(diffs) - half, mean(diffs) + half


def by_model(results: list[dict], protocol: str, tau: float) -> dict[str, dict]:
    return {r["model"]: r for r in results if r["protocol"] == protocol and abs(r["tau"] - tau) < 1e-9}


def seeds_of(results: list[dict], method: str) -> list[int]:
    return sorted({int(r["model"].rsplit("_s", 1)[1]) for r in results if method_of(r["model"]) == method})


def seed_diffs(results: list[dict], key, a: str = "sft", b: str = "relay") -> tuple[list[int], list[float], list[float]]:
    """(the seeds both have, per-seed b - a of key(result) at tau 0.85 on the test tasks, a's values)."""
    test = by_model(results, "test", TAU)
    seeds = [s for s in seeds_of(results, a) if f"{a}_s{s}" in test and f"{b}_s{s}" in test]
    return seeds, [key(test[f"{b}_s{s}"]) - key(test[f"{a}_s{s}"]) for s in seeds], [key(test[f"{a}_s{s}"]) for s in seeds]


def devices(results: list[dict]) -> str:
    """Where the results were decoded: one device for all, or each device's runs."""
    runs: dict[str, set] = {}
    for r in results:
        runs.setdefault(r.get("device", "not recorded"), set()).add(r["model"])
    if len(runs) == 1:
        return f"{next(iter(runs))}, every result"
    return "; ".join(f"{d}: {', '.join(sorted(models))}" for d, models in sorted(runs.items()))


def nfe(r: dict) -> float:
    return mean(r["nfe"])


def plus(r: dict) -> float:
    return 100 * mean(r["plus"])


def method_labels(base_label: str) -> dict[str, str]:
    """Each method's row label, the base named as the study names it (v2: stage B, v3: B3)."""
    return METHODS | {"base": base_label}


def table(results: list[dict], base_label: str = METHODS["base"]) -> list[str]:
    lines = ["| model | seeds | step | test: base | plus | NFE | held-out wording: plus | NFE | validation: plus | NFE |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    columns = [("test", "base"), ("test", "plus"), ("test", "nfe"), ("reworded", "plus"), ("reworded", "nfe"),
               ("val", "plus"), ("val", "nfe")]
    for method, label in method_labels(base_label).items():
        models = sorted({r["model"] for r in results if method_of(r["model"]) == method})
        if not models:
            continue
        cells = []
        for protocol, key in columns:
            found = by_model(results, protocol, TAU)
            values = [(100 if key != "nfe" else 1) * mean(found[m][key]) for m in models if m in found]
            cells.append(fmt(values))
        steps = sorted({r["step"] for r in results if r["model"] in models})
        lines.append(f"| {label} | {len(models)} | {', '.join(map(str, steps))} | " + " | ".join(cells) + " |")
    return lines


def interval_text(lo: float, hi: float, digits: int) -> str:
    """The 95% interval with the given decimals; one seed pair has none, and says so."""
    if math.isnan(lo):
        return "no interval from one seed pair"
    return f"95% interval {lo:+.{digits}f} to {hi:+.{digits}f}"


def verdict(pairs: int, inside: bool) -> str:
    """The protocol's verdict at PAIRS seed pairs or more; before, where the interval stands, marked interim."""
    if pairs < PAIRS:
        where = "inside" if inside else "not inside"
        return f"interim, {where} the bound (the verdict is read at {PAIRS} seed pairs)"
    return "decisive" if inside else "NOT decisive: add seeds"


def primary(results: list[dict]) -> list[str]:
    seeds, diffs, sft = seed_diffs(results, nfe)
    if not diffs:
        return ["no seed has both an SFT and a Relay result at tau 0.85 yet"]
    m, lo, hi = interval(diffs)
    bound = DECISIVE * mean(sft)
    pairs = f"{len(diffs)} seed pair" + ("s" if len(diffs) > 1 else "")
    return [f"Relay - SFT, mean NFE per test task at tau {TAU:g}, over {pairs}: {m:+.2f} "
            f"({interval_text(lo, hi, 2)}; SFT's mean NFE {mean(sft):.2f}, so ±10% is ±{bound:.2f}): "
            + verdict(len(diffs), not math.isnan(lo) and (hi - lo) / 2 < bound),
            "", "Per seed (SFT, Relay, difference): " + "; ".join(
                f"s{s}: {a:.2f}, {a + d:.2f}, {d:+.2f}" for s, a, d in zip(seeds, sft, diffs))]


def secondary(results: list[dict]) -> list[str]:
    _, diffs, _ = seed_diffs(results, plus)
    if not diffs:
        return []
    m, lo, hi = interval(diffs)
    reading = "non-inferior" if lo > -MARGIN else ("inferior" if hi < -MARGIN else "not shown non-inferior")
    if len(diffs) < PAIRS:
        reading = f"interim, {reading} so far (the verdict is read at {PAIRS} seed pairs)"
    lines = [f"Relay - SFT, pass@1 plus at tau {TAU:g}, points: {m:+.1f} ({interval_text(lo, hi, 1)}; "
             f"margin -{MARGIN:g}): {reading}", "",
             "pass@1 plus at matched NFE along the tau sweep (Relay - SFT; per-task paired s.e., seed s.d.):", "",
             "| NFE | SFT | Relay | difference | s.e. | seed s.d. |", "|---|---|---|---|---|---|"]
    found = curves(results, "test")
    pairs = seed_pairs(found, None, "sft", "relay")
    for budget, a, b, d, se, spread in matched_rows(pairs, "test") if pairs else []:
        lines.append(f"| {budget:.1f} | {a:.1f} | {b:.1f} | {d:+.1f} | {se:.1f} | {one(spread)} |")
    return lines


def training(out: str) -> list[str]:
    """Each run's median logged throughput and its share of clipped steps, from the kept train_metrics.jsonl."""
    lines = ["| run | steps | median tokens/s | clipped steps | last validation loss |", "|---|---|---|---|---|"]
    for model in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        path = os.path.join(out, model, "train_metrics.jsonl")
        if model == "base" or not os.path.exists(path):
            continue
        rows = store.read_metrics(path)
        speeds = sorted(r["tokens_per_s"] for r in rows if "tokens_per_s" in r)
        steps = [r for r in rows if "clipped" in r]
        clipped = sum(r["clipped"] * n for r, n in zip(steps, step_counts(steps))) / max(1, rows[-1]["step"])
        val = [r["val_loss"] for r in rows if "val_loss" in r]
        lines.append(f"| {model} | {rows[-1]['step']} | {speeds[len(speeds) // 2]:.0f} | {100 * clipped:.0f}% | "
                     f"{val[-1] if val else '-'} |")
    return lines


def step_counts(records: list[dict]) -> list[int]:
    """How many steps each logged record averages (the steps since the record before)."""
    return [r["step"] - (records[i - 1]["step"] if i else 0) for i, r in enumerate(records)]


def nfe_sources(results: list[dict], base_label: str = METHODS["base"]) -> list[str]:
    """Where each method's NFE comes from, at tau 0.85 on the test tasks: answer length (tokens, blocks decoded) and
    forward passes per block (mean over seeds of the per-task means); decodings that recorded blocks only."""
    test = [r for r in by_model(results, "test", TAU).values() if "blocks" in r]
    lines = ["| model | seeds | NFE | answer tokens | blocks | NFE per block |", "|---|---|---|---|---|---|"]
    for method, label in method_labels(base_label).items():
        found = [r for r in test if method_of(r["model"]) == method]
        if found:
            per_block = [mean([n / max(1, b) for n, b in zip(r["nfe"], r["blocks"])]) for r in found]
            lines.append(f"| {label} | {len(found)} | {fmt([nfe(r) for r in found])} | "
                         f"{fmt([mean(r['tokens']) for r in found])} | {fmt([mean(r['blocks']) for r in found], 2)} | "
                         f"{fmt(per_block, 2)} |")
    return lines if len(lines) > 2 else []


def rows_seen(out: str) -> list[str]:
    """Each run's rows (train_fastdllm.py's ledger, where its log has one): new rows per step, distinct rows at the
    last step, the mask ratio of the trained states and the relay LayerNorm weight's norm at the end."""
    lines = ["| run | steps | new rows per step | distinct rows | mask ratio of trained states | relay γ norm |",
             "|---|---|---|---|---|---|"]
    for model in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        path = os.path.join(out, model, "train_metrics.jsonl")
        rows = store.read_metrics(path) if os.path.exists(path) else []
        if not rows or "distinct_rows" not in rows[-1]:
            continue
        weights = step_counts(rows)
        new = sum(r["new_rows"] * n for r, n in zip(rows, weights)) / rows[-1]["step"]
        ratios = [r["mask_ratio"] for r in rows if "mask_ratio" in r]
        gamma = rows[-1].get("relay_gamma_norm")
        lines.append(f"| {model} | {rows[-1]['step']} | {new:.2f} | {rows[-1]['distinct_rows']} | "
                     f"{f'{mean(ratios):.3f}' if ratios else '-'} | {f'{gamma:.3f}' if gamma is not None else '-'} |")
    return lines if len(lines) > 2 else []


def base_trace(out: str) -> list[str]:
    """v3's base: B3's validation pass@1 plus at each decoded step, where the plateau rule stopped, the regime check."""
    path = os.path.join(out, "b3.json")
    if not os.path.exists(path):
        return []
    b3 = store.read_json(path, ("val_plus", "stop"))
    lines = ["B3's validation pass@1 plus (tau 0.85, 200 tasks) by step: " + ", ".join(
        f"{step}: {value:.1f}%" for step, value in sorted(((int(k), v) for k, v in b3["val_plus"].items()))),
        "", f"The plateau rule stopped B3 at step {b3['stop']}."]
    regime = os.path.join(out, "regime.json")
    if os.path.exists(regime):
        check = store.read_json(regime, ("b3_val_plus", "sft_s1_val_plus", "passed"))
        sft = "not run" if check["sft_s1_val_plus"] is None else f"{check['sft_s1_val_plus']:.1f}%"
        needs = check.get("b3_needs", 20)  # regime.json files written before the threshold was recorded: 20
        lines += ["", f"Regime check: B3 {check['b3_val_plus']:.1f}% validation plus (needs >= {needs:g}), SFT seed 1 "
                  f"{sft} (needs B3 ± 5): {'passed' if check['passed'] else 'FAILED'}."]
    return lines


def frontier_point(r: dict) -> tuple[float, float]:
    """One decoding's place on the frontier: (mean NFE per test task, pass@1 plus %)."""
    return mean(select(r, "test", "nfe")), rate(r, "test")


def mean_curve(curves: list[list[dict]]) -> list[tuple[float, float]]:
    """The seeds' mean frontier: at each tau every seed was decoded at, (mean NFE, mean pass@1 plus) over the seeds."""
    taus = sorted(set.intersection(*({r["tau"] for r in c} for c in curves))) if curves else []
    at = [[frontier_point(next(r for r in c if r["tau"] == tau)) for c in curves] for tau in taus]
    return [(mean([nfe for nfe, _ in points]), mean([plus for _, plus in points])) for points in at]


def plot_frontier(results: list[dict], path: str, base_label: str = METHODS["base"]) -> None:
    """Each method's seeds faint, their mean frontier bold (seed s.d. is in the report's tables)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"base": "0.5", "sft": "tab:blue", "rollout": "tab:green", "relay_sg": "tab:purple", "relay": "tab:red"}
    found = curves(results, "test")
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    for method, label in method_labels(base_label).items():
        seeds = [c for (m, _), c in sorted(found.items()) if method_of(m) == method]
        if not seeds:
            continue
        if len(seeds) > 1:
            for c in seeds:
                ax.plot(*zip(*map(frontier_point, c)), "-", color=colors[method], alpha=0.25, lw=1)
        nfe, plus = zip(*mean_curve(seeds))
        ax.plot(nfe, plus, "o-", color=colors[method], ms=4, lw=2,
                label=label + (f" (mean of {len(seeds)} seeds)" if len(seeds) > 1 else ""))
    save_axes(fig, ax, path, "mean NFE per task", "held-out compositions: pass@1 against forward passes over tau")


def save_axes(fig, ax, path: str, xlabel: str, title: str, ylabel: str = "pass@1 plus (%)") -> None:
    """Labels, grid and legend, then the figure written to path (both of the report's figures)."""
    import matplotlib.pyplot as plt
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -----------------------------------------------------------------------------
# v3's part T: trajectories on v2's base, and what each change does to v2's gap

TRAJECTORIES = {"sft_s1": "Vanilla SFT (1e-3)", "relay_s1": "Relay (3e-4)", "relay_steps900_s1": "Relay, 900 steps (3e-4)"}


def trajectory(results: list[dict], model: str) -> list[tuple[int, float, float]]:
    """(step, validation pass@1 plus %, validation mean NFE) at each decoded checkpoint of one run."""
    val = sorted((r for r in results if r["model"] == model and r["protocol"] == "val"), key=lambda r: r["step"])
    return [(r["step"], plus(r), nfe(r)) for r in val]


def nfe_at_plus(points: list[tuple[int, float, float]], target: float) -> float | None:
    """The NFE where the trajectory (in step order) first reaches `target` validation pass@1, interpolated between
    the two checkpoints that bracket it; None if it never does."""
    for (_, p0, n0), (_, p1, n1) in zip(points, points[1:]):
        if min(p0, p1) <= target <= max(p0, p1):
            return n0 if p1 == p0 else n0 + (target - p0) / (p1 - p0) * (n1 - n0)
    return None


def trajectory_lines(results: list[dict]) -> list[str]:
    lines = ["| run | step | validation plus (%) | NFE |", "|---|---|---|---|"]
    for model, label in TRAJECTORIES.items():
        lines += [f"| {label} | {step} | {p:.1f} | {n:.1f} |" for step, p, n in trajectory(results, model)]
    sft, relay = trajectory(results, "sft_s1"), trajectory(results, "relay_s1")
    if len(sft) > 1 and len(relay) > 1:
        lo = max(min(p for _, p, _ in sft), min(p for _, p, _ in relay))
        hi = min(max(p for _, p, _ in sft), max(p for _, p, _ in relay))
        lines += ["", "NFE at matched validation pass@1 plus (each trajectory interpolated where it first reaches it):",
                  "", "| validation plus (%) | SFT | Relay | Relay - SFT |", "|---|---|---|---|"]
        for target in ([lo + (hi - lo) * i / 3 for i in range(4)] if hi > lo else []):
            a, b = nfe_at_plus(sft, target), nfe_at_plus(relay, target)
            if a is not None and b is not None:
                lines.append(f"| {target:.1f} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
    return lines


def v2_test(v2_out: str) -> dict[str, dict]:
    """v2's kept test decodings at tau 0.85, by model (the runs T's changes are read against)."""
    return by_model(kept(v2_out), "test", TAU) if os.path.isdir(v2_out) else {}


def changes(results: list[dict], v2: dict[str, dict]) -> list[str]:
    """Relay - SFT in test NFE at tau 0.85 as v2 ran it and with each of T's changes, per seed and on average."""
    test = by_model(results, "test", TAU)
    rows = [("v2 as run: Relay - SFT", "relay_s{}", "sft_s{}", v2, v2),
            ("rate: Relay at 1e-3 - SFT", "relay_lr0.001_s{}", "sft_s{}", test, v2),
            ("data seen: Relay - SFT on Relay's distinct rows", "relay_s{}", "sft_limited_s{}", v2, test),
            ("length: Relay 900 steps - SFT (300)", "relay_steps900_s{}", "sft_s{}", test, test)]
    lines = ["| comparison (test NFE, tau 0.85) | seeds | per seed | mean | pass@1 plus, points |", "|---|---|---|---|---|"]
    for label, a, b, found_a, found_b in rows:
        seeds = [s for s in (1, 2, 3) if a.format(s) in found_a and b.format(s) in found_b]
        if not seeds:
            continue
        diffs = [nfe(found_a[a.format(s)]) - nfe(found_b[b.format(s)]) for s in seeds]
        points = [plus(found_a[a.format(s)]) - plus(found_b[b.format(s)]) for s in seeds]
        lines.append(f"| {label} | {', '.join(map(str, seeds))} | {', '.join(f'{d:+.1f}' for d in diffs)} | "
                     f"{mean(diffs):+.1f} | {mean(points):+.1f} |")
    return lines if len(lines) > 2 else []


def plot_trajectories(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"sft_s1": "tab:blue", "relay_s1": "tab:red", "relay_steps900_s1": "tab:orange"}
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    for model, label in TRAJECTORIES.items():
        points = trajectory(results, model)
        if points:
            ax.plot([n for _, _, n in points], [p for _, p, _ in points], "o-", color=colors[model], ms=4, label=label)
            for step, p, n in points:
                ax.annotate(str(step), (n, p), fontsize=6, xytext=(3, 3), textcoords="offset points")
    save_axes(fig, ax, path, "mean NFE per validation task (tau 0.85)",
              "v2's base: NFE against pass@1 along training (labels: step)", "validation pass@1 plus (%)")


def trajectory_report(out: str, figures: str | None = None, v2_out: str = "results/mini_study_v2") -> str:
    results = kept(out, pins=os.path.join(v2_out, "data.json"))  # T decodes v2's data, pinned by v2
    lines = ["# Table 2 in miniature v3, part T: report", "",
             "Drawn by scripts/table2/mini_report_v2.py from the JSONs in this folder and v2's.",
             f"Decoded on: {devices(results)}.", "", "## Trajectories (200 validation tasks, tau 0.85)", "",
             *trajectory_lines(results), "", "## Relay - SFT with each change (400 test tasks, tau 0.85)", "",
             *changes(results, v2_test(v2_out)), "", "## Training", "", *training(out), "",
             "## Rows each run trained on", "", *rows_seen(out), ""]
    text = "\n".join(lines)
    with open(os.path.join(out, "mini_study_v3_t.md"), "w") as f:
        f.write(text)
    if any(r["protocol"] == "val" for r in results):
        os.makedirs(figures or out, exist_ok=True)
        plot_trajectories(results, os.path.join(figures or out, "mini_trajectories_v3.png"))
    print(text)
    return text


# what differs between the studies' reports, by the folder's name (v2 chooses each run's step on validation; v3 takes
# checkpoint 200, as the paper; its base is B3)
REPORTS = {"mini_study_v2": ("v2", "each run's step chosen on validation", METHODS["base"]),
           "mini_study_v3": ("v3", "each run's checkpoint 200", "Fast-dLLM v2 (B3)")}


def kept(out: str, pins: str | None = None) -> list[dict]:
    """The study's kept results, each checked against its name, its digests, the protocol's tasks and the study's
    data pins (out/data.json, or pins); a smoke study's folder (toy sizes) is checked for names and digests only."""
    if "smoke" in out:
        return store.load(out)
    path = pins or os.path.join(out, "data.json")
    sha = store.read_json(path, ("sha256",))["sha256"] if os.path.exists(path) else None
    results = store.load(out, tasks=TASKS, stamped=True, pins=sha)
    if results and sha is None:
        raise SystemExit(f"{path} is missing: the study's data pins, which every kept result is checked against "
                         "(restore it: git checkout)")
    return results


def report(out: str, figures: str | None = None) -> str:
    if os.path.basename(os.path.normpath(out)) == "mini_study_v3_t":
        return trajectory_report(out, figures)
    folder = os.path.basename(os.path.normpath(out))  # mini_study_v3_cuda: v3's protocol on another device
    version, steps, base_label = next((REPORTS[k] for k in sorted(REPORTS, reverse=True) if folder.startswith(k)),
                                      REPORTS["mini_study_v2"])
    results = [r for r in kept(out) if r["model"] != "b3"]  # b3: the base's trace, not a row
    lines = [f"# Table 2 in miniature {version}: report", "",
             "Drawn by scripts/table2/mini_report_v2.py from the JSONs in this folder alone.",
             f"Decoded on: {devices(results)}.", "", *([*base_trace(out), ""] if base_trace(out) else []),
             f"## Table 2's columns (tau {TAU:g}; mean ± s.d. over seeds; {steps})", "",
             *table(results, base_label), "", "## Primary outcome", "", *primary(results), "", "## Secondary outcomes",
             "", *secondary(results), "", "## Training (equal steps x batch)", "", *training(out), ""]
    for title, section in (("Where the NFE comes from (test tasks, tau 0.85)", nfe_sources(results, base_label)),
                           ("Rows each run trained on", rows_seen(out))):
        lines += [f"## {title}", "", *section, ""] if section else []
    text = "\n".join(lines)
    with open(os.path.join(out, f"mini_study_{version}.md"), "w") as f:
        f.write(text)
    if any(r["protocol"] == "test" for r in results):
        os.makedirs(figures or out, exist_ok=True)
        plot_frontier(results, os.path.join(figures or out, f"mini_frontier_{version}.png"), base_label)
    print(text)
    return text


def main(argv: list[str] | None = None) -> str:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("out", nargs="?", default="results/mini_study_v2", help="the folder of kept results")
    args = p.parse_args(argv)
    if not os.path.isdir(args.out):
        raise SystemExit(f"mini_report_v2.py: {args.out} is not a folder of kept results (scripts/table2/study.py --out)")
    if not kept(args.out):  # every kept JSON read and checked before anything is written
        raise SystemExit(f"mini_report_v2.py: {args.out} holds no kept results (run/step_*.json)")
    return report(args.out)


if __name__ == "__main__":
    main()
