"""Table 1, the Pareto figure (paper Figure 2) and merging, from the entries sample.py writes to results.json.

    from sudoku.report import format_frontier, format_table, plot_pareto
    entries = json.load(open("results.json"))["checkpoints"]
    print(format_table(entries, tau=0.15)); plot_pareto(entries, "pareto.png")
    print(format_frontier(entries, budgets=(15, 20, 25, 30)))   # accuracy at matched NFE (sudoku/frontier.py)

Checkpoints of one method are its seeds (same --labels label, else same objective and tying); every
cell is the mean ± sample s.d. over them. Column and metric definitions: docs/sudoku_metrics.md.
"""
import argparse
import hashlib
import json
import math
import os
import sys

import numpy as np
import torch

from sudoku.frontier import Point, compare

OBJECTIVE_NAMES = {"mlm": "MLM", "rollout": "Rollout", "relay_sg": "Relay (sg)", "relay": "Relay"}
# one colour per objective in every figure (matplotlib's first four), so plots can be read side by side
OBJECTIVE_COLORS = {"mlm": "C0", "rollout": "C1", "relay_sg": "C2", "relay": "C3"}


def tau_key(tau: float) -> str:
    """The key of a τ in results.json ("0.15")."""
    return f"{tau:.2f}"


# -----------------------------------------------------------------------------
# Table 1 and the Pareto figure

def method_name(config: dict) -> str:
    objective = config.get("objective", "?")
    tied = config.get("tie_embeddings")
    tying = "tied" if tied else ("untied" if tied is not None else "?")
    return f"{OBJECTIVE_NAMES.get(objective, objective)}, {tying}"


DEFAULTS = {"temperature": 1.0, "state_noise": 0.0, "samples_per_puzzle": 1, "seed": 0}  # sample.py's sampler defaults


def sampler_suffix(entry: dict) -> str:
    """" [T=1.5, noise 1, k=8]" for an entry decoded with sampler knobs, "" at the paper's decoding (and for
    entries written before the knobs existed)."""
    knobs = DEFAULTS | entry.get("sampler", {})
    parts = [f"T={knobs['temperature']:g}"] if knobs["temperature"] != 1.0 else []
    if knobs["state_noise"] != 0.0:
        parts.append(f"noise {knobs['state_noise']:g} seed {knobs['seed']}")
    if knobs["samples_per_puzzle"] != 1:
        parts.append(f"k={knobs['samples_per_puzzle']}")
    return f" [{', '.join(parts)}]" if parts else ""


def group_by_method(entries: list[dict]) -> dict[str, list[dict]]:
    """Checkpoints of one method are its seeds: same label (--labels), else same (objective, tying), and
    the same sampler knobs (another temperature is another row, never another seed)."""
    groups: dict[str, list[dict]] = {}
    for e in entries:
        groups.setdefault((e.get("label") or method_name(e["config"])) + sampler_suffix(e), []).append(e)
    return groups


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample s.d. (ddof=1; nan with one value)."""
    a = np.asarray(values, dtype=float)
    return float(a.mean()), (float(a.std(ddof=1)) if a.size > 1 else math.nan)


def _fmt(values: list, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    m, s = mean_sd([v * scale for v in values])
    return f"{m:.{digits}f}{unit}" + ("" if math.isnan(s) else f" ± {s:.{digits}f}")


def is_collapsed(m: dict) -> bool:
    """A collapsed model: legal rate 0 and exact match 0 (or unknown, without answers). 4 of 48 known tied
    300k-step runs of the paper's setup ended so, from their first validation on (docs/sudoku_metrics.md)."""
    return m.get("legal_rate") == 0 and not m.get("exact_match")


def collapsed_at(entry: dict, tau: float) -> bool:
    """Collapsed in every cohort it was scored on at τ."""
    found = [r[tau_key(tau)] for r in entry["results"].values() if tau_key(tau) in r]
    return bool(found) and all(is_collapsed(m) for m in found)


def _batch512(m: dict, batch_size: int) -> float | None:
    # results written before batch512_nfe existed: their batch_nfe is the batch-512 count if decoded at 512
    return m.get("batch512_nfe", m.get("batch_nfe") if batch_size == 512 else None)


def format_table(entries: list[dict], tau: float, batch_size: int = 512) -> str:
    """Table-1-style markdown at τ, mean ± sample s.d. over seeds (see docs/sudoku_metrics.md).

    First Table 1's own columns in its order: Acc (%) and Mean NFE unfiltered, then deduction-only, both
    NFE columns on Table 1's basis, the batch-1 count (the authors decoded one puzzle at a time). Then per
    cohort the batch-512 count of the authors' validation logs and the other metrics. batch_size: that of
    the decode, used only for results files older than the batch512_nfe key. Collapsed checkpoints
    (exact match and legal rate 0) are counted in the seeds cell and named below the table.
    """
    cohorts = [c for c in ("all", "deduction_only") if any(c in e["results"] for e in entries)]
    title = {"all": "unfiltered", "deduction_only": "deduction-only"}
    head = ["Objective", "Tying", "seeds"]
    for c in cohorts:
        head += [f"Acc (%) {title[c]}", f"Mean NFE {title[c]} (batch-1 count)"]
    for c in cohorts:
        head += [f"NFE {title[c]} (batch-512 count)", f"Forwards run {title[c]}", f"Legal (%) {title[c]}",
                 f"Violating snapshots {title[c]}", f"Violations summed over boards {title[c]}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    collapsed = []
    for name, group in group_by_method(entries).items():
        tied = group[0]["config"].get("tie_embeddings")
        tying = "?" if tied is None else ("tied" if tied else "untied")
        objective = group[0].get("label") or OBJECTIVE_NAMES.get(group[0]["config"].get("objective", "?"),
                                                                 group[0]["config"].get("objective", "?"))
        objective += sampler_suffix(group[0])
        down = [e["path"] for e in group if collapsed_at(e, tau)]
        collapsed += down
        row = [objective, tying, str(len(group)) + (f" ({len(down)} collapsed)" if down else "")]
        ms = {}
        for c in cohorts:
            found = [e["results"].get(c, {}).get(tau_key(tau)) for e in group]
            ms[c] = [m for m in found if m is not None]
            row += [_fmt([m["exact_match"] for m in ms[c]], 100.0), _fmt([m.get("batch1_nfe") for m in ms[c]])]
        for c in cohorts:
            row += [_fmt([_batch512(m, batch_size) for m in ms[c]]), _fmt([m["mean_nfe"] for m in ms[c]]),
                    _fmt([m["legal_rate"] for m in ms[c]], 100.0),
                    _fmt([m.get("violating_snapshots") for m in ms[c]]), _fmt([m["violations_rollout"] for m in ms[c]])]
        lines.append("| " + " | ".join(row) + " |")
    n = {c: sorted({e["results"][c][tau_key(tau)]["n"] for e in entries if tau_key(tau) in e["results"].get(c, {})})
         for c in cohorts}
    lines.append(f"τ = {tau:g}; n = " + ", ".join(f"{title[c]} {'/'.join(map(str, n[c]))}" for c in cohorts)
                 + "; the first columns are Table 1's, in its order; definitions in docs/sudoku_metrics.md")
    if collapsed:
        lines.append(f"COLLAPSED (exact match 0 and legal rate 0, included in the means): {', '.join(collapsed)}")
    return "\n".join(lines)


NFE_AXES = {"batch1_nfe": "mean NFE, batch-1 count (Table 1's)", "batch512_nfe": "mean NFE, batch-512 count",
            "batch_nfe": "mean NFE, batch count at --batch_size", "mean_nfe": "mean forwards run per puzzle"}


def entry_names(entries: list[dict]) -> list[str]:
    """A short unique name per checkpoint: its method and seed, or its path where those repeat."""
    names = [f"{e.get('label') or method_name(e['config'])}{sampler_suffix(e)} (seed {e['config'].get('seed', '?')})"
             for e in entries]
    return [n if names.count(n) == 1 else e["path"] for n, e in zip(names, entries)]


def format_frontier(entries: list[dict], budgets, nfe: str = "batch1_nfe") -> str:
    """Accuracy at matched NFE per cohort (sudoku.frontier.compare): each checkpoint's τ sweep is a curve of
    (mean NFE on the `nfe` basis, exact match), read at each budget by linear interpolation with a
    binomial s.e.; a budget outside a curve's NFE range is reported as "outside", never extrapolated.
    nfe: a key of NFE_AXES, by default Table 1's batch-1 count."""
    out = []
    names = entry_names(entries)
    for cohort in ("all", "deduction_only"):
        curves, spans = {}, []
        for name, e in zip(names, entries):
            sweep = e["results"].get(cohort, {})
            points = [(t, Point(nfe=m[nfe], acc=m["exact_match"], n=m["n"])) for t, m in sweep.items()
                      if m.get("exact_match") is not None and m.get(nfe) is not None]
            if not points:
                continue
            curves[name] = [p for _, p in points]
            lo, hi = min(points, key=lambda tp: tp[1].nfe), max(points, key=lambda tp: tp[1].nfe)
            spans.append(f"{name}: NFE {lo[1].nfe:.2f} (τ {float(lo[0]):g}) to {hi[1].nfe:.2f} (τ {float(hi[0]):g}), "
                         f"{len(points)} τ")
        if not curves:
            continue
        title = {"all": "unfiltered", "deduction_only": "deduction-only"}[cohort]
        out += [f"Accuracy at matched NFE, {title}, on the {NFE_AXES[nfe]} (exact match ± binomial s.e., "
                "interpolated along each τ sweep; \"outside\" = beyond the model's NFE range, not extrapolated)",
                compare(curves, tuple(budgets)), "NFE range of each sweep: " + "; ".join(spans), ""]
    return "\n".join(out).rstrip() if out else "--frontier: no results with answers to read accuracy from"


def method_styles(groups: dict[str, list[dict]]) -> dict[str, tuple[str, str]]:
    """(colour, line style) per method: its objective's colour; a second or third method of one objective
    (e.g. another buffer) is dashed or dotted. Unknown objectives take the next free colours."""
    colors, seen, styles = dict(OBJECTIVE_COLORS), {}, {}
    spare = iter(f"C{i}" for i in range(len(OBJECTIVE_COLORS), 10))
    for name, group in groups.items():
        objective = group[0]["config"].get("objective")
        if objective not in colors:
            colors[objective] = next(spare, "k")
        seen[objective] = seen.get(objective, -1) + 1
        styles[name] = (colors[objective], ("-", "--", ":", "-.")[seen[objective] % 4])
    return styles


def plot_pareto(entries: list[dict], path: str, nfe: str = "batch1_nfe") -> None:
    """Exact match vs NFE over the τ sweep, one curve per method, ±1 s.d. ribbons; one panel per cohort."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    cohorts = [c for c in ("all", "deduction_only") if any(c in e["results"] for e in entries)]
    fig, axes = plt.subplots(1, len(cohorts), figsize=(5.5 * len(cohorts), 4.2), squeeze=False)
    groups = group_by_method(entries)
    styles = method_styles(groups)
    for ax, cohort in zip(axes[0], cohorts):
        for name, group in groups.items():
            taus = sorted({t for e in group for t in e["results"].get(cohort, {})}, key=float)
            pts = []
            for t in taus:
                ms = [e["results"][cohort][t] for e in group if t in e["results"].get(cohort, {})]
                if not ms or ms[0]["exact_match"] is None or any(m.get(nfe) is None for m in ms):  # older files
                    continue
                x, xs = mean_sd([m[nfe] for m in ms])
                y, ys = mean_sd([100 * m["exact_match"] for m in ms])
                pts.append((x, y, 0.0 if math.isnan(xs) else xs, 0.0 if math.isnan(ys) else ys, t))
            if not pts:
                continue
            pts.sort()
            x, y, xs, ys, t = (np.array(v) for v in zip(*pts))
            color, linestyle = styles[name]
            line, = ax.plot(x, y, marker="o", color=color, linestyle=linestyle,
                            label=f"{name} ({len(group)} seed{'s' * (len(group) > 1)})")
            if ax.lines[0] is line:  # τ of each point, on the first curve only to keep the plot readable
                for xi, yi, ti in zip(x, y, t):
                    ax.annotate(f"τ={float(ti):g}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
            ax.fill_between(x, y - ys, y + ys, color=line.get_color(), alpha=0.2, linewidth=0)
            if xs.any():
                ax.errorbar(x, y, xerr=xs, fmt="none", ecolor=line.get_color(), alpha=0.5)
        ax.set_xlabel(NFE_AXES[nfe] + "  (lower τ → more NFE)")
        ax.set_ylabel("exact match (%)")
        ax.set_title({"all": "unfiltered", "deduction_only": "deduction-only"}[cohort])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


# -----------------------------------------------------------------------------
# merging results files: same settings, same puzzles

def data_source(args: argparse.Namespace, cohorts: dict[str, tuple[torch.Tensor, torch.Tensor | None]]) -> dict:
    """Which puzzles were scored: --data, --data_dir and a sha256 of each cohort's questions and answers
    (in order), so that results computed on different test sets are never merged as seeds."""
    puzzles = {}
    for cohort, (q, a) in cohorts.items():
        h = hashlib.sha256(q.to(torch.int64).contiguous().numpy().tobytes())
        if a is not None:
            h.update(a.to(torch.int64).contiguous().numpy().tobytes())
        puzzles[cohort] = h.hexdigest()
    return {"data": args.data, "data_dir": portable_path(args.data_dir), "puzzles": puzzles}


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def portable_path(path: str) -> str:
    """Relative to the repository when inside it (kept results then name no machine's directories), else absolute."""
    full = os.path.abspath(path)
    return os.path.relpath(full, REPO) if os.path.commonpath([full, REPO]) == REPO else full


def check_same_puzzles(where: str, source: dict | None, ref: dict | None) -> None:
    """One-line refusal when two data sources scored different puzzles in a cohort they share."""
    if source is None or ref is None:
        return
    for cohort, digest in source["puzzles"].items():
        if ref["puzzles"].get(cohort, digest) != digest:
            raise SystemExit(f"{where}: its {cohort} puzzles (--data={source['data']}, data_dir {source['data_dir']}) "
                             f"are not those of --data={ref['data']} in {ref['data_dir']}; results on different "
                             "test sets are not seeds of one method")


def load_results(spec: str, args: argparse.Namespace) -> tuple[list[dict], dict | None]:
    """Checkpoint entries of earlier --out files and their common data source; they must come from the
    same settings and the same puzzles (checked against this run's puzzles in main)."""
    entries, ref = [], None
    for path in [s.strip() for s in spec.split(",") if s.strip()]:
        try:
            with open(path) as f:
                saved = json.load(f)
            found = saved["checkpoints"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"--results {path}: not a sample.py --out file ({type(e).__name__})") from None
        # batch_nfe depends on batch_size; sampler knobs may differ (each entry records its own: sampler_suffix)
        for key in ("data", "n", "max_steps", "batch_size", "ema", "relay_carry"):
            if key in saved and saved[key] != getattr(args, key):
                raise SystemExit(f"--results {path}: computed with {key}={saved[key]!r} but this run has "
                                 f"{key}={getattr(args, key)!r}; results from different settings do not compare")
        missing = [t for t in args.taus if not any(tau_key(t) in e["results"].get(c, {}) for e in found for c in e["results"])]
        if missing:
            raise SystemExit(f"--results {path}: has no results at τ = {', '.join(f'{t:g}' for t in missing)}; "
                             f"pass the τ values it has with --taus")
        source = saved.get("data_source")
        if source is None:
            print(f"warning: --results {path} records no data source (written before sources were recorded); "
                  "cannot check that it scored the same puzzles", file=sys.stderr)
        check_same_puzzles(f"--results {path}", source, ref)
        ref = ref or source
        entries.extend(found)
    return entries, ref
