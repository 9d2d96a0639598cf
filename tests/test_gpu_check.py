"""scripts/gpu/gpu_check.py: the GPU check runs every part and reports it, and never passes a part silently.

The smoke run is the check's own plan at tiny sizes on the CPU, so the plan cannot rot while no GPU
is at hand. The other tests give the runner made-up parts: a part that prints nothing it should, one
that overruns its limit (its child processes too), one that fails, one already done.
"""
import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "gpu"))
import gpu_check  # noqa: E402
from gpu_check import Part  # noqa: E402

PY = sys.executable


@pytest.mark.slow  # about 3-5 minutes of subprocesses on 2 cores: run with `pytest -m slow` and before a GPU loan
def test_smoke_runs_every_part_and_reports_its_results(tmp_path):
    """Every part of the plan runs (status ok) and its results reach report.md. Fails when a part is
    dropped from the run or from the report, when a bench stops printing its table, or when the
    learning comparison loses a run (checked by deleting the CPU reference run's command). No budget:
    the smoke's own default (test_the_smoke_has_no_budget_a_slow_machine_could_exhaust)."""
    out = tmp_path / "report"
    proc = subprocess.run([PY, "scripts/gpu/gpu_check.py", "--smoke", f"--out_dir={out}"],
                          cwd=ROOT, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = (out / "report.md").read_text()
    parts = gpu_check.plan(True, str(out / "work"))
    for i, part in enumerate(parts, 1):
        record = json.loads((out / f"{part.name}.json").read_text())
        assert record["status"] == "ok", (part.name, record["status"])
        assert f"## {i}. {part.title}\n\nStatus: ok" in report
        assert record["commands"] and all(c in report for c in record["commands"])
    speed = "\n".join(json.loads((out / "train_speed.json").read_text())["output"])
    assert all(f"| {objective} |" in speed for objective in ("mlm", "rollout", "relay_sg", "relay"))
    learn = json.loads((out / "learn.json").read_text())["summary"]
    rows = [line for line in learn.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 6 and all("-" not in line.split("|", 2)[2] for line in rows)  # every run logged every step
    assert all((out / f"{name}.png").exists() for name in ("learn", "relay_tied", "mlm_tied", "memory_profile"))
    fastdllm = "\n".join(json.loads((out / "fastdllm_train.json").read_text())["output"])
    assert fastdllm.count("step 2 |") == 2
    assert "| prefix cache | " in report and "| relay |" in report and "| sft |" in report
    check_standin_pair(out)


def check_standin_pair(out) -> None:
    """The 7.1M pair's part at toy sizes: compute-matched (MLM 80 steps, Relay 40 of two forwards each), every
    kept point evaluated with the light protocol and the last with the full one, and the compared EMA weights
    back as bf16 files that load and equal the run's fp32 EMA rounded. Fails when MLM trains Relay's step
    count (checked) or the weights travel in fp32 (checked)."""
    import torch
    from safetensors.torch import load_file
    from common import load_model
    pair_dir = out / "gpu_standin"
    pair = json.loads((pair_dir / "pair.json").read_text())
    assert pair["planned_steps"] == {"mlm": 80, "relay": 40} and pair["final_equivalents"] == 80
    assert {o: r["steps"] for o, r in pair["runs"].items()} == {"mlm": 80, "relay": 40}
    assert "| test hard cohort |" in (pair_dir / "summary.md").read_text()
    for run, step in (("mlm_s1", 80), ("relay_s1", 40)):
        for set_slug in ("top1465", "test", "test_hard_cohort"):
            assert sorted(os.listdir(pair_dir / run / set_slug)) == ["full_80.json", "light_40.json", "light_80.json"]
        assert (pair_dir / run / "metrics.jsonl").exists()
        returned = str(pair_dir / "weights" / f"{run}_80.safetensors")
        ema = load_file(str(out / "work" / "standin_pair_runs" / run / "kept" / f"step_{step}.safetensors"))
        state = load_file(returned)
        assert all(t.dtype == torch.bfloat16 for t in state.values()) and state.keys() == ema.keys()
        assert all(torch.equal(state[k], ema[k].to(torch.bfloat16)) for k in ema)
        load_model(returned)  # its digest and config read back


def fake_plan(monkeypatch, parts: list[Part]) -> None:
    monkeypatch.setattr(gpu_check, "plan", lambda smoke, work: parts)
    monkeypatch.setattr(gpu_check, "python_path_with_wheels", lambda env: env)


def run(tmp_path, *args: str) -> int:
    return gpu_check.main(["--smoke", f"--out_dir={tmp_path}", *args])


def record(tmp_path, name: str) -> dict:
    return json.loads((tmp_path / f"{name}.json").read_text())


class SlowMachine:
    """A fake clock and a fake run_command: each command takes `seconds` on the fake clock, or is stopped
    at its timeout (returning None, as run_command does) when that comes first. Nothing runs for real."""

    def __init__(self, monkeypatch, seconds: float, output: str = "| result |"):
        self.now, self.seconds, self.output, self.commands = 0.0, seconds, output, []
        monkeypatch.setattr(gpu_check, "clock", lambda: self.now)
        monkeypatch.setattr(gpu_check, "run_command", self.run_command)

    def run_command(self, cmd, timeout, log, env):
        self.commands.append(cmd[-1])
        if self.seconds > timeout:
            self.now += timeout
            return None, ""
        self.now += self.seconds
        return 0, self.output


def quick_part(name: str, limit_s: int = 3600) -> Part:
    return Part(name, name, lambda: [[PY, "-c", name]], limit_s, 60, r"\| result \|")


def test_the_smoke_gives_a_slow_machine_all_the_time_it_needs(tmp_path, monkeypatch):
    """--smoke (no --budget_minutes) runs every command of its plan to the end on a slow machine: on a fake
    clock where each command takes 7 minutes (about 50 times the smoke's commands on 2 idle cores), no part
    is stopped by a budget or a time limit (each fails only for printing no result: the fake commands print
    nothing). Fails with a default budget in smoke mode (checked with the former 9 minutes) and with the
    GPU's time limits in the smoke (checked: ddp's two commands overran its 300 s)."""
    monkeypatch.setattr(gpu_check, "python_path_with_wheels", lambda env: env)
    machine = SlowMachine(monkeypatch, seconds=7 * 60, output="")
    run(tmp_path)
    parts = gpu_check.plan(True, str(tmp_path / "work"))
    assert len(machine.commands) == sum(len(p.commands()) for p in parts)
    assert all(record(tmp_path, p.name)["status"].startswith("FAILED: ran, but printed nothing") for p in parts)


def test_the_budget_cuts_the_running_part_and_starts_no_more(tmp_path, monkeypatch):
    """On a fake clock, a 5-minute budget and parts of 200 s each: the first passes, the second is stopped
    when the budget runs out (not a failure: it runs again next time), the third is not started; the next
    run, with a fresh budget, continues with them. Fails when a part's time limit ignores the budget
    (checked: the second part then passed at 400 s) or when parts start past the budget (checked: the
    third ran)."""
    fake_plan(monkeypatch, [quick_part("a"), quick_part("b"), quick_part("c")])
    machine = SlowMachine(monkeypatch, seconds=200)
    assert run(tmp_path, "--budget_minutes=5") == 0  # nothing failed; parts are left to run
    assert machine.commands == ["a", "b"] and machine.now == 300
    assert record(tmp_path, "a")["status"] == "ok"
    assert record(tmp_path, "b")["status"] == "stopped: out of budget"
    assert not (tmp_path / "c.json").exists()
    assert "| c | not run yet |" in (tmp_path / "report.md").read_text()
    assert run(tmp_path, "--budget_minutes=10") == 0
    assert machine.commands == ["a", "b", "b", "c"]
    assert [record(tmp_path, n)["status"] for n in "bc"] == ["ok", "ok"]


def test_a_budget_that_is_not_positive_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="--budget_minutes must be > 0, got 0"):
        run(tmp_path, "--budget_minutes=0")


def test_pack_returns_the_report_in_few_files_and_says_what_does_not_fit(tmp_path, monkeypatch, capsys):
    """--pack: the report and the parts' results (not work/, where the runs, data and checkpoints are) in one
    gpu_report.tgz, each weights file beside it; a file over the size limit is named and the exit status is 1.
    Fails when work/ goes into the archive (checked: its checkpoint then did) or a weights file is left out."""
    import tarfile
    out, dest = tmp_path / "report", tmp_path / "returned"
    write = ("import os, sys; w = sys.argv[1]; os.makedirs(w + '/work/run', exist_ok=True); "
             "os.makedirs(w + '/results/weights', exist_ok=True); open(w + '/work/run/ckpt.pt', 'wb').write(bytes(64)); "
             "open(w + '/results/summary.md', 'w').write('| ok |'); "
             "open(w + '/results/weights/mlm_s1_8.safetensors', 'wb').write(bytes(2048)); print('| ok |')")
    fake_plan(monkeypatch, [Part("writer", "Writes", lambda: [[PY, "-c", write, str(out)]], 30, 1, r"\| ok \|")])
    assert run(out, f"--pack={dest}") == 0
    assert sorted(os.listdir(dest)) == ["gpu_report.tgz", "mlm_s1_8.safetensors"]
    with tarfile.open(dest / "gpu_report.tgz") as tar:
        names = tar.getnames()
    assert {"gpu_report/report.md", "gpu_report/writer.json", "gpu_report/results/summary.md"} <= set(names)
    assert not [n for n in names if "work" in n or n.endswith(".safetensors")], names
    monkeypatch.setattr(gpu_check, "RETURNED_FILE_BYTES", 1024)
    assert run(out, f"--pack={dest}") == 1
    assert "mlm_s1_8.safetensors is 0.0 MiB, over the 0 MiB" in capsys.readouterr().err


def test_a_part_that_prints_no_result_fails(tmp_path, monkeypatch):
    """A bench that exits 0 but prints no table is FAILED, in the report and the exit status.
    Fails when the expect check is dropped (checked)."""
    fake_plan(monkeypatch, [Part("quiet", "Prints no table", lambda: [[PY, "-c", "print('warming up')"]], 30, 1, r"^\|")])
    assert run(tmp_path) == 1
    assert record(tmp_path, "quiet")["status"].startswith("FAILED: ran, but printed nothing matching")
    assert "| quiet | FAILED" in (tmp_path / "report.md").read_text()


def test_a_part_over_its_limit_is_stopped_with_its_children(tmp_path, monkeypatch):
    """A part over its limit is FAILED within the limit, and the processes it started end with it
    (a torchrun worker left behind would hold the GPU). Fails when only the direct child is killed
    (checked with proc.kill() instead of killing the process group)."""
    pid_file = tmp_path / "child.pid"
    script = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    fake_plan(monkeypatch, [Part("slow", "Sleeps", lambda: [[PY, "-c", script]], 3, 1, r".")])
    t0 = time.time()
    assert run(tmp_path) == 1
    assert time.time() - t0 < 20
    assert record(tmp_path, "slow")["status"] == "FAILED: over its 3 s limit"
    time.sleep(0.5)
    assert not running(int(pid_file.read_text()))


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan killed here may wait for a PID 1 that never reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_done_parts_are_skipped_and_failed_ones_run_again(tmp_path, monkeypatch):
    """Running the check again continues it: a part that passed is not rerun (its result is kept),
    a failed one is. Fails when the skip test ignores the status (checked)."""
    counter = tmp_path / "runs.txt"
    append = f"open({str(counter)!r}, 'a').write('{{}}\\n'); print('| result |')"
    fake_plan(monkeypatch, [
        Part("good", "Passes", lambda: [[PY, "-c", append.format("good")]], 30, 1, r"\| result \|"),
        Part("bad", "Fails", lambda: [[PY, "-c", append.format("bad") + "; raise SystemExit(3)"]], 30, 1, r"."),
    ])
    assert run(tmp_path) == 1
    assert run(tmp_path) == 1
    assert counter.read_text().split() == ["good", "bad", "bad"]
    assert record(tmp_path, "bad")["status"].startswith("FAILED: exit code 3")
    assert run(tmp_path, "--redo=good", "--parts=good") == 0
    assert counter.read_text().split() == ["good", "bad", "bad", "good"]


def test_unknown_part_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="unknown part.*nope; the parts are standin_pair, mini3_seeds, mini3_t, tests, train_profile"):
        run(tmp_path, "--parts=nope")


def check_arguments(cmd: list[str]) -> None:
    """Parse one command's arguments with its script's own config loader and checks (no work is done)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import bench_generate, bench_train, memory_profile, prepare_data, train_fastdllm, train_sudoku  # noqa: E401
    from configurator import load_config
    args = cmd[1:]
    if args[:2] == ["-m", "torch.distributed.run"]:
        args = [a for a in args[2:] if not a.startswith("--nproc_per_node")]
    script, args = args[0], args[1:]
    if script == "-m":  # pytest: its own options are checked by pytest itself; --device by conftest
        assert args[0] == "pytest"
    elif script == "-c":  # a copy of kept results (in the repository) or of what gpu_prepare.sh packed to carry
        assert os.path.isdir(os.path.join(ROOT, args[1])) or args[1].startswith(gpu_check.MINI3_DATA + "/"), args
    elif script == "scripts/table2/study.py":
        from scripts.table2 import study
        study.parse_args(args)
    elif script == "train_sudoku.py":
        train_sudoku.check_config(load_config(train_sudoku.TrainConfig, args))
    elif script == "train_fastdllm.py":
        train_fastdllm.parse_config(args)
    elif script == "tests/test_pin_reference_models.py":  # its own usage check: --compare [--device=...]
        assert args[0] == "--compare" and len(args) == 2 and args[1].startswith("--device=")
    elif script == "prepare_data.py":
        prepare_data.parse_args(args)
    elif script == "scripts/sudoku/standin_study.py":
        from scripts.sudoku import standin_study
        standin_study.parse_args(args)
    elif script == "scripts/gpu/gpu_standin.py":
        from scripts.gpu import gpu_standin
        gpu_standin.parse_args(args)
    else:
        loaders = {"bench/bench_train.py": bench_train.BenchConfig, "bench/bench_generate.py": bench_generate.BenchConfig,
                   "bench/memory_profile.py": memory_profile.Config}
        load_config(loaders[script], args)


def test_every_command_of_the_gpu_plan_parses(tmp_path, monkeypatch):
    """The GPU plan's commands (which CI never runs) pass their scripts' own argument checks, so a
    GPU session does not lose a part to a misspelt option. Fails on a misspelt key (checked with
    --pad_too=2048) and on a value a script refuses (checked with --save_interval=-2)."""
    import torch
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the plan is for a GPU; only parsing happens here
    commands = [cmd for part in gpu_check.plan(False, str(tmp_path)) for cmd in part.commands()]
    assert len(commands) == 41
    for cmd in commands:
        check_arguments(cmd)


def test_parts_not_yet_run_go_before_failed_ones(tmp_path, monkeypatch):
    """A part that failed is retried only after the parts that have not run yet, so one part failing
    for good cannot take every later run's time. Fails with the plain plan order (checked)."""
    counter = tmp_path / "runs.txt"
    log = f"open({str(counter)!r}, 'a').write('{{}}\\n')"
    fake_plan(monkeypatch, [
        Part("bad", "Fails", lambda: [[PY, "-c", log.format("bad") + "; raise SystemExit(1)"]], 30, 1, r"."),
        Part("fresh", "Passes", lambda: [[PY, "-c", log.format("fresh") + "; print('| ok |')"]], 30, 1, r"\| ok \|"),
    ])
    assert run(tmp_path, "--parts=bad") == 1
    assert run(tmp_path) == 1
    assert counter.read_text().split() == ["bad", "fresh", "bad"]


def test_a_table1_run_resumes_only_while_unfinished(tmp_path):
    """The Table 1 parts continue a run cut short (--resume=True) but start afresh over a finished one:
    resuming a finished run trains nothing and prints no result, so the part could never pass again.
    Fails when any checkpoint means resume (checked)."""
    out = tmp_path / "relay_tied"
    part = next(p for p in gpu_check.plan(False, str(tmp_path)) if p.name == "table1_relay")
    flags = lambda: [a for a in part.commands()[-1] if a in ("--resume=True", "--overwrite=True")]  # noqa: E731
    assert flags() == ["--overwrite=True"]  # nothing yet
    out.mkdir()
    (out / "ckpt.pt").write_bytes(b"")
    for seconds, expected in ((60.0, "--resume=True"), (180.5, "--overwrite=True")):
        (out / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 1.0, "train_seconds": seconds}) + "\n")
        assert flags() == [expected]


def test_the_judge_runs_in_the_strongest_sandbox_the_loan_has(monkeypatch, capsys):
    """mini3_seeds' judge: the strongest isolating mode that works on the lent machine, else "unsafe" said in one line
    (the study must be judged there: its checkpoints do not come back). Failed with the ValueError let through."""
    import fastdllm.sandbox
    monkeypatch.setattr(fastdllm.sandbox, "mode_problem", lambda mode: "" if mode == "namespaces" else "no bwrap")
    assert gpu_check.judge_sandbox() == "namespaces"
    monkeypatch.setattr(fastdllm.sandbox, "mode_problem", lambda mode: "not permitted")
    assert gpu_check.judge_sandbox() == "unsafe"
    assert "judging unisolated on this machine: no sandbox works here" in capsys.readouterr().out
