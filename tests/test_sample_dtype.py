"""sample.py --dtype: the decoding precision reaches the model (bf16 autocast on CUDA by default, fp32 on the CPU)."""
import json

import pytest
import torch

import sample
import sudoku.decode
from model import ModelConfig, SudokuTransformer
from helpers import constant_checkpoint, make_puzzles, puzzle_csv


def logits_dtypes(dtype: str) -> tuple[set, torch.Tensor]:
    """The dtypes of the head's outputs during a decode at `dtype` on the CPU, and the decoded boards."""
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(n_layer=1, n_head=2, n_embd=16, d_ff=32, dropout=0.0, relay=True))
    seen = set()
    model.head.register_forward_hook(lambda m, i, out: seen.add(out.dtype))
    q, _ = make_puzzles(4)
    return seen, sudoku.decode.decode_puzzles(model, q, tau=0.15, dtype=dtype).pred


def test_decode_dtype_sets_the_autocast():
    """dtype="bfloat16" decodes under bf16 autocast even on the CPU; "auto" on the CPU stays fp32 and
    gives exactly the boards of "float32". Catches: the dtype argument ignored (tried: autocast() always
    fp32 off CUDA, fails) and an unknown dtype accepted (tried: fails)."""
    bf16, _ = logits_dtypes("bfloat16")
    auto, pred_auto = logits_dtypes("auto")
    fp32, pred_fp32 = logits_dtypes("float32")
    assert bf16 == {torch.bfloat16} and auto == fp32 == {torch.float32}
    assert torch.equal(pred_auto, pred_fp32)
    with pytest.raises(ValueError, match="dtype must be one of"):
        logits_dtypes("float16")


def test_sample_cli_passes_dtype_and_records_it(tmp_path, monkeypatch):
    """--dtype reaches every decode call and the --out file records it. Catches: the flag parsed but not
    passed on (tried: fails)."""
    seen, decode = [], sample.decode_puzzles

    def spy(*args, **kwargs):
        seen.append(kwargs.get("dtype"))
        return decode(*args, **kwargs)
    monkeypatch.setattr(sample, "decode_puzzles", spy)
    out = tmp_path / "r.json"
    sample.main([f"--ckpt={constant_checkpoint(tmp_path / 'c.pt')}", f"--data={puzzle_csv(tmp_path / 'p.csv')}",
                 "--n=2", "--taus=0.15", "--dtype=bfloat16", f"--out={out}"])
    assert seen == ["bfloat16"] and json.loads(out.read_text())["dtype"] == "bfloat16"
