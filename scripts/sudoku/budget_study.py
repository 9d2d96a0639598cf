"""From-scratch budget study: exact match and NFE against training compute for each objective, with
cold and staggered rollout buffers, read from the runs' metrics.jsonl.

    python scripts/sudoku/budget_study.py --minutes=60                    # 4 objectives cold + 3 staggered: ~7 h on 2 cores
    python scripts/sudoku/budget_study.py --minutes=60 --buffers=cold     # the paper's buffer only: ~4 h
    python scripts/sudoku/budget_study.py --iters=2500 --eval_interval=250 --buffers=cold   # compute-matched step budget
    python scripts/sudoku/budget_study.py --plot_only                     # redraw from the runs already in --runs
    python scripts/sudoku/budget_study.py --smoke                         # toy size, ~3 minutes

A wall-clock budget (--minutes) is fair only when each run has the machine to itself. A step budget
(--iters) does not depend on what else runs: it is the number of optimizer steps of the K = 2
objectives, and MLM gets twice as many (a K = 2 step runs two forward passes and one backward
through both, about twice an MLM step), so every run gets the same number of forward passes; the
x axis is then MLM-step equivalents (steps x forwards per step).

Runs go sequentially (with --minutes each gets the whole machine, so its wall-clock is the 2-core one):
  python train_sudoku.py config/cpu_<objective>.py --seed=S --buffer_init=<cold|staggered> --eval_interval=E ...
MLM has no buffer, so it runs once. Every validation record (exact match and NFE at τ = 0.15 on the
first eval_puzzles validation puzzles, EMA weights) becomes a point at the training time spent so far;
validation time itself is not counted. Outputs in --runs: budget.png, budget.json, the printed table.
"""
import json
import math
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
import sudoku.report  # noqa: E402
from scripts import runs  # noqa: E402

NAMES = sudoku.report.OBJECTIVE_NAMES
SMOKE_TRAIN = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--d_ff=64", "--eval_puzzles=32", "--batch_size=16",
               "--log_interval=5"]
SMOKE_DATA = ["--n_train=400", "--n_val=20", "--n_test=64", "--min_clues=30"]


def curve(metrics_path: str, forwards_per_step: int = 1) -> list[dict]:
    """Validation points of one run: step, compute (step x forwards_per_step), training minutes so far,
    exact match, NFE, batch NFE.

    Training time (validation excluded) is the `train_seconds` that train_sudoku.py logs with its
    training record of the same step; without one, the integral of the logged ms_per_step.
    """
    rates, points = [], []  # rates: (last step of the interval, ms per step in it)
    with open(metrics_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    logged = {}  # step -> train_seconds of the training records
    for r in records:
        if "ms_per_step" in r:
            rates.append((r["step"], r["ms_per_step"]))
            if "train_seconds" in r:
                logged[r["step"]] = r["train_seconds"]
    for r in records:
        if "val/exact" not in r:
            continue
        seconds = r.get("train_seconds", logged.get(r["step"]))
        if seconds is None:
            seconds, prev = 0.0, 0
            for end, ms in rates:
                seconds += ms / 1000 * (min(end, r["step"]) - prev)
                prev = min(end, r["step"])
                if end >= r["step"]:
                    break
            if prev < r["step"]:  # steps after the last log line: at the last known rate
                seconds += (rates[-1][1] if rates else 0.0) / 1000 * (r["step"] - prev)
        points.append({"step": r["step"], "compute": r["step"] * forwards_per_step, "minutes": seconds / 60,
                       "exact": r["val/exact"],
                       "nfe": r.get("val/nfe"), "batch_nfe": r.get("val/batch_nfe")})
    return points


AXES = {"minutes": ("min", "training wall-clock (minutes, validation excluded)"),
        "compute": ("", "training compute (MLM-step equivalents: steps x forwards per step)")}


def at_minute(points: list[dict], minute: float, axis: str = "minutes") -> dict | None:
    """The latest validation point at or before `minute` of training (or that much compute)."""
    done = [p for p in points if p[axis] <= minute + 1e-9]
    return done[-1] if done else None


def report(curves: dict[str, list[dict]], marks: list[float], axis: str = "minutes") -> str:
    """Markdown: exact match (%) / NFE of each run at the given training minutes (or compute)."""
    unit = AXES[axis][0]
    head = ["run"] + [f"{m:g} {unit}".strip() for m in marks] + ["last point"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    slack = 1.0 if axis == "minutes" else 0.0
    for name, points in curves.items():
        cells, trained = [], max((p[axis] for p in points), default=0.0)
        for m in marks + [math.inf]:
            # a run cut short (e.g. to be resumed) says nothing about the minutes it has not trained yet
            p = None if m != math.inf and m > trained + slack else at_minute(points, m, axis)
            cells.append("–" if p is None else f"{100 * p['exact']:.1f}% / {p['nfe']:.1f}"
                         + (f" ({p['minutes']:.1f} min, step {p['step']})" if m == math.inf else ""))
        lines.append("| " + " | ".join([name] + cells) + " |")
    lines.append("exact match on the validation puzzles / mean NFE per puzzle, at τ = 0.15, EMA weights")
    return "\n".join(lines)


def plot(curves: dict[str, list[dict]], styles: dict[str, tuple[str, str]], path: str, axis: str = "minutes") -> None:
    """styles: (colour, line style) per curve name."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, points in curves.items():
        if not points:
            continue
        color, style = styles[name]
        x = [p[axis] for p in points]
        ax1.plot(x, [100 * p["exact"] for p in points], color=color, linestyle=style, marker="o", markersize=3,
                 label=name)
        ax2.plot(x, [p["nfe"] for p in points], color=color, linestyle=style, marker="o", markersize=3)
    ax1.set_ylabel("exact match (%)")
    ax2.set_ylabel("mean NFE per puzzle")
    for ax in (ax1, ax2):
        ax.set_xlabel(AXES[axis][1])
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle("From scratch on the CPU presets: validation at τ = 0.15 during training")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--minutes", type=float, help="wall-clock budget per run (default 60)")
    p.add_argument("--iters", type=int, help="step budget of the K=2 objectives (MLM gets 2x; instead of minutes)")
    p.add_argument("--objectives", default=",".join(runs.OBJECTIVES))
    p.add_argument("--buffers", default="cold,staggered", help="buffer_init values for the rollout objectives")
    p.add_argument("--seed", default="1", help="one seed, or several comma-separated (run one after another)")
    p.add_argument("--eval_interval", type=int, default=100, help="steps between validation points")
    p.add_argument("--runs", default="runs/budget")
    p.add_argument("--data_dir", default="data/sudoku")
    p.add_argument("--train_args", default="", help="extra train_sudoku.py overrides for every run")
    p.add_argument("--plot_only", action="store_true", help="train nothing: read the runs in --runs")
    p.add_argument("--smoke", action="store_true", help="toy sizes (tiny data, 20 steps): checks the pipeline only")
    p.add_argument("--replace_runs", action="store_true", help="delete and retrain a run directory that holds a run "
                   "of a different command (default: stop with a message naming the differing arguments)")
    args = p.parse_args(argv)
    objectives = runs.objective_list(args.objectives, "--objectives")
    buffers = [b.strip() for b in args.buffers.split(",") if b.strip()]
    if not buffers or set(buffers) - {"cold", "staggered"}:
        raise SystemExit(f"--buffers: use cold, staggered or cold,staggered, got {args.buffers!r}")
    runs.check_budget("--minutes", args.minutes, minutes=True)
    runs.check_budget("--iters", args.iters, minutes=False)
    if args.minutes is not None and args.iters is not None:
        raise SystemExit("--minutes and --iters: give one training budget, not both")
    runs.need(args.eval_interval >= 1, "--eval_interval", ">= 1 (the study plots the validation records)",
              args.eval_interval)
    if args.smoke:  # its own budget: a given one would be replaced
        given = [f"--{k}" for k in ("minutes", "iters") if getattr(args, k) is not None]
        if given:
            raise SystemExit(f"{given[0]}: --smoke sets its own budget (20 steps); drop one of them")
    seeds = runs.seed_list(args.seed, "--seed")
    for key in ("runs", "data_dir"):
        runs.check_folder(getattr(args, key), f"--{key}")
    train_args, data_args = shlex.split(args.train_args), []
    if args.smoke:
        args.runs = args.runs if args.runs != "runs/budget" else "runs/budget_smoke"
        args.data_dir = args.data_dir if args.data_dir != "data/sudoku" else "data/sudoku_smoke"
        args.minutes, args.iters, args.eval_interval = None, 20, 10
        train_args, data_args = SMOKE_TRAIN + train_args, SMOKE_DATA
    if args.minutes is None and args.iters is None:
        args.minutes = 60.0
    run_dir, data_dir = os.path.abspath(args.runs), os.path.abspath(args.data_dir)

    plan = [(o, b, s) for s in seeds for o in objectives for b in (["cold"] if o == "mlm" else buffers)]
    names = {(o, b, s): NAMES[o] + ("" if o == "mlm" else f", {b}") + (f", seed {s}" if len(seeds) > 1 else "")
             for o, b, s in plan}
    dirs = {(o, b, s): os.path.join(run_dir, f"{o}_s{s}" if o == "mlm" else f"{o}_{b}_s{s}") for o, b, s in plan}
    forwards = {o: 1 if o == "mlm" else 2 for o in objectives}  # forward passes per optimizer step (K = 2)
    if not args.plot_only:
        runs.ensure_data(data_dir, data_args)
        for o, b, s in plan:
            extra = [] if o == "mlm" else [f"--buffer_init={b}"]
            per_run = 2 // forwards[o] if args.iters is not None else 1  # a step budget gives MLM 2x the steps
            budget = runs.budget_args(args.minutes, None if args.iters is None else args.iters * per_run)
            runs.train(o, dirs[o, b, s], s, budget + extra + [f"--data_dir={data_dir}",
                       f"--eval_interval={args.eval_interval * per_run}", *train_args], replace=args.replace_runs)
    curves = {}
    for key in plan:
        path = os.path.join(dirs[key], "metrics.jsonl")
        if not os.path.exists(path):
            print(f"{names[key]}: no {path}, left out")
            continue
        curves[names[key]] = curve(path, forwards[key[0]])
    if not any(curves.values()):
        raise SystemExit(f"no validation records in {run_dir}: train the runs first (drop --plot_only)")
    axis = "minutes" if args.iters is None else "compute"
    longest = max(p[axis] for c in curves.values() for p in c)
    if axis == "minutes":
        step = 10 if longest > 20 else (2 if longest > 4 else 0.5)
    else:
        step = max(1, round(longest / 6, -int(math.floor(math.log10(max(longest / 6, 1))))))
    marks = [step * i for i in range(1, int(longest // step) + 1)][:8]
    print("\n" + report(curves, marks, axis))
    # colour: objective; line: solid for the cold buffer, dashed for staggered; later seeds dotted
    styles = {names[o, b, s]: (sudoku.report.OBJECTIVE_COLORS[o],
                               "--" if b == "staggered" else ("-" if s == seeds[0] else ":")) for o, b, s in plan}
    plot(curves, styles, os.path.join(run_dir, "budget.png"), axis)
    with open(os.path.join(run_dir, "budget.json"), "w") as f:
        json.dump(curves, f, indent=1)
    print(f"wrote {run_dir}/budget.png and budget.json")


if __name__ == "__main__":
    main()
