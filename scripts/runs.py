"""Shared plumbing of the experiment drivers: run a command with its output teed to a log, train one
run unless an identical finished one is already there (resuming an interrupted one, extending one to a
larger budget, never deleting one without replace=True), evaluate checkpoints with sample.py.

Every run is a `python train_sudoku.py config/cpu_<objective>.py ...` subprocess, so a driver does
nothing a user could not type by hand; the commands are echoed as they start.
"""
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import common  # noqa: E402

OBJECTIVES = ("mlm", "rollout", "relay_sg", "relay")


def sh(cmd: list[str], log: str | None = None, echo: bool = True) -> None:
    """Run cmd from the repo root, echo it, tee its output to `log` (echo=False: output to `log` only, for
    drivers that run several commands at once); stop the driver if it fails."""
    if echo:
        print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    t0 = time.time()
    # line-buffered, so train.log is current while a long run goes on and complete if it is killed
    with open(log, "a", buffering=1) if log else open(os.devnull, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        last = ""
        if not echo:
            f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        for line in proc.stdout:
            if echo:
                sys.stdout.write(line)
            f.write(line)
            last = line.strip() or last
        code = proc.wait()
    if code:
        raise SystemExit(f"command failed with exit code {code} after {time.time() - t0:.0f} s: {last}"
                         + (f" (full output in {log})" if log else ""))


def one_line(e: BaseException) -> str:
    """A job's failure as one line: a failed command's SystemExit as it is, any other exception with its type."""
    text = str(e).strip()
    if isinstance(e, SystemExit):
        return text
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def budget_args(minutes: float | None, iters: int | None) -> list[str]:
    """Overrides for a training budget: wall-clock minutes (train_sudoku's max_minutes) or steps."""
    if (minutes is None) == (iters is None):
        raise SystemExit("give one training budget, in minutes or in steps (--minutes or --iters), not both")
    if iters is not None:
        return [f"--max_iters={iters}"]
    return [f"--max_minutes={minutes}", "--max_iters=100000000"]


def ensure_data(data_dir: str, prepare: list[str]) -> None:
    """Build the Sudoku data with prepare_data.py unless data_dir already has the test split."""
    if not os.path.exists(os.path.join(os.path.abspath(data_dir), "test.npy")):
        sh([sys.executable, "prepare_data.py", f"--out_dir={os.path.abspath(data_dir)}", *prepare])


def has_derived_fields(data_dir: str) -> bool:
    """Does the test split carry the solver fields the deduction-only cohort needs?"""
    import pyarrow.parquet as pq
    return "strategies_used" in pq.read_schema(os.path.join(os.path.abspath(data_dir), "test.parquet")).names


BUDGET_KEYS = ("--max_minutes", "--max_iters")  # a finished run may be extended to a larger budget


def read_marker(path: str) -> list[str] | None:
    """The command recorded in STARTED.json / DONE.json, or None without one."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("cmd")


def write_marker(path: str, record: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


PATH_KEYS = ("--out_dir", "--data_dir", "--init_from")  # one directory may be spelled relative or absolute


def changed_args(old: list[str], new: list[str]) -> dict[str, tuple[str | None, str | None]]:
    """{argument: (old value, new value)} for the --key=value and positional arguments that differ; paths
    are compared as the directories they name from the current directory (runs/x and /repo/runs/x agree)."""
    def as_dict(cmd: list[str]) -> dict[str, str]:
        return dict(a.split("=", 1) if a.startswith("--") and "=" in a else (f"argument {i}", a) for i, a in enumerate(cmd))

    def same_path(key: str, x: str | None, y: str | None) -> bool:
        return key in PATH_KEYS and x is not None and y is not None and os.path.realpath(x) == os.path.realpath(y)
    a, b = as_dict(old), as_dict(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not same_path(k, a.get(k), b.get(k))}


def is_extension(changes: dict[str, tuple[str | None, str | None]], finished: bool = True) -> bool:
    """Only the budget changed, and it grew (or the run has not finished: then it may also shrink, and
    the run resumes to the new budget, as train_sudoku.py allows)."""
    def grew(old, new) -> bool:
        try:
            return float(new) >= float(old) or not finished
        except (TypeError, ValueError):
            return False
    return bool(changes) and all(k in BUDGET_KEYS and grew(*v) for k, v in changes.items())


def train_command(objective: str, out_dir: str, seed: int, args: list[str]) -> list[str]:
    return [sys.executable, "train_sudoku.py", f"config/cpu_{objective}.py", f"--seed={seed}", f"--out_dir={out_dir}", *args]


def trained_longer(changes: dict[str, tuple[str | None, str | None]]) -> bool:
    """Only --max_iters changed, and the finished run's was larger. The learning rate is warm-up then
    constant and the data stream does not depend on --max_iters, so that run passed through this
    budget's weights: a driver that reads kept steps by number can use them."""
    if set(changes) != {"--max_iters"}:
        return False
    try:
        return int(changes["--max_iters"][0]) > int(changes["--max_iters"][1])
    except (TypeError, ValueError):
        return False


def train(objective: str, out_dir: str, seed: int, args: list[str], replace: bool = False, echo: bool = True,
          longer_ok: bool = False) -> str:
    """Train one run into out_dir; returns out_dir. Never deletes a run unless replace=True:
    - a run finished with the same command is skipped; with longer_ok, so is one finished with a larger
      --max_iters and nothing else changed (a driver reading its kept steps by number, after one run
      was extended);
    - one interrupted (killed, out of session time) resumes from its last checkpoint;
    - one whose command differs only by a larger budget (--max_minutes / --max_iters), or an unfinished one
      by any budget, is resumed to it;
    - any other run there (another command's, or one this driver did not start) stops the driver with one
      line naming the differing arguments; replace=True deletes it and trains afresh."""
    cmd = train_command(objective, out_dir, seed, args)
    full = os.path.abspath(out_dir)
    done, started = os.path.join(full, "DONE.json"), os.path.join(full, "STARTED.json")
    has_ckpt = os.path.exists(os.path.join(full, "ckpt.pt"))
    holds_run = has_ckpt or os.path.exists(os.path.join(full, "metrics.jsonl"))
    previous = read_marker(done) or read_marker(started)
    changes = changed_args(previous, cmd[1:]) if previous is not None else {}
    if previous is not None and not changes and os.path.exists(done):
        print(f"{out_dir}: already trained with the same command, skipped")
        return out_dir
    if longer_ok and os.path.exists(done) and trained_longer(changes):
        old, new = changes["--max_iters"]
        print(f"{out_dir}: already trained past this budget (--max_iters {old} > {new}), skipped: its kept steps are read")
        return out_dir
    conflict = (previous is None and holds_run) or (bool(changes) and not is_extension(changes, os.path.exists(done)))
    if conflict and not replace:
        what = ("holds a run this driver did not start" if previous is None else "holds a run of another command ("
                + "; ".join(f"{k}: {old} -> {new}" for k, (old, new) in changes.items()) + ")")
        raise SystemExit(f"{out_dir} {what}; use another directory, or replace it (the driver's --replace_runs flag)")
    if conflict:
        print(f"{out_dir}: replacing the run there (replace=True)")
        shutil.rmtree(full)
        has_ckpt = holds_run = False
    resume = has_ckpt
    if resume:
        print(f"{out_dir}: " + ("extending the run to the new budget" if changes else "interrupted run of the same command")
              + ", resuming from its checkpoint")
        if os.path.exists(done):
            os.remove(done)  # not finished under the new budget until it gets there
    os.makedirs(full, exist_ok=True)
    write_marker(started, {"cmd": cmd[1:]})
    # a run killed before its first checkpoint left only log lines: it starts again from scratch
    flags = ["--resume=True"] if resume else (["--overwrite=True"] if holds_run else [])
    t0 = time.time()
    sh(cmd + flags, log=os.path.join(full, "train.log"), echo=echo)
    write_marker(done, {"cmd": cmd[1:], "seconds": round(time.time() - t0, 1), "resumed": resume})
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
    from common import CheckpointError, load_checkpoint
    try:
        return int(load_checkpoint(os.path.join(run_dir, "ckpt.pt"), required=("step",))["step"])
    except CheckpointError as e:
        raise SystemExit(str(e)) from None


def seed_list(text: str, flag: str) -> list[int]:
    """A flag's comma-separated training seeds (integers >= 0, each once); one line naming the flag otherwise."""
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 0 or len(set(out)) < len(out):
        raise SystemExit(f"{flag}: give one or more seeds >= 0, each once, got {text!r}")
    return out


def need(ok: bool, flag: str, rule: str, value) -> None:
    """Stop in one line naming the flag unless ok (write ok so that NaN fails it)."""
    if not ok:
        raise SystemExit(f"{flag} must be {rule}, got {value!r}")


def check_budget(flag: str, value: float | None, minutes: bool) -> None:
    """A training budget flag, when given: a finite number of minutes > 0, or a step count >= 1."""
    if value is not None:
        need(0 < value < math.inf if minutes else value >= 1, flag, "a finite number > 0" if minutes else ">= 1", value)


def objective_list(text: str, flag: str) -> list[str]:
    """A flag's comma-separated objectives, each once; one line naming the flag otherwise."""
    out = [t.strip() for t in text.split(",") if t.strip()]
    bad = [o for o in out if o not in OBJECTIVES]
    if bad or not out:
        raise SystemExit(f"{flag}: unknown objective(s) {bad}: choose from {', '.join(OBJECTIVES)}")
    if len(set(out)) < len(out):
        raise SystemExit(f"{flag}: each objective once, got {text!r}")
    return out


def check_folder(path: str, flag: str) -> None:
    """Stop in one line naming the flag unless `path` is, or can be made, a folder this user writes in
    (checked before any work: a driver runs for hours before it first writes there). Writes nothing."""
    problem = common.folder_problem(path)
    if problem:
        raise SystemExit(f"{flag}={path} {problem}")
