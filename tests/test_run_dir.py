"""common.py: one run-directory contract for both trainers (docs/reliability.md). train_sudoku.py's side
is tested in test_reliability.py; here train_fastdllm.py meets the same rules (refusal of a fresh run
over a run, the lock, resume rules, checksummed resume state, kills during a save), and both trainers
the same data order. Each test names the bug it was checked against: the bug was put in once, the test
failed, the bug was taken out."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import common
import train_fastdllm as T
import train_sudoku as ts
from helpers import TINY as TINY_SUDOKU, TRAIN, VAL, snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# one process, no DeepSpeed, the tiny random Qwen2: about a second per run
TINY = ["config/fastdllm_tiny.py", "--deepspeed=", "--bd_size=8", "--objective=relay"]


def fastdllm(out_dir, *args) -> None:
    os.chdir(ROOT)  # the preset path is relative
    T.main(TINY + [f"--out_dir={out_dir}", *args])


def steps_logged(out_dir) -> list[int]:
    return [json.loads(line)["step"] for line in open(os.path.join(out_dir, "metrics.jsonl"))]


def weights(ckpt_dir) -> dict:
    return load_file(os.path.join(ckpt_dir, "model.safetensors"))


def assert_same_weights(a, b) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


# ----------------------------------------------------------------------------- Fast-dLLM: one run per out_dir

def test_a_fresh_fastdllm_run_into_a_run_is_refused_and_changes_nothing(tmp_path):
    """The issue's two commands: a second fresh run into a finished run's out_dir stops with one line and
    leaves every file as it was (sha256 of each file before and after), in-process and as a command line.
    --overwrite=True then really starts afresh. Bug checked: RUN_FILES without "resume" and "ckpt-*"
    (the second run replaced resume/ and left ckpt-2 beside its ckpt-1, as before this module)."""
    out = tmp_path / "a"
    fastdllm(out, "--max_iters=2")
    before = snapshot(out)
    assert {"ckpt-2/model.safetensors", "resume/manifest.json", "metrics.jsonl"} <= set(before)
    with pytest.raises(SystemExit, match="already holds a run \\(ckpt-2, metrics.jsonl, resume\\): continue it with "
                                         "--resume=True, or pass --overwrite=True") as e:
        fastdllm(out, "--max_iters=1")
    assert "\n" not in str(e.value) and snapshot(out) == before
    proc = subprocess.run([sys.executable, "train_fastdllm.py", *TINY, "--max_iters=1", f"--out_dir={out}"], cwd=ROOT,
                          capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "already holds a run" in lines[0], proc.stderr
    assert snapshot(out) == before
    fastdllm(out, "--max_iters=1", "--overwrite=True")
    assert sorted(os.listdir(out)) == ["ckpt-1", "metrics.jsonl", "resume"] and steps_logged(out) == [1]


def test_a_second_concurrent_fastdllm_run_is_refused_and_a_killed_run_resumes(tmp_path):
    """A training process holds out_dir; a second run into it (fresh or resume) stops with one line naming
    the first's pid and writes nothing. After a kill -9 of the first, its stale lock does not block the
    resume. Bug checked: train_fastdllm.main without common.hold (the second run trained into the
    first's files)."""
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "train_fastdllm.py", *TINY, f"--out_dir={out}", "--max_iters=100000",
                              "--save_interval=2", "--lr_decay_iters=100000"], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=os.environ | {"OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 120
        while not (out / "resume" / "manifest.json").exists():
            assert first.poll() is None, first.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "the first run saved nothing in 120 s"
            time.sleep(0.2)
        for args in (["--max_iters=1"], ["--max_iters=100000", "--lr_decay_iters=100000", "--resume=True"]):
            with pytest.raises(SystemExit) as e:
                fastdllm(out, *args)
            assert str(e.value).startswith(f"out_dir={out} is in use by another run (pid {first.pid} on ")
        assert (out / common.LOCK_FILE).read_text().split()[0] == str(first.pid)  # still the first run's
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    saved = json.loads((out / "resume" / "manifest.json").read_text())["step"]
    fastdllm(out, f"--max_iters={saved + 1}", "--lr_decay_iters=100000", "--resume=True")
    assert steps_logged(out) == list(range(1, saved + 2)) and not (out / common.LOCK_FILE).exists()


def test_fastdllm_resume_refuses_changed_hyperparameters_and_records_an_allowed_change(tmp_path):
    """A resume with another learning rate (or a key the saved state only fits) stops with one line before
    any work and changes nothing; max_iters may grow; --allow_config_change=True applies the new rate
    and records it. Bug checked: train() without check_resume (the run trained on at lr 1e-3 with a
    resume state that said 3e-3)."""
    out = tmp_path / "run"
    fastdllm(out, "--max_iters=2")
    before = snapshot(out)
    for args, message in [(["--learning_rate=1e-3"], "resume: learning_rate changed: .*resume has learning_rate=0.003, "
                                                      "this run learning_rate=0.001; .*--allow_config_change=True"),
                          (["--device_batch_size=1", "--allow_config_change=True"], "device_batch_size changed: .*only fit its value")]:
        with pytest.raises(SystemExit, match=message) as e:
            fastdllm(out, "--max_iters=3", "--resume=True", *args)
        assert "\n" not in str(e.value) and snapshot(out) == before
    fastdllm(out, "--max_iters=3", "--resume=True", "--allow_config_change=True", "--learning_rate=1e-3",
             "--weight_decay=0.1")
    config = json.loads((out / "resume" / "manifest.json").read_text())["config"]
    assert config["learning_rate"] == 1e-3 and config["history"] == [
        {"step": 2, "changed": {"max_iters": [2, 3], "learning_rate": [3e-3, 1e-3], "weight_decay": [0.0, 0.1]}}]
    record = json.loads(open(out / "metrics.jsonl").readlines()[-1])
    cfg = T.parse_config(TINY + ["--learning_rate=1e-3"])
    assert record["step"] == 3 and record["lr"] == T.lr_at(2, cfg)
    state = torch.load(out / "resume" / "state.pt", weights_only=False)
    assert [g["weight_decay"] for g in state["optimizer"]["param_groups"]] == [0.1]  # not the saved 0.0


def test_fastdllm_resumes_a_state_written_under_the_old_key_names(tmp_path):
    """A resume/ written before batch_size and threshold became device_batch_size and train_tau resumes
    under the new names: its value is kept and a change is refused as before. Bug checked: resumed_config
    without RENAMED_KEYS (the saved threshold was read as the default 0.85: the same-value resume was
    refused and a run with the default went on silently)."""
    out = tmp_path / "run"
    fastdllm(out, "--max_iters=2", "--train_tau=0.5")
    path = out / "resume" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["config"]["threshold"] = manifest["config"].pop("train_tau")
    manifest["config"]["batch_size"] = manifest["config"].pop("device_batch_size")
    del manifest["manifest_sha256"]  # as then: manifests had no digest of their own
    path.write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="resume: train_tau changed: .*train_tau=0.5, this run train_tau=0.85"):
        fastdllm(out, "--max_iters=3", "--resume=True")
    fastdllm(out, "--max_iters=3", "--resume=True", "--train_tau=0.5")
    assert steps_logged(out) == [1, 2, 3]


def test_a_kill_during_a_fastdllm_save_never_leaves_a_wrong_state(tmp_path, monkeypatch):
    """Kills inside save(): before the manifest (resume.tmp incomplete: the previous state is used), and
    between swap_in's two renames (no resume/: the complete resume.tmp is used). Each then resumes to
    the weights and log of an uninterrupted run. A resume/ whose files were mixed from two saves is
    refused. Bugs checked: recover() disabled (the resume was refused for want of resume/),
    verify_manifest disabled (the mixed state trained on)."""
    args = ["--max_iters=6", "--save_interval=2", "--objective=rollout"]
    fastdllm(tmp_path / "full", *args)
    out = tmp_path / "cut"
    real_swap = common.swap_in

    class Killed(Exception):
        pass

    def kill_in_rank_file(step):
        real_save = torch.save

        def save(obj, path, *a, **k):
            if os.path.basename(str(path)) == "rank0.pt" and obj["data"]["pos"] == step * 4:  # 4 rows per step
                raise Killed
            real_save(obj, path, *a, **k)
        monkeypatch.setattr(T.torch, "save", save)

    def kill_between_renames(step):
        def swap_in(tmp, final):
            if json.load(open(os.path.join(tmp, common.MANIFEST)))["step"] == step:
                os.replace(final, final + ".old")
                raise Killed
            real_swap(tmp, final)
        monkeypatch.setattr(common, "swap_in", swap_in)

    for i, arm in enumerate([lambda: kill_in_rank_file(4), lambda: kill_between_renames(6)]):
        arm()
        with pytest.raises(Killed):
            fastdllm(out, *args, *(["--resume=True"] if i else []))
        monkeypatch.undo()
        if i == 1:
            assert not (out / "resume").exists() and (out / "resume.tmp" / common.MANIFEST).exists()
    fastdllm(out, *args, "--resume=True")  # resumes at step 6 from resume.tmp: no step left to train
    assert steps_logged(out) == steps_logged(tmp_path / "full") == [1, 2, 3, 4, 5, 6]
    assert_same_weights(tmp_path / "full" / "ckpt-6", out / "ckpt-6")
    assert sorted(os.listdir(out)) == ["ckpt-2", "ckpt-4", "ckpt-6", "metrics.jsonl", "resume"]
    # a state mixed from two saves (the rank file of step 6 beside step 4's weights) loads as valid but wrong
    fastdllm(tmp_path / "four", "--max_iters=4", "--save_interval=2", "--objective=rollout")
    (out / "resume" / "rank0.pt").write_bytes((tmp_path / "four" / "resume" / "rank0.pt").read_bytes())
    with pytest.raises(SystemExit, match="rank0.pt is corrupted: its contents do not match the sha256") as e:
        fastdllm(out, "--max_iters=8", "--save_interval=2", "--objective=rollout", "--resume=True")
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- one data order

def epochs_of(stream: list[int], n: int) -> list[list[int]]:
    return [stream[e * n:(e + 1) * n] for e in range(len(stream) // n)]


def test_sudoku_sees_every_puzzle_once_per_epoch_in_a_fresh_order(tmp_path):
    """The rows that train_sudoku.train_step trains on, over 4 epochs of 96 puzzles at batch 20 (batches
    cross epoch ends). Bug checked: BatchOrder seeded without the epoch (the same permutation every
    epoch)."""
    cfg = ts.load_config(ts.TrainConfig, TINY_SUDOKU + [f"--out_dir={tmp_path}", "--batch_size=20", "--objective=mlm"])
    run = ts.setup(cfg, TRAIN, VAL)
    stream, rows = [], run.order.rows
    run.order.rows = lambda pos, batch_size: stream.extend(rows(pos, batch_size).tolist()) or rows(pos, batch_size)
    while len(stream) < 4 * 96:
        ts.train_step(run)
    epochs = epochs_of(stream, 96)
    assert len(epochs) == 4 and all(sorted(e) == list(range(96)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 4  # a fresh order each epoch


@pytest.mark.parametrize("world", [1, 2])
def test_fastdllm_sees_every_row_once_per_epoch_in_a_fresh_order(world):
    """train_fastdllm.Batches, one per rank, 13 rows, batch 2 per rank: the ranks' batches of each step,
    concatenated, are the global stream; each epoch of it holds every row once, in a fresh order, and a
    resumed loader continues it. Bugs checked: the loader of before this module (a rank's share of a
    per-epoch permutation, a new epoch when the next batch does not fit: it dropped the last batch's rows,
    and the rows beyond a multiple of world), and a loader that skips to the next epoch when fewer than
    two batches remain (drops the last full batch of each epoch)."""
    n, bs = 13, 2
    loaders = [T.Batches(list(range(n)), bs, rank, world, seed=3) for rank in range(world)]
    stream = []
    for _ in range(4 * n):
        for loader in loaders:
            stream += loader.next()
    epochs = epochs_of(stream, n)
    assert all(sorted(e) == list(range(n)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == len(epochs)
    resumed = T.Batches(list(range(n)), bs, 0, world, seed=3)
    resumed.load_state_dict(loaders[0].state_dict())
    assert resumed.next() == loaders[0].next()
    # a resume/ of the older loader ({epoch, position in this rank's share}) continues at the same place
    resumed.load_state_dict({"epoch": 2, "pos": 4})
    assert resumed.pos == 2 * n + 4 * world
