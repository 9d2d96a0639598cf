"""Run directories, locks, honest resume, checksummed checkpoints and up-front input checks
(docs/reliability.md). Each test names the bug it was checked against: the bug was put in once, the
test failed, the bug was taken out."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict

import numpy as np
import pytest
import torch

import common
import sample
import sudoku.step
import train_sudoku as ts
from configurator import load_config
from common import load_model
from model import ModelConfig, SudokuTransformer
from scripts import runs
from sudoku.board import format_board, random_grid
from helpers import TINY, TRAIN, VAL, corrupt_tensor_byte, snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(out_dir, *args) -> dict:
    cfg = load_config(ts.TrainConfig, TINY + [f"--out_dir={out_dir}", "--eval_interval=2", *args])
    return ts.train(cfg, TRAIN, VAL)


def ckpt_of(out_dir) -> dict:
    return torch.load(os.path.join(out_dir, "ckpt.pt"), weights_only=True)


def steps_logged(out_dir) -> tuple[list[int], list[int]]:
    """Steps of the training records and of the validation records in metrics.jsonl, in file order."""
    records = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    return [r["step"] for r in records if "lr" in r], [r["step"] for r in records if "val/exact" in r]


def tensors(obj) -> list[torch.Tensor]:
    """Every tensor in a nested checkpoint, in a fixed order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=repr) for t in tensors(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in tensors(x)]
    return []


# ----------------------------------------------------------------------------- run directories and locks

def test_a_fresh_run_never_overwrites_a_run(tmp_path):
    """Bug: without check_run_dir's refusal the second run replaced ckpt.pt and logged steps 1, 2, 1, 2
    (checked by deleting the refusal); --overwrite=True must start afresh with a clean log."""
    out = tmp_path / "run"
    train(out, "--max_iters=2")
    before = snapshot(out)
    with pytest.raises(SystemExit, match="already holds a run .*--resume=True.*--overwrite=True") as e:
        train(out, "--max_iters=2", "--learning_rate=1e-3")
    assert "\n" not in str(e.value) and snapshot(out) == before
    train(out, "--max_iters=3", "--overwrite=True")
    assert steps_logged(out)[0] == [1, 2, 3] and ckpt_of(out)["step"] == 3
    assert not (out / ts.LOCK_FILE).exists()  # released at the end of the run


def test_a_run_killed_before_its_first_checkpoint_is_told_the_way_out(tmp_path):
    """Killed before its first checkpoint (metrics.jsonl, no ckpt.pt): --resume=True used to say "drop
    --resume" and the plain command "continue it with --resume=True", a circle. Both now name
    --overwrite=True (the one way that works) and another out_dir, and --overwrite=True does start afresh."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0, "lr": 0.001}\n')
    for flags in ([], ["--resume=True"]):
        with pytest.raises(SystemExit) as e:
            train(out, "--max_iters=2", *flags)
        message = str(e.value)
        assert "stopped before its first checkpoint" in message and "--overwrite=True" in message
        assert "another out_dir" in message and "continue it with --resume" not in message, message
    train(out, "--max_iters=2", "--overwrite=True")
    assert steps_logged(out)[0] == [1, 2]


def test_a_live_lock_refuses_and_a_stale_one_is_replaced(tmp_path, capsys):
    """Bugs: pid_alive always False (a second run trains into a held directory) and always True (a
    kill -9 leaves out_dir locked for ever); both checked."""
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(["sleep", "60"])
    try:
        (out / ts.LOCK_FILE).write_text(f"{holder.pid} {socket.gethostname()}\n")
        with pytest.raises(SystemExit, match=f"in use by another run \\(pid {holder.pid} ") as e:
            train(out, "--max_iters=1")
        assert "\n" not in str(e.value) and sorted(os.listdir(out)) == [ts.LOCK_FILE]
    finally:
        holder.kill()
        holder.wait()
    train(out, "--max_iters=1")  # the holder died without removing its lock
    assert "replacing the stale lock" in capsys.readouterr().out
    assert ckpt_of(out)["step"] == 1 and not (out / ts.LOCK_FILE).exists()
    # a lock from another machine cannot be checked: refused, with the way out named
    (out / ts.LOCK_FILE).write_text("12345 some-other-host\n")
    with pytest.raises(SystemExit, match="another machine: delete"):
        train(out, "--max_iters=2", "--resume=True")


def _cli(*args: str) -> list[str]:
    """train_sudoku.main in a fresh interpreter, on the tests' tiny puzzles instead of data_dir."""
    code = ("import sys; sys.path[:0] = [sys.argv.pop(1), sys.argv.pop(1)]; import train_sudoku as ts, "
            "helpers as t; ts.load_training_split = lambda split, d: t.TRAIN if split == 'train' else t.VAL; "
            "ts.main(sys.argv[1:])")
    return [sys.executable, "-c", code, ROOT, os.path.join(ROOT, "tests"), *TINY, *args]


def test_second_concurrent_run_refuses_with_one_line_and_a_killed_run_resumes(tmp_path):
    """A training process holds out_dir; a second run into it stops with one line naming the first's pid
    (bug checked: lock_holder always None; the second run resumed and trained into the first's files). After a kill -9
    of the first, its stale lock does not block the resume."""
    out = tmp_path / "run"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(_cli(f"--out_dir={out}", "--max_iters=100000", "--eval_interval=3", "--eval_puzzles=0"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.time() + 120
        while not (out / "ckpt.pt").exists():
            assert first.poll() is None, first.stderr.read().decode()
            assert time.time() < deadline, "the first run wrote no checkpoint in 120 s"
            time.sleep(0.2)
        with pytest.raises(SystemExit) as e:  # the second run (in this process: the command line is tested below)
            train(out, "--max_iters=5", "--eval_interval=3", "--eval_puzzles=0", "--resume=True")  # still going
        assert str(e.value) == (f"out_dir={out} is in use by another run (pid {first.pid} on "
                                f"{socket.gethostname()}); wait for it to finish or choose another out_dir")
        assert (out / ts.LOCK_FILE).read_text().split()[0] == str(first.pid)  # still the first run's
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert (out / ts.LOCK_FILE).read_text().split()[0] == str(first.pid)  # left behind by the kill
    saved = ckpt_of(out)["step"]
    train(out, f"--max_iters={saved + 2}", "--eval_interval=3", "--eval_puzzles=0", "--resume=True")
    assert steps_logged(out)[0] == list(range(1, saved + 3)) and not (out / ts.LOCK_FILE).exists()


def test_every_step_logged_once_after_any_sequence_of_kills(tmp_path, monkeypatch):
    """Kills between steps, between a log line and its checkpoint, in the middle of writing ckpt.pt and in
    the middle of a log line; after each, a resume. The log must list steps 1..10 once and the weights
    equal an uninterrupted run. Bugs checked: drop_records_after disabled (steps repeat) and its
    torn-line handling removed (the resume dies on a JSON error)."""
    args = ["--objective=relay", "--dropout=0.1", "--max_iters=10"]
    train(tmp_path / "full", *args)
    out = tmp_path / "cut"
    real_lr_at, real_save = ts.lr_at, ts.save_checkpoint

    class Killed(Exception):
        pass

    def kill_before_step(n):
        def lr_at(it, cfg):
            if it == n - 1:
                raise Killed
            return real_lr_at(it, cfg)
        monkeypatch.setattr(sudoku.step, "lr_at", lr_at)

    def kill_in_save(at_step, write_tmp):
        def save(obj, path):
            if obj["step"] == at_step:
                if write_tmp:  # torch.save got halfway
                    open(path + ".tmp", "wb").write(b"PK\x03\x04 half a checkpoint")
                raise Killed
            real_save(obj, path)
        monkeypatch.setattr(ts, "save_checkpoint", save)

    kills = [lambda: kill_before_step(4), lambda: kill_in_save(4, False), lambda: kill_in_save(6, True),
             lambda: kill_before_step(9)]
    for i, arm in enumerate(kills):
        arm()
        with pytest.raises(Killed):
            train(out, *args, *(["--resume=True"] if i else []))
        monkeypatch.setattr(sudoku.step, "lr_at", real_lr_at)
        monkeypatch.setattr(ts, "save_checkpoint", real_save)
        if i == 2:
            with open(out / "metrics.jsonl", "a") as f:
                f.write('{"step": 7, "loss": 1.2')  # killed in the middle of a log line
    train(out, *args, "--resume=True")
    assert steps_logged(out) == steps_logged(tmp_path / "full") == (list(range(1, 11)), [2, 4, 6, 8, 10])
    full, cut = ckpt_of(tmp_path / "full"), ckpt_of(out)
    for key in full["model"]:
        assert torch.equal(full["model"][key], cut["model"][key]), key


# ----------------------------------------------------------------------------- resume rules

def test_resume_refuses_a_changed_hyperparameter_and_records_an_allowed_change(tmp_path):
    """Bugs checked: the refusal removed (the run trained at lr 0.5 with the checkpoint saying 3e-3), and
    the optimizer's saved weight_decay kept after an allowed change (the checkpoint then recorded 0.5 but
    AdamW used 0.01)."""
    out = tmp_path / "run"
    train(out, "--max_iters=2")
    before = snapshot(out)
    for args, message in [(["--learning_rate=0.5"], "learning_rate changed: .* has learning_rate=0.003, this run "
                                                     "learning_rate=0.5; .*--allow_config_change=True"),
                          (["--ema_decay=0.0"], "ema_decay=0.9999, this run ema_decay=0.0"),
                          (["--n_embd=64", "--allow_config_change=True"], "n_embd changed: .*only fit its value")]:
        with pytest.raises(SystemExit, match=message) as e:
            train(out, "--max_iters=4", "--resume=True", *args)
        assert "\n" not in str(e.value) and snapshot(out) == before
    train(out, "--max_iters=4", "--resume=True")  # a longer budget needs no flag
    train(out, "--max_iters=6", "--resume=True", "--allow_config_change=True", "--learning_rate=1e-3",
          "--weight_decay=0.5")
    ckpt = ckpt_of(out)
    assert ckpt["config"]["learning_rate"] == 1e-3 and ckpt["config"]["max_iters"] == 6
    assert ckpt["config"]["history"] == [
        {"step": 2, "changed": {"max_iters": [2, 4]}},
        {"step": 4, "changed": {"max_iters": [4, 6], "learning_rate": [3e-3, 1e-3], "weight_decay": [0.01, 0.5]}}]
    records = [json.loads(line) for line in open(out / "metrics.jsonl") if '"lr"' in line]
    assert [r["lr"] for r in records] == [1.5e-3, 3e-3, 3e-3, 3e-3, 1e-3, 1e-3]  # what each step used
    assert [g["weight_decay"] for g in ckpt["optimizer"]["param_groups"]] == [0.5, 0.0]


def test_resume_of_an_exhausted_time_budget_trains_no_further_step(tmp_path):
    """Bug checked: the loop's first stop test only looked at max_iters, so every resume of a run that
    had used up max_minutes trained (and saved) one more step."""
    out = tmp_path / "run"
    train(out, "--max_iters=50", "--max_minutes=1e-6")
    assert ckpt_of(out)["step"] == 1
    train(out, "--max_iters=50", "--max_minutes=1e-6", "--resume=True")
    assert ckpt_of(out)["step"] == 1 and steps_logged(out)[0] == [1]


# ----------------------------------------------------------------------------- checksums

def test_a_corrupted_checkpoint_is_refused_everywhere(tmp_path, capsys):
    """One flipped byte in a weight: torch.load alone returns the damaged tensor (asserted below, so the
    test shows what it guards against). Bug checked: load_checkpoint without the checksum comparison."""
    out = tmp_path / "run"
    train(out, "--max_iters=2")
    good = ckpt_of(out)
    assert good["checksum"] == common.checksum(good)
    corrupt_tensor_byte(out / "ckpt.pt")
    damaged = ckpt_of(out)  # no error from torch.load ...
    assert any(not torch.equal(a, b) for a, b in zip(tensors(good), tensors(damaged)))  # ... on changed weights
    with pytest.raises(SystemExit, match="corrupted: its contents do not match the sha256") as e:
        train(out, "--max_iters=4", "--resume=True")
    assert "\n" not in str(e.value)
    with pytest.raises(SystemExit, match="corrupted"):
        sample.load_checkpoints(str(out), "cpu", True)
    with pytest.raises(ValueError, match="corrupted"):
        load_model(str(out))
    # a checkpoint without its checksum (from before checksums, or with the entry lost) is refused in one line;
    # export_reference.py --allow_unverified writes a verified copy, loudly, with the same weights
    torch.save({k: v for k, v in good.items() if k != "checksum"}, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="has no checksum") as e:
        load_model(str(tmp_path / "old.pt"))
    assert "\n" not in str(e.value) and "--allow_unverified" in str(e.value)
    from scripts.sudoku import export_reference
    with pytest.raises(SystemExit, match="has no checksum"):
        export_reference.main([f"--ckpt={tmp_path / 'old.pt'}", f"--out={tmp_path / 'copy.safetensors'}"])
    capsys.readouterr()
    export_reference.main([f"--ckpt={tmp_path / 'old.pt'}", f"--out={tmp_path / 'copy.safetensors'}", "--allow_unverified"])
    assert "NOT verified" in capsys.readouterr().err
    copy, _ = load_model(str(tmp_path / "copy.safetensors"))
    assert all(torch.equal(a, b) for a, b in zip(copy.state_dict().values(), common.model_from_checkpoint(good, "cpu", True).state_dict().values()))


def test_checksum_covers_tensor_bytes_dtype_and_plain_values():
    """The digest changes with one tensor element, the dtype or shape of the same bytes, or a plain value,
    and does not depend on dict insertion order. Bugs checked: dtype, shape and plain values each left
    out of the digest; dicts walked in insertion order."""
    base = {"a": torch.arange(6, dtype=torch.float32), "b": {"step": 3, "lr": 1e-3}}
    digest = common.checksum(base)
    assert common.checksum({"b": {"lr": 1e-3, "step": 3}, "a": torch.arange(6, dtype=torch.float32)}) == digest
    changed = [{"a": torch.arange(6, dtype=torch.float32).index_fill(0, torch.tensor([5]), 5.0000005), "b": base["b"]},
               {"a": torch.arange(6, dtype=torch.float32).view(torch.int32), "b": base["b"]},  # same bytes
               {"a": torch.arange(6, dtype=torch.float32).view(2, 3), "b": base["b"]},
               {"a": base["a"], "b": {"step": 4, "lr": 1e-3}}]
    assert len({common.checksum(c) for c in changed} | {digest}) == 5


def flip_byte(path, offset: int, bit: int = 6) -> None:
    raw = bytearray(open(path, "rb").read())
    raw[offset] ^= 1 << bit
    open(path, "wb").write(bytes(raw))


def test_a_corrupted_weights_file_is_refused_by_every_loader(tmp_path, capsys):
    """A copy of a reference model with one weight byte flipped: safetensors alone returns the changed tensor
    (asserted, so the test shows what it guards against); sample.py, train_sudoku --init_from and load_model
    refuse it with one line naming the file. Damaged metadata reads the same. Bug checked: read_weights
    without the digest comparison."""
    from safetensors.torch import load_file
    good = tmp_path / "relay.safetensors"
    reference, meta = load_model(os.path.join(ROOT, "reference", "relay.safetensors"))
    common.save_weights(reference, str(good), {"config": json.dumps(meta), "weights": "ema"})
    load_model(str(good))  # the intact copy loads
    bad = tmp_path / "flipped.safetensors"
    bad.write_bytes(good.read_bytes())
    flip_byte(bad, os.path.getsize(bad) - 1000)  # inside the last tensor's data
    assert any(not torch.equal(load_file(good)[k], v) for k, v in load_file(bad).items())
    for load in (lambda: sample.load_checkpoints(str(bad), "cpu", True),
                 lambda: train(tmp_path / "child", f"--init_from={bad}", "--max_iters=1")):
        with pytest.raises(SystemExit, match=f"{bad} is corrupted: its weights or metadata do not match") as e:
            load()
        assert "\n" not in str(e.value)
    assert not (tmp_path / "child" / "ckpt.pt").exists()
    meta_damaged = tmp_path / "meta.safetensors"
    raw = good.read_bytes()
    assert b'\\"n_layer\\": 4' in raw  # in a JSON string inside the JSON header
    meta_damaged.write_bytes(raw.replace(b'\\"n_layer\\": 4', b'\\"n_layer\\": 5', 1))  # the header still parses
    with pytest.raises(ValueError, match="is corrupted"):
        load_model(str(meta_damaged))


def test_a_weights_file_without_a_digest_is_refused_and_export_reference_adds_one(tmp_path, capsys):
    """A file exported before digests existed cannot be told from one whose digest entry was damaged: load_model
    refuses it in one line naming the way out, export_reference.py --allow_unverified, which writes it again with
    a digest and the same tensors. Bug checked: read_weights loading a save_weights file without a digest."""
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open
    src = os.path.join(ROOT, "reference", "mlm.safetensors")
    with safe_open(src, "pt") as f:
        meta = {k: v for k, v in f.metadata().items() if k != common.WEIGHTS_DIGEST}
    old = tmp_path / "old.safetensors"
    save_file(load_file(src), old, metadata=meta)
    with pytest.raises(ValueError, match="has no sha256 .* --allow_unverified$"):
        load_model(str(old))
    from scripts.sudoku import export_reference
    export_reference.main([f"--ckpt={old}", f"--out={tmp_path / 'new.safetensors'}", "--allow_unverified"])
    assert "carries no sha256: its weights are not verified" in capsys.readouterr().err
    model, _ = load_model(str(tmp_path / "new.safetensors"))
    assert capsys.readouterr().err == ""
    assert all(torch.equal(load_file(src)[k], v) for k, v in model.state_dict().items())


def test_an_export_names_no_machine_directory(tmp_path):
    """A run trained with absolute paths inside the repository exports them relative to it (what the
    committed reference models carry); a path outside it and a relative one stay as they were. Fails with
    the config exported as the run recorded it (checked)."""
    from safetensors import safe_open
    from scripts.sudoku import export_reference
    model = SudokuTransformer(ModelConfig(n_layer=1, n_head=2, n_embd=16, d_ff=32, dropout=0.0))
    config = {"objective": "mlm", "out_dir": os.path.join(ROOT, "runs", "x"), "data_dir": str(tmp_path / "data"),
              "init_from": "runs/parent", "seed": 0}
    common.save_checkpoint({"model": model.state_dict(), "model_config": asdict(model.config),
                            "ema": {"shadow": dict(model.named_parameters())}, "step": 3, "config": config},
                           str(tmp_path / "ckpt.pt"))
    for src, out in ((tmp_path / "ckpt.pt", tmp_path / "a.safetensors"), (tmp_path / "a.safetensors", tmp_path / "b.safetensors")):
        export_reference.main([f"--ckpt={src}", f"--out={out}"])
        with safe_open(str(out), "pt") as f:
            exported = json.loads(f.metadata()["config"])
        assert exported == {**config, "out_dir": "runs/x"}, src
    old = {**config, "out_dir": os.path.join(ROOT, "runs", "x")}  # an older export, absolute paths: rewritten too
    common.save_weights(model, str(tmp_path / "old.safetensors"), {"config": json.dumps(old), "weights": "ema"})
    export_reference.main([f"--ckpt={tmp_path / 'old.safetensors'}", f"--out={tmp_path / 'c.safetensors'}"])
    with safe_open(str(tmp_path / "c.safetensors"), "pt") as f:
        assert json.loads(f.metadata()["config"])["out_dir"] == "runs/x"


# ----------------------------------------------------------------------------- sample.py --results provenance

def tiny_checkpoint(path) -> str:
    model = SudokuTransformer(ModelConfig(n_layer=1, n_head=2, n_embd=16, d_ff=32, dropout=0.0))
    common.save_checkpoint({"model": model.state_dict(), "model_config": asdict(model.config), "ema": None,
                                "config": {"objective": "mlm", "tie_embeddings": False, "seed": 0}}, str(path))
    return str(path)


def puzzle_csv(path, seed: int) -> str:
    rng = np.random.default_rng(seed)
    rows = ["question,answer"]
    for _ in range(3):
        sol = random_grid(rng)
        q = sol.copy()
        q[rng.permutation(81)[:30]] = 0
        rows.append(f"{format_board(q)},{format_board(sol)}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_results_from_different_puzzles_are_not_merged_as_seeds(tmp_path):
    """Same --data argument, different puzzles behind it (a data file rewritten, as with two data_dirs
    holding different test splits). Bug checked: check_same_puzzles disabled; the two files were averaged
    as 2 seeds."""
    ckpt, data = tiny_checkpoint(tmp_path / "m.pt"), tmp_path / "test.csv"
    common = [f"--data={data}", "--n=3", "--taus=0.15"]
    puzzle_csv(data, seed=0)
    sample.main([f"--ckpt={ckpt}", *common, f"--out={tmp_path / 's0.json'}"])
    source = json.loads((tmp_path / "s0.json").read_text())["data_source"]
    assert source["data"] == str(data) and set(source["puzzles"]) == {"all"}
    puzzle_csv(data, seed=1)
    sample.main([f"--ckpt={ckpt}", *common, f"--out={tmp_path / 's1.json'}"])
    with pytest.raises(SystemExit, match="not those of .*not seeds of one method"):
        sample.main([f"--results={tmp_path / 's0.json'},{tmp_path / 's1.json'}", *common, "--table"])
    with pytest.raises(SystemExit, match="not seeds of one method"):  # checked before decoding the new puzzles
        sample.main([f"--results={tmp_path / 's0.json'}", f"--ckpt={ckpt}", *common])
    sample.main([f"--results={tmp_path / 's1.json'}", f"--ckpt={ckpt}", *common, f"--out={tmp_path / 'both.json'}"])
    assert len(json.loads((tmp_path / "both.json").read_text())["checkpoints"]) == 2


# ----------------------------------------------------------------------------- bad-input sweep

def bad_train_inputs(tmp):
    """(argv, text the one-line error must contain, path that must be left untouched)."""
    fresh = str(tmp / "fresh")
    run = str(tmp / "run")
    cases = [(f"--{arg}", key) for arg, key in [
        ("log_interval=0", "log_interval"), ("n_head=0", "n_head"), ("n_head=5", "n_head must be a divisor"),
        ("eval_batch_size=0", "eval_batch_size"), ("n_embd=-32", "n_embd"), ("dropout=1.5", "dropout"),
        ("dropout=1.0", "dropout"), ("learning_rate=-1e-3", "learning_rate"), ("device=gpu", "device"),
        ("eval_puzzles=-5", "eval_puzzles"), ("ema_decay=2.0", "ema_decay"), ("n_layer=0", "n_layer"),
        ("max_iters=0", "max_iters"), ("grad_clip=-1.0", "grad_clip"), ("train_tau=-1.0", "train_tau"),
        ("eval_max_steps=0", "eval_max_steps"), ("seed=-1", "seed"), ("beta2=1.0", "beta2"),
        ("warmup_iters=-1", "warmup_iters"), ("max_minutes=-1.0", "max_minutes"), ("K=0", "K must be"),
        ("init_from=/nonexistent/run", "init_from"), ("learning_rat=1e-3", "unknown config key 'learning_rat'")]]
    argv = [([a, f"--out_dir={fresh}"], key, fresh) for a, key in cases]
    if not torch.cuda.is_available():
        argv.append((["--device=cuda", f"--out_dir={fresh}"], "device=cuda", fresh))
    nan_cfg = tmp / "nan.py"
    nan_cfg.write_text("learning_rate = float('nan')\n")
    broken = tmp / "broken.py"
    broken.write_text("n_layer = 2\nn_head = (4\n")
    (tmp / "a_file").write_text("x")
    argv += [([str(nan_cfg), f"--out_dir={fresh}"], "learning_rate must be a finite number > 0, got nan", fresh),
             ([str(broken), f"--out_dir={fresh}"], f"config file {broken}, line 2: syntax error", fresh),
             ([f"--out_dir={tmp / 'a_file'}"], "is a file", str(tmp / "a_file")),
             ([f"--out_dir={fresh}", "--resume=True"], "no " + os.path.join(fresh, "ckpt.pt"), fresh),
             ([f"--out_dir={run}"], "already holds a run", run),
             ([f"--out_dir={fresh}"], "python prepare_data.py", fresh),  # no data in data_dir
             ([f"--out_dir={run}", "--resume=True", "--overwrite=True"], "pass one of them", run)]
    for name, content in [("empty", b""), ("truncated", None), ("foreign", "foreign")]:
        d = tmp / name
        d.mkdir()
        if content == "foreign":
            torch.save({"weights": torch.zeros(3)}, d / "ckpt.pt")
        else:
            (d / "ckpt.pt").write_bytes(content if content is not None else (tmp / "run" / "ckpt.pt").read_bytes()[:5000])
        message = {"empty": "is empty (0 bytes)", "truncated": "cannot read checkpoint",
                   "foreign": "not a train_sudoku.py checkpoint"}[name]
        argv.append(([f"--out_dir={d}", "--resume=True"], message, str(d)))
    return argv


def test_bad_train_inputs_stop_with_one_line_and_write_nothing(tmp_path, capsys):
    """Each bad input of train_sudoku.py, through main() as the command line runs it: a SystemExit whose
    message (printed as the one stderr line) names the problem, no other exception, nothing written.
    Bugs checked: each range check (e.g. eval_puzzles, ema_decay) deleted in turn; the configurator's
    SyntaxError handling removed; the removal of an out_dir created by a run that then failed."""
    train(tmp_path / "run", "--max_iters=1")
    for argv, message, path in bad_train_inputs(tmp_path):
        before = snapshot(path)
        with pytest.raises(SystemExit) as e:
            ts.main(TINY + [f"--data_dir={tmp_path / 'no_data'}", *argv])
        text = str(e.value.code)
        assert isinstance(e.value.code, str) and "\n" not in text and message in text, (argv, text)
        assert snapshot(path) == before, argv
        assert "Traceback" not in capsys.readouterr().err


def test_bad_sample_inputs_stop_before_decoding(tmp_path, monkeypatch):
    """sample.py: a 0-byte, foreign or corrupted --ckpt and a --plot / --dump into a missing directory
    stop with one line before any puzzle is decoded. Bug checked: check_output_paths not called (the
    --plot error came after all decoding, here caught by the decode spy; --out under a file and a negative
    budget were refused only after decoding, with a traceback)."""
    data = puzzle_csv(tmp_path / "p.csv", seed=0)
    good = tiny_checkpoint(tmp_path / "good.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    bad = tiny_checkpoint(tmp_path / "bad.pt")
    corrupt_tensor_byte(bad)
    monkeypatch.setattr(sample, "decode_puzzles", lambda *a, **k: pytest.fail("decoded before checking the inputs"))
    for args, message in [([f"--ckpt={tmp_path / 'empty.pt'}"], "is empty (0 bytes)"),
                          ([f"--ckpt={tmp_path / 'list.pt'}"], "holds a list, not a checkpoint"),
                          ([f"--ckpt={bad}"], "corrupted"),
                          ([f"--ckpt={good}", f"--plot={tmp_path / 'no' / 'p.png'}"], "--plot"),
                          ([f"--ckpt={good}", f"--dump={tmp_path / 'no' / 'd.jsonl'}"], "--dump"),
                          ([f"--ckpt={good}", f"--plot={tmp_path}"], "is a directory"),
                          ([f"--ckpt={good}", f"--out={tmp_path / 'p.csv' / 'r.json'}"], "is a file, not a directory"),
                          ([f"--ckpt={good}", "--budgets=20,-1"], "--budgets must be finite numbers > 0")]:
        with pytest.raises(SystemExit) as e:
            sample.main([f"--data={data}", "--n=3", f"--out={tmp_path / 'out' / 'r.json'}", *args])
        assert "\n" not in str(e.value.code) and message in str(e.value.code), (args, e.value.code)
        assert not (tmp_path / "out").exists() and not (tmp_path / "no").exists()


def test_command_lines_print_one_line_and_no_traceback(tmp_path):
    """The real entry points in fresh interpreters (exit code, stderr as a user sees it)."""
    broken = tmp_path / "broken.py"
    broken.write_text("n_layer = 2\nn_head = (4\n")
    (tmp_path / "empty.pt").write_bytes(b"")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    for cmd, message in [(["train_sudoku.py", str(broken), f"--out_dir={tmp_path / 'o'}"],
                          f"config file {broken}, line 2: syntax error"),
                         (["sample.py", f"--ckpt={tmp_path / 'empty.pt'}"], "is empty (0 bytes)"),
                         (["quickstart.py", f"--out_dir={tmp_path / 'empty.pt'}"], "is a file, not a directory"),
                         (["quickstart.py", f"--out_dir={tmp_path / 'empty.pt' / 'sub'}"], "is under the file"),
                         (["quickstart.py", "--seed=-1"], "--seed must be >= 0")]:
        proc = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and message in lines[0], (cmd, proc.stderr)
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- scripts/runs.py

def test_runs_train_extends_budgets_and_never_deletes_a_run_without_replace(tmp_path, monkeypatch):
    """Bug checked: the old rule (any changed argument -> shutil.rmtree, fresh run): extending
    --max_minutes from 60 to 90 deleted the finished checkpoint; a real change did so silently."""
    calls = []

    def fake_sh(cmd, log=None, echo=True):  # stands in for train_sudoku.py: records the flags, writes a run
        calls.append(cmd[cmd.index("--out_dir=" + out):][1:])
        os.makedirs(out, exist_ok=True)
        open(os.path.join(out, "ckpt.pt"), "a").write("x")
    monkeypatch.setattr(runs, "sh", fake_sh)
    out = str(tmp_path / "mlm_s1")
    budget = ["--max_minutes=60", "--max_iters=100000000"]
    runs.train("mlm", out, 1, budget)
    runs.train("mlm", out, 1, budget)  # finished, same command: skipped
    runs.train("mlm", out, 1, ["--max_minutes=90", "--max_iters=100000000"])  # extended: resumed
    assert calls == [budget, ["--max_minutes=90", "--max_iters=100000000", "--resume=True"]]
    done = json.load(open(os.path.join(out, "DONE.json")))
    assert "--max_minutes=90" in done["cmd"] and done["resumed"]
    before = snapshot(out)
    for args, named in [(["--max_minutes=60", "--max_iters=100000000"], "--max_minutes: 90 -> 60"),
                        (["--max_minutes=90", "--max_iters=100000000", "--learning_rate=1e-3"],
                         "--learning_rate: None -> 1e-3")]:
        with pytest.raises(SystemExit, match=f"holds a run of another command \\({named}\\).*--replace_runs") as e:
            runs.train("mlm", out, 1, args)
        assert "\n" not in str(e.value) and snapshot(out) == before
    open(os.path.join(out, "old_file"), "w").write("from the replaced run")
    runs.train("mlm", out, 1, ["--max_minutes=30"], replace=True)
    assert calls[-1] == ["--max_minutes=30"] and not os.path.exists(os.path.join(out, "old_file"))
    # an interrupted run resumes; one killed before its first checkpoint restarts over its log lines
    os.remove(os.path.join(out, "DONE.json"))
    runs.train("mlm", out, 1, ["--max_minutes=30"])
    assert calls[-1] == ["--max_minutes=30", "--resume=True"]
    os.remove(os.path.join(out, "DONE.json"))
    os.remove(os.path.join(out, "ckpt.pt"))
    open(os.path.join(out, "metrics.jsonl"), "w").write('{"step": 1}\n')
    runs.train("mlm", out, 1, ["--max_minutes=30"])
    assert calls[-1] == ["--max_minutes=30", "--overwrite=True"]
    # an unfinished run may also shrink its budget (bug checked: the finished-run rule applied to it)
    os.remove(os.path.join(out, "DONE.json"))
    runs.train("mlm", out, 1, ["--max_minutes=20"])
    assert calls[-1] == ["--max_minutes=20", "--resume=True"]
    # a run this driver did not start is not touched
    other = tmp_path / "manual"
    other.mkdir()
    (other / "ckpt.pt").write_text("mine")
    with pytest.raises(SystemExit, match="did not start"):
        runs.train("mlm", str(other), 1, [])
    assert (other / "ckpt.pt").read_text() == "mine"


def test_runs_train_resumes_a_run_whose_paths_are_spelled_another_way(tmp_path, monkeypatch):
    """A run started as /abs/runs/mlm_s1 with /abs/data is the same run when the same driver command is
    given runs/mlm_s1 and data from that directory. Bug checked: the strings were compared, and the
    interrupted run stopped the driver as "a run of another command (--out_dir: /abs/... -> runs/...)".
    A data directory that really differs is still refused."""
    calls = []

    def fake_sh(cmd, log=None, echo=True):  # stands in for train_sudoku.py: records the flags, writes a checkpoint
        calls.append(cmd[4:])  # after python, train_sudoku.py, the config and --seed
        out_dir = next(a.split("=", 1)[1] for a in cmd if a.startswith("--out_dir="))
        os.makedirs(out_dir, exist_ok=True)
        open(os.path.join(out_dir, "ckpt.pt"), "a").write("x")
    monkeypatch.setattr(runs, "sh", fake_sh)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "other").mkdir()
    runs.train("mlm", str(tmp_path / "runs" / "mlm_s1"), 1, [f"--data_dir={tmp_path / 'data'}"])
    os.remove(tmp_path / "runs" / "mlm_s1" / "DONE.json")  # interrupted
    runs.train("mlm", "runs/mlm_s1", 1, ["--data_dir=data"])
    assert calls[-1] == ["--out_dir=runs/mlm_s1", "--data_dir=data", "--resume=True"]
    with pytest.raises(SystemExit, match="--data_dir: .* -> other"):
        runs.train("mlm", "runs/mlm_s1", 1, ["--data_dir=other"])
