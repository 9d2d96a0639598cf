import json

import pytest
import torch

from common import load_model, save_weights
from model import ModelConfig, SudokuTransformer, apply_rope, rope_cache

SMALL = dict(n_layer=2, n_head=4, n_embd=32, d_ff=64, dropout=0.0)


def tokens(B=3, L=81, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 17, (B, L), generator=g).to(device)


@pytest.mark.parametrize("tie,relay,expected", [
    (False, False, 7_105_536), (True, False, 7_099_008), (False, True, 7_106_304), (True, True, 7_099_776)])
def test_paper_parameter_counts(tie, relay, expected):
    model = SudokuTransformer(ModelConfig(tie_embeddings=tie, relay=relay))
    assert model.num_params() == expected


def test_tied_head_shares_rescaled_embedding():
    model = SudokuTransformer(ModelConfig(tie_embeddings=True))
    assert model.head.weight is model.tok_emb.weight
    w = model.tok_emb.weight
    assert torch.all(w[0] == 0)  # PAD row
    assert abs(w[1:].std().item() - 384 ** -0.5) < 0.01  # N(0, 1/sqrt(d)), not N(0, 1)


def test_relay_with_zero_layernorm_equals_plain_model(device):
    torch.manual_seed(0)
    plain = SudokuTransformer(ModelConfig(**SMALL)).to(device)
    relay = SudokuTransformer(ModelConfig(**SMALL, relay=True)).to(device)
    missing, unexpected = relay.load_state_dict(plain.state_dict(), strict=False)
    assert set(missing) == {"relay_norm.weight", "relay_norm.bias"} and not unexpected
    torch.nn.init.zeros_(relay.relay_norm.weight)
    torch.nn.init.zeros_(relay.relay_norm.bias)
    x = tokens(device=device)
    h = torch.randn(3, 81, 32).to(device)
    ref_logits, ref_h = plain(x)
    for state in (None, h):
        logits, h_out = relay(x, state)
        assert torch.equal(logits, ref_logits) and torch.equal(h_out, ref_h)


def test_relay_state_is_used_and_none_means_zero(device):
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(**SMALL, relay=True))
    with torch.no_grad():
        model.relay_norm.bias.normal_()  # LN(0) = beta: make it non-trivial
    model.to(device)
    x = tokens(device=device)
    a, _ = model(x, None)
    b, _ = model(x, torch.zeros(3, 81, 32, device=device))
    c, _ = model(x, torch.randn(3, 81, 32).to(device))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert (a - c).abs().max() > 1e-3


def test_h_out_is_pre_final_norm_and_plain_model_rejects_h(device):
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(**SMALL)).to(device)
    logits, h = model(tokens(device=device))
    torch.testing.assert_close(logits, model.head(model.final_norm(h)))
    with pytest.raises(ValueError, match="relay=False"):
        model(tokens(device=device), h)


def test_attention_is_bidirectional(device):
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(**SMALL)).to(device)
    x = tokens(B=1, device=device)
    y = x.clone()
    y[0, -1] = 2 if x[0, -1] != 2 else 9
    assert (model(x)[0][0, 0] - model(y)[0][0, 0]).abs().max() > 1e-6  # cell 0 sees cell 80


def test_rope_scores_depend_only_on_relative_position():
    cos, sin = rope_cache(64, 90)
    q, k = torch.randn(64), torch.randn(64)
    def score(m, n):
        return (apply_rope(q, cos[m], sin[m]) * apply_rope(k, cos[n], sin[n])).sum()
    torch.testing.assert_close(score(3, 10), score(40, 47), rtol=1e-4, atol=1e-4)
    assert abs(score(3, 10) - score(3, 11)) > 1e-4
    # rotate-half pairs dim i with dim i + 32, angle pos * 10000^(-2i/64)
    x = torch.zeros(64); x[5] = 1.0
    out = apply_rope(x, cos[7], sin[7])
    angle = 7 * 10000 ** (-2 * 5 / 64)
    torch.testing.assert_close(out[[5, 37]], torch.tensor([torch.cos(torch.tensor(angle)), torch.sin(torch.tensor(angle))]))


def test_dropout_only_in_training(device):
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(**{**SMALL, "dropout": 0.5})).to(device)
    x = tokens(device=device)
    model.eval()
    assert torch.equal(model(x)[0], model(x)[0])
    model.train()
    assert not torch.equal(model(x)[0], model(x)[0])


def save_ckpt(path, model, ema_shadow=None):
    from helpers import write_checkpoint
    write_checkpoint(path, model, ema_shadow=ema_shadow)


def test_load_model_round_trip_and_ema(tmp_path, device):
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(**SMALL, relay=True))
    shadow = {n: p.detach() + 1.0 for n, p in model.named_parameters()}
    save_ckpt(tmp_path / "ckpt.pt", model, shadow)
    raw, cfg = load_model(str(tmp_path), device=str(device), ema=False)
    assert cfg["objective"] == "relay" and not raw.training
    for (n, p), q in zip(model.named_parameters(), raw.parameters()):
        assert q.device.type == device.type and torch.equal(p, q.cpu()), n
    ema, _ = load_model(str(tmp_path / "ckpt.pt"), device=str(device))
    for n, p in ema.named_parameters():
        assert p.device.type == device.type and torch.equal(p.cpu(), shadow[n]), n
    assert ema.rope_cos.device.type == device.type  # buffers follow the model


def test_load_model_errors(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint"):
        load_model(str(tmp_path / "missing.pt"))
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match="cannot read"):
        load_model(str(tmp_path / "junk.pt"))
    torch.save({"weights": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a train_sudoku.py checkpoint"):
        load_model(str(tmp_path / "other.pt"))


def test_optional_learned_positions(device):
    base = SudokuTransformer(ModelConfig(**SMALL))
    model = SudokuTransformer(ModelConfig(**SMALL, pos_emb=True)).to(device)
    assert model.num_params() - base.num_params() == 81 * 32
    assert SudokuTransformer(ModelConfig()).pos_emb is None  # the paper's model has RoPE only
    x = tokens(B=1, device=device)
    with torch.no_grad():
        model.pos_emb.zero_()
        a = model(x)[0]
        model.pos_emb[5] = torch.randn(32).to(device)
        b = model(x)[0]
    assert (a - b).abs().amax(-1)[0, 5] > 1e-3  # the embedding of position 5 is added to cell 5


def test_model_py_imports_only_torch_and_relay():
    """model.py is copied with relay.py alone: it imports torch, relay and the standard library's
    dataclasses/math, nothing of this repository's (the checksummed loader is common.load_model).
    Checked: fails with model.py's earlier `from checkpoint import load_checkpoint`."""
    import ast
    import model
    tree = ast.parse(open(model.__file__).read())
    modules = {n.module if isinstance(n, ast.ImportFrom) else a.name
               for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
               for a in (n.names if isinstance(n, ast.Import) else [None])}
    assert {m.split(".")[0] for m in modules} <= {"torch", "relay", "dataclasses", "math", "typing"}, modules


@pytest.mark.parametrize("tied", [False, True])
def test_weights_file_round_trip(tmp_path, tied):
    """save_weights -> load_model gives the same model in eval mode (dropout 0.1 here, so a loader that
    left the model in train mode fails; so does one that dropped the relay LayerNorm or the config). Tied
    embeddings too: on the CPU their one tensor under two names made safetensors refuse to write the file
    (a Table 1 preset with keep_interval failed at its first kept step; fails without save_weights' clone)."""
    torch.manual_seed(0)
    model = SudokuTransformer(ModelConfig(n_layer=2, n_head=2, n_embd=32, d_ff=64, relay=True, pos_emb=True,
                                          tie_embeddings=tied))
    with torch.no_grad():
        model.relay_norm.bias.normal_()
    path = str(tmp_path / "m.safetensors")
    save_weights(model.eval(), path, {"config": json.dumps({"objective": "relay"})})
    loaded, config = load_model(path)
    tokens = torch.randint(0, 17, (3, 81))
    h = torch.randn(3, 81, 32)
    assert config == {"objective": "relay"} and loaded.config == model.config
    assert torch.equal(loaded(tokens, h)[0], model(tokens, h)[0])


def test_weights_file_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    for path in (str(bad), str(tmp_path / "missing.safetensors")):
        with pytest.raises(ValueError) as e:
            load_model(path)
        assert path in str(e.value) and "\n" not in str(e.value)
