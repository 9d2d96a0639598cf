"""A file this repository wrote is never loaded unverified (docs/reliability.md, "Checksums"): its digest
cannot be switched off by damaging the file. A Sudoku .safetensors whose `sha256` entry was renamed, a
Fast-dLLM ckpt-N/ or resume/ whose manifest.json was deleted, each with a weight byte flipped as well, is
refused in one line by every loader; a directory in the hub's layout without our files still loads, and
the run says and records that it was not verified. Each test names the bug it was seen failing on."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file

import common
import quickstart
import sample
import train_sudoku as ts
from configurator import load_config
from helpers import TINY, TRAIN, VAL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
