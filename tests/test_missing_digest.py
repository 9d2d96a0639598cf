"""A file this repository wrote is never loaded unverified (docs/reliability.md, "Checksums"): its digest
cannot be switched off by damaging the file. A Sudoku .safetensors whose `sha256` entry was renamed, a
Fast-dLLM ckpt-N/ or resume/ whose manifest.json was deleted, each with a weight byte flipped as well, is
refused in one line by every loader; a directory in the hub's layout without our files still loads, and
the run says and records that it was not verified. Each test names the bug it was seen failing on."""
import contextlib
import io
import json
import os
import shutil

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
from fastdllm.model import load_fastdllm, make_tiny_tokenizer, MASK_TOKEN, TINY_CONFIG
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
    from scripts import export_reference
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
    message = f"{ckpt} has no manifest.json, but its model.safetensors was written with one"
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


def test_a_hub_layout_directory_loads_and_the_run_records_it_unverified(tmp_path, monkeypatch, capsys):
    """A directory written by transformers' save_pretrained (as `hf download` leaves one) has no manifest and no
    mark of ours: load_fastdllm loads it with a warning, train_fastdllm.py --init_from records in its
    resume/manifest.json that the parent's files were not verified, and eval_code.py in results.json; a
    checkpoint of ours is recorded verified. Bugs checked: check_files refusing every directory without a
    manifest; the record left out of eval_code.py's results.json."""
    hub = tmp_path / "hub"
    lm = hub_layout_dir(hub)
    assert not (hub / "manifest.json").exists()
    model, _ = load_fastdllm(str(hub), dtype=torch.float32)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in lm.state_dict().items())
    assert model.files_check.startswith("not verified") and "its files are not verified" in capsys.readouterr().err
    monkeypatch.chdir(ROOT)
    T.main(FASTDLLM_TINY[:2] + [f"--out_dir={tmp_path / 'child'}", f"--init_from={hub}", "--bd_size=32",
                                "--max_iters=1", "--save_interval=1", "--objective=sft", "--pad_to=32"])
    parent = json.loads((tmp_path / "child" / "resume" / "manifest.json").read_text())["config"]["parent"]
    assert parent["init_from"] == str(hub) and parent["files"].startswith("not verified: no manifest.json")
    for model_dir, verified in ((hub, False), (tmp_path / "child" / "ckpt-1", True)):
        out = tmp_path / f"eval_{verified}"
        eval_code.main([f"--model={model_dir}", "--limit=1", "--max_new_tokens=32", "--batch_size=1", "--device=cpu",
                        "--dtype=float32", SANDBOX, f"--out_dir={out}"])
        recorded = json.loads((out / "results.json").read_text())["model_files"]
        assert recorded.startswith("verified" if verified else "not verified"), recorded
