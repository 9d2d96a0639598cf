"""scripts/table2/store.py's keep step, the bf16 copy of a run's checkpoint that the next stage starts from and the
repository keeps (two lanes can reach it at the same moment, and a resumed study reaches it again), and how a killed
training run goes on."""
import threading

import pytest
import torch

import fastdllm.model as fm
from scripts.table2 import store, study


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
                store.keep(src, str(tmp_path / f"t{trial}_lane{i}"))
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
    store.keep(src, dst)
    monkeypatch.setattr(fm, "load_fastdllm", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded again")))
    store.keep(src, dst)  # a resumed study: dst holds step 200 already
    relay_checkpoint(tmp_path / "ckpt-200", 150)  # another step of the run (a manifest edited by hand is refused)
    with pytest.raises(AssertionError, match="loaded again"):  # a checkpoint of another step is kept anew
        store.keep(src, dst)


def test_a_damaged_kept_manifest_is_a_one_line_failure(tmp_path, monkeypatch):
    """The kept copy of sft_s1 whose manifest.json lost a byte: manifest_step refuses it in one line naming the file
    (read through common.read_manifest). Bug checked: manifest_step reading it with json.load (a changed step taken
    as is; a truncated file a JSONDecodeError that killed the lane's thread while the study exited 0)."""
    kept = tmp_path / "kept" / "sft_s1"
    relay_checkpoint(kept, 200)
    manifest = kept / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"step": 200', '"step": 201'))
    with pytest.raises(SystemExit, match=f"{manifest} is corrupted") as e:
        store.manifest_step(str(kept))
    assert "\n" not in str(e.value)
    manifest.write_text(manifest.read_text()[:-5])  # truncated: not JSON any more
    with pytest.raises(SystemExit, match=f"{manifest} is damaged"):
        store.manifest_step(str(kept))



@pytest.mark.parametrize("left, flag", [(["metrics.jsonl"], "--overwrite=True"),
                                        (["metrics.jsonl", "resume/"], "--resume=True"), ([], None)])
def test_a_killed_fine_tune_restarts_or_resumes(tmp_path, monkeypatch, left, flag):
    """A run killed before its first checkpoint leaves only its log lines: train_fastdllm.py refuses such a folder
    without --overwrite, so the study must start it again; one killed later resumes from resume/. Both ways a study
    trains (to the end, and v3's B3 to a given step). Bug checked: B3 trained to a step without the overwrite (a B3
    killed before its first save was refused by train_fastdllm.py)."""
    out = tmp_path / "run"
    out.mkdir()
    for name in left:
        (out / name.rstrip("/")).mkdir() if name.endswith("/") else (out / name).write_text("{}\n")
    commands = []
    monkeypatch.setattr(store.runs, "sh", lambda cmd, **kw: commands.append(cmd))
    monkeypatch.setattr(store.runs, "write_marker", lambda *a: None)
    store.finetune("config/x.py", str(out), ["--seed=1"], 1, str(tmp_path / "log"))
    st = study.Study("v3", "data", "pins", (), str(tmp_path), str(tmp_path / "out"))
    study.train(st, "config/x.py", "run", [], lambda text: None, max_iters=100)
    for command in commands:
        restart_flags = [c for c in command if c in ("--overwrite=True", "--resume=True")]
        assert restart_flags == ([flag] if flag else [])
    assert len(commands) == 2
