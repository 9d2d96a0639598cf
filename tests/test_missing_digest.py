"""A file this repository wrote is never loaded unverified (docs/reliability.md, "Checksums"): its digest
cannot be switched off by damaging the file. A Sudoku .safetensors whose `sha256` entry was renamed, a
Fast-dLLM ckpt-N/ or resume/ whose manifest.json was deleted, each with a weight byte flipped as well, is
refused in one line by every loader; so is any local Fast-dLLM directory without a manifest (its mark damaged,
or another tool's), which loads only with --allow_unverified=True, and the run then says and records that
it was not verified. Each test names the bug it was seen failing on."""
import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import common
import eval_code
import fastdllm.sandbox
import quickstart
import sample
import train_fastdllm as T
import train_sudoku as ts
from configurator import load_config
import fastdllm.chat
from fastdllm.model import SHA256_IN, load_fastdllm, make_tiny_tokenizer, MASK_TOKEN, TINY_CONFIG
from helpers import TINY, TRAIN, VAL, corrupt_tensor_byte, snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASTDLLM_TINY = ["config/fastdllm_tiny.py", "--deepspeed=", "--bd_size=8", "--log_interval=1"]


def _scoring_mode() -> str:
    try:
        return fastdllm.sandbox.choose_mode("auto").mode
    except ValueError:
        return "unsafe"


SANDBOX = f"--sandbox={_scoring_mode()}"


def flip_weight_byte(path) -> None:
    """One bit of one byte inside the last tensor of a safetensors file (its data ends the file)."""
    raw = bytearray(open(path, "rb").read())
    raw[-100] ^= 0x10
    open(path, "wb").write(bytes(raw))


# ----------------------------------------------------------------------------- Sudoku .safetensors

def test_a_renamed_digest_with_a_flipped_weight_is_refused_by_every_sudoku_loader(tmp_path, monkeypatch):
    """The shipped reference/standin_relay.safetensors with `sha256` renamed `sha257` (one byte) and one weight
    byte flipped: safetensors reads the changed weights (asserted); sample.py, quickstart.py, train_sudoku.py
    --init_from and export_reference.py refuse it in one line that names the file and writes nothing;
    export_reference.py --allow_unverified, the way out the refusal names for a trusted older export, writes
    it again with a digest. Bug checked: read_weights warning on a file without a digest and loading it (the
    old rule: sample.py and quickstart.py exited 0)."""
    from scripts.sudoku import export_reference
    src = os.path.join(ROOT, "reference", "standin_relay.safetensors")
    bad = tmp_path / "standin_relay.safetensors"
    raw = open(src, "rb").read()
    assert raw.count(b'"sha256"') == 1
    bad.write_bytes(raw.replace(b'"sha256"', b'"sha257"'))
    flip_weight_byte(bad)
    assert any(not torch.equal(load_file(src)[k], v) for k, v in load_file(bad).items())
    message = f"{bad} has no sha256 although common.save_weights wrote it"
    monkeypatch.setitem(quickstart.REFERENCES, "standin", {"MLM": quickstart.REFERENCES["standin"]["MLM"], "Relay": str(bad)})
    monkeypatch.chdir(ROOT)
    cfg = load_config(ts.TrainConfig, TINY + [f"--out_dir={tmp_path / 'child'}", f"--init_from={bad}"])
    for load in (lambda: sample.main([f"--ckpt={bad}", "--n=1"]),
                 lambda: quickstart.main(["--n=1", f"--out_dir={tmp_path / 'quick'}"]),
                 lambda: ts.train(cfg, TRAIN, VAL),
                 lambda: export_reference.main([f"--ckpt={bad}", f"--out={tmp_path / 'again.safetensors'}"])):
        with pytest.raises(SystemExit, match=message) as e:
            load()
        assert "\n" not in str(e.value) and "--allow_unverified" in str(e.value)
    assert os.listdir(tmp_path) == ["standin_relay.safetensors"]  # nothing written

    export_reference.main([f"--ckpt={bad}", f"--out={tmp_path / 'again.safetensors'}", "--allow_unverified"])
    model, _ = common.load_model(str(tmp_path / "again.safetensors"))  # verified from now on
    assert all(torch.equal(load_file(bad)[k], v) for k, v in model.state_dict().items())


def test_sample_names_the_checkpoint_once(tmp_path):
    """sample.py's refusals of a damaged or foreign model said its path twice (--ckpt X: X: ...). Bug checked:
    the old "--ckpt {path}: {message}"."""
    bad = tmp_path / "flipped.safetensors"
    bad.write_bytes(open(os.path.join(ROOT, "reference", "mlm.safetensors"), "rb").read())
    flip_weight_byte(bad)
    with pytest.raises(SystemExit, match="is corrupted") as e:
        sample.main([f"--ckpt={bad}", "--n=1"])
    assert str(e.value).count(str(bad)) == 1, str(e.value)


# ----------------------------------------------------------------------------- Fast-dLLM ckpt-N/ and resume/

def test_a_deleted_manifest_with_a_flipped_weight_is_refused_by_every_fastdllm_loader(fastdllm_run, tmp_path, monkeypatch):
    """ckpt-1/ without manifest.json and with one weight byte flipped: load_fastdllm, eval_code.py --model and
    train_fastdllm.py --init_from refuse it in one line naming the directory (its model.safetensors says a
    manifest was written), and write nothing. Bug checked: check_files without the mark (the old rule: a
    warning, then eval_code.py went on to decode with the changed weights)."""
    ckpt = tmp_path / "ckpt-1"
    shutil.copytree(fastdllm_run / "ckpt-1", ckpt)
    (ckpt / "manifest.json").unlink()
    flip_weight_byte(ckpt / "model.safetensors")
    monkeypatch.chdir(ROOT)
    message = (f"{ckpt}/manifest.json is missing \\(its model.safetensors was written with one by "
               "fastdllm.model.save_fastdllm: it was deleted or lost\\)")
    for load in (lambda: load_fastdllm(str(ckpt), dtype=torch.float32),
                 lambda: eval_code.main([f"--model={ckpt}", "--limit=1", "--device=cpu", SANDBOX,
                                         f"--out_dir={tmp_path / 'eval'}"]),
                 lambda: T.main(FASTDLLM_TINY + [f"--out_dir={tmp_path / 'child'}", f"--init_from={ckpt}",
                                                 "--max_iters=1"])):
        with pytest.raises((ValueError, SystemExit), match=message) as e:
            with contextlib.redirect_stdout(io.StringIO()):
                load()
        assert "\n" not in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-1"]


def damage_mark(weights, part: str) -> None:
    """One byte of model.safetensors' SHA256_IN metadata entry changed, its key or its value (the header is JSON)."""
    raw = open(weights, "rb").read()
    key, value = (f'"{text}"'.encode() for text in SHA256_IN)
    old = key if part == "key" else value
    assert raw.count(old) == 1
    open(weights, "wb").write(raw.replace(old, old[:-2] + bytes([old[-2] ^ 0x20]) + old[-1:]))


def unverifiable_copy(run, path, part: str = "key"):
    """ckpt-1/ of a tiny run without manifest.json, its mark damaged (part: "key" or "value") and a weight flipped."""
    shutil.copytree(run / "ckpt-1", path)
    (path / "manifest.json").unlink()
    damage_mark(path / "model.safetensors", part)
    flip_weight_byte(path / "model.safetensors")
    assert any(not torch.equal(load_file(run / "ckpt-1" / "model.safetensors")[k], v)
               for k, v in load_file(path / "model.safetensors").items())
    return path


def fastdllm_loaders(ckpt, out, *flags: str) -> dict:
    """Every command that loads a Fast-dLLM checkpoint directory, in this process, on ckpt, writing under out."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import memory_profile
    return {"load_fastdllm": lambda: load_fastdllm(str(ckpt), dtype=torch.float32,
                                                   allow_unverified="--allow_unverified=True" in flags),
            "chat": lambda: fastdllm.chat.main([f"--model={ckpt}", "--max_new_tokens=8", "--device=cpu",
                                                "--dtype=float32", *flags]),
            "memory_profile": lambda: memory_profile.main([f"--init_from={ckpt}", "--regimes=sft", "--seq_len=16",
                                                           "--dtype=float32", "--device=cpu", f"--out={out}/mp", *flags]),
            "eval_code": lambda: eval_code.main([f"--model={ckpt}", "--limit=1", "--max_new_tokens=32", "--batch_size=1",
                                                 "--device=cpu", "--dtype=float32", SANDBOX, f"--out_dir={out}/eval",
                                                 *flags]),
            "train_fastdllm": lambda: T.main(FASTDLLM_TINY + [f"--out_dir={out}/child", f"--init_from={ckpt}",
                                                              "--max_iters=1", "--save_interval=1", *flags])}


def test_a_local_directory_without_a_manifest_is_refused_by_every_fastdllm_loader(fastdllm_run, tmp_path, monkeypatch):
    """ckpt-1/ without manifest.json, one byte of its SHA256_IN mark changed (key, or value) and one weight byte
    flipped: eval_code.py --model and train_fastdllm.py --init_from (real command lines: exit 1, one line on stderr,
    no traceback), load_fastdllm, fastdllm.chat and bench/memory_profile.py refuse it naming its manifest.json and
    --allow_unverified=True, and write nothing. Bug checked: check_files warning on a directory without the mark
    and loading it (the old rule: eval_code.py decoded with the flipped weight and exited 0)."""
    ckpt = unverifiable_copy(fastdllm_run, tmp_path / "ckpt-1")
    out = tmp_path
    message = f"{ckpt}/manifest.json is missing"
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    for cmd in (["eval_code.py", f"--model={ckpt}", "--limit=1", "--device=cpu", SANDBOX, f"--out_dir={out}/eval"],
                ["train_fastdllm.py", *FASTDLLM_TINY, f"--out_dir={out}/child", f"--init_from={ckpt}", "--max_iters=1"]):
        proc = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and message in lines[0], (cmd, proc.stderr)
        assert "--allow_unverified=True" in lines[0]
    monkeypatch.chdir(ROOT)
    for name, load in fastdllm_loaders(ckpt, out).items():
        if name not in ("eval_code", "train_fastdllm"):
            with pytest.raises((ValueError, SystemExit), match=message) as e:
                load()
            assert "\n" not in str(e.value) and "--allow_unverified=True" in str(e.value), name
    value_damaged = unverifiable_copy(fastdllm_run, tmp_path / "value", part="value")
    with pytest.raises(ValueError, match=f"{value_damaged}/manifest.json is missing"):
        load_fastdllm(str(value_damaged), dtype=torch.float32)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-1", "value"]


def test_allow_unverified_loads_a_directory_without_a_manifest_with_a_warning(fastdllm_run, tmp_path, monkeypatch,
                                                                               capfd):
    """The same directory with --allow_unverified=True: every loader loads it (the flipped weight with it), each
    with a WARNING line naming its manifest.json, and the runs record it unverified (train_fastdllm.py: parent.files
    in resume/manifest.json; eval_code.py: model_files in results.json). Bug checked: the flag read by no loader."""
    ckpt = unverifiable_copy(fastdllm_run, tmp_path / "ckpt-1")
    out = tmp_path
    monkeypatch.chdir(ROOT)
    for name, load in fastdllm_loaders(ckpt, out, "--allow_unverified=True").items():
        with contextlib.redirect_stdout(io.StringIO()):
            load()
        err = capfd.readouterr().err
        assert f"WARNING: {ckpt}/manifest.json is missing" in err and "UNVERIFIED" in err, (name, err)
    model, _ = load_fastdllm(str(ckpt), dtype=torch.float32, allow_unverified=True)
    assert all(torch.equal(v.float(), model.state_dict()[k]) for k, v in load_file(ckpt / "model.safetensors").items())
    parent = json.loads((out / "child" / "resume" / "manifest.json").read_text())["config"]["parent"]
    assert parent["files"].startswith("not verified") and "allow_unverified" in parent["files"]
    assert json.loads((out / "eval" / "results.json").read_text())["model_files"].startswith("not verified")


def test_a_deleted_resume_manifest_with_a_flipped_byte_is_refused(fastdllm_run, tmp_path, monkeypatch):
    """resume/ without manifest.json and with one byte of the optimizer state flipped: --resume=True refuses it
    in one line that names --allow_unverified_resume (for a resume/ from before manifests) and changes
    nothing. Bug checked: check_resume and load_resume warning and resuming (the old rule: it trained on the
    flipped optimizer state)."""
    run = tmp_path / "run"
    shutil.copytree(fastdllm_run, run)
    (run / "resume" / "manifest.json").unlink()
    corrupt_tensor_byte(run / "resume" / "state.pt")
    before = snapshot(run)
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit, match=f"resume: {run}/resume has no manifest.json") as e:
        T.main(FASTDLLM_TINY + [f"--out_dir={run}", "--max_iters=2", "--resume=True"])
    assert "\n" not in str(e.value) and "--allow_unverified_resume=True" in str(e.value)
    assert snapshot(run) == before


def test_a_listed_file_that_is_missing_is_refused(fastdllm_run, tmp_path):
    """ckpt-1/ with chat_template.jinja (listed in its manifest) deleted: without it the tokenizer loads with
    no chat template at all. Bug checked: verify_manifest refusing only files its manifest does not list."""
    ckpt = tmp_path / "ckpt-1"
    shutil.copytree(fastdllm_run / "ckpt-1", ckpt)
    (ckpt / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match=r"does not hold the files its manifest lists \(missing \['chat_template.jinja'\]"):
        load_fastdllm(str(ckpt), dtype=torch.float32)


def hub_layout_dir(path) -> None:
    """A tiny Qwen2 and tokenizer as transformers' save_pretrained writes them: none of our files or marks."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    tok = make_tiny_tokenizer()
    torch.manual_seed(0)
    lm = Qwen2ForCausalLM(Qwen2Config(**TINY_CONFIG, mask_token_id=tok.convert_tokens_to_ids(MASK_TOKEN),
                                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))
    lm.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return lm


def test_a_hub_layout_directory_loads_only_when_allowed_and_the_run_records_it(fastdllm_run, tmp_path, monkeypatch,
                                                                              capsys):
    """A directory written by transformers' save_pretrained (as `hf download --local-dir` leaves one) has no
    manifest and no mark of ours: load_fastdllm refuses it in one line naming --allow_unverified=True, and with it
    loads the same weights with a warning; eval_code.py records in results.json that its files were not verified,
    and that a checkpoint of ours was. Bugs checked: check_files loading an unmarked local directory with only a
    warning; the record left out of eval_code.py's results.json."""
    hub = tmp_path / "hub"
    lm = hub_layout_dir(hub)
    assert not (hub / "manifest.json").exists()
    with pytest.raises(ValueError, match=f"{hub}/manifest.json is missing .*--allow_unverified=True$"):
        load_fastdllm(str(hub), dtype=torch.float32)
    model, _ = load_fastdllm(str(hub), dtype=torch.float32, allow_unverified=True)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in lm.state_dict().items())
    assert model.files_check.startswith("not verified") and "UNVERIFIED" in capsys.readouterr().err
    monkeypatch.chdir(ROOT)
    for model_dir, verified in ((hub, False), (fastdllm_run / "ckpt-1", True)):
        out = tmp_path / f"eval_{verified}"
        eval_code.main([f"--model={model_dir}", "--limit=1", "--max_new_tokens=32", "--batch_size=1", "--device=cpu",
                        "--dtype=float32", "--allow_unverified=True", SANDBOX, f"--out_dir={out}"])
        recorded = json.loads((out / "results.json").read_text())["model_files"]
        assert recorded.startswith("verified" if verified else "not verified"), recorded


def hub_cache_snapshot(cache, source) -> str:
    """source's files laid out as the hub client caches them: blobs named by their hash (sha256 for the weights,
    as for LFS files; git's blob sha1 for the rest), linked from snapshots/<revision>/."""
    repo = cache / "models--org--tiny"
    snapshot = repo / "snapshots" / ("0" * 40)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for f in sorted(source.iterdir()):
        data = f.read_bytes()
        name = (hashlib.sha256(data).hexdigest() if f.suffix == ".safetensors"
                else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        (repo / "blobs" / name).write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.join("..", "..", "blobs", name))
    return str(snapshot)


def test_a_hub_cache_snapshot_is_verified_against_its_blob_hashes(tmp_path, monkeypatch):
    """A snapshot in the hub cache loads verified, each file against the hash its blob is named by; a flipped
    weight byte in a blob, or a file that is no link to a blob, is refused in one line naming the file. Bug
    checked: a hub snapshot loaded with only a warning, whatever its blobs held."""
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    hub_layout_dir(tmp_path / "saved")
    snapshot = hub_cache_snapshot(tmp_path / "cache", tmp_path / "saved")
    model, _ = load_fastdllm(snapshot, dtype=torch.float32)
    assert model.files_check.startswith("verified"), model.files_check
    weights = os.path.realpath(os.path.join(snapshot, "model.safetensors"))
    data = bytearray(open(weights, "rb").read())
    data[-1] ^= 1
    open(weights, "wb").write(bytes(data))
    with pytest.raises(ValueError, match="model.safetensors differs from the hash its hub cache blob is named by"):
        load_fastdllm(snapshot, dtype=torch.float32)
    os.remove(os.path.join(snapshot, "model.safetensors"))
    shutil.copy(tmp_path / "saved" / "model.safetensors", os.path.join(snapshot, "model.safetensors"))
    with pytest.raises(ValueError, match="model.safetensors is not a link to a hub cache blob"):
        load_fastdllm(snapshot, dtype=torch.float32)


def relink(snapshot, name: str, blob: str) -> None:
    """Point the snapshot's `name` at blobs/`blob`, as the hub client links it."""
    path = os.path.join(snapshot, name)
    if os.path.lexists(path):
        os.remove(path)
    os.symlink(os.path.join("..", "..", "blobs", blob), path)


def test_a_hub_snapshot_missing_a_file_the_loader_reads_is_refused(tmp_path, monkeypatch, capsys):
    """A snapshot without its tokenizer_config.json link (the tokenizer would load with no eos or pad token) or its
    chat_template.jinja link (no chat template: other prompts) is refused in one line naming the file and
    --allow_unverified=True; with that flag it loads with a warning, and says it was not verified. Without
    generation_config.json, a file a repository may lack, it loads verified. Bugs checked: verify_hub_snapshot
    checking only the files there (both refusals missed); generation_config.json required (the last load refused)."""
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    hub_layout_dir(tmp_path / "saved")
    snapshot = hub_cache_snapshot(tmp_path / "cache", tmp_path / "saved")
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        blob = os.path.basename(os.path.realpath(os.path.join(snapshot, name)))
        os.remove(os.path.join(snapshot, name))
        with pytest.raises(ValueError, match=f"{snapshot}/{name} is missing .*--allow_unverified=True$") as e:
            load_fastdllm(snapshot, dtype=torch.float32)
        assert "\n" not in str(e.value)
        capsys.readouterr()
        model, _ = load_fastdllm(snapshot, dtype=torch.float32, allow_unverified=True)
        assert model.files_check.startswith(f"not verified: {snapshot}/{name} is missing"), model.files_check
        assert f"{name} is missing" in capsys.readouterr().err
        relink(snapshot, name, blob)
    os.remove(os.path.join(snapshot, "generation_config.json"))
    model, _ = load_fastdllm(snapshot, dtype=torch.float32)
    assert model.files_check.startswith("verified"), model.files_check


def test_a_re_pointed_weights_link_is_refused_only_with_a_pin(tmp_path, monkeypatch, capsys):
    """model.safetensors re-pointed to another valid blob of the cache (other weights) passes the blob check: the
    file is the blob it links to, and offline nothing says which blob is this file's (docs/reliability.md). With
    the pin `python -m fastdllm.model --pin=org/tiny` wrote before, load_fastdllm refuses it in one line naming the
    file and the pin, with --allow_unverified=True too, and so does --pin of every other loader (eval_code.py,
    train_fastdllm.py, fastdllm.chat, bench/memory_profile.py); a plain file of those other
    weights in the link's place is refused by the pin under --allow_unverified=True as well, and so is a
    special_tokens_map.json the pin does not list. Bugs checked: the pin's sha256 not compared with the files (the
    re-pointed link's refusals missed); the blob check, under allow_unverified, returning before the pin is
    compared (the plain file's refusal missed); files the pin does not list left unchecked (the added one loaded)."""
    import huggingface_hub.constants
    import fastdllm.model
    from safetensors.torch import save_file
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    hub_layout_dir(tmp_path / "saved")
    snapshot = hub_cache_snapshot(tmp_path / "cache", tmp_path / "saved")
    (tmp_path / "cache" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "cache" / "models--org--tiny" / "refs" / "main").write_text("0" * 40)  # the hub id's revision
    pin = tmp_path / "pins" / "tiny.json"
    fastdllm.model.main(["--pin=org/tiny", f"--out={pin}"])
    assert capsys.readouterr().out.startswith(f"wrote {pin}: the sha256 of 6 files")
    model, _ = load_fastdllm(snapshot, dtype=torch.float32, pin=str(pin))
    assert model.files_check.startswith(f"verified: every file the loader reads against the sha256 in the pin {pin}")
    pinned = model.state_dict()
    extra = b'{"eos_token": "<|endoftext|>"}'  # a file the pin does not list that the tokenizer would read
    blob = hashlib.sha1(b"blob %d\0" % len(extra) + extra).hexdigest()
    (tmp_path / "cache" / "models--org--tiny" / "blobs" / blob).write_bytes(extra)
    relink(snapshot, "special_tokens_map.json", blob)
    with pytest.raises(ValueError, match=f"{snapshot}/special_tokens_map.json is not in the pin {pin}, and the loader"):
        load_fastdllm(snapshot, dtype=torch.float32, pin=str(pin))
    os.remove(os.path.join(snapshot, "special_tokens_map.json"))

    other = tmp_path / "other.safetensors"  # another model's weights, a valid blob of the same cache
    save_file({k: v + 1 for k, v in load_file(tmp_path / "saved" / "model.safetensors").items()}, str(other))
    blob = hashlib.sha256(other.read_bytes()).hexdigest()
    shutil.copy(other, tmp_path / "cache" / "models--org--tiny" / "blobs" / blob)
    relink(snapshot, "model.safetensors", blob)
    model, _ = load_fastdllm(snapshot, dtype=torch.float32)  # the hole a pin closes
    assert model.files_check.startswith("verified"), model.files_check
    assert not torch.equal(model.state_dict()["model.norm.weight"], pinned["model.norm.weight"])
    refusal = f"{snapshot}/model.safetensors differs from the pin {pin} "
    for allow in (False, True):
        with pytest.raises(ValueError, match=refusal) as e:
            load_fastdllm(snapshot, dtype=torch.float32, allow_unverified=allow, pin=str(pin))
        assert "\n" not in str(e.value)
    monkeypatch.chdir(ROOT)
    for name, load in fastdllm_loaders(snapshot, tmp_path, f"--pin={pin}").items():
        if name != "load_fastdllm":  # called with pin= above
            with pytest.raises((ValueError, SystemExit), match=refusal):
                load()
    os.remove(os.path.join(snapshot, "model.safetensors"))
    shutil.copy(other, os.path.join(snapshot, "model.safetensors"))
    with pytest.raises(ValueError, match=refusal):
        load_fastdllm(snapshot, dtype=torch.float32, allow_unverified=True, pin=str(pin))


def test_a_damaged_pin_is_refused_in_one_line(tmp_path, monkeypatch):
    """A pin that is not JSON, lacks an entry, pins no file, or has a digest changed (one hex digit) is refused in one
    line naming it and how to write it again, by load_fastdllm (with --allow_unverified=True too) and by
    eval_code.py, which writes nothing. Bugs checked: read_pin without its own sha256 (the changed digit taken for
    a changed file); without the check of its entry names (a KeyError on the missing digest) or of its files (an
    empty pin refusing the snapshot's files one by one instead)."""
    import huggingface_hub.constants
    from fastdllm.model import _pin_digest, write_pin
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    hub_layout_dir(tmp_path / "saved")
    snapshot = hub_cache_snapshot(tmp_path / "cache", tmp_path / "saved")
    good = write_pin(snapshot, str(tmp_path / "pin.json"))
    text = (tmp_path / "pin.json").read_text()
    no_files = {k: v for k, v in good.items() if k != "files"}
    no_digest = {k: v for k, v in good.items() if k != "pin_sha256"}
    empty = dict(good, files={})
    empty["pin_sha256"] = _pin_digest(empty)
    digit = good["files"]["model.safetensors"][0]
    changed = dict(good, files=dict(good["files"], **{"model.safetensors": ("1" if digit == "0" else "0")
                                                     + good["files"]["model.safetensors"][1:]}))
    cases = {"truncated": (text[:len(text) // 2], "is damaged \\(not readable JSON"),
             "no_files": (json.dumps(no_files), "is damaged \\(a pin holds files, pin_sha256, snapshot"),
             "no_digest": (json.dumps(no_digest), "is damaged \\(a pin holds files, pin_sha256, snapshot"),
             "empty": (json.dumps(empty), "is damaged \\(its 'files' entry"),
             "changed": (json.dumps(changed), "is corrupted: its contents do not match the sha256 stored in it")}
    monkeypatch.chdir(ROOT)
    for name, (content, why) in cases.items():
        bad = tmp_path / f"{name}.json"
        bad.write_text(content)
        message = f"the pin {bad} {why}.*; write it again \\(python -m fastdllm.model --pin="
        for allow in (False, True):
            with pytest.raises(ValueError, match=message) as e:
                load_fastdllm(snapshot, dtype=torch.float32, allow_unverified=allow, pin=str(bad))
            assert "\n" not in str(e.value), name
        with pytest.raises(SystemExit, match=message):
            eval_code.main([f"--model={snapshot}", f"--pin={bad}", "--limit=1", "--device=cpu", SANDBOX,
                            f"--out_dir={tmp_path / name}"])
        assert not (tmp_path / name).exists()
