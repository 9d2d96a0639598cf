"""scripts/table2/mini_study.py's keep step: the bf16 copy of a run's last checkpoint that the next stage starts from and
the repository keeps. Two lanes can reach it at the same moment, and a resumed study reaches it again."""
import os
import threading

import pytest
import torch

import fastdllm.model as fm
from scripts.table2 import mini_study


def relay_checkpoint(path, step: int) -> str:
    model = fm.make_tiny_fastdllm(use_relay=True, seed=3)
    with torch.no_grad():
        model.relay_layer_norm.weight.normal_()  # nonzero, so a relay that was not loaded shows
    fm.save_fastdllm(model, fm.make_tiny_tokenizer(), str(path), info={"step": step})
    return str(path)


def test_two_lanes_keep_at_once(tmp_path):
    """Both lanes finished seed 1 together after a resume and loaded at once: transformers' from_pretrained is not
    thread-safe, and the study died with 'Cannot copy out of meta tensor'."""
    src = relay_checkpoint(tmp_path / "ckpt-200", 200)
    expected = fm.load_fastdllm(src, dtype=torch.bfloat16)[0].relay_layer_norm.weight
    for trial in range(20):  # a race: each trial catches it about half the time without the lock
        errors, start = [], threading.Barrier(2)

        def keep(i: int) -> None:
            start.wait()
            try:
                mini_study.keep(src, str(tmp_path / f"t{trial}_lane{i}"))
            except Exception as e:  # noqa: BLE001 - the thread's failure is the test's finding
                errors.append(repr(e))
        lanes = [threading.Thread(target=keep, args=(i,)) for i in range(2)]
        for t in lanes:
            t.start()
        for t in lanes:
            t.join()
        assert not errors, errors
        for i in range(2):
            kept = fm.load_fastdllm(str(tmp_path / f"t{trial}_lane{i}"))[0]
            assert torch.equal(kept.relay_layer_norm.weight, expected)


def test_a_kept_step_is_not_kept_again(tmp_path, monkeypatch):
    src = relay_checkpoint(tmp_path / "ckpt-200", 200)
    dst = str(tmp_path / "kept")
    mini_study.keep(src, dst)
    monkeypatch.setattr(fm, "load_fastdllm", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded again")))
    mini_study.keep(src, dst)  # a resumed study: dst holds step 200 already
    relay_checkpoint(tmp_path / "ckpt-200", 150)  # another step of the run (a manifest edited by hand is refused)
    with pytest.raises(AssertionError, match="loaded again"):  # a checkpoint of another step is kept anew
        mini_study.keep(src, dst)


def test_on_a_gpu_every_command_runs_there_and_b_in_one_process(monkeypatch, tmp_path):
    """--device=cuda (faked: no GPU here) reaches every command the study runs: pretraining, B in one process
    (not one per lane: the lanes share the one GPU), the fine-tunes and every evaluation. Fails with the flag
    dropped from any stage (checked: from the evaluations)."""
    monkeypatch.setattr(mini_study, "torch_cuda", lambda: True)
    args = mini_study.parse_args(["--device=cuda", "--lanes=10", "--seeds=1", "--extra=rollout",
                                  f"--runs={tmp_path / 'runs'}", f"--kept={tmp_path / 'kept'}",
                                  f"--out={tmp_path / 'out'}"])
    commands = []
    monkeypatch.setattr(mini_study.runs, "sh", lambda cmd, **kw: commands.append(cmd))
    monkeypatch.setattr(mini_study.runs, "write_marker", lambda *a: None)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # prepare() sets it for the lanes
    monkeypatch.chdir(mini_study.runs.ROOT)  # as main() does: the paths are relative to the repository
    for name in ("keep", "keep_log"):
        monkeypatch.setattr(mini_study, name, lambda *a, **k: None)
    monkeypatch.setattr(mini_study, "kept_steps", lambda run_dir: [50])
    monkeypatch.setattr(mini_study, "test_file", lambda args, n: "tasks.jsonl")
    monkeypatch.setattr(mini_study.mini_report, "compact", lambda *a, **k: None)
    mini_study.run_all(args)
    scripts = [next(c for c in cmd if c.endswith(".py") or c == "fastdllm.mini_data") for cmd in commands]
    assert scripts.count("eval_code.py") == 5 + 3 * (3 + 5)  # base: 5 taus; sft, relay, rollout: 3 light + 5 full
    assert scripts.count("train_fastdllm.py") == 4 and "scripts/table2/pretrain_ar.py" in scripts
    for cmd, script in zip(commands, scripts):
        if script != "fastdllm.mini_data":
            assert "--device=cuda" in cmd, cmd
    stage_b = next(cmd for cmd in commands if "config/fastdllm_mini_adapt.py" in cmd)
    assert "torch.distributed.run" not in stage_b and "--gradient_accumulation_steps=4" in stage_b


def study_args(tmp_path):
    """Two seeds of SFT and Relay, no extra objective, one lane (so the order of the runs is fixed)."""
    return mini_study.parse_args(["--seeds=1,2", "--extra=", "--lanes=1", f"--runs={tmp_path / 'runs'}",
                                  f"--kept={tmp_path / 'kept'}", f"--out={tmp_path / 'out'}"])


def fake_stages(monkeypatch, finished: list) -> None:
    """The study's stages without their commands: each job's fine-tune and evaluations only say they ran."""
    for name in ("prepare", "stage_b", "keep_log"):
        monkeypatch.setattr(mini_study, name, lambda *a, **k: None)
    monkeypatch.setattr(mini_study, "finetune", lambda config, out, *a, **k: finished.append(os.path.basename(out)))
    monkeypatch.setattr(mini_study, "kept_steps", lambda run_dir: [50])
    monkeypatch.setattr(mini_study, "evaluate", lambda *a, **k: None)


def test_an_exception_in_a_lane_stops_the_study_in_one_line(tmp_path, monkeypatch):
    """keep() raising something other than SystemExit in a lane (here a RuntimeError) fails the study: exit non-zero,
    one line naming the run and the cause, no later run started, and the runs finished before it stay. Bug
    checked: lane() catching only SystemExit (the thread died with a traceback, the lane's later runs never
    started, and the study exited 0)."""
    finished: list[str] = []
    fake_stages(monkeypatch, finished)

    def keep(src: str, dst: str) -> None:
        raise RuntimeError("the disk went away\nsecond line")
    monkeypatch.setattr(mini_study, "keep", keep)
    monkeypatch.chdir(mini_study.runs.ROOT)  # as main() does: the paths are relative to the repository
    with pytest.raises(SystemExit) as e:
        mini_study.run_all(study_args(tmp_path))
    message = str(e.value)
    assert message == "the study stopped: sft_s1: RuntimeError: the disk went away", message
    assert finished == ["sft_s1"]  # the base evaluation and sft_s1's fine-tune ran; nothing after the failure


def test_a_damaged_kept_manifest_is_a_one_line_failure(tmp_path, monkeypatch):
    """The kept copy of sft_s1 (--kept) whose manifest.json lost a byte: manifest_step refuses it in one line naming
    the file (read through common.read_manifest), and the study that reaches it stops, naming the run. Bug
    checked: manifest_step reading it with json.load (a changed step taken as is; a truncated file a
    JSONDecodeError that killed the lane's thread while the study exited 0)."""
    kept = tmp_path / "kept" / "sft_s1"
    relay_checkpoint(kept, 200)
    manifest = kept / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"step": 200', '"step": 201'))
    with pytest.raises(SystemExit, match=f"{manifest} is corrupted") as e:
        mini_study.manifest_step(str(kept))
    assert "\n" not in str(e.value)
    manifest.write_text(manifest.read_text()[:-5])  # truncated: not JSON any more
    with pytest.raises(SystemExit, match=f"{manifest} is damaged"):
        mini_study.manifest_step(str(kept))

    relay_checkpoint(tmp_path / "runs" / "sft_s1" / "ckpt-200", 200)  # the run's last step, intact
    finished: list[str] = []
    fake_stages(monkeypatch, finished)
    monkeypatch.setattr(mini_study, "kept_steps", lambda run_dir: [200])
    monkeypatch.chdir(mini_study.runs.ROOT)  # as main() does: the paths are relative to the repository
    with pytest.raises(SystemExit, match="the study stopped: sft_s1: .*manifest.json is damaged") as e:
        mini_study.run_all(study_args(tmp_path))
    assert "\n" not in str(e.value) and finished == ["sft_s1"]


@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_report_only_without_results_fails(tmp_path, folder, capsys):
    """--report_only on a folder that does not exist, or holds no result: exit non-zero, one line naming it.
    Bug checked: mini_report.report printing 'no kept results' and the study exiting 0."""
    out = tmp_path / "results"
    if folder == "empty":
        out.mkdir()
    with pytest.raises(SystemExit, match="no kept results in .*/results: run the study first") as e:
        mini_study.main(["--report_only", f"--out={out}"])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("left, flag", [(["metrics.jsonl"], "--overwrite=True"),
                                        (["metrics.jsonl", "resume/"], "--resume=True"), ([], None)])
def test_a_killed_fine_tune_restarts_or_resumes(tmp_path, monkeypatch, left, flag):
    """A run killed before its first checkpoint leaves only its log lines: train_fastdllm.py refuses such a folder
    without --overwrite, so the study must start it again; one killed later resumes from resume/."""
    out = tmp_path / "run"
    out.mkdir()
    for name in left:
        (out / name.rstrip("/")).mkdir() if name.endswith("/") else (out / name).write_text("{}\n")
    commands = []
    monkeypatch.setattr(mini_study.runs, "sh", lambda cmd, **kw: commands.append(cmd))
    monkeypatch.setattr(mini_study.runs, "write_marker", lambda *a: None)
    mini_study.finetune("config/x.py", str(out), ["--seed=1"], 1, str(tmp_path / "log"))
    restart_flags = [c for c in commands[0] if c in ("--overwrite=True", "--resume=True")]
    assert restart_flags == ([flag] if flag else [])
