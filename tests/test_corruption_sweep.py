"""Every file a loader reads, damaged one byte at a time: each kind (a Sudoku ckpt.pt, a Sudoku .safetensors,
every file of a Fast-dLLM ckpt-N/ directory, the Fast-dLLM resume/manifest.json) under random single-byte
flips either loads exactly what was written or is refused with one line naming the file; never a changed
load, never another exception (which a command would print as a traceback). Plus the user-facing cases:
eval_code.py on a truncated, a broken and a flipped checkpoint, and resume on a flipped manifest.
docs/reliability.md lists what each kind verifies."""
import contextlib
import io
import json
import os
import shutil

import numpy as np
import pytest
import torch

import common
import eval_code
import fastdllm.model
import train_fastdllm as T
import train_sudoku as ts
from configurator import load_config
from helpers import TINY, TRAIN, VAL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLIPS = 120  # per file kind (per file for a ckpt-N/ directory)
SANDBOX = "--sandbox=namespaces"


def flips(path, n: int, seed: int):
    """n copies of the file's bytes, each with one random bit of one random byte flipped; half of the flips
    fall in the first 4 KB (headers, JSON, zip directory) where the formats are most fragile."""
    raw = open(path, "rb").read()
    rng = np.random.default_rng(seed)
    for i in range(n):
        pos = int(rng.integers(min(len(raw), 4096))) if i % 2 else int(rng.integers(len(raw)))
        damaged = bytearray(raw)
        damaged[pos] ^= 1 << int(rng.integers(8))
        yield bytes(damaged)


def outcome(load, path: str) -> tuple[str, object]:
    """('refused', message) for the loaders' one-line errors, ('loaded', value) otherwise; any other
    exception propagates and fails the test."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return "loaded", load()
    except (common.CheckpointError, ValueError, SystemExit) as e:
        message = str(e)
        assert "\n" not in message and os.path.basename(path) in message, message
        return "refused", message


def sweep(path: str, copy: str, load, unchanged, seed: int) -> None:
    """FLIPS damaged copies of path through `load`: each refused in one line, or loaded and `unchanged`."""
    refused = 0
    for damaged in flips(path, FLIPS, seed=seed):
        open(copy, "wb").write(damaged)
        kind, value = outcome(lambda: load(copy), copy)
        refused += kind == "refused"
        if kind == "loaded":  # only a flip that changes nothing the file holds may load
            assert unchanged(value)
    assert refused >= FLIPS // 2  # most flips change contents (the rest hit padding or unused zip fields)


def test_sudoku_checkpoint_flips(tmp_path):
    cfg = load_config(ts.TrainConfig, TINY + [f"--out_dir={tmp_path / 'run'}", "--eval_interval=0", "--max_iters=1"])
    ts.train(cfg, TRAIN, VAL)
    path = str(tmp_path / "run" / "ckpt.pt")
    good = common.load_checkpoint(path)["checksum"]
    sweep(path, str(tmp_path / "copy.pt"), common.load_checkpoint, lambda c: common.checksum(c) == good, seed=1)


def test_sudoku_weights_file_flips(tmp_path):
    path = str(tmp_path / "w.safetensors")
    model, meta = common.load_model(os.path.join(ROOT, "reference", "mlm.safetensors"))
    common.save_weights(model, path, {"config": json.dumps(meta), "weights": "ema"})
    good = {k: v.clone() for k, v in common.load_model(path)[0].state_dict().items()}
    sweep(path, str(tmp_path / "copy.safetensors"), common.load_model,
          lambda loaded: all(torch.equal(good[k], v) for k, v in loaded[0].state_dict().items()), seed=2)


def test_fastdllm_checkpoint_flips_in_every_file(fastdllm_run, tmp_path):
    """check_files (what load_fastdllm runs first) on a copy of ckpt-1/ with one file damaged: every flip in
    a listed file is refused; a flip in manifest.json loads only if it leaves the manifest's content as it was."""
    ckpt = fastdllm_run / "ckpt-1"
    names = sorted(os.listdir(ckpt))
    assert "manifest.json" in names and "model.safetensors" in names and "config.json" in names
    fastdllm.model.check_files(str(ckpt), downloaded=False)  # the intact one passes
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for i, name in enumerate(names):
        copy = tmp_path / f"c{i}"
        shutil.copytree(ckpt, copy)
        for damaged in flips(ckpt / name, FLIPS // 4, seed=10 + i):
            (copy / name).write_bytes(damaged)
            kind, _ = outcome(lambda: fastdllm.model.check_files(str(copy), downloaded=False), str(copy))
            if kind == "loaded":
                assert name == "manifest.json" and json.loads(damaged) == manifest, name


def test_fastdllm_resume_manifest_flips(fastdllm_run, tmp_path):
    """read_manifest + verify_manifest, what a resume runs first: no flip of resume/manifest.json is accepted
    with other contents (one once changed "step": 8 to 9), none ends in another exception (KeyError: 'world')."""
    state = fastdllm_run / "resume"
    manifest = json.loads((state / "manifest.json").read_text())
    copy = tmp_path / "resume"
    shutil.copytree(state, copy)

    def load():
        m = common.read_manifest(str(copy))
        common.verify_manifest(str(copy), m)
        return m
    for damaged in flips(state / "manifest.json", FLIPS, seed=3):
        (copy / "manifest.json").write_bytes(damaged)
        kind, value = outcome(load, str(copy / "manifest.json"))
        if kind == "loaded":
            assert value == manifest


def test_resume_with_a_flipped_manifest_is_one_line(fastdllm_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(fastdllm_run, run)
    path = run / "resume" / "manifest.json"
    path.write_text(path.read_text().replace('"step": 1', '"step": 2'))  # still JSON, other contents
    os.chdir(ROOT)
    with pytest.raises(SystemExit, match="manifest.json is corrupted: its contents do not match the sha256") as e:
        T.main(["config/fastdllm_tiny.py", f"--out_dir={run}", "--deepspeed=", "--bd_size=8", "--max_iters=2",
                "--resume=True"])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("damage,message", [
    ("truncate", "model.safetensors is corrupted"), ("config", "config.json is corrupted"),
    ("flip", "model.safetensors is corrupted"), ("no_manifest_truncate", "cannot load the weights in")])
def test_eval_code_on_a_damaged_checkpoint_is_one_line(fastdllm_run, tmp_path, damage, message):
    """Before: a truncated model.safetensors gave a traceback (SafetensorError: header too small), a broken
    config.json a line naming no file, a flipped weight byte loaded silently."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(fastdllm_run / "ckpt-1", ckpt)
    weights = ckpt / "model.safetensors"
    if damage.startswith("no_manifest"):
        (ckpt / "manifest.json").unlink()
    if damage.endswith("truncate"):
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "config":
        (ckpt / "config.json").write_text("{not json")
    else:
        raw = bytearray(weights.read_bytes())
        raw[-10] ^= 0x10
        weights.write_bytes(bytes(raw))
    with pytest.raises(SystemExit, match=message) as e:
        eval_code.main([f"--model={ckpt}", "--limit=1", "--device=cpu", SANDBOX, f"--out_dir={tmp_path / 'out'}",
                        *(["--allow_unverified=True"] if damage.startswith("no_manifest") else [])])
    assert "\n" not in str(e.value)
