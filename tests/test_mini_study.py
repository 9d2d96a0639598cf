"""scripts/mini_study.py's keep step: the bf16 copy of a run's last checkpoint that the next stage starts from and
the repository keeps. Two lanes can reach it at the same moment, and a resumed study reaches it again."""
import json
import threading

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
    try:
        mini_study.keep(src, dst)
    except AssertionError as e:
        assert "loaded again" in str(e)
    else:
        raise AssertionError("a checkpoint of another step was not kept")
