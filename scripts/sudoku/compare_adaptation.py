"""Compute-matched adaptation: train MLM for N minutes, then continue from that checkpoint
for M minutes each with MLM, Rollout, Relay (sg) and Relay; evaluate all over the τ sweep.

    python scripts/sudoku/compare_adaptation.py --parent_minutes=15 --minutes=10 --seeds=1,2,3
    python scripts/sudoku/compare_adaptation.py --parent_iters=1500 --iters=500 --seeds=1,2,3    # step budgets
    python scripts/sudoku/compare_adaptation.py --parent_from=runs/cpu/mlm_s{seed} --iters=100 --seeds=1,2,3
                 # parents = reproduce_cpu.py's MLM runs; children: 100 K=2 steps, the MLM child 200 steps
    python scripts/sudoku/compare_adaptation.py --smoke                                          # toy size, ~3 minutes

Wall time is about seeds x (N + 4 M) minutes plus evaluation. Per seed S (runs in --runs):
  s<S>/parent_mlm     python train_sudoku.py config/cpu_mlm.py --seed=S --max_minutes=N
  s<S>/<objective>    python train_sudoku.py config/cpu_<objective>.py --seed=S --max_minutes=M --init_from=s<S>/parent_mlm
(relay objectives add their relay LayerNorm at zero, so they start exactly at the parent's function.)
With step budgets the MLM child gets --mlm_iters (default 2 x --iters), because a K = 2 step costs two
forwards and one backward through both: 2.0x an MLM step (bench/bench_train.py, README). So the children
are compute-matched either way. --parent_from reuses finished MLM runs as parents instead of training them.
Then sample.py evaluates the parents (the "no adaptation" reference) and the four children of every
seed on the same test puzzles: results.json, table.md and pareto.png in --runs.
"""
import os
import shlex
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
import sudoku.report  # noqa: E402
from scripts import runs  # noqa: E402

SMOKE_TRAIN = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--d_ff=64", "--eval_interval=0", "--eval_puzzles=32", "--log_interval=10", "--batch_size=16"]
SMOKE_DATA = ["--n_train=400", "--n_val=20", "--n_test=64", "--min_clues=30"]


def main(argv: list[str] | None = None) -> None:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--parent_minutes", type=float, help="MLM pretraining budget N (wall-clock)")
    p.add_argument("--minutes", type=float, help="adaptation budget M per objective (wall-clock)")
    p.add_argument("--parent_iters", type=int, help="MLM pretraining budget in steps (instead of minutes)")
    p.add_argument("--iters", type=int, help="adaptation budget in steps (instead of minutes)")
    p.add_argument("--mlm_iters", type=int, help="the MLM child's steps with --iters (default 2 x --iters: compute-matched)")
    p.add_argument("--parent_from", help="existing MLM run per seed instead of training parents, e.g. runs/cpu/mlm_s{seed}")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--objectives", default=",".join(runs.OBJECTIVES), help="the children trained from each parent")
    p.add_argument("--runs", default="runs/adapt")
    p.add_argument("--data_dir", default="data/sudoku")
    p.add_argument("--n", type=int, default=2000, help="test puzzles to evaluate (first N)")
    p.add_argument("--warmup_iters", type=int, default=50, help="warmup of the children's fresh optimizer")
    p.add_argument("--train_args", default="", help="extra train_sudoku.py overrides for every run")
    p.add_argument("--sample_args", default="", help="extra sample.py options")
    p.add_argument("--smoke", action="store_true", help="toy sizes (tiny data, 30 + 20 steps, 2 seeds): checks the pipeline only")
    p.add_argument("--replace_runs", action="store_true", help="delete and retrain a run directory that holds a run "
                   "of a different command (default: stop with a message naming the differing arguments)")
    args = p.parse_args(argv)
    seeds, objectives = runs.seed_list(args.seeds, "--seeds"), runs.objective_list(args.objectives, "--objectives")
    for key in ("parent_minutes", "minutes"):
        runs.check_budget(f"--{key}", getattr(args, key), minutes=True)
    for key in ("parent_iters", "iters", "mlm_iters"):
        runs.check_budget(f"--{key}", getattr(args, key), minutes=False)
    if args.smoke:  # its own budgets: a given one would be replaced
        given = [f"--{k}" for k in ("parent_minutes", "minutes", "parent_iters", "iters") if getattr(args, k) is not None]
        if given:
            raise SystemExit(f"{given[0]}: --smoke sets its own budgets (30 + 20 steps); drop one of them")
    runs.need(args.n >= 1, "--n", ">= 1", args.n)
    runs.need(args.warmup_iters >= 0, "--warmup_iters", ">= 0", args.warmup_iters)
    for key in ("runs", "data_dir"):
        runs.check_folder(getattr(args, key), f"--{key}")
    train_args, data_args = shlex.split(args.train_args), []
    if args.smoke:
        args.runs = args.runs if args.runs != "runs/adapt" else "runs/adapt_smoke"
        args.data_dir = args.data_dir if args.data_dir != "data/sudoku" else "data/sudoku_smoke"
        args.parent_minutes = args.minutes = None
        args.parent_iters, args.iters, args.n = 30, 20, min(args.n, 64)
        seeds = seeds[:2]
        train_args, data_args = SMOKE_TRAIN + train_args, SMOKE_DATA
    if args.parent_minutes is None and args.parent_iters is None:
        args.parent_minutes = 15.0
    if args.minutes is None and args.iters is None:
        args.minutes = 10.0
    parent_budget = runs.budget_args(args.parent_minutes, args.parent_iters)
    child_budget = runs.budget_args(args.minutes, args.iters)
    mlm_iters = None if args.iters is None else args.mlm_iters or 2 * args.iters
    mlm_budget = child_budget if mlm_iters is None else runs.budget_args(None, mlm_iters)
    run_dir, data_dir = os.path.abspath(args.runs), os.path.abspath(args.data_dir)
    t0 = time.time()

    runs.ensure_data(data_dir, data_args)
    parents, children, labels = [], [], []
    spent = (f"{args.parent_minutes:g} min" if args.parent_minutes is not None else f"{args.parent_iters} steps")
    for seed in seeds:
        common = [f"--data_dir={data_dir}", *train_args]
        if args.parent_from:
            parent = args.parent_from.format(seed=seed)
            if not os.path.exists(os.path.join(parent, "ckpt.pt")):
                raise SystemExit(f"--parent_from: no finished run at {parent} (ckpt.pt missing)")
            spent = f"{runs.checkpoint_step(parent)} steps"
        else:
            parent = runs.train("mlm", os.path.join(run_dir, f"s{seed}", "parent_mlm"), seed, parent_budget + common,
                                replace=args.replace_runs)
        parents.append(parent)
        for objective in objectives:
            is_mlm = objective == "mlm"
            child = runs.train(objective, os.path.join(run_dir, f"s{seed}", objective), seed,
                               (mlm_budget if is_mlm else child_budget) + common
                               + [f"--init_from={parent}", f"--warmup_iters={args.warmup_iters}"],
                               replace=args.replace_runs)
            children.append(child)
            more = (f"+{args.minutes:g} min" if args.minutes is not None
                    else f"+{mlm_iters if is_mlm else args.iters} steps")
            labels.append(f"{sudoku.report.OBJECTIVE_NAMES[objective]} ({spent} MLM {more})")
    t_train = time.time() - t0
    cohorts = "all,deduction_only" if runs.has_derived_fields(data_dir) else "all"
    results = runs.evaluate(parents + children, [f"MLM parent ({spent})"] * len(parents) + labels, data_dir, args.n,
                            os.path.join(run_dir, "results.json"), os.path.join(run_dir, "pareto.png"), cohorts,
                            shlex.split(args.sample_args))
    with open(os.path.join(run_dir, "table.md"), "w") as f:
        f.write(sudoku.report.format_table(results["checkpoints"], results["tau"]) + "\n")
    print(f"\ntraining {t_train / 60:.1f} min, total {(time.time() - t0) / 60:.1f} min; "
          f"wrote {run_dir}/results.json, table.md, pareto.png")


if __name__ == "__main__":
    main()
