"""The paper's 7.1M model on the stand-in, MLM against Relay compute-matched, trained side by side on one GPU
and evaluated there with the stand-in study's protocol (docs/reproduce.md, "The study"). Not comparable with Table 1.

    python scripts/gpu/gpu_standin.py --data_dir=data/sudoku-standin-gpu   # on a GPU: about 8 minutes
    python scripts/gpu/gpu_standin.py --smoke                              # CPU, toy sizes: the same path (what CI runs)

1. train: `config/mlm_tied.py` and `config/relay_tied.py` (bf16 autocast on CUDA, compiled) at once, two
   train_sudoku.py processes on the one device, on the stand-in (`--allow_any_data=True`). Compute-matched:
   MLM trains twice Relay's steps (a K = 2 step runs two forward passes). Both stop at --train_minutes of
   training time (compile included) if their steps are not done by then. The paper's settings tied to its
   300k steps are scaled to each run's length (scaled_settings); the others are the paper's.
2. keep: each run's EMA weights at every quarter of its steps, rounded to bf16 (what comes back from the
   GPU, under 16 MiB each; on CUDA the evaluation's bf16 autocast rounds the matrix weights so anyway).
3. evaluate: sample.py exactly as scripts/sudoku/standin_study.py calls it: the light protocol at every kept point,
   the full one (Top1465's first 500, the test split's first 1,000, its whole hard cohort) at the last
   point both runs reached, so the comparison is compute-matched even when the time ran out first.
4. report: scripts/sudoku/standin_report.py over the kept results (--out/standin_study.md), then this pair at
   matched NFE next to the CPU study's (--compare) in --out/summary.md and --out/pair.json.

The pair's checkpoints (weights, EMA and AdamW state, Relay's buffer: over 100 MB each) cannot leave a GPU lent
for one command with 16 MiB files, so each run of this script trains its pair from nothing and stands alone.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
from scripts import runs  # noqa: E402
from scripts.sudoku import standin_protocol, standin_report  # noqa: E402
from scripts.sudoku.standin_study import FORWARDS, FULL, LIGHT, SETS, SMOKE_PROTOCOL  # noqa: E402

PY = sys.executable
PAPER_STEPS = 300_000  # App. A.1: 300k steps, warm-up 2,000, constant learning rate after it; EMA 0.9999
PAPER_WARMUP, PAPER_EMA = 2000, 0.9999
# Relay steps that fit --train_minutes=6 with MLM's twice as many beside them, compiled, compile time included:
# MLM 10.3 and Relay 20.4 ms a step alone on the H200 (docs/gpu.md, "The H200 report"), 205 s of steps for 4,800
# and 9,600 plus about 100 s of compiling; the H100's memory is about 1.4x slower
PLANNED_RELAY_STEPS = {"H200": 4800, "H100": 3600}
OTHER_GPU_RELAY_STEPS = 3000
SMOKE_TRAIN = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--d_ff=64", "--batch_size=16", "--log_interval=10"]
SMOKE_DATA = ["--n_train=400", "--n_val=20", "--n_test=100"]  # scripts/sudoku/standin_study.py's smoke data
OBJECTIVES = ("mlm", "relay")
RETURNED_FILE_BYTES = 16 * 2**20  # a GPU lent for one command brings back files up to 16 MiB (docs/gpu.md)


def scaled_settings(steps: int) -> dict:
    """The paper's settings tied to its 300k steps, at the same fraction of a run of `steps` optimizer steps:
    warm-up 2,000 steps (1/150 of the run) and EMA decay 0.9999 (1 / (1 - decay) = 10,000 steps averaged,
    1/30 of the run; its warm-up min(decay, (1 + n) / (10 + n)) then reaches the cap at 3/10 of the run,
    as at 90k of 300k). The learning rate is constant after warm-up, as the paper's: nothing to scale."""
    fraction = steps / PAPER_STEPS
    return {"warmup_iters": max(1, round(PAPER_WARMUP * fraction)),
            "ema_decay": round(1 - (1 - PAPER_EMA) / fraction, 6)}


def run_name(objective: str, seed: int) -> str:
    return f"{objective}_s{seed}"  # the stand-in report's run names


def train_command(objective: str, steps: int, args: argparse.Namespace) -> list[str]:
    keep = steps // args.keep_points
    settings = [f"--{k}={v}" for k, v in scaled_settings(steps).items()]
    device = ["--compile=True"] if args.device.startswith("cuda") and args.compile else []
    return [PY, "train_sudoku.py", f"config/{objective}_tied.py", f"--data_dir={args.data_dir}", "--allow_any_data=True",
            f"--out_dir={os.path.join(args.runs, run_name(objective, args.seed))}", f"--seed={args.seed}",
            f"--max_iters={steps}", f"--max_minutes={args.train_minutes:g}", *settings, f"--keep_interval={keep}",
            "--eval_interval=0", "--eval_split=val", f"--eval_puzzles={args.eval_puzzles}", f"--device={args.device}",
            *device, *(SMOKE_TRAIN if args.smoke else [])]


def train_pair(args: argparse.Namespace) -> dict[str, list[str]]:
    """Both runs at once, each in its own process; a pair already trained with the same commands is kept.
    Returns {objective: its command}."""
    commands = {o: train_command(o, args.relay_steps * FORWARDS["relay"] // FORWARDS[o], args) for o in OBJECTIVES}
    todo = {}
    for o, cmd in commands.items():
        run_dir = os.path.join(args.runs, run_name(o, args.seed))
        if runs.read_marker(os.path.join(run_dir, "DONE.json")) == cmd[1:]:
            print(f"{run_dir}: already trained with the same command, kept", flush=True)
            continue
        # a run cut short here is not resumed (the loan's time is fixed): trained afresh, and what was made
        # from its earlier weights goes (train_sudoku.py's --overwrite=True deletes the weights themselves)
        for stale in (os.path.join(run_dir, "kept_bf16"), os.path.join(args.out, run_name(o, args.seed))):
            shutil.rmtree(stale, ignore_errors=True)
        os.makedirs(run_dir, exist_ok=True)
        todo[o] = cmd + ["--overwrite=True"]
    # the cores shared out between the two processes (and the evaluation's workers after them)
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // 2))
    for o, cmd in todo.items():
        print(f"[{time.strftime('%H:%M:%S')}] training {run_name(o, args.seed)}: $ {shown(cmd)}", flush=True)
    with ThreadPoolExecutor(len(todo) or 1) as pool:
        jobs = {o: pool.submit(runs.sh, cmd, os.path.join(args.runs, run_name(o, args.seed), "train.log"), False)
                for o, cmd in todo.items()}
    failed = [f"{run_name(o, args.seed)}: {job.exception()}" for o, job in jobs.items() if job.exception()]
    if failed:
        raise SystemExit("training failed: " + "; ".join(failed))
    for o in todo:
        runs.write_marker(os.path.join(args.runs, run_name(o, args.seed), "DONE.json"), {"cmd": commands[o][1:]})
    return commands


def shown(cmd: list[str]) -> str:
    return " ".join("python" if c == PY else c for c in cmd)


def kept_points(args: argparse.Namespace) -> dict[str, list[int]]:
    """{objective: the MLM-step equivalents of its kept weights}, ascending."""
    from scripts.sudoku.standin_study import kept_steps
    return {o: [s * FORWARDS[o] for s in kept_steps(os.path.join(args.runs, run_name(o, args.seed)))]
            for o in OBJECTIVES}


def to_bf16(source: str, target: str) -> None:
    """A save_weights file with its tensors rounded to bf16, the metadata kept and its digest redone:
    common.load_weights reads it into an fp32 model like any other."""
    import torch
    from safetensors.torch import save_file
    import common
    state, meta = common.read_weights(source)
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}
    meta = {k: v for k, v in meta.items() if k != common.WEIGHTS_DIGEST} | {"dtype": "bfloat16 (rounded from fp32)"}
    meta[common.WEIGHTS_DIGEST] = common.weights_digest(state, meta)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    save_file(state, target + ".tmp", metadata=meta)
    os.replace(target + ".tmp", target)


def bf16_path(args: argparse.Namespace, objective: str, equivalents: int) -> str:
    step = equivalents // FORWARDS[objective]
    return os.path.join(args.runs, run_name(objective, args.seed), "kept_bf16", f"step_{step}.safetensors")


def evaluations(args: argparse.Namespace, points: dict[str, list[int]], final: int) -> list[tuple[list[str], str, str]]:
    """(sample.py command, its result file, its log) for every kept point up to the final one (light) and the
    final one (full), those not yet done: the stand-in study's command and result layout (its evaluate)."""
    jobs = []
    for o in OBJECTIVES:
        name = run_name(o, args.seed)
        for eq, protocol in [(eq, "light") for eq in points[o] if eq <= final] + [(final, "full")]:
            spec = SMOKE_PROTOCOL if args.smoke else LIGHT if protocol == "light" else FULL
            for set_name, file in SETS.items():
                out = standin_protocol.result_path(args.out, name, set_name, protocol, eq)
                if os.path.exists(out):
                    continue
                log = os.path.join(args.runs, name, "eval", f"{standin_protocol.slug(set_name)}_{protocol}_{eq}.log")
                jobs.append(([PY, "sample.py", f"--ckpt={bf16_path(args, o, eq)}",
                              f"--data={os.path.join(args.data_dir, file)}", f"--n={spec['n'][set_name]}",
                              f"--taus={','.join(f'{t:g}' for t in spec['taus'])}", "--per_puzzle=True",
                              f"--device={args.device}", f"--out={out}.tmp"], out, log))
    return jobs


def evaluate_pair(args: argparse.Namespace) -> int:
    """bf16 copies of the kept weights, then every sample.py call (--eval_workers at once); returns the
    compute of the full protocol: the last kept point both runs reached."""
    points = kept_points(args)
    shared = sorted(set(points["mlm"]) & set(points["relay"]))
    if not shared:
        raise SystemExit(f"no kept weights at a compute both runs reached (MLM {points['mlm']}, Relay {points['relay']}, "
                         "in MLM-step equivalents): --train_minutes too short for the first kept point")
    final = shared[-1]
    for o in OBJECTIVES:
        for eq in points[o]:
            if eq <= final and not os.path.exists(bf16_path(args, o, eq)):
                step = eq // FORWARDS[o]
                to_bf16(os.path.join(args.runs, run_name(o, args.seed), "kept", f"step_{step}.safetensors"),
                        bf16_path(args, o, eq))
    jobs = evaluations(args, points, final)
    print(f"[{time.strftime('%H:%M:%S')}] evaluating: {len(jobs)} sample.py calls, {args.eval_workers} at once; the "
          f"full protocol at {final:,} MLM-step equivalents", flush=True)
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.eval_workers))

    def one(job: tuple[list[str], str, str]) -> None:
        cmd, out, log = job
        os.makedirs(os.path.dirname(out), exist_ok=True)
        os.makedirs(os.path.dirname(log), exist_ok=True)
        runs.sh(cmd, log=log, echo=False)
        os.replace(out + ".tmp", out)
    with ThreadPoolExecutor(args.eval_workers) as pool:
        list(pool.map(one, jobs))  # the first failure stops the script (runs.sh's one line)
    return final


# -----------------------------------------------------------------------------
# the summary: this pair and the CPU study's at matched NFE (full protocol), the run's facts

def matched(found: dict, set_slug: str, eq: int) -> dict | None:
    """MLM and Relay's exact match at matched NFE on the full protocol at compute eq, seed by seed, as the
    stand-in report reads its crossover: each sweep's accuracy at budgets spread over the NFE range all cover."""
    import sudoku.frontier
    seeds = standin_report.paired_seeds(found, set_slug, eq)
    if not seeds:
        return None
    curves = {o: [standin_report.curve(found[o, s, set_slug, "full", eq]) for s in seeds] for o in OBJECTIVES}
    budgets = sudoku.frontier.even_budgets(curves["mlm"] + curves["relay"], standin_report.MATCHED_BUDGETS)
    n = min(p.n for c in curves["mlm"] for p in c)
    if not budgets:
        return {"budgets": [], "n": n, "seeds": seeds}
    acc = {o: standin_report.matched_mean(cs, budgets) for o, cs in curves.items()}
    return {"budgets": budgets, "n": n, "seeds": seeds, **acc, "se": standin_report.puzzle_se(acc["mlm"], acc["relay"], n)}


def summary_rows(out: str, found: dict, eq: int) -> dict[str, str]:
    """{set name: the Markdown cells after the set's name} for one study's pairs at compute eq."""
    cells = {}
    for name in SETS:
        r = matched(found, standin_protocol.slug(name), eq)
        if r is None:
            continue
        head = f"{describe(out, name, eq, r['seeds'][0])} | {eq:,}"
        if not r["budgets"]:
            cells[name] = f"{head} | no NFE range both cover | | | | | {len(r['seeds'])} |"
            continue
        diff = [b - a for a, b in zip(r["mlm"], r["relay"])]
        cells[name] = (f"{head} | {r['budgets'][0]:.1f}-{r['budgets'][-1]:.1f} | {percent(r['mlm'])} | "
                       f"{percent(r['relay'])} | {percent(diff)} | {100 * r['se']:.1f} | {len(r['seeds'])} |")
    return cells


def percent(values: list[float]) -> str:
    """Mean over seeds in percent, ± their s.d. when there are several."""
    mean, sd = standin_report.mean_sd(values)
    return f"{100 * mean:.1f}" + (f" ± {100 * sd:.1f}" if len(values) > 1 else "")


def describe(out: str, set_name: str, eq: int, seed: int) -> str:
    """"parameters | batch | device" of a study's MLM run, from the run config its full result records."""
    import torch
    from model import model_from_config
    with open(standin_protocol.result_path(out, run_name("mlm", seed), set_name, "full", eq)) as f:
        saved = json.load(f)
    config = saved["checkpoints"][0]["config"]
    with torch.device("meta"):
        params = sum(p.numel() for p in model_from_config(config).parameters())
    size = f"{params / 1e6:.1f}M" if params >= 100_000 else f"{params:,}"
    return f"{size} | {config['batch_size']} | {saved['device']}"


def run_facts(args: argparse.Namespace, objective: str) -> dict:
    """Steps reached, training seconds and speed of a run, from its metrics.jsonl and ckpt.pt."""
    run_dir = os.path.join(args.runs, run_name(objective, args.seed))
    records = [r for r in metric_records(run_dir) if "loss" in r]
    last = records[-1] if records else {}
    ckpt = os.path.join(run_dir, "ckpt.pt")
    return {"steps": last.get("step", 0), "train_seconds": last.get("train_seconds", 0.0),
            "last_loss": last.get("loss"), "ms_per_step_last_log": last.get("ms_per_step"),
            "checkpoint_mb": round(os.path.getsize(ckpt) / 1e6, 1) if os.path.exists(ckpt) else None}


def metric_records(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def device_name(device: str) -> str:
    import torch
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    import platform
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def summarize(args: argparse.Namespace, commands: dict, final: int, minutes: dict) -> str:
    relay_steps = args.relay_steps
    facts = {o: run_facts(args, o) for o in OBJECTIVES}
    settings = {o: scaled_settings(relay_steps * FORWARDS["relay"] // FORWARDS[o]) for o in OBJECTIVES}
    rows = [summary_rows(args.out, standin_report.load(args.out), final)]
    if args.compare:
        cpu = standin_report.load(args.compare)
        cpu_eq = standin_report.final_point(cpu)
        if cpu_eq is not None:
            rows.append(summary_rows(args.compare, cpu, cpu_eq))
    table = ["| set | parameters | batch | device | MLM-step equivalents | NFE range | MLM | Relay | Relay − MLM | "
             "s.e. (puzzles) | seeds |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in SETS:
        table += [f"| {name} | {r[name]}" for r in rows if name in r]
    short = [o for o in OBJECTIVES if facts[o]["steps"] < relay_steps * FORWARDS["relay"] // FORWARDS[o]]
    command = " ".join(["python scripts/gpu/gpu_standin.py", *args.argv]).replace(runs.ROOT + os.sep, "")
    pair = {"command": command, "device": args.device_label,
            "commands": {o: shown(c) for o, c in commands.items()}, "planned_steps":
            {o: relay_steps * FORWARDS["relay"] // FORWARDS[o] for o in OBJECTIVES}, "runs": facts,
            "scaled_settings": settings, "final_equivalents": final, "minutes": minutes,
            "stopped_short": short, "stands_alone": stands_alone(facts)}
    with open(os.path.join(args.out, "pair.json"), "w") as f:
        json.dump(pair, f, indent=1)
    lines = [
        f"# {args.model_label} on the stand-in: MLM against Relay, compute-matched, one device", "",
        "Trained on the stand-in (`--allow_any_data=True`): NOT comparable with the paper's Table 1.", "",
        "| | |", "|---|---|",
        f"| command | `{pair['command']}` |", f"| device | {args.device_label} |",
        *[f"| {o} | `{pair['commands'][o]}`: {facts[o]['steps']:,} of {pair['planned_steps'][o]:,} steps in "
          f"{facts[o]['train_seconds'] / 60:.1f} min of training (compile included) |" for o in OBJECTIVES],
        "| scaled to the run's length (the paper: 300k steps) | " + "; ".join(
            f"{o}: warmup_iters={s['warmup_iters']}, ema_decay={s['ema_decay']}" for o, s in settings.items())
        + "; learning rate constant after warm-up, as the paper's |",
        f"| compared at | {final:,} MLM-step equivalents (the last kept point both reached), EMA weights in bf16 |",
        f"| minutes | training {minutes['train']:.1f}, evaluation {minutes['evaluate']:.1f}, in all "
        f"{minutes['all']:.1f} |",
        f"| continued by a later loan? | {continued(facts)} |",
        "", "Exact match (%) at matched NFE per puzzle, full protocol (mean over seeds ± s.d.):", "", *table]
    if short:
        lines += ["", f"**Stopped short by --train_minutes={args.train_minutes:g}: {', '.join(short)}** (compared at "
                  "the last compute both reached; the scaled settings are those of the planned length)."]
    return "\n".join(lines) + "\n"


def stands_alone(facts: dict) -> bool:
    """Is a run's checkpoint too large to come back from the device (so that no later loan continues it)?"""
    return max(f["checkpoint_mb"] or 0 for f in facts.values()) * 1e6 > RETURNED_FILE_BYTES


def continued(facts: dict) -> str:
    mb = max(f["checkpoint_mb"] or 0 for f in facts.values())
    if stands_alone(facts):
        return (f"no: a checkpoint (weights, EMA, AdamW state, Relay's buffer) is up to {mb:.0f} MB, over the "
                f"{RETURNED_FILE_BYTES / 2**20:.0f} MiB a returned file may hold; this pair stands alone")
    return f"its checkpoints ({mb:.1f} MB at most) could travel; this script still trains each pair afresh"


# -----------------------------------------------------------------------------
# the data and the arguments

def check_data(args: argparse.Namespace) -> None:
    """The stand-in's files are here (smoke: built), and (with --compare) their scored puzzles are the CPU
    study's. Before any training: a wrong carry costs no GPU time."""
    needed = ["train.npy", "val.npy", "meta.json", *SETS.values()]
    missing = [f for f in needed if not os.path.exists(os.path.join(args.data_dir, f))]
    if missing and args.smoke:
        runs.ensure_data(args.data_dir, ["--source=standin", *SMOKE_DATA])
        missing = [f for f in needed if not os.path.exists(os.path.join(args.data_dir, f))]
    if missing:
        raise SystemExit(f"--data_dir={args.data_dir} lacks {', '.join(missing)}: build the stand-in where larsdoku "
                         "is installed (python prepare_data.py --source=standin) and bring it (docs/gpu.md)")
    if args.compare:
        check_same_puzzles(args.data_dir, args.compare)


def check_same_puzzles(data_dir: str, compare: str) -> None:
    """Each set's puzzles that the full protocol scores (questions and answers, in order) are those the
    study in `compare` scored, by the sha256 its sample.py results record: the pairs are read side by side."""
    import numpy as np
    import torch
    from sudoku.puzzle_files import load_puzzles
    from sudoku.report import data_source
    for name, file in SETS.items():
        folder = os.path.dirname(standin_protocol.result_path(compare, "mlm_s1", name, "full", 0))
        found = sorted(f for f in os.listdir(folder) if f.startswith("full_")) if os.path.isdir(folder) else []
        if not found:
            raise SystemExit(f"--compare={compare}: no full results in {folder}; --compare= reads no study beside this one")
        with open(os.path.join(folder, found[0])) as f:
            kept = json.load(f)
        puzzles = load_puzzles(os.path.join(data_dir, file))
        n = kept["n"] or len(puzzles.question)
        q, a = (torch.as_tensor(np.asarray(x)[:n], dtype=torch.long) for x in (puzzles.question, puzzles.answer))
        mine = data_source(argparse.Namespace(data=file, data_dir=data_dir), {"all": (q, a)})["puzzles"]["all"]
        if mine != kept["data_source"]["puzzles"]["all"]:
            raise SystemExit(f"--data_dir={data_dir}: the first {n} puzzles of {file} are not those the study in "
                             f"{compare} scored: rebuild with `python prepare_data.py --source=standin` at its default "
                             "sizes, or pass --compare= for a pair not read beside that study")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--data_dir", default="data/sudoku-standin-gpu", help="the stand-in's files (docs/gpu.md)")
    p.add_argument("--runs", default="runs/gpu_standin", help="the two training runs")
    p.add_argument("--out", default="results/gpu_standin", help="the kept results, the report and the summary")
    p.add_argument("--weights", default="", help="where the final pair's bf16 EMA weights go (default: --out/weights)")
    p.add_argument("--compare", default="results/standin_study", help="the CPU study's kept results, read beside "
                   "this pair (and their puzzles checked against --data_dir's); '' for none")
    p.add_argument("--relay_steps", type=int, default=0, help="Relay's steps, MLM twice as many (default by device: "
                   + ", ".join(f"{k} {v:,}" for k, v in PLANNED_RELAY_STEPS.items()) + f", other GPUs "
                   f"{OTHER_GPU_RELAY_STEPS:,})")
    p.add_argument("--train_minutes", type=float, default=6.0, help="training time (compile included) after which "
                   "each run stops, its steps done or not")
    p.add_argument("--keep_points", type=int, default=4, help="kept and evaluated points per run (the last: the end)")
    p.add_argument("--eval_puzzles", type=int, default=1000, help="the runs' own validation at their end (val split)")
    p.add_argument("--eval_workers", type=int, default=8, help="sample.py processes at once")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--compile", type=runs_bool, default=True, help="torch.compile the step on CUDA (default True)")
    p.add_argument("--smoke", action="store_true", help="CPU, toy model and data, 80 and 40 steps: the same path")
    p.add_argument("--check_only", action="store_true", help="check --data_dir (and its puzzles against --compare's) "
                   "and stop: where the data is built, before it is carried (scripts/gpu/gpu_prepare.sh)")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    if args.smoke:
        args.device, args.compile, args.keep_points, args.eval_workers = "cpu", False, 2, 2
        args.relay_steps, args.eval_puzzles = args.relay_steps or 40, 16
        args.compare = "" if args.compare == "results/standin_study" else args.compare
        for key, default, smoke in (("data_dir", "data/sudoku-standin-gpu", "data"), ("runs", "runs/gpu_standin", "runs"),
                                    ("out", "results/gpu_standin", "results")):
            if getattr(args, key) == default:
                setattr(args, key, f"runs/gpu_standin-smoke/{smoke}")
    for key in ("keep_points", "eval_puzzles", "eval_workers"):
        if getattr(args, key) < 1:
            raise SystemExit(f"--{key} must be >= 1, got {getattr(args, key)}")
    if not args.train_minutes > 0:
        raise SystemExit(f"--train_minutes must be > 0, got {args.train_minutes:g}")
    if args.relay_steps and (args.relay_steps < 40 or args.relay_steps % args.keep_points):
        raise SystemExit(f"--relay_steps must be at least 40 (the scaled EMA decay is 0 below 30) and a multiple of "
                         f"--keep_points={args.keep_points}, got {args.relay_steps}")
    args.weights = args.weights or os.path.join(args.out, "weights")
    for key in ("data_dir", "runs", "out", "weights", "compare"):
        if getattr(args, key):
            setattr(args, key, repo_path(getattr(args, key)))
    return args


def runs_bool(text: str) -> bool:
    if text not in ("True", "False"):
        raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")
    return text == "True"


def repo_path(path: str) -> str:
    """Relative inside the repository (the kept results then name no machine's directories), absolute outside."""
    full = os.path.abspath(path)
    return os.path.relpath(full, runs.ROOT) if os.path.commonpath([full, runs.ROOT]) == runs.ROOT else full


def plan_device(args: argparse.Namespace) -> None:
    """The device's name, and Relay's steps from it unless given."""
    if args.device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            raise SystemExit(f"--device={args.device} but this torch sees no CUDA device; use --smoke on a CPU")
    args.device_label = device_name(args.device)
    if not args.relay_steps:
        known = [k for k in PLANNED_RELAY_STEPS if k in args.device_label]
        args.relay_steps = PLANNED_RELAY_STEPS[known[0]] if known else OTHER_GPU_RELAY_STEPS
        if not known:
            print(f"{args.device_label}: no planned step count for this device, Relay {args.relay_steps:,} steps "
                  "(--relay_steps to choose)", flush=True)
    args.model_label = "toy model (smoke)" if args.smoke else "7.1M (config/*_tied.py)"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.chdir(runs.ROOT)
    if args.check_only:
        check_data(args)
        print(f"{args.data_dir}: the stand-in's files are there" + (f", their scored puzzles those of {args.compare}"
                                                                    if args.compare else ""))
        return
    t0 = time.time()
    plan_device(args)
    check_data(args)
    commands = train_pair(args)
    t_train = time.time()
    final = evaluate_pair(args)
    t_eval = time.time()
    report = subprocess.run([PY, "scripts/sudoku/standin_report.py", f"--out={args.out}", f"--data_dir={args.data_dir}"],
                            cwd=runs.ROOT, capture_output=True, text=True)
    if report.returncode:
        raise SystemExit(f"scripts/sudoku/standin_report.py failed: {(report.stderr.strip().splitlines() or ['?'])[-1]}")
    for o in OBJECTIVES:  # the learning curves travel with the results (the runs stay on the device)
        for f in ("metrics.jsonl", "train.log"):
            shutil.copyfile(os.path.join(args.runs, run_name(o, args.seed), f),
                            os.path.join(args.out, run_name(o, args.seed), f))
    os.makedirs(args.weights, exist_ok=True)
    for o in OBJECTIVES:  # the pair that was compared, as it comes back
        target = os.path.join(args.weights, f"{run_name(o, args.seed)}_{final}.safetensors")
        shutil.copyfile(bf16_path(args, o, final), target + ".tmp")
        os.replace(target + ".tmp", target)
    minutes = {"train": (t_train - t0) / 60, "evaluate": (t_eval - t_train) / 60, "all": (time.time() - t0) / 60}
    text = summarize(args, commands, final, minutes)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    print(text, flush=True)
    print(f"wrote {args.out}/summary.md, {args.out}/standin_study.md and the weights in {args.weights}")


if __name__ == "__main__":
    main()
