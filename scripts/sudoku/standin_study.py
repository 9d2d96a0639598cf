"""The stand-in study: MLM against Relay on Sudoku-Extreme's composition, compute-matched, past the crossover.

    python scripts/sudoku/standin_study.py                      # all of it, from nothing, resumable (2 cores: ~4 h a pair)
    python scripts/sudoku/standin_study.py --report_only        # tables and figures from the kept results (--out)
    python scripts/sudoku/standin_study.py --lanes=8 --device=cuda --prebuilt   # on a GPU: every run at once (data carried)
    python scripts/sudoku/standin_study.py --smoke              # toy sizes: checks the pipeline in a few minutes

What it does, each step skipped when its output is already there (so a killed study resumes):
1. the data: `prepare_data.py --source=standin` (26% easy, 74% hard puzzles per split, every puzzle
   rated; its test split's hard cohort in test_hard.parquet);
2. the runs, `train_sudoku.py config/cpu_<objective>.py` with the 0.8M CPU presets: MLM and Relay with
   each of --seeds, then --extra objectives with the first seed. Compute-matched: every run gets
   --equivalents MLM-step equivalents (MLM steps, or K = 2 steps counted twice: a K = 2 step runs two
   forward passes) and keeps its EMA weights every --keep_every equivalents (kept/step_N.safetensors).
   --lanes runs at once, each with the machine's cores shared out (one thread per lane on 2 cores);
3. the evaluations, one `sample.py` call per (kept weights, puzzle set): every kept step with the light
   protocol (fewer puzzles and τs), the last one also with the full protocol; each JSON is kept in --out
   (the sets, protocols and layout: scripts/sudoku/standin_protocol.py);
4. the report, `scripts/sudoku/standin_report.py` (always redrawn): the crossover figure (accuracy at matched NFE against training compute), the difficulty
   ladder (Relay - MLM per rating and clue band) and Table 1's columns, in --out/standin_study.md.
"""
import argparse
import os
import queue
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
from scripts import runs  # noqa: E402
from scripts.sudoku.standin_protocol import FULL, LIGHT, SETS, result_path  # noqa: E402

FORWARDS = {"mlm": 1, "rollout": 2, "relay_sg": 2, "relay": 2}  # forward passes per optimizer step (K = 2)
SMOKE_TRAIN = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--d_ff=64", "--batch_size=16", "--eval_puzzles=16",
               "--log_interval=5", "--warmup_iters=5"]
SMOKE_DATA = ["--n_train=400", "--n_val=20", "--n_test=100"]
SMOKE_PROTOCOL = {"taus": (0.05, 0.25), "n": {"Top1465": 16, "test": 24, "test hard cohort": 0}}


def run_name(objective: str, seed: int) -> str:
    return f"{objective}_s{seed}"


def plan(seeds: list[int], extra: list[str]) -> list[tuple[str, int]]:
    """The runs in the order the lanes take them: MLM and Relay seed by seed, then the extra objectives."""
    return [(o, s) for s in seeds for o in ("mlm", "relay")] + [(o, seeds[0]) for o in extra]


def train_args(objective: str, args: argparse.Namespace) -> list[str]:
    per = FORWARDS[objective]
    return [f"--max_iters={args.equivalents // per}", f"--data_dir={args.data_dir}",
            f"--eval_interval={args.eval_every // per}", f"--keep_interval={args.keep_every // per}",
            "--eval_puzzles=300", f"--device={args.device}", *args.train_args]


def kept_steps(run_dir: str) -> list[int]:
    """Steps with kept weights in a run directory, ascending."""
    folder = os.path.join(run_dir, "kept")
    found = [re.fullmatch(r"step_(\d+)\.safetensors", f) for f in (os.listdir(folder) if os.path.isdir(folder) else [])]
    return sorted(int(m.group(1)) for m in found if m)


def evaluate(run_dir: str, objective: str, step: int, protocol: str, args: argparse.Namespace) -> None:
    """sample.py on every set for one kept step; each (set, protocol) JSON written once, then kept."""
    spec = SMOKE_PROTOCOL if args.smoke else LIGHT if protocol == "light" else FULL
    equivalents = step * FORWARDS[objective]
    for name, file in SETS.items():
        out = result_path(args.out, os.path.basename(run_dir), name, protocol, equivalents)
        if os.path.exists(out):
            continue
        os.makedirs(os.path.dirname(out), exist_ok=True)
        runs.sh([sys.executable, "sample.py", f"--ckpt={run_dir}/kept/step_{step}.safetensors",
                 f"--data={os.path.join(args.data_dir, file)}", f"--n={spec['n'][name]}",
                 f"--taus={','.join(f'{t:g}' for t in spec['taus'])}", "--per_puzzle=True",
                 f"--device={args.device}", f"--out={out}.tmp"], log=os.path.join(run_dir, "eval.log"), echo=False)
        os.replace(out + ".tmp", out)


def lane(number: int, todo: "queue.Queue", args: argparse.Namespace, failures: list) -> None:
    """Take runs from the queue until it is empty or a lane has failed: train one, then evaluate its kept weights.
    Any failure is recorded in failures as one line naming the run, so that run_all stops the study with it."""
    while not failures:
        try:
            objective, seed = todo.get_nowait()
        except queue.Empty:
            return
        name = run_name(objective, seed)
        run_dir = os.path.join(args.runs, name)
        say = lambda text: print(f"[lane {number}] {time.strftime('%H:%M')} {name}: {text}", flush=True)  # noqa: E731
        try:
            say(f"training to {args.equivalents} MLM-step equivalents (log: {run_dir}/train.log)")
            t0 = time.time()
            # longer_ok: a run extended past this budget (e.g. seed 1 to 24,000) is read, not stopped on
            runs.train(objective, run_dir, seed, train_args(objective, args), echo=False, longer_ok=True)
            say(f"trained ({(time.time() - t0) / 3600:.2f} h this time); evaluating (log: {run_dir}/eval.log)")
            steps = kept_steps(run_dir)
            last = args.equivalents // FORWARDS[objective]
            for step in steps:
                evaluate(run_dir, objective, step, "light", args)
            if last in steps:
                evaluate(run_dir, objective, last, "full", args)
            say(f"evaluated {len(steps)} kept steps; results in {args.out}/{name}")
        # BaseException: anything a run raises (a failed command's SystemExit, a bug's exception) would otherwise
        # end this thread alone and the study would exit 0 without the lane's later runs; KeyboardInterrupt
        # reaches the main thread only, so nothing here swallows Ctrl-C
        except BaseException as e:  # noqa: BLE001
            failures.append(f"{name}: {runs.one_line(e)}")
            say(f"FAILED: {runs.one_line(e)}")


def run_all(args: argparse.Namespace) -> None:
    if args.prebuilt and not os.path.exists(os.path.join(args.data_dir, "test.npy")):
        raise SystemExit(f"--prebuilt: {args.data_dir} holds no stand-in data; build it where larsdoku is installed "
                         "(python prepare_data.py --source=standin) and bring it here")
    runs.ensure_data(args.data_dir, ["--source=standin", *(SMOKE_DATA if args.smoke else [])])
    if not os.path.exists(os.path.join(args.data_dir, "test_hard.parquet")):
        raise SystemExit(f"{args.data_dir} holds no test_hard.parquet: not built with --source=standin; "
                         "choose another --data_dir or rebuild it")
    # the cores shared out among the lanes (inherited by every command): one each on the 2-core CPU; on a
    # GPU machine it keeps 8 lanes of torch's default 16 threads each from fighting over 16 cores
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.lanes))
    todo: queue.Queue = queue.Queue()
    for item in plan(args.seeds, args.extra):
        todo.put(item)
    failures: list[str] = []
    threads = [threading.Thread(target=lane, args=(i + 1, todo, args, failures)) for i in range(args.lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit("the study stopped: " + "; ".join(failures))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--seeds", default="1,2,3", help="seeds of MLM and Relay")
    p.add_argument("--extra", default="rollout,relay_sg", help="objectives trained once (first seed) after MLM and "
                   "Relay; '' for none")
    p.add_argument("--equivalents", type=int, help="training compute per run, in MLM-step equivalents (default "
                   "12000, --smoke 40; a larger value later extends finished runs)")
    p.add_argument("--keep_every", type=int, help="keep the EMA weights every this many equivalents (default 2000, "
                   "--smoke 20)")
    p.add_argument("--eval_every", type=int, help="validate and checkpoint every this many equivalents (default "
                   "1000, --smoke 20)")
    p.add_argument("--lanes", type=int, default=2, help="runs at once (CPU: one per core; a GPU: all of them)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--data_dir", default="data/sudoku-standin")
    p.add_argument("--prebuilt", action="store_true", help="fail instead of building --data_dir when it is missing "
                   "(a machine without larsdoku would build other hard puzzles and no Top1465)")
    p.add_argument("--runs", default="runs/standin")
    p.add_argument("--out", default="results/standin_study", help="kept results and the report")
    p.add_argument("--figures", default="", help="where the figures go (default: --out)")
    p.add_argument("--train_args", default="", help="extra train_sudoku.py overrides for every run")
    p.add_argument("--report_only", action="store_true", help="train and evaluate nothing: report the kept results")
    p.add_argument("--smoke", action="store_true", help="toy sizes (tiny data and model, 40 equivalents)")
    args = p.parse_args(argv)
    args.seeds = runs.seed_list(args.seeds, "--seeds")
    args.extra = runs.objective_list(args.extra, "--extra") if args.extra.strip() else []
    args.train_args = args.train_args.split()
    if {"mlm", "relay"} & set(args.extra):
        raise SystemExit(f"--extra: MLM and Relay are trained with every seed already; got {','.join(args.extra)}")
    for key, full, smoke in (("equivalents", 12000, 40), ("keep_every", 2000, 20), ("eval_every", 1000, 20)):
        if getattr(args, key) is None:  # --smoke changes the defaults, never a value given
            setattr(args, key, smoke if args.smoke else full)
    if args.smoke:
        args.data_dir = "data/sudoku-standin-smoke" if args.data_dir == "data/sudoku-standin" else args.data_dir
        args.runs = "runs/standin-smoke" if args.runs == "runs/standin" else args.runs
        args.out = "runs/standin-smoke/results" if args.out == "results/standin_study" else args.out
        args.train_args = SMOKE_TRAIN + args.train_args
    for key in ("equivalents", "keep_every", "eval_every", "lanes"):
        if getattr(args, key) < 1:
            raise SystemExit(f"--{key} must be >= 1")
    for key in ("keep_every", "eval_every"):
        if getattr(args, key) % 2 or args.equivalents % getattr(args, key):
            raise SystemExit(f"--{key} must be even and divide --equivalents ({args.equivalents}), so MLM and the "
                             f"K = 2 objectives keep weights at the same compute; got {getattr(args, key)}")
    args.figures = args.figures or args.out
    for key in ("data_dir", "runs", "out", "figures"):  # commands run from the repository root (scripts/runs.py)
        runs.check_folder(getattr(args, key), f"--{key}")
        setattr(args, key, repo_path(getattr(args, key)))
    return args


# the study's flag behind each train_sudoku.py key it sets (any other key comes from --train_args)
FLAG_OF_KEY = {"seed": "--seeds", "device": "--device", "max_iters": "--equivalents", "keep_interval": "--keep_every",
               "eval_interval": "--eval_every", "data_dir": "--data_dir"}


def check_runs(args: argparse.Namespace) -> None:
    """Every run's train_sudoku.py settings (preset, this study's flags and --train_args) checked as
    train_sudoku.py checks them, before the data is built: a typo stops here, not after an hour."""
    from configurator import ConfigError, load_config
    from train_sudoku import TrainConfig, check_config
    for objective, seed in plan(args.seeds, args.extra):
        command = runs.train_command(objective, os.path.join(args.runs, run_name(objective, seed)), seed,
                                     train_args(objective, args))
        try:
            check_config(load_config(TrainConfig, command[2:]))  # after `python train_sudoku.py`
        except ConfigError as e:
            key = re.match(r"\w*", str(e)).group()
            raise SystemExit(f"{FLAG_OF_KEY.get(key, '--train_args')}: train_sudoku.py would refuse "
                             f"{run_name(objective, seed)}: {e}") from None


def repo_path(path: str) -> str:
    """A path as the commands see it from the repository root: relative inside the repository (so the kept
    results name no machine's directories), absolute outside it."""
    full = os.path.abspath(path)
    inside = os.path.commonpath([full, runs.ROOT]) == runs.ROOT
    return os.path.relpath(full, runs.ROOT) if inside else full


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.chdir(runs.ROOT)
    if not args.report_only:
        check_runs(args)
        run_all(args)
    runs.sh([sys.executable, "scripts/sudoku/standin_report.py", f"--out={args.out}", f"--figures={args.figures}",
             f"--data_dir={args.data_dir}"])


if __name__ == "__main__":
    main()
