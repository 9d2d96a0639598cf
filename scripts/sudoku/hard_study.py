"""The CPU Table 1 on hard Sudoku: every finished run of the four objectives evaluated on hard and easy
puzzles, Table 1's columns at τ = 0.15 with seeds, and the accuracy-NFE frontier at matched NFE.

    python prepare_data.py --source=larsdoku --out_dir=data/sudoku-hard --derive --derive_splits=top1465
    python scripts/sudoku/budget_study.py --iters=1500 --eval_interval=250 --objectives=mlm --seed=1,2,3 \\
        --runs=runs/hard --data_dir=data/sudoku-hard --train_args="--eval_puzzles=300"      # and relay, ...
    python scripts/sudoku/hard_study.py --runs=runs/hard --data_dir=data/sudoku-hard --easy_data_dir=data/sudoku

Evaluation sets: Top1465 (a classic hard collection, never trained on: prepare_data.py drops its
symmetric copies from train and val), the hard test split, Top1465's deduction-only cohort (Tim
Vink's solver finishes it without brute force, using pairs or fish: the paper's cohort rule), and
the easy generated mix (--easy_data_dir). Each (run, set) is one `sample.py` call whose JSON is kept
in --out, so an interrupted study resumes; finished runs only (DONE.json from the driver). A run with
kept results and no run directory on this disk is reported from its JSON, so results committed from
another machine (results/hard_study/) join the runs trained here:

    python scripts/sudoku/hard_study.py --runs=runs/hard --out=results/hard_study

Outputs in --out: hard_study.md (the tables) and hard_study.png (the frontier, one panel per set).
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
import sudoku.frontier  # noqa: E402
import sudoku.report  # noqa: E402
from scripts import runs  # noqa: E402

TAUS = (0.01, 0.02, 0.05, 0.10, 0.15, 0.25)  # the paper's sweep, widened below: hard puzzles need more passes
HEADLINE_TAU = 0.15
RUN_NAME = re.compile(r"^(mlm|rollout|relay_sg|relay)(?:_cold)?_s(\d+)$")


def finished_runs(run_dir: str, out_dir: str) -> dict[str, list[tuple[int, str]]]:
    """{objective: [(seed, run path)]} of the runs to report, in objective order: those the driver finished
    (DONE.json), and those with results kept in out_dir whose run directory is not on this disk (results
    committed from another machine: reported, never re-evaluated). A run still training is left out."""
    here = _listdir(run_dir)
    names = {n for n in here if os.path.exists(os.path.join(run_dir, n, "DONE.json"))}
    names |= {n for n in _listdir(out_dir) if os.path.isdir(os.path.join(out_dir, n)) and n not in here}
    found: dict[str, list[tuple[int, str]]] = {}
    for name in sorted(names):
        m = RUN_NAME.match(name)
        if m:
            found.setdefault(m.group(1), []).append((int(m.group(2)), os.path.join(run_dir, name)))
    return {o: sorted(found[o]) for o in runs.OBJECTIVES if o in found}


def _listdir(path: str) -> list[str]:
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def eval_sets(args: argparse.Namespace) -> dict[str, list[str] | None]:
    """{set name: sample.py arguments}, None for a set whose data is missing here (kept results only)."""
    top = os.path.join(args.data_dir, "top1465.parquet")
    sets = {"Top1465": [f"--data={top}", f"--n={args.n}"],
            "hard test split": ["--data=test", f"--data_dir={args.data_dir}", f"--n={args.n}"],
            "Top1465 deduction-only": [f"--data={top}", "--cohort=deduction_only", "--n=0"],
            "easy mix": ["--data=test", f"--data_dir={args.easy_data_dir}", f"--n={args.n}"]}
    need = {"Top1465": top, "hard test split": os.path.join(args.data_dir, "test.npy"),
            "Top1465 deduction-only": top, "easy mix": os.path.join(args.easy_data_dir, "test.npy")}
    missing = {name: f"{path} not found" for name, path in need.items() if not os.path.exists(path)}
    if "Top1465 deduction-only" not in missing:
        import pyarrow.parquet as pq
        if "strategies_used" not in pq.read_schema(top).names:
            missing["Top1465 deduction-only"] = (f"{top} has no solver fields (prepare_data.py --derive "
                                                 "--derive_splits=top1465)")
    for name, why in missing.items():
        print(f"{name}: {why}; only kept results are reported")
        sets[name] = None
    return sets


def evaluate(run: str, name: str, sample_args: list[str] | None, out_dir: str, taus: tuple[float, ...],
             scored: dict[str, tuple[str, dict | None]]) -> dict | None:
    """One run on one set: the cohort's results by τ key, from a kept JSON or a fresh sample.py call;
    None when neither the JSON nor the finished run is here. Every run of a set must have scored the same
    puzzles as the first one (`scored`: set -> its first JSON and data source), or the study stops."""
    path = os.path.join(out_dir, os.path.basename(run), re.sub(r"\W+", "_", name).strip("_") + ".json")
    done = os.path.join(run, "DONE.json")
    if os.path.exists(path) and os.path.exists(done) and os.path.getmtime(done) > os.path.getmtime(path):
        print(f"{name}: {run} finished training after its kept result was written: evaluating it anew")
        os.remove(path)
    if not os.path.exists(path):
        if sample_args is None or not os.path.exists(done):
            why = "its data" if sample_args is None else f"its checkpoint ({run})"
            print(f"{name}: no kept result of {os.path.basename(run)} and {why} is not here: left out of this set")
            return None
        runs.sh([sys.executable, "sample.py", f"--ckpt={run}", f"--taus={','.join(f'{t:g}' for t in taus)}",
                 f"--out={path}.tmp", "--device=cpu", *sample_args])
        os.replace(path + ".tmp", path)
    with open(path) as f:
        kept = json.load(f)
    first_seen = scored.setdefault(name, (path, kept.get("data_source")))
    sudoku.report.check_same_puzzles(path, kept.get("data_source"), first_seen[1])
    return next(iter(kept["checkpoints"][0]["results"].values()))


def curve(results: dict) -> list[sudoku.frontier.Point]:
    """The τ sweep as frontier points, NFE per puzzle at batch 1 (Table 1's count)."""
    return [sudoku.frontier.Point(nfe=m["batch1_nfe"] if "batch1_nfe" in m else m["mean_nfe"], acc=m["exact_match"],
                                  n=m["n"]) for m in results.values()]


def table(results: dict[str, dict[str, list[dict]]], tau: float) -> str:
    """Per set and objective: seeds, then mean ± s.d. over seeds of Table 1's columns at τ, and the share of
    blank cells filled right (near 0% exact match on hard puzzles, the one column that still separates)."""
    cols = [("exact_match", 100, "exact (%)"), ("token_accuracy", 100, "blank cells right (%)"),
            ("batch1_nfe", 1, "NFE per puzzle"), ("legal_rate", 100, "legal (%)"),
            ("violations_final", 1, "violations, final board"), ("violating_snapshots", 1, "violating snapshots")]
    lines = ["| puzzles | objective | seeds | " + " | ".join(c[2] for c in cols) + " |", "|" + "---|" * (3 + len(cols))]
    for name, by_objective in results.items():
        for objective, seeds in by_objective.items():
            at = [s[sudoku.report.tau_key(tau)] for s in seeds]
            n = at[0]["n"]
            cells = [sudoku.report._fmt([m[key] for m in at], scale, 1 if scale == 100 else 2)
                     for key, scale, _ in cols]
            lines.append(f"| {name} (n = {n}) | {sudoku.report.OBJECTIVE_NAMES[objective]} | {len(seeds)} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


def matched(results: dict[str, dict[str, list[dict]]], k: int = 4) -> str:
    """Per set: accuracy of each objective at k NFE budgets spread over the range every seed covers."""
    lines = []
    for name, by_objective in results.items():
        seeds = {o: [curve(s) for s in runs_of] for o, runs_of in by_objective.items()}
        budgets = sudoku.frontier.even_budgets([c for cs in seeds.values() for c in cs], k)
        if not budgets:  # say where each sweep lies, so the reader sees which ones miss each other
            spans = ", ".join(f"{sudoku.report.OBJECTIVE_NAMES[o]} {min(p.nfe for c in cs for p in c):.1f}-"
                              f"{max(p.nfe for c in cs for p in c):.1f}" for o, cs in seeds.items())
            lines.append(f"\n{name}: no NFE range is covered by every run (NFE per puzzle each objective's runs "
                         f"cover together: {spans})")
            continue
        lines += [f"\n**{name}**: exact match (%) at matched NFE per puzzle (mean over seeds ± s.d. over seeds; "
                  "one seed: ± binomial s.e.)", "",
                  "| objective | " + " | ".join(f"NFE {b:.1f}" for b in budgets) + " |",
                  "|" + "---|" * (1 + len(budgets))]
        for objective, cs in seeds.items():
            cells = []
            for b in budgets:
                v = sudoku.frontier.across_seeds(cs, b)
                cells.append("outside" if v is None else f"{100 * v[0]:.1f} ± {100 * v[1]:.1f}")
            lines.append(f"| {sudoku.report.OBJECTIVE_NAMES[objective]} ({len(cs)}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, dict[str, list[dict]]], path: str) -> None:
    colors = {sudoku.report.OBJECTIVE_NAMES[o]: c for o, c in sudoku.report.OBJECTIVE_COLORS.items()}
    panels = {name: {sudoku.report.OBJECTIVE_NAMES[o]: [curve(s) for s in seeds] for o, seeds in by_objective.items()}
              for name, by_objective in results.items()}
    taus = ", ".join(f"{t:g}" for t in TAUS)
    sudoku.frontier.plot_panels(panels, colors, f"exact match against NFE per puzzle over τ ∈ {{{taus}}}", path)


def main(argv: list[str] | None = None) -> None:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--runs", default="runs/hard")
    p.add_argument("--data_dir", default="data/sudoku-hard")
    p.add_argument("--easy_data_dir", default="data/sudoku")
    p.add_argument("--n", type=int, default=500, help="first n puzzles of each set (the deduction-only cohort: all)")
    p.add_argument("--out", default="", help="results directory (default: <runs>/study)")
    p.add_argument("--only", default="", help="comma-separated run names: evaluate and report only these "
                   "(one process per core, each with its own runs, evaluates in parallel)")
    args = p.parse_args(argv)
    runs.need(args.n >= 0, "--n", ">= 0 (0: all)", args.n)
    out = args.out or os.path.join(args.runs, "study")
    runs.check_folder(out, "--out")
    found = finished_runs(args.runs, out)
    if args.only:
        only = set(args.only.split(","))
        found = {o: named for o, seeds in found.items()
                 if (named := [(seed, run) for seed, run in seeds if os.path.basename(run) in only])}
        unknown = only - {os.path.basename(run) for seeds in found.values() for _, run in seeds}
        if unknown:
            raise SystemExit(f"--only: no finished run or kept result named {', '.join(sorted(unknown))} in "
                             f"{args.runs} or {out}")
    if not found:
        raise SystemExit(f"no finished runs in {args.runs} and no kept results in {out}: train them first "
                         "(see this script's docstring)")
    results: dict[str, dict[str, list[dict]]] = {}
    scored: dict[str, tuple[str, dict | None]] = {}
    for name, sample_args in eval_sets(args).items():
        for objective, seeds in found.items():
            kept = [r for _, run in seeds if (r := evaluate(run, name, sample_args, out, TAUS, scored)) is not None]
            if kept:
                results.setdefault(name, {})[objective] = kept
    text = (f"Table 1's columns at τ = {HEADLINE_TAU:g} (mean ± s.d. over seeds)\n\n{table(results, HEADLINE_TAU)}\n"
            + matched(results))
    print("\n" + text)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "hard_study.md"), "w") as f:
        f.write(text + "\n")
    plot(results, os.path.join(out, "hard_study.png"))
    print(f"wrote {out}/hard_study.md and hard_study.png")


if __name__ == "__main__":
    main()
