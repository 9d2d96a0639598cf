"""CPU reproduction of Table 1's objective ordering: train the four objectives with the CPU presets,
evaluate them over the τ sweep, print the table and draw the Pareto figure. One command:

    python scripts/sudoku/reproduce_cpu.py                        # 1 seed: ~4 min data + 4 x ~10 min training + eval
    python scripts/sudoku/reproduce_cpu.py --seeds=1,2,3          # mean ± s.d. over seeds (3x the training time)
    python scripts/sudoku/reproduce_cpu.py --minutes=12           # the same wall-clock for every objective
    python scripts/sudoku/reproduce_cpu.py --smoke                # the whole pipeline at a toy size, ~2 minutes

Steps (each is a plain command, echoed as it runs):
  1. python prepare_data.py                              (skipped when data/sudoku exists)
  2. python train_sudoku.py config/cpu_<objective>.py --seed=S --out_dir=runs/cpu/<objective>_s<S>
     (skipped when that run already finished with the same command)
  3. python sample.py --ckpt=<all runs> --data=test --n=2000 --table --plot=runs/cpu/pareto.png --out=runs/cpu/results.json
Outputs in --runs: results.json (sample.py's JSON), pareto.png, table.md, each run's train.log and metrics.jsonl.
"""
import os
import shlex
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
import sudoku.report  # noqa: E402
from scripts import runs  # noqa: E402

SMOKE_TRAIN = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--d_ff=64", "--max_iters=20", "--eval_interval=0", "--eval_puzzles=32", "--log_interval=10", "--batch_size=16"]
SMOKE_DATA = ["--n_train=400", "--n_val=20", "--n_test=64", "--min_clues=30"]


def main(argv: list[str] | None = None) -> None:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--seeds", default="1", help="comma-separated training seeds")
    p.add_argument("--objectives", default=",".join(runs.OBJECTIVES))
    p.add_argument("--runs", default="runs/cpu", help="where the runs, results.json and pareto.png go")
    p.add_argument("--data_dir", default="data/sudoku")
    p.add_argument("--n", type=int, default=2000, help="test puzzles to evaluate (first N, as the paper)")
    p.add_argument("--minutes", type=float, help="training wall-clock per objective instead of the presets' max_iters")
    p.add_argument("--train_args", default="", help="extra train_sudoku.py overrides, e.g. '--max_iters=800'")
    p.add_argument("--sample_args", default="", help="extra sample.py options, e.g. '--taus=0.1,0.15'")
    p.add_argument("--smoke", action="store_true", help="toy sizes (tiny data, 20 steps): checks the pipeline only")
    p.add_argument("--replace_runs", action="store_true", help="delete and retrain a run directory that holds a run "
                   "of a different command (default: stop with a message naming the differing arguments)")
    args = p.parse_args(argv)
    seeds, objectives = runs.seed_list(args.seeds, "--seeds"), runs.objective_list(args.objectives, "--objectives")
    runs.need(args.n >= 1, "--n", ">= 1", args.n)
    runs.check_budget("--minutes", args.minutes, minutes=True)
    if args.smoke and args.minutes is not None:
        raise SystemExit("--minutes: --smoke trains every run for its own 20 steps; drop one of them")
    for key in ("runs", "data_dir"):
        runs.check_folder(getattr(args, key), f"--{key}")
    train_args, data_args = shlex.split(args.train_args), []
    if args.smoke:
        args.runs = args.runs if args.runs != "runs/cpu" else "runs/cpu_smoke"
        args.data_dir = args.data_dir if args.data_dir != "data/sudoku" else "data/sudoku_smoke"
        args.n = min(args.n, 64)
        train_args, data_args = SMOKE_TRAIN + train_args, SMOKE_DATA
    if args.minutes is not None and not args.smoke:
        train_args = runs.budget_args(args.minutes, None) + train_args
    run_dir, data_dir = os.path.abspath(args.runs), os.path.abspath(args.data_dir)
    t0 = time.time()

    runs.ensure_data(data_dir, data_args)
    ckpts = []
    for seed in seeds:
        for objective in objectives:
            out = runs.train(objective, os.path.join(run_dir, f"{objective}_s{seed}"), seed,
                             [f"--data_dir={data_dir}", *train_args], replace=args.replace_runs)
            ckpts.append(out)
    t_train = time.time() - t0
    cohorts = "all,deduction_only" if runs.has_derived_fields(data_dir) else "all"
    results = runs.evaluate(ckpts, None, data_dir, args.n, os.path.join(run_dir, "results.json"),
                            os.path.join(run_dir, "pareto.png"), cohorts, shlex.split(args.sample_args))
    table = sudoku.report.format_table(results["checkpoints"], results["tau"])
    with open(os.path.join(run_dir, "table.md"), "w") as f:
        f.write(table + "\n")
    print(f"\ndata + training {t_train / 60:.1f} min, total {(time.time() - t0) / 60:.1f} min; "
          f"wrote {run_dir}/results.json, table.md, pareto.png")


if __name__ == "__main__":
    main()
