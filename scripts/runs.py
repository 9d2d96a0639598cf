"""Shared plumbing of the experiment drivers: run a command with its output teed to a log, train one
run unless an identical finished one is already there (resuming an interrupted one), evaluate
checkpoints with sample.py.

Every run is a `python train_sudoku.py config/cpu_<objective>.py ...` subprocess, so a driver does
nothing a user could not type by hand; the commands are echoed as they start.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OBJECTIVES = ("mlm", "rollout", "relay_sg", "relay")


def sh(cmd: list[str], log: str | None = None) -> None:
    """Run cmd from the repo root, echo it, tee its output to `log`; stop the driver if it fails."""
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    t0 = time.time()
    # line-buffered, so train.log is current while a long run goes on and complete if it is killed
    with open(log, "a", buffering=1) if log else open(os.devnull, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        last = ""
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
            last = line.strip() or last
        code = proc.wait()
    if code:
        raise SystemExit(f"command failed with exit code {code} after {time.time() - t0:.0f} s: {last}"
                         + (f" (full output in {log})" if log else ""))


def train_has(key: str) -> bool:
    """Does train_sudoku.py's TrainConfig have this key?"""
    import dataclasses
    from train_sudoku import TrainConfig
    return key in {f.name for f in dataclasses.fields(TrainConfig)}


def budget_args(minutes: float | None, iters: int | None) -> list[str]:
    """Overrides for a training budget: wall-clock minutes (needs train_sudoku's max_minutes) or steps."""
    if (minutes is None) == (iters is None):
        raise SystemExit("give exactly one budget: minutes or iters")
    if iters is not None:
        return [f"--max_iters={iters}"]
    if not train_has("max_minutes"):
        raise SystemExit("train_sudoku.py has no max_minutes key for a wall-clock budget: use the *_iters "
                         "options instead (a step budget)")
    return [f"--max_minutes={minutes}", "--max_iters=100000000"]


def ensure_data(data_dir: str, prepare: list[str]) -> None:
    """Build the Sudoku data with prepare_data.py unless data_dir already has the test split."""
    if not os.path.exists(os.path.join(os.path.abspath(data_dir), "test.parquet")):
        sh([sys.executable, "prepare_data.py", f"--out_dir={os.path.abspath(data_dir)}", *prepare])


def has_derived_fields(data_dir: str) -> bool:
    """Does the test split carry the solver fields the deduction-only cohort needs?"""
    import pyarrow.parquet as pq
    return "strategies_used" in pq.read_schema(os.path.join(os.path.abspath(data_dir), "test.parquet")).names


def train(objective: str, out_dir: str, seed: int, args: list[str]) -> str:
    """Train one run into out_dir; returns out_dir. A run that already finished with the same command
    is skipped; one that was interrupted (killed, out of session time) resumes from its last checkpoint,
    so a long study can be stopped and restarted. Anything else in out_dir is replaced."""
    cmd = [sys.executable, "train_sudoku.py", f"config/cpu_{objective}.py", f"--seed={seed}", f"--out_dir={out_dir}", *args]
    full = os.path.abspath(out_dir)
    done, started = os.path.join(full, "DONE.json"), os.path.join(full, "STARTED.json")

    def same_command(marker: str) -> bool:
        if not os.path.exists(marker):
            return False
        with open(marker) as f:
            return json.load(f).get("cmd") == cmd[1:]

    if same_command(done):
        print(f"{out_dir}: already trained with the same command, skipped (delete it to retrain)")
        return out_dir
    resume = same_command(started) and os.path.exists(os.path.join(full, "ckpt.pt"))
    if resume:
        print(f"{out_dir}: interrupted run of the same command, resuming from its checkpoint")
    else:
        if os.path.exists(full):
            shutil.rmtree(full)  # a fresh start: train_sudoku.py appends to metrics.jsonl
        os.makedirs(full)
        with open(started, "w") as f:
            json.dump({"cmd": cmd[1:]}, f)
    t0 = time.time()
    sh(cmd + (["--resume=True"] if resume else []), log=os.path.join(full, "train.log"))
    with open(done, "w") as f:
        json.dump({"cmd": cmd[1:], "seconds": round(time.time() - t0, 1), "resumed": resume}, f)
    return out_dir


def evaluate(ckpts: list[str], labels: list[str] | None, data_dir: str, n: int, out: str, plot: str,
             cohorts: str = "all", extra: list[str] = ()) -> dict:
    """sample.py over the τ sweep: prints the per-τ lines and the table, writes `out` and `plot`."""
    out = os.path.abspath(out)
    cmd = [sys.executable, "sample.py", f"--ckpt={','.join(ckpts)}", "--data=test", f"--data_dir={data_dir}",
           f"--n={n}", f"--cohort={cohorts}", f"--out={out}", "--table", *extra]
    if plot:
        cmd.append(f"--plot={os.path.abspath(plot)}")
    if labels:
        cmd.append(f"--labels={','.join(labels)}")
    sh(cmd)
    with open(os.path.abspath(out)) as f:
        return json.load(f)


def checkpoint_step(run_dir: str) -> int:
    """The step a finished train_sudoku.py run saved its checkpoint at."""
    import torch
    return int(torch.load(os.path.join(run_dir, "ckpt.pt"), map_location="cpu", weights_only=False)["step"])


def int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"expected comma-separated integers, got {text!r}") from None


def objective_list(text: str) -> list[str]:
    out = [t.strip() for t in text.split(",") if t.strip()]
    bad = [o for o in out if o not in OBJECTIVES]
    if bad or not out:
        raise SystemExit(f"unknown objective(s) {bad}: choose from {', '.join(OBJECTIVES)}")
    return out
