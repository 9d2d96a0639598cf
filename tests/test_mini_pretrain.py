"""Table 2 in miniature, stage A (scripts/table2/pretrain_ar.py): the loss, resuming, and the checkpoint stage B reads."""
import json
import os
import shutil
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "table2"))
import pretrain_ar  # noqa: E402
from fastdllm import mini_corpus  # noqa: E402
from fastdllm.model import load_fastdllm  # noqa: E402

TINY = ["--n_layer=2", "--n_embd=32", "--n_head=2", "--n_kv_head=1", "--d_ff=64", "--seq_len=16", "--batch_size=4",
        "--warmup_iters=2", "--log_interval=2", "--eval_interval=3"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A token stream and tokenizer in the layout fastdllm.mini_data writes, from a few lines of code."""
    out = tmp_path_factory.mktemp("mini_data")
    texts = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(200)]
    tok = mini_corpus.train_tokenizer(texts, vocab_size=300)
    tok.save_pretrained(str(out / "tokenizer"))
    mini_corpus.write_tokens(tok, texts[:180], str(out / "train.bin"))
    mini_corpus.write_tokens(tok, texts[180:], str(out / "heldout.bin"))
    return out


def test_the_loss_is_transformers_causal_lm_loss(data_dir, device):
    """Our FastDLLM forward with a causal mask against Qwen2ForCausalLM's own causal attention and loss (on the CPU)."""
    from transformers import AutoTokenizer
    cfg = pretrain_ar.PretrainConfig(n_layer=2, n_embd=32, n_head=2, n_kv_head=1, d_ff=64)
    model = pretrain_ar.build_model(cfg, AutoTokenizer.from_pretrained(str(data_dir / "tokenizer"))).double()
    x = torch.randint(0, 300, (3, 17), generator=torch.Generator().manual_seed(0))
    hidden = model.model(input_ids=x[:, :-1]).last_hidden_state  # Qwen2Model's default mask is causal
    logits = model.lm_head(hidden)
    expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    assert torch.allclose(pretrain_ar.causal_loss(model.to(device), x.to(device)).cpu(), expected, rtol=0, atol=1e-10)


def test_the_held_out_loss_scores_every_window_once(data_dir):
    from transformers import AutoTokenizer
    cfg = pretrain_ar.PretrainConfig(n_layer=2, n_embd=32, n_head=2, n_kv_head=1, d_ff=64)
    model = pretrain_ar.build_model(cfg, AutoTokenizer.from_pretrained(str(data_dir / "tokenizer")))
    tokens = np.fromfile(data_dir / "heldout.bin", dtype=np.uint16)
    n = (len(tokens) - 1) // 16
    windows = [torch.from_numpy(tokens[i * 16:i * 16 + 17].astype(np.int64))[None] for i in range(n)]
    one_by_one = sum(pretrain_ar.causal_loss(model, w).item() for w in windows) / n
    assert pretrain_ar.heldout_loss(model, tokens, 16, batch_size=3) == pytest.approx(one_by_one, rel=1e-5)


def run(data_dir, out, *extra):
    pretrain_ar.main([f"--data_dir={data_dir}", f"--out_dir={out}", *TINY, *extra])


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(data_dir, tmp_path, device):
    on = f"--device={device.type}"
    run(data_dir, tmp_path / "whole", "--max_iters=6", on)
    run(data_dir, tmp_path / "split", "--max_iters=3", on)
    with open(tmp_path / "split" / "metrics.jsonl", "a") as f:  # a run killed after logging step 4, before saving
        f.write(json.dumps({"step": 4, "loss": 0.0}) + "\n")
    run(data_dir, tmp_path / "split", "--max_iters=6", "--resume=True", on)
    a, _ = load_fastdllm(str(tmp_path / "whole" / "model"), dtype=torch.float32)
    b, _ = load_fastdllm(str(tmp_path / "split" / "model"), dtype=torch.float32)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        if device.type == "cpu":
            assert torch.equal(p, q), name
        else:  # CUDA's embedding backward adds with atomics: the last bits may differ between two runs
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=name)
    records = [json.loads(line) for line in open(tmp_path / "split" / "metrics.jsonl")]
    assert [r["step"] for r in records] == [2, 3, 4, 6]  # the killed run's step 4 dropped, nothing twice
    assert records[2]["loss"] != 0.0


def test_the_checkpoint_is_one_stage_b_reads(data_dir, tmp_path):
    run(data_dir, tmp_path / "a", "--max_iters=2")
    model, tok = load_fastdllm(str(tmp_path / "a" / "model"), use_relay=True, dtype=torch.float32)
    assert (model.config.mask_token_id, model.config.bd_size) == (tok.convert_tokens_to_ids("|<MASK>|"), 32)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as Qwen2.5 1.5B
    assert float(model.relay_layer_norm.weight.abs().sum()) == 0.0  # a fresh relay: an exact no-op


def test_bad_settings_are_refused_in_one_line(data_dir, tmp_path, capsys):
    for bad, says in (("--n_embd=33", "n_embd"), ("--max_iters=0", "max_iters"),
                      ("--learning_rate=-1", "learning_rate"), ("--device=tpu", "device")):
        with pytest.raises(SystemExit) as e:
            run(data_dir, tmp_path / "x", bad)
        assert says in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SystemExit) as e:
        pretrain_ar.main([f"--data_dir={tmp_path}", f"--out_dir={tmp_path / 'y'}"])
    assert "python -m fastdllm.mini_data" in str(e.value)
    assert not os.path.exists(tmp_path / "x") and not os.path.exists(tmp_path / "y")


def test_a_stream_of_another_tokenizer_is_refused_in_one_line(data_dir, tmp_path):
    """A token id the tokenizer does not have would index past the embedding inside the first step: refused before
    any work (failed without the check: the run trained on, no error raised)."""
    bad = tmp_path / "data"
    shutil.copytree(data_dir, bad)
    tokens = np.fromfile(bad / "train.bin", dtype=np.uint16)
    tokens[len(tokens) // 2] = 300  # the tokenizer has ids 0-299
    tokens.tofile(bad / "train.bin")
    with pytest.raises(SystemExit) as e:
        run(bad, tmp_path / "out", "--max_iters=2")
    assert "train.bin holds token id 300, outside the tokenizer's 300 ids" in str(e.value) and "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "out")  # nothing written

