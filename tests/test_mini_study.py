"""scripts/mini_study.py's keep step: the bf16 copy of a run's last checkpoint that the next stage starts from and
the repository keeps. Two lanes can reach it at the same moment, and a resumed study reaches it again."""
import json
import threading

import pytest
import torch

import fastdllm.model as fm
from scripts import mini_study


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
    with open(tmp_path / "ckpt-200" / "manifest.json") as f:
        manifest = json.load(f)
    manifest["step"] = 150  # another step of the run: kept anew
    with open(tmp_path / "ckpt-200" / "manifest.json", "w") as f:
        json.dump(manifest, f)
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
    assert scripts.count("train_fastdllm.py") == 4 and "scripts/pretrain_ar.py" in scripts
    for cmd, script in zip(commands, scripts):
        if script != "fastdllm.mini_data":
            assert "--device=cuda" in cmd, cmd
    stage_b = next(cmd for cmd in commands if "config/fastdllm_mini_adapt.py" in cmd)
    assert "torch.distributed.run" not in stage_b and "--gradient_accumulation_steps=4" in stage_b
