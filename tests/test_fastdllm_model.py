"""fastdllm/model.py: masks, token shift, relay injection, checkpoints (tiny random Qwen2, no hub)."""
import json
import warnings

import pytest
import torch
from safetensors.torch import save_file
from transformers import Qwen2ForCausalLM

from fastdllm.model import (bd_training_mask, block_causal_mask, load_fastdllm, make_tiny_fastdllm,
                            make_tiny_tokenizer, save_fastdllm, shift_hidden, shift_logits)


def _rand_ids(model, B, L, n_mask, seed=0):
    """Random ids with n_mask MASK columns, on the model's device."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (B, L), generator=g)
    pos = torch.randperm(L, generator=g)[:n_mask]
    x[:, pos] = model.mask_token_id
    return x.to(model.lm_head.weight.device)


def test_training_mask_equals_three_rules():
    L, bd = 12, 4
    m = bd_training_mask(L, bd)[0, 0]
    assert m.shape == (2 * L, 2 * L)
    for q in range(2 * L):
        for k in range(2 * L):
            q0, k0 = q >= L, k >= L
            bq, bk = (q % L) // bd, (k % L) // bd
            m_bd = bq == bk and q0 == k0
            m_obc = (not q0) and k0 and bq > bk
            m_bc = q0 and k0 and bq >= bk
            assert bool(m[q, k]) == (m_bd or m_obc or m_bc), (q, k)
    assert not m[L:, :L].any()  # x_0 never attends to x_t
    # a noised block sees no other noised block
    for q in range(L):
        for k in range(L):
            assert bool(m[q, k]) == (q // bd == k // bd)
    with pytest.raises(ValueError):
        bd_training_mask(10, 4)


def test_block_causal_mask_with_cache_offset():
    m = block_causal_mask(q_len=4, kv_len=12, bd_size=4)[0, 0]
    for qi in range(4):
        for k in range(12):
            assert bool(m[qi, k]) == ((8 + qi) // 4 >= k // 4)


def test_shift_exact_values():
    x = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3)
    s = shift_logits(x)
    assert torch.equal(s[:, 0], x[:, 0])
    assert torch.equal(s[:, 1:], x[:, :-1])
    assert torch.equal(shift_hidden(x), s)


def test_zero_init_relay_gives_exactly_the_no_relay_logits(device):
    base = make_tiny_fastdllm(use_relay=False, seed=1, bd_size=8).to(device)
    relay = make_tiny_fastdllm(use_relay=True, seed=1, bd_size=8).to(device)
    assert torch.equal(relay.relay_layer_norm.weight.cpu(), torch.zeros(64))
    assert torch.equal(relay.relay_layer_norm.bias.cpu(), torch.zeros(64))
    x = _rand_ids(base, 2, 16, 6)
    h = (torch.randn(2, 16, 64) * 3).to(device)
    with torch.no_grad():
        a = base(x).logits
        b = relay(x, relay_h=h).logits
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="use_relay=True"):
        base(x, relay_h=h)


def test_relay_enters_only_at_mask_positions(device):
    model = make_tiny_fastdllm(use_relay=True, bd_size=8).to(device)
    with torch.no_grad():
        model.relay_layer_norm.weight.fill_(1.0)
        model.relay_layer_norm.bias.fill_(0.3)
    x = _rand_ids(model, 2, 16, 6)
    x = torch.cat([x, x], dim=1)  # doubled input; relay covers the first half only
    h = torch.randn(2, 16, 64).to(device)
    with torch.no_grad():
        e0 = model.embed(x)
        e1 = model.embed(x, h)
    changed = (e1 - e0).abs().sum(-1) > 0  # (B, 32)
    expected = torch.zeros_like(changed)
    expected[:, :16] = x[:, :16] == model.mask_token_id
    assert torch.equal(changed, expected)
    with torch.no_grad():
        assert not torch.equal(model(x[:, :16]).logits, model(x[:, :16], relay_h=h).logits)


def test_forward_with_cache_equals_full_forward(device):
    """Also: the cache reaches Qwen2Model under the name the installed transformers reads (5.x deprecates
    past_key_values with a FutureWarning and drops it in 5.40; fails when the old name is passed)."""
    model = make_tiny_fastdllm(bd_size=8).to(device).eval()
    x = _rand_ids(model, 2, 24, 4)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        full = model(x)  # default mask: block-causal over absolute positions
        pre = model(x[:, :16], use_cache=True)
        nxt = model(x[:, 16:], past_key_values=pre.past_key_values, use_cache=True)
    torch.testing.assert_close(pre.logits, full.logits[:, :16], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nxt.logits, full.logits[:, 16:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nxt.hidden, full.hidden[:, 16:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("relay_layer", [-1, 0])
def test_n_last_keeps_the_last_positions_of_a_full_forward(relay_layer, device):
    """n_last (what decoding reads) returns exactly the last positions of the full forward, for the final-norm
    and a decoder-layer readout. Fails if n_last keeps the first positions (checked: slice(0, n_last)) or
    slices logits but not hidden; giving n_keep too is refused."""
    model = make_tiny_fastdllm(bd_size=8, relay_layer=relay_layer).to(device).eval()
    x = _rand_ids(model, 2, 24, 5)
    with torch.no_grad():
        full, tail = model(x), model(x, n_last=3)
    torch.testing.assert_close(tail.logits, full.logits[:, -3:])
    torch.testing.assert_close(tail.hidden, full.hidden[:, -3:])
    with pytest.raises(ValueError, match="not both"):
        model(x, n_keep=2, n_last=3)


def test_hidden_is_final_norm_output_and_relay_layer_readout(device):
    model = make_tiny_fastdllm(bd_size=8).to(device).eval()
    x = _rand_ids(model, 1, 16, 3)
    with torch.no_grad():
        out = model(x)
        torch.testing.assert_close(model.lm_head(out.hidden), out.logits)  # h_s feeds the head
        model.config.relay_layer = 0
        mask = block_causal_mask(16, 16, 8, device=device)
        ref = model.model(inputs_embeds=model.embed(x), attention_mask=mask, output_hidden_states=True).hidden_states
        out0 = model(x)
    torch.testing.assert_close(out0.hidden, ref[1])  # raw residual stream after decoder layer 0
    torch.testing.assert_close(out0.logits, out.logits)


def test_save_load_round_trip_with_relay_keys(tmp_path, device):
    model = make_tiny_fastdllm(use_relay=True, bd_size=8)
    with torch.no_grad():
        model.relay_layer_norm.weight.normal_()
        model.relay_layer_norm.bias.normal_()
    save_fastdllm(model, make_tiny_tokenizer(), str(tmp_path))
    cfg = json.load(open(tmp_path / "config.json"))
    assert cfg["use_relay"] is True and cfg["relay_layer"] == -1 and cfg["bd_size"] == 8
    loaded, tok = load_fastdllm(str(tmp_path), dtype=torch.float32, device=str(device))
    assert loaded.relay_layer_norm is not None and tok.convert_tokens_to_ids("|<MASK>|") == loaded.mask_token_id
    for k, v in model.state_dict().items():
        assert loaded.state_dict()[k].device.type == device.type and torch.equal(v, loaded.state_dict()[k].cpu()), k
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight  # tie survives
    model.to(device)
    x = _rand_ids(model, 2, 16, 5)
    h = torch.randn(2, 16, 64).to(device)
    with torch.no_grad():
        assert torch.equal(model(x, relay_h=h).logits, loaded(x, relay_h=h).logits)
    # use_relay=False drops the relay; use_relay=True on a plain checkpoint attaches a zero one
    assert load_fastdllm(str(tmp_path), use_relay=False, dtype=torch.float32)[0].relay_layer_norm is None
    # transformers users can read the same directory as a plain Qwen2 (relay keys ignored)
    hf = Qwen2ForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).to(device)
    with torch.no_grad():
        # without relay_h the relay is inactive, so plain Qwen2 with the same mask must agree
        torch.testing.assert_close(hf(x, attention_mask=block_causal_mask(16, 16, 8, device=device)).logits,
                                   model(x).logits)


def test_loads_released_key_layout(tmp_path, device):
    """A checkpoint as the authors' code writes it: Fast_dLLM_Qwen model_type and auto_map,
    pre-release key names, sharded safetensors with an index, no lm_head (tied)."""
    src = make_tiny_fastdllm(use_relay=True, bd_size=8, seed=3)
    with torch.no_grad():
        src.relay_layer_norm.weight.uniform_(0.5, 1.5)
        src.relay_layer_norm.bias.uniform_(-0.2, 0.2)
    sd = {k: v.clone() for k, v in src.state_dict().items() if k != "lm_head.weight"}
    assert {"model.relay_layer_norm.weight", "model.relay_layer_norm.bias"} <= set(sd)
    keys = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2], "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for fname, ks in shards.items():
        save_file({k: sd[k] for k in ks}, str(tmp_path / fname), metadata={"format": "pt"})
    json.dump({"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}, open(tmp_path / "model.safetensors.index.json", "w"))
    cfg = src.config.to_dict()
    for k in ("use_relay", "relay_layer"):
        cfg.pop(k)
    cfg.update(architectures=["Fast_dLLM_QwenForCausalLM"], model_type="Fast_dLLM_Qwen", use_loopholing=True, loophole_layer=-1,
               auto_map={"AutoConfig": "configuration.Fast_dLLM_QwenConfig", "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"})
    json.dump(cfg, open(tmp_path / "config.json", "w"))
    make_tiny_tokenizer().save_pretrained(str(tmp_path))
    # the authors' layout has no manifest.json of ours: it loads only unverified, on request
    model, _ = load_fastdllm(str(tmp_path), dtype=torch.float32, device=str(device), allow_unverified=True)
    assert model.config.use_relay and model.config.relay_layer == -1
    src.to(device)
    x = _rand_ids(src, 2, 16, 6)
    h = torch.randn(2, 16, 64).to(device)
    with torch.no_grad():
        assert torch.equal(model(x, relay_h=h).logits, src(x, relay_h=h).logits)


def test_tiny_tokenizer_is_deterministic_and_round_trips():
    a, b = make_tiny_tokenizer(), make_tiny_tokenizer()
    text = "def f(x):\n    return x + 1  # é"
    assert a.encode(text) == b.encode(text) and a.decode(a.encode(text)) == text
    assert a.get_vocab() == b.get_vocab() and len(a) < 300
    ids = a.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "|<MASK>|"])
    assert len(set(ids)) == 4 and min(ids) >= 256


def test_offline_hub_id_and_missing_dir_give_one_line():
    with pytest.raises(ValueError, match="cannot fetch"):
        load_fastdllm("Efficient-Large-Model/Fast_dLLM_v2_1.5B")
    with pytest.raises(ValueError, match="does not exist"):
        load_fastdllm("./no/such/checkpoint")
