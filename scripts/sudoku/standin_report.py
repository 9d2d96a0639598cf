"""The stand-in study's report, drawn only from its kept results (results/standin_study/): the crossover
figure, the difficulty ladder and Table 1's columns (scripts/sudoku/standin_study.py runs the study).

    python scripts/sudoku/standin_study.py --report_only          # or: python scripts/sudoku/standin_report.py

The kept results are laid out as scripts/sudoku/standin_protocol.py says (one sample.py --out file per run, puzzle
set, protocol and training compute); <out>/puzzles.json holds the rating and clue count of each set's
puzzles in the order they were scored (no puzzles), so the ladder redraws without the data.
"""
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
import sudoku.frontier  # noqa: E402
import sudoku.report  # noqa: E402
from scripts.sudoku.standin_protocol import FILE, FULL, LIGHT, RUN, SETS, slug  # noqa: E402
from sudoku.frontier import Point  # noqa: E402

NAMES = sudoku.report.OBJECTIVE_NAMES
HEADLINE_TAU = 0.15
RATING_BANDS = ((0, 0), (1, 10), (11, 50), (51, 100), (101, 200), (201, None))  # this solver's backtracks
CLUE_BANDS = ((17, 23), (24, 26), (27, 30), (31, 45))
MATCHED_BUDGETS = 4  # NFE budgets spread over the range every compared curve covers


# -----------------------------------------------------------------------------
# reading the kept results

def load(out: str) -> dict:
    """{(objective, seed, set slug, protocol, equivalents): the cohort's results by τ key} of every kept JSON."""
    found = {}
    for run in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        m = RUN.match(run)
        if not m:
            continue
        for set_slug in sorted(os.listdir(os.path.join(out, run))):
            folder = os.path.join(out, run, set_slug)
            for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
                f = FILE.match(name)
                if not f:
                    continue
                with open(os.path.join(folder, name)) as fh:
                    kept = json.load(fh)
                results = next(iter(kept["checkpoints"][0]["results"].values()))
                found[m.group(1), int(m.group(2)), set_slug, f.group(1), int(f.group(2))] = results
    return found


def curve(results: dict, metric: str = "exact_match", keep: np.ndarray | None = None) -> list[Point]:
    """A τ sweep as frontier points (Table 1's batch-1 NFE); `keep` selects puzzles from the per-puzzle record."""
    points = []
    for m in results.values():
        if keep is None:
            points.append(Point(nfe=m["batch1_nfe"], acc=m[metric], n=m["n"]))
            continue
        pp = m["per_puzzle"]
        nfe = np.asarray(pp["batch1_nfe"], dtype=float)[keep]
        if metric == "exact_match":
            value = np.frombuffer(pp["solved"].encode(), dtype=np.uint8)[keep] == ord("1")
        else:
            value = np.asarray(pp["blank_right"], dtype=float)[keep]
        points.append(Point(nfe=float(nfe.mean()), acc=float(value.mean()), n=int(keep.sum())))
    return points


def matched_mean(curves: list[list[Point]], budgets: list[float]) -> list[float]:
    """Each curve's mean accuracy over the budgets (all inside every curve's NFE range)."""
    return [float(np.mean([sudoku.frontier.accuracy_at(c, b)[0] for b in budgets])) for c in curves]


def mean_sd(values: list[float]) -> tuple[float, float]:
    mean = float(np.mean(values))
    return mean, (float(np.std(values, ddof=1)) if len(values) > 1 else math.nan)


def puzzle_se(mlm: list[float], relay: list[float], n: int) -> float:
    """The standard error of mean(Relay - MLM) over seeds that comes from scoring only n puzzles. Per seed,
    each accuracy's binomial variance, the two models' treated as independent (an upper bound on the same
    puzzles, where their successes correlate). Agresti-Caffo: one solved and one unsolved puzzle added to
    each accuracy, p = (a n + 1) / (n + 2) with variance p(1 - p) / (n + 2), so that 0% against 0% on a
    few puzzles does not claim an error of zero. Over seeds, the mean of their standard errors: every seed
    is scored on the same puzzles, so the puzzles' error does not average out over seeds (dividing by
    sqrt(seeds) would assume it did); the mean is its upper bound whatever the seeds' correlation."""
    def var(acc: float) -> float:
        p = (acc * n + 1) / (n + 2)
        return p * (1 - p) / (n + 2)
    pairs = list(zip(mlm, relay))  # seed i of each
    return sum(math.sqrt(var(a) + var(b)) for a, b in pairs) / len(pairs)


def _fmt(values: list[float]) -> str:
    m, s = mean_sd(values)
    mean = f"{100 * m:.1f}".replace("-0.0", "0.0")  # rounding noise of a zero difference
    return mean + ("" if math.isnan(s) else f" ± {100 * s:.1f}")


# -----------------------------------------------------------------------------
# the crossover: accuracy at matched NFE against training compute

def crossover(found: dict, set_slug: str, metric: str = "exact_match", seeds: set[int] | None = None,
              upto: int | None = None) -> list[dict]:
    """Per compute point (up to `upto`) where MLM and Relay both have light results: the NFE budgets both
    cover, and each objective's per-seed mean accuracy over them (the seeds present at that point, or only
    `seeds`)."""
    rows = []
    points = sorted({k[4] for k in found if k[2] == set_slug and k[3] == "light" and (upto is None or k[4] <= upto)})
    for eq in points:
        sweeps = {o: {s: found[k] for k in found if k[0] == o and k[2] == set_slug and k[3] == "light"
                      and k[4] == eq and (seeds is None or k[1] in seeds) for s in [k[1]]} for o in ("mlm", "relay")}
        if not all(sweeps.values()):
            continue
        curves = {o: [curve(r, metric) for _, r in sorted(v.items())] for o, v in sweeps.items()}
        budgets = sudoku.frontier.even_budgets(curves["mlm"] + curves["relay"], MATCHED_BUDGETS)
        row = {"equivalents": eq, "budgets": budgets, "n": min(p.n for c in curves["mlm"] for p in c),
               "seeds": {o: sorted(v) for o, v in sweeps.items()}}
        for o, cs in curves.items():
            row[o] = matched_mean(cs, budgets) if budgets else []
        rows.append(row)
    return rows


def crossover_table(found: dict, set_names: dict[str, str], seeds: set[int] | None = None,
                    upto: int | None = None) -> str:
    lines = []
    for set_slug, title in set_names.items():
        rows = crossover(found, set_slug, seeds=seeds, upto=upto)
        if not rows:
            continue
        over = "mean over seeds ± s.d."
        if seeds is not None:
            title += f", seed {', '.join(map(str, sorted(seeds)))} alone"
            over = "this seed's pair"
        lines += [f"\n**{title}**: exact match (%) at matched NFE per puzzle, {over}", "",
                  "| compute (MLM-step equivalents) | NFE range | MLM | Relay | Relay − MLM | s.e. (puzzles) | seeds |",
                  "|---|---|---|---|---|---|---|"]
        for r in rows:
            if not r["budgets"]:
                lines.append(f"| {r['equivalents']:,} | no NFE range both cover | | | | | |")
                continue
            paired = r["seeds"]["mlm"] == r["seeds"]["relay"]  # else no difference seed by seed (mid-evaluation)
            diff = [b - a for a, b in zip(r["mlm"], r["relay"])]  # seed i of Relay against seed i of MLM
            se = f"{100 * puzzle_se(r['mlm'], r['relay'], r['n']):.1f}" if paired else "n/a"
            lines.append(f"| {r['equivalents']:,} | {r['budgets'][0]:.1f}-{r['budgets'][-1]:.1f} | {_fmt(r['mlm'])} | "
                         f"{_fmt(r['relay'])} | {_fmt(diff) if paired else 'n/a'} | {se} | "
                         f"{len(r['mlm'])} / {len(r['relay'])} |")
    return "\n".join(lines)


def plot_crossover(found: dict, set_names: dict[str, str], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    metrics = (("exact_match", "exact match (%)"), ("token_accuracy", "blank cells filled right (%)"))
    fig, axes = plt.subplots(2, len(set_names), figsize=(5 * len(set_names), 7.5), squeeze=False)
    for col, (set_slug, title) in enumerate(set_names.items()):
        for row, (metric, label) in enumerate(metrics):
            ax = axes[row][col]
            rows = [r for r in crossover(found, set_slug, metric, upto=final_point(found)) if r["budgets"]]
            for o in ("mlm", "relay"):
                xs = [r["equivalents"] for r in rows]
                stats = [mean_sd(r[o]) for r in rows]
                mean = np.array([100 * m for m, _ in stats])
                sd = np.nan_to_num(np.array([100 * s for _, s in stats]))
                ax.plot(xs, mean, "o-", color=sudoku.report.OBJECTIVE_COLORS[o], label=NAMES[o])
                ax.fill_between(xs, mean - sd, mean + sd, color=sudoku.report.OBJECTIVE_COLORS[o], alpha=0.2)
            for seed in extended_seeds(found):  # its own curve, all of it: its values differ from the mean's
                alone = [r for r in crossover(found, set_slug, metric, seeds={seed}) if r["budgets"]]
                for o in ("mlm", "relay"):
                    ax.plot([r["equivalents"] for r in alone], [100 * r[o][0] for r in alone], "o--", mfc="none",
                            lw=1, color=sudoku.report.OBJECTIVE_COLORS[o], label=f"{NAMES[o]}, seed {seed} alone")
            ax.set(xlabel="training compute (MLM-step equivalents)", ylabel=f"{label} at matched NFE")
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(title)
                ax.legend(fontsize=8)
    fig.suptitle("Stand-in for Sudoku-Extreme: MLM and Relay at matched NFE during training (mean of the seeds ± "
                 "s.d.; dashed: a seed trained on alone)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -----------------------------------------------------------------------------
# the ladder: Relay - MLM at matched NFE per difficulty band, final checkpoints

def paired_seeds(found: dict, set_slug: str, eq: int) -> list[int]:
    """The seeds whose MLM and Relay both have full results on the set at compute eq."""
    return sorted(s for o, s, sl, protocol, e in found if o == "mlm" and sl == set_slug and protocol == "full"
                  and e == eq and ("relay", s, sl, "full", e) in found)


def final_point(found: dict) -> int | None:
    """The compute of the ladder and Table 1's columns: where the most seed pairs (MLM and Relay of one seed)
    have full results on the test split, the largest such. A run extended past the study's budget alone
    (e.g. seed 1 to 24,000) shows in the crossover and does not take the ladder from the other seeds."""
    paired = {eq: len(paired_seeds(found, "test", eq)) for eq in {k[4] for k in found}}
    return max((n, eq) for eq, n in paired.items() if n)[1] if any(paired.values()) else None


def extended_seeds(found: dict) -> list[int]:
    """The seeds whose MLM and Relay both have light results past final_point (trained past the study's budget)."""
    last = final_point(found)
    if last is None:
        return []
    past = {(o, s) for o, s, _, protocol, eq in found if protocol == "light" and eq > last}
    return sorted(s for o, s in past if o == "mlm" and ("relay", s) in past)


def extended_full_point(found: dict, seed: int) -> int | None:
    """The largest compute past final_point where this seed's MLM and Relay both have full results on the test split."""
    past = [e for e in {k[4] for k in found} if e > (final_point(found) or 0)]
    return max((e for e in past if seed in paired_seeds(found, "test", e)), default=None)


def bands(values: np.ndarray, edges: tuple) -> list[tuple[str, np.ndarray]]:
    out = []
    for lo, hi in edges:
        keep = (values >= lo) & (values <= (np.inf if hi is None else hi))
        out.append((f"{lo}+" if hi is None else (f"{lo}" if lo == hi else f"{lo}-{hi}"), keep))
    return out


def ladder(found: dict, info: dict, eq: int, set_slug: str = "test") -> list[dict]:
    """Per rating band and clue band of the set's scored puzzles: each objective's accuracy at matched NFE
    (per seed) and Relay - MLM seed by seed, over the seeds both objectives have results for."""
    seeds = paired_seeds(found, set_slug, eq)
    sweeps = {o: [found[o, s, set_slug, "full", eq] for s in seeds] for o in ("mlm", "relay")}
    rows = []
    for kind, key, edges in (("rating", "rating", RATING_BANDS), ("clues", "clues", CLUE_BANDS)):
        values = np.asarray(info[set_slug][key])
        for label, keep in bands(values, edges):
            if keep.sum() < 10:
                continue
            curves = {o: [curve(r, "exact_match", keep) for r in rs] for o, rs in sweeps.items()}
            budgets = sudoku.frontier.even_budgets(curves["mlm"] + curves["relay"], MATCHED_BUDGETS)
            row = {"kind": kind, "band": label, "n": int(keep.sum()), "budgets": budgets}
            if budgets:
                row.update({o: matched_mean(cs, budgets) for o, cs in curves.items()})
                row["se"] = puzzle_se(row["mlm"], row["relay"], row["n"])
            rows.append(row)
    return rows


def ladder_table(rows: list[dict], eq: int) -> str:
    lines = ["| band | puzzles | NFE range | MLM | Relay | Relay − MLM (seed by seed) | s.e. (puzzles) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        name = f"rating {r['band']}" if r["kind"] == "rating" else f"{r['band']} clues"
        if not r["budgets"]:
            lines.append(f"| {name} | {r['n']} | no NFE range both cover | | | | |")
            continue
        diff = [b - a for a, b in zip(r["mlm"], r["relay"])]
        lines.append(f"| {name} | {r['n']} | {r['budgets'][0]:.1f}-{r['budgets'][-1]:.1f} | {_fmt(r['mlm'])} | "
                     f"{_fmt(r['relay'])} | {_fmt(diff)} | {100 * r['se']:.1f} |")
    return (f"Exact match (%) at matched NFE per puzzle on the test split, by this solver's rating and by clue "
            f"count, at {eq:,} MLM-step equivalents (mean over seeds ± s.d.; s.e. (puzzles): the standard error "
            f"of the difference from the band's puzzle count alone)\n\n" + "\n".join(lines))


def plot_ladder(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
    for ax, kind, xlabel in zip(axes[0], ("rating", "clues"), ("rating band (solver backtracks)", "clue band")):
        sel = [r for r in rows if r["kind"] == kind]
        for i, r in enumerate(sel):
            if not r["budgets"]:  # a band the sweeps give no common NFE: say so rather than drop its slot
                ax.text(i, 0, "no NFE range\nall runs cover", ha="center", va="bottom", fontsize=7)
                continue
            diff = [100 * (b - a) for a, b in zip(r["mlm"], r["relay"])]
            ax.bar(i, np.mean(diff), yerr=100 * r["se"], capsize=3, color="C3", alpha=0.6)
            ax.plot([i] * len(diff), diff, "k.", markersize=5)
        x = np.arange(len(sel))
        ax.set_xlim(-0.6, len(sel) - 0.4)
        ax.axhline(0, color="k", linewidth=0.8)
        ax.set_xticks(x, [f"{r['band']}\n(n={r['n']})" for r in sel], fontsize=8)
        ax.set(xlabel=xlabel, ylabel="Relay − MLM (points)")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("Difficulty ladder on the test split: Relay − MLM, exact match at matched NFE\n"
                 "(bars: mean over seeds with the puzzle-count s.e.; dots: each seed pair)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -----------------------------------------------------------------------------
# the puzzles' ratings and clue counts, and the report

def puzzle_info(out: str, data_dir: str, sets: dict[str, tuple[str, int]]) -> dict:
    """{set slug: {rating, clues}} of the puzzles the full protocol scores, in order: read from data_dir when it
    is here (and written to out/puzzles.json), else from out/puzzles.json."""
    path = os.path.join(out, "puzzles.json")
    files = {slug(name): os.path.join(data_dir, f) for name, (f, _) in sets.items()}
    if all(os.path.exists(f) for f in files.values()):
        import pandas as pd
        from sudoku.puzzle_files import strings_to_digits
        info = {}
        for name, (f, n) in sets.items():
            frame = pd.read_parquet(os.path.join(data_dir, f))
            frame = frame.iloc[:n] if n else frame
            info[slug(name)] = {"rating": frame["rating"].astype(int).tolist(),
                                "clues": (strings_to_digits(frame["question"]) > 0).sum(1).tolist()}
        os.makedirs(out, exist_ok=True)
        with open(path, "w") as f:
            json.dump(info, f)
        return info
    if not os.path.exists(path):
        raise SystemExit(f"no {path} and no data in {data_dir}: build the data (prepare_data.py --source=standin)")
    with open(path) as f:
        return json.load(f)


def n_scored(found: dict, set_slug: str, eq: int) -> int:
    """How many puzzles the full protocol scored on a set at compute eq (the first n of its file)."""
    ns = {next(iter(r.values()))["n"] for k, r in found.items() if k[2] == set_slug and k[3] == "full" and k[4] == eq}
    if len(ns) != 1:
        raise SystemExit(f"the full results on {set_slug} at {eq} equivalents scored different numbers of puzzles "
                         f"({sorted(ns)}): not comparable")
    return ns.pop()


def full_sweeps(found: dict, eq: int, set_names: dict[str, str], seeds: set[int] | None = None) -> dict:
    """{set title: {objective: [each seed's full sweep]}} at compute eq, objectives in Table 1's order (all
    seeds, or only `seeds`)."""
    results = {}
    for set_slug, title in set_names.items():
        for o in ("mlm", "rollout", "relay_sg", "relay"):
            sweeps = [found[k] for k in sorted(found) if k[0] == o and k[2] == set_slug and k[3] == "full"
                      and k[4] == eq and (seeds is None or k[1] in seeds)]
            if sweeps:
                results.setdefault(title, {})[o] = sweeps
    return results


def table1(found: dict, eq: int, set_names: dict[str, str], seeds: set[int] | None = None) -> str:
    from scripts.sudoku.hard_study import table
    return table(full_sweeps(found, eq, set_names, seeds), HEADLINE_TAU)


def extra_objective_points(found: dict) -> list[tuple[int, int]]:
    """(seed, compute) of every Rollout or Relay (sg) run's full results: where the four objectives are
    compared, whatever compute MLM and Relay have reached since."""
    return sorted({(s, e) for o, s, _, protocol, e in found if o in ("rollout", "relay_sg") and protocol == "full"})


def objectives_compared(found: dict, set_names: dict[str, str]) -> list[str]:
    """The four objectives at matched NFE, for each seed and compute with a Rollout or Relay (sg) run: that
    seed's runs at that compute only, so every objective is read on the same NFE budgets."""
    from scripts.sudoku.hard_study import matched
    text = []
    for seed, eq in extra_objective_points(found):
        text += ["", f"## The four objectives, seed {seed} ({eq:,} MLM-step equivalents, full protocol)",
                 matched(full_sweeps(found, eq, set_names, {seed}), MATCHED_BUDGETS)]
    return text


def plot_objectives(found: dict, set_names: dict[str, str], taus: list[float], path: str) -> None:
    """The four objectives' accuracy-NFE frontiers of the first seed and compute that has them (full protocol)."""
    seed, eq = extra_objective_points(found)[0]
    panels = {title: {NAMES[o]: [curve(sweeps[0])] for o, sweeps in by_objective.items()}
              for title, by_objective in full_sweeps(found, eq, set_names, {seed}).items()}
    colors = {NAMES[o]: c for o, c in sudoku.report.OBJECTIVE_COLORS.items()}
    title = (f"seed {seed} at {eq:,} MLM-step equivalents: exact match against NFE per puzzle over "
             f"τ ∈ {{{', '.join(f'{t:g}' for t in taus)}}}")
    sudoku.frontier.plot_panels(panels, colors, title, path)


def protocol_text(spec: dict) -> str:
    sets = ", ".join(f"{name} first {n}" if n else f"{name} all" for name, n in spec["n"].items())
    return sets + "; τ ∈ {" + ", ".join(f"{t:g}" for t in spec["taus"]) + "}"


def report(out: str, figures: str, data_dir: str) -> None:
    found = load(out)
    if not found:
        raise SystemExit(f"no kept results in {out}: run the study first (scripts/sudoku/standin_study.py)")
    set_names = {slug(name): name for name in SETS}
    eq = final_point(found)  # the ladder's and Table 1's compute; the crossover's means stop there
    text = ["# Stand-in study: MLM and Relay on Sudoku-Extreme's composition", "",
            f"## Crossover (light protocol: {protocol_text(LIGHT)})",
            crossover_table(found, set_names, upto=eq)]
    for seed in extended_seeds(found):
        text += ["", f"## Seed {seed} trained past the study's budget (light protocol; matched NFE over this "
                 "seed's own curves, so its values at shared points differ from the means above)",
                 crossover_table(found, set_names, seeds={seed})]
        last = extended_full_point(found, seed)
        for e in (eq, last) if last is not None else ():  # the same seed before and after
            text += ["", f"Table 1's columns at τ = {HEADLINE_TAU:g}, seed {seed} at {e:,} MLM-step equivalents "
                     f"(full protocol):", "", table1(found, e, set_names, seeds={seed})]
    os.makedirs(figures, exist_ok=True)
    plot_crossover(found, set_names, os.path.join(figures, "standin_crossover.png"))
    if eq is not None:
        scored = {name: n_scored(found, slug(name), eq) for name in SETS}  # the n each full result scored
        info = puzzle_info(out, data_dir, {name: (f, scored[name]) for name, f in SETS.items()})
        rows = ladder(found, info, eq)
        text += ["", f"## Difficulty ladder (full protocol: {protocol_text(FULL)})", "", ladder_table(rows, eq)]
        plot_ladder(rows, os.path.join(figures, "standin_ladder.png"))
        text += ["", f"## Table 1's columns at τ = {HEADLINE_TAU:g} ({eq:,} MLM-step equivalents, full protocol: "
                 f"{protocol_text(FULL)})",
                 "", table1(found, eq, set_names)]
    text += objectives_compared(found, set_names)
    if extra_objective_points(found):
        plot_objectives(found, set_names, FULL["taus"], os.path.join(figures, "standin_objectives.png"))
    body = "\n".join(text) + "\n"
    print(body)
    with open(os.path.join(out, "standin_study.md"), "w") as f:
        f.write(body)
    print(f"wrote {out}/standin_study.md and the figures in {figures}")


def main(argv: list[str] | None = None) -> None:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--out", default="results/standin_study", help="the kept results; the report is written here")
    p.add_argument("--figures", default="", help="where the figures go (default: --out)")
    p.add_argument("--data_dir", default="data/sudoku-standin", help="the study's data (else out/puzzles.json)")
    a = p.parse_args(argv)
    from scripts.runs import check_folder
    for flag, path in (("--out", a.out), ("--figures", a.figures or a.out)):
        check_folder(path, flag)
    report(a.out, a.figures or a.out, a.data_dir)


if __name__ == "__main__":
    main()
