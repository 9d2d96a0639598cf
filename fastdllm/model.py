"""Fast-dLLM v2 (a block-diffusion Qwen2.5) with the Relay channel.

The backbone is transformers' Qwen2 driven through `inputs_embeds` with a 4-D boolean
attention mask and its KV cache; this file adds what the library cannot express:
  - the relay LayerNorm injected at MASK positions before decoder layer 0 (paper Sec. 4.2),
  - the block-diffusion attention masks (training [x_t || x_0] mask and the block-causal
    inference mask),
  - the token shift ("logit i-1 predicts token i"), shared by training and generation,
  - loading / saving checkpoints in the layout of the released Relay checkpoints
    (config.json with the Fast_dLLM_Qwen class names and auto_map, bd_size, use_relay, relay_layer;
    safetensors with model.* / lm_head.weight / model.relay_layer_norm.{weight,bias}), so the authors'
    tools, trust_remote_code users and plain `Qwen2ForCausalLM.from_pretrained` users read what we
    save, and we read the released checkpoints without running their remote code; what we save also
    carries manifest.json (the sha256 of every file), checked whenever it is loaded.

    from fastdllm.model import load_fastdllm, make_tiny_fastdllm
    model, tok = load_fastdllm("Efficient-Large-Model/Fast_dLLM_v2_1.5B", use_relay=True)
    model = make_tiny_fastdllm(use_relay=True)   # random 2-layer Qwen2 for CPU tests

    python -m fastdllm.model --pin=Efficient-Large-Model/Fast_dLLM_v2_1.5B --out=PIN.json   # pin a hub snapshot
"""
import inspect
import json
import os
import sys
import threading
import warnings
from typing import NamedTuple

import torch
import torch.nn as nn
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2Model
from transformers.cache_utils import DynamicCache
from transformers.utils import logging as hf_logging

from relay import RelayLayerNorm

HUB_ID = "Efficient-Large-Model/Fast_dLLM_v2_1.5B"
MASK_TOKEN = "|<MASK>|"
DEFAULT_MASK_ID = 151665  # not in the 1.5B config.json; the authors' config class default
DEFAULT_BD_SIZE = 32
RELAY_KEYS = ("model.relay_layer_norm.weight", "model.relay_layer_norm.bias")
# what the released checkpoints' config.json names (their remote code: configuration.py, modeling.py)
RELEASED_ARCH = dict(architectures=["Fast_dLLM_QwenForCausalLM"], model_type="Fast_dLLM_Qwen", auto_map={
    "AutoConfig": "configuration.Fast_dLLM_QwenConfig", "AutoModel": "modeling.Fast_dLLM_QwenModel",
    "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"})
TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "added_tokens", "vocab", "merges", "chat_template")
# model.safetensors' metadata entry that says the directory's manifest.json lists its sha256: save_fastdllm writes
# both, so a directory with the entry and no manifest has lost it (transformers writes only {"format": "pt"})
SHA256_IN = ("sha256_in", "manifest.json")
ALLOW_UNVERIFIED = "--allow_unverified=True"  # every loader's way out of a refused missing manifest
WEIGHTS_INDEX = "model.safetensors.index.json"  # a sharded checkpoint's list of its shards
PIN_KEYS = ("files", "pin_sha256", "snapshot")  # all a pin file holds (write_pin)
PIN_COMMAND = "python -m fastdllm.model --pin=SNAPSHOT --out=PIN"

# LMFlow's `fast_dllm_v2` conversation template (Qwen2.5 ChatML with the short default system
# prompt). The {% generation %} span marks what is supervised: the assistant content plus
# "<|im_end|>\n"; the role header is not. Used for training data and for the tiny tokenizer.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message['content'] + '<|im_end|>\\n' }}{%- endgeneration %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# -----------------------------------------------------------------------------
# attention masks (bool, True = may attend), shape (1, 1, Lq, Lkv) for SDPA broadcasting


def bd_training_mask(L: int, bd_size: int, device=None) -> torch.Tensor:
    """Mask over the doubled training input [x_t || x_0] of length 2L (paper App. "Model Architecture": M_BD, M_OBC, M_BC).

    M_BD : same block, same stream (each noised block and each clean block is bidirectional)
    M_OBC: x_t query, x_0 key, strictly earlier block (a noised block sees the clean prefix)
    M_BC : x_0 query, x_0 key, block_q >= block_kv (the clean stream is block-causal)
    So x_0 never attends to x_t and a noised block never sees another noised block.
    """
    if L % bd_size:
        raise ValueError(f"sequence length {L} must be a multiple of the block size {bd_size}")
    idx = torch.arange(2 * L, device=device)
    is0 = idx >= L
    blk = (idx - L * is0) // bd_size
    q0, k0 = is0[:, None], is0[None, :]
    bq, bk = blk[:, None], blk[None, :]
    m_bd = (bq == bk) & (q0 == k0)
    m_obc = ~q0 & k0 & (bq > bk)
    m_bc = q0 & k0 & (bq >= bk)
    return (m_bd | m_obc | m_bc)[None, None]


def block_causal_mask(q_len: int, kv_len: int, bd_size: int, device=None) -> torch.Tensor:
    """Inference mask: the queries are the last q_len of kv_len absolute positions (cache + chunk);
    a query sees every key whose block is not later than its own (the authors' inference forward; docs/fastdllm.md)."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)
    k_pos = torch.arange(kv_len, device=device)
    return ((q_pos[:, None] // bd_size) >= (k_pos[None, :] // bd_size))[None, None]


# -----------------------------------------------------------------------------
# token shift: the head at position i-1 predicts token i, so the relay state that belongs to
# token i is also the one computed at i-1 (docs/fastdllm.md, "Model")


def shift_logits(logits: torch.Tensor) -> torch.Tensor:
    """(B, L, V) -> (B, L, V) with out[:, i] = logits[:, i-1] and out[:, 0] = logits[:, 0]."""
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def shift_hidden(h: torch.Tensor) -> torch.Tensor:
    """(B, L, d) -> (B, L, d) relay alignment h_t[i] = h_s[i-1], h_t[0] = h_s[0]."""
    return torch.cat([h[:, :1], h[:, :-1]], dim=1)


# -----------------------------------------------------------------------------


class FastDLLMOutput(NamedTuple):  # a NamedTuple, so DeepSpeed ZeRO-3 can see the output tensors
    logits: torch.Tensor  # (B, L, V), unshifted
    hidden: torch.Tensor  # (B, L, d) relay readout h_s (after the final RMSNorm when relay_layer = -1)
    past_key_values: DynamicCache | None = None


# transformers renamed Qwen2Model.forward's KV cache argument (and its output) from past_key_values to cache
# (5.x, the old name deprecated until 5.40): pass it under the name the installed version reads
QWEN2_CACHE_KW = "cache" if "cache" in inspect.signature(Qwen2Model.forward).parameters else "past_key_values"


class FastDLLM(nn.Module):
    """Qwen2 decoder + optional relay LayerNorm. Parameter names follow the released checkpoints:
    model.* (Qwen2Model), lm_head.weight (tied to model.embed_tokens.weight for the 1.5B) and
    model.relay_layer_norm.{weight,bias}."""

    def __init__(self, lm: Qwen2ForCausalLM, use_relay: bool | None = None):
        super().__init__()
        config = lm.config
        for key, default in (("bd_size", DEFAULT_BD_SIZE), ("mask_token_id", DEFAULT_MASK_ID),
                             ("use_relay", False), ("relay_layer", -1)):
            if getattr(config, key, None) is None:
                setattr(config, key, default)
        if use_relay is not None:
            config.use_relay = bool(use_relay)
        if not -1 <= config.relay_layer < config.num_hidden_layers:
            raise ValueError(f"relay_layer={config.relay_layer} must be -1 or a decoder layer index < {config.num_hidden_layers}")
        self.config = config
        self.files_check = "no files: built in memory"  # load_fastdllm: whether the files it read were verified
        self.model = lm.model  # Qwen2Model
        self.lm_head = lm.lm_head  # shares its weight with model.embed_tokens when tied
        # Living inside self.model gives the released key name model.relay_layer_norm.*.
        # gamma = 0 and beta = 0 make a fresh relay an exact no-op (docs/fastdllm.md, "Model").
        self.model.relay_layer_norm = (
            RelayLayerNorm(config.hidden_size, eps=config.rms_norm_eps, zero_init=True).to(
                device=lm.lm_head.weight.device, dtype=lm.lm_head.weight.dtype)
            if config.use_relay else None)

    @property
    def relay_layer_norm(self) -> nn.Module | None:
        return self.model.relay_layer_norm

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    def gradient_checkpointing_enable(self) -> None:
        # non-reentrant, as in the authors' runs: reentrant checkpointing only sends gradients to inputs
        # that require grad; tests/test_fastdllm_train.py checks the relay gradients are unchanged
        kwargs = {"use_reentrant": False}
        if hasattr(self.model, "activation_checkpointing_enable"):  # transformers >= 5 renamed it
            self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

    def embed(self, input_ids: torch.Tensor, relay_h: torch.Tensor | None = None,
              relay_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Token embedding plus LN_relay(relay_h) only where input_ids == mask_token_id.

        relay_h (B, L', d) with L' <= L covers the first L' positions (e.g. only the x_t half
        of the doubled training input); positions beyond it get no relay. It must already be
        shifted (see shift_hidden). relay_rows (B,) bool: only these rows get it (decoding with
        fastdllm/graphs.py runs rows with and without a carry in one forward)."""
        x = self.model.embed_tokens(input_ids)  # (B, L, d)
        if relay_h is None:
            return x
        if self.relay_layer_norm is None:
            raise ValueError("relay_h was given but this model has no relay LayerNorm: load or build it with use_relay=True")
        B, L = input_ids.shape
        if relay_h.dim() != 3 or relay_h.shape[0] != B or relay_h.shape[1] > L or relay_h.shape[2] != x.shape[2]:
            raise ValueError(f"relay_h must have shape (B={B}, L'<={L}, d={x.shape[2]}), got {tuple(relay_h.shape)}")
        n = relay_h.shape[1]
        ln = self.relay_layer_norm
        delta = ln(relay_h.to(ln.weight.dtype)).to(x.dtype)  # (B, n, d)
        guard = (input_ids[:, :n] == self.config.mask_token_id).unsqueeze(-1)
        if relay_rows is not None:
            guard = guard & relay_rows[:, None, None]
        head = torch.where(guard, x[:, :n] + delta, x[:, :n])  # committed / clean tokens never see the relay
        return head if n == L else torch.cat([head, x[:, n:]], dim=1)

    def forward(self, input_ids: torch.Tensor, relay_h: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                past_key_values: DynamicCache | None = None, use_cache: bool = False,
                n_keep: int | None = None, n_last: int | None = None,
                relay_rows: torch.Tensor | None = None) -> FastDLLMOutput:
        """One forward. attention_mask: 4-D bool (B or 1, 1, Lq, Lkv), True = may attend; None gives
        the block-causal inference mask over [cache || input]. n_keep: return logits and hidden
        only for the first n_keep positions (the x_t half in training: the lm_head over a
        151936-word vocabulary is the largest activation, so skipping the x_0 half matters). n_last: only
        the last n_last positions instead (decoding reads the logits of the active block, never the prefix's).
        relay_rows: see embed."""
        if n_keep is not None and n_last is not None:
            raise ValueError("give n_keep or n_last, not both")
        B, L = input_ids.shape
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if attention_mask is None:
            attention_mask = block_causal_mask(L, past + L, self.config.bd_size, input_ids.device)
        if attention_mask.dim() != 4 or attention_mask.dtype != torch.bool:
            raise ValueError("attention_mask must be a 4-D bool tensor (B, 1, Lq, Lkv) with True = may attend")
        if self.config._attn_implementation == "eager":  # eager adds the mask to the scores
            attention_mask = torch.zeros(attention_mask.shape, dtype=self.lm_head.weight.dtype,
                                         device=input_ids.device).masked_fill(~attention_mask, torch.finfo(self.lm_head.weight.dtype).min)
        inputs_embeds = self.embed(input_ids, relay_h, relay_rows)
        captured = {}
        if self.config.relay_layer >= 0:  # readout = raw residual stream after decoder layer k
            layer = self.model.layers[self.config.relay_layer]
            hook = layer.register_forward_hook(lambda m, i, o: captured.__setitem__("h", o[0] if isinstance(o, tuple) else o))
        try:
            out = self.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=use_cache, **{QWEN2_CACHE_KW: past_key_values})
        finally:
            if self.config.relay_layer >= 0:
                hook.remove()
        hidden = captured.get("h", out.last_hidden_state)
        keep = slice(L - n_last, L) if n_last is not None else slice(0, L if n_keep is None else n_keep)
        logits = self.lm_head(out.last_hidden_state[:, keep])
        cache = (out.cache if QWEN2_CACHE_KW == "cache" else out.past_key_values) if use_cache else None
        return FastDLLMOutput(logits=logits, hidden=hidden[:, keep], past_key_values=cache)


# -----------------------------------------------------------------------------
# checkpoints

_LEGACY_RENAMES = {"use_loopholing": "use_relay", "loophole_layer": "relay_layer"}
_LEGACY_DROPPED = ("use_cab", "use_mlp_carry", "read_layers", "only_mask_tokens", "loophole_position_guard")


def _config_from_json(path: str) -> Qwen2Config:
    with open(path) as f:
        d = json.load(f)
    for old, new in _LEGACY_RENAMES.items():  # pre-release Relay checkpoints
        if old in d:
            d.setdefault(new, d.pop(old))
    dropped = [k for k in d if k in _LEGACY_DROPPED or k.startswith("cab_")]
    if dropped:
        warnings.warn(f"ignoring unsupported legacy config keys {dropped} in {path}")
    for k in dropped + ["auto_map", "architectures", "model_type", "transformers_version"]:
        d.pop(k, None)
    d.setdefault("bd_size", DEFAULT_BD_SIZE)
    d.setdefault("mask_token_id", DEFAULT_MASK_ID)
    d.setdefault("use_relay", False)
    d.setdefault("relay_layer", -1)
    return Qwen2Config(**d)


def _weight_files(ckpt_dir: str) -> list[str]:
    index = os.path.join(ckpt_dir, WEIGHTS_INDEX)
    if os.path.exists(index):
        with open(index) as f:
            return sorted({os.path.join(ckpt_dir, v) for v in json.load(f)["weight_map"].values()})
    single = os.path.join(ckpt_dir, "model.safetensors")
    if os.path.exists(single):
        return [single]
    raise ValueError(f"no model.safetensors (or model.safetensors.index.json) in {ckpt_dir}")


def resolve_checkpoint(name_or_path: str) -> str:
    """A local directory as is; otherwise a hub id, downloaded (config, tokenizer, safetensors)."""
    if os.path.isdir(name_or_path):
        return name_or_path
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") != 1:
        raise ValueError(f"checkpoint directory '{name_or_path}' does not exist (and it is not a hub id like {HUB_ID})")
    from huggingface_hub import snapshot_download
    try:
        # *.py: the release's remote code, copied next to checkpoints we save (never imported by us)
        return snapshot_download(name_or_path, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja", "*.py"])
    except Exception as e:
        raise ValueError(f"cannot fetch '{name_or_path}' from the Hugging Face hub ({type(e).__name__}); "
                         f"download it where there is internet (hf download {name_or_path} --local-dir DIR) and pass DIR "
                         f"with {ALLOW_UNVERIFIED} (a download has no manifest.json of ours)") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200]}" if text else type(e).__name__


def in_hub_cache(path: str) -> bool:
    """A snapshot in the hub cache: check_files verifies it against its blobs' hash names (verify_hub_snapshot)."""
    from huggingface_hub.constants import HF_HUB_CACHE
    return os.path.realpath(path).startswith(os.path.realpath(HF_HUB_CACHE) + os.sep)


def _marked(weight_file: str) -> bool:
    """model.safetensors carries SHA256_IN: save_fastdllm wrote it, with a manifest."""
    try:
        with safe_open(weight_file, framework="pt") as f:
            return (f.metadata() or {}).get(SHA256_IN[0]) == SHA256_IN[1]
    except BaseException as e:  # an unreadable header: the loader refuses the file itself
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return False


def check_files(ckpt_dir: str, downloaded: bool, allow_unverified: bool = False, pin: str | None = None) -> str:
    """Checkpoints this repository writes (save_fastdllm) carry manifest.json, the sha256 of every file and of
    itself, verified here: ValueError with one line naming the file on any difference. A local directory without
    a manifest is refused too, whether or not model.safetensors says one was written (SHA256_IN): one damaged byte
    of that mark, or another tool, gives a directory no file of which can be verified. allow_unverified loads it
    anyway, with a warning; it never lets a manifest that disagrees with its files through. A hub download (a
    snapshot in the hub cache) is checked against its blobs' hash names instead (verify_hub_snapshot), and against
    `pin` when given (write_pin). Returns what was checked, for the run's records."""
    import common  # the manifest rules shared with the resume state
    if pin is not None:
        if not downloaded:
            raise ValueError(f"a pin ({pin}) is for snapshots in the hub cache, and {ckpt_dir} is a local directory "
                             f"(verified against its {common.MANIFEST}); drop the pin")
        read_pin(pin)  # a damaged pin is refused before minutes of hashing
    way_out = f"restore {ckpt_dir} from a copy, or train it again"
    manifest = common.read_manifest(ckpt_dir, fields=("files",), way_out=way_out)
    if manifest is not None:
        common.verify_manifest(ckpt_dir, manifest, way_out)
        if pin is not None:  # a snapshot of a checkpoint of ours: its manifest.json is a blob of the cache too
            check_pin(ckpt_dir, pin)
            return f"verified: the sha256 of every file, in {common.MANIFEST} and in the pin {pin}"
        return f"verified: the sha256 of every file, in {common.MANIFEST}"
    if not os.path.isfile(os.path.join(ckpt_dir, "config.json")):
        raise ValueError(f"{ckpt_dir} is not a Fast-dLLM checkpoint directory (no config.json)")
    if downloaded:
        return verify_hub_snapshot(ckpt_dir, allow_unverified, pin)
    missing = os.path.join(ckpt_dir, common.MANIFEST)
    why = _why_no_manifest(ckpt_dir)
    if not allow_unverified:
        raise ValueError(f"{missing} is missing ({why}), so no file of {ckpt_dir} can be verified; {way_out}, or load "
                         f"it unverified with {ALLOW_UNVERIFIED}")
    print(f"WARNING: {missing} is missing ({why}): loading {ckpt_dir} UNVERIFIED because of {ALLOW_UNVERIFIED}; "
          "a damaged or changed file goes unnoticed", file=sys.stderr)
    return f"not verified: no {common.MANIFEST} ({why}), loaded with {ALLOW_UNVERIFIED}"


def _why_no_manifest(ckpt_dir: str) -> str:
    """What the directory says about its missing manifest: our mark means it was written with one."""
    try:
        marked = [f for f in _weight_files(ckpt_dir) if _marked(f)]
    except (OSError, ValueError, TypeError, KeyError):  # no weights or a broken index: the loader says so
        marked = []
    if marked:
        return (f"its {os.path.basename(marked[0])} was written with one by fastdllm.model.save_fastdllm: it was "
                "deleted or lost")
    return "written by another tool, or before manifests, or its mark is damaged"


# -----------------------------------------------------------------------------
# hub cache snapshots: each file a link to a blob named by its hash; a pin records which blob each file must be


def verify_hub_snapshot(ckpt_dir: str, allow_unverified: bool = False, pin: str | None = None) -> str:
    """A hub cache snapshot links each file to a blob named by its content hash (sha256 for LFS files, git's blob
    sha1 for small ones): every file is checked against that name, and every file a load cannot do without
    (required_files) must be there. ValueError with one line naming the first file that differs, is no such link
    or is missing; allow_unverified loads it anyway, with a warning. This proves each file is the blob it links
    to, not that the blob is this file's: a link re-pointed to another blob of the cache passes. `pin` (write_pin)
    closes that: every file the loader reads must have the sha256 pinned, and no flag lets a difference through."""
    import common  # the same sha256 the manifests use
    sha256 = {name: common.file_sha256(os.path.join(ckpt_dir, name)) for name in _snapshot_files(ckpt_dir)}
    if pin is not None:  # first: allow_unverified must not skip it
        check_pin(ckpt_dir, pin, sha256)
    for name, digest in sha256.items():
        why = _blob_mismatch(os.path.join(ckpt_dir, name), digest)
        if why is not None:
            return _refuse_or_warn(ckpt_dir, os.path.join(ckpt_dir, name), why, allow_unverified)
    for name, holds in required_files(ckpt_dir).items():
        if name not in sha256:
            return _refuse_or_warn(ckpt_dir, os.path.join(ckpt_dir, name),
                                   f"is missing ({holds}), so the snapshot is incomplete", allow_unverified)
    if pin is not None:
        return (f"verified: every file the loader reads against the sha256 in the pin {pin}, and against its hub "
                "cache blob")
    return "verified: every file against the hash its hub cache blob is named by, none the loader needs missing"


def _snapshot_files(ckpt_dir: str) -> list[str]:
    """Every file under ckpt_dir, relative; a link to no file (its blob gone) counts as missing."""
    found = [os.path.relpath(os.path.join(d, f), ckpt_dir) for d, _, files in os.walk(ckpt_dir) for f in files]
    return sorted(f for f in found if os.path.isfile(os.path.join(ckpt_dir, f)))


def _blob_mismatch(path: str, sha256: str) -> str | None:
    """Why path is not the blob it links to (None when it is): the blob's name is its content hash."""
    from huggingface_hub.utils.sha import git_hash
    blob = os.path.realpath(path)
    want = os.path.basename(blob)
    if len(want) == 64:
        got = sha256
    elif len(want) == 40:  # git's blob sha1: the small, non-LFS files
        with open(blob, "rb") as f:
            got = git_hash(f.read())
    else:
        return "is not a link to a hub cache blob named by its hash"
    if got == want:
        return None
    return f"differs from the hash its hub cache blob is named by ({want[:12]}...): {blob} was changed or damaged"


def _refuse_or_warn(ckpt_dir: str, path: str, why: str, allow_unverified: bool) -> str:
    if not allow_unverified:
        raise ValueError(f"{path} {why}; delete the snapshot and download it again, or load it unverified "
                         f"with {ALLOW_UNVERIFIED}")
    print(f"WARNING: {path} {why}: loading {ckpt_dir} UNVERIFIED because of {ALLOW_UNVERIFIED}", file=sys.stderr)
    return f"not verified: {path} {why}, loaded with {ALLOW_UNVERIFIED}"


def _read_json(path: str) -> dict:
    """path's JSON object, or {} when it is missing or unreadable: the loader then refuses the file itself."""
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return d if isinstance(d, dict) else {}


def required_files(ckpt_dir: str) -> dict[str, str]:
    """The files of a snapshot a load cannot do without, each with what it holds. config.json; the weights as
    transformers and _weight_files read them (model.safetensors, or model.safetensors.index.json and every shard
    it names); tokenizer.json and tokenizer_config.json (without the latter the tokenizer loads, with no eos or
    pad token); chat_template.jinja unless tokenizer_config.json holds the template (the older layout), since
    without one the tokenizer loads with no template and fastdllm/prompt.py falls back to plain ChatML; the remote
    code config.json's auto_map names (train_fastdllm.py copies it into every checkpoint it saves). The other
    files loaded_files lists are read when present; a repository may not have them."""
    need = {"config.json": "the model's config", "tokenizer.json": "the tokenizer",
            "tokenizer_config.json": "the tokenizer's special tokens"}
    if os.path.isfile(os.path.join(ckpt_dir, WEIGHTS_INDEX)):
        need[WEIGHTS_INDEX] = "the index of the weight shards"
        weight_map = _read_json(os.path.join(ckpt_dir, WEIGHTS_INDEX)).get("weight_map")
        shards = weight_map.values() if isinstance(weight_map, dict) else ()
        need.update({s: "a weight shard its index names" for s in sorted(set(shards)) if isinstance(s, str)})
    else:
        need["model.safetensors"] = "the weights"
    if "chat_template" not in _read_json(os.path.join(ckpt_dir, "tokenizer_config.json")):
        need["chat_template.jinja"] = "the chat template"
    need.update({f: "remote code its config.json's auto_map names" for f in _remote_code(ckpt_dir)})
    return need


def _remote_code(ckpt_dir: str) -> list[str]:
    """The files of the modules config.json's auto_map names ("modeling.Fast_dLLM_QwenForCausalLM": modeling.py;
    a "repo--module.Class" entry lives in another repository)."""
    auto_map = _read_json(os.path.join(ckpt_dir, "config.json")).get("auto_map")
    if not isinstance(auto_map, dict):
        return []
    refs = [r for v in auto_map.values() for r in (v if isinstance(v, list) else [v])]  # AutoTokenizer: [slow, fast]
    return sorted({r.rsplit(".", 1)[0].replace(".", "/") + ".py" for r in refs
                   if isinstance(r, str) and "." in r and "--" not in r})


def loaded_files(ckpt_dir: str) -> list[str]:
    """Every file of ckpt_dir the loader reads, required or read when present: what a pin lists. transformers reads
    config.json, generation_config.json and model.safetensors (before an index); _weight_files the index and its
    shards; load_tokenizer_files every TOKENIZER_FILES name; train_fastdllm.py copies every *.py."""
    top = [n for n in os.listdir(ckpt_dir) if os.path.isfile(os.path.join(ckpt_dir, n))]
    read = {n for n in top if n in ("config.json", "generation_config.json", "model.safetensors", WEIGHTS_INDEX)
            or n.startswith(TOKENIZER_FILES) or n.endswith(".py")}
    return sorted(read | {n for n in required_files(ckpt_dir) if os.path.isfile(os.path.join(ckpt_dir, n))})


def _pin_digest(pin: dict) -> str:
    """sha256 of the pin's content (canonical JSON) without its own digest."""
    import hashlib
    body = {k: v for k, v in pin.items() if k != "pin_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def write_pin(name_or_path: str, out: str) -> dict:
    """Pin a hub snapshot (a hub id, or a path in the hub cache): check it first (check_files: each file against
    its blob's name, none the loader needs missing), then write `out`, the sha256 of every file the loader reads
    (loaded_files) and of the pin itself. Loads given pin=out refuse any file that differs. The pin vouches for the
    snapshot as it is now, not for what the hub serves: pin right after a download you trust. Returns the pin."""
    ckpt_dir = resolve_checkpoint(name_or_path)
    if not in_hub_cache(ckpt_dir):
        raise ValueError(f"{ckpt_dir} is not a snapshot in the hub cache: a local directory is verified against its "
                         "manifest.json, there is nothing to pin")
    try:
        check_files(ckpt_dir, downloaded=True)
    except ValueError as e:  # its way out is the loaders'
        raise ValueError(f"not pinned: {e}") from None
    import common
    # hashed a second time after the check: pinning is once per download
    pin = {"snapshot": os.path.realpath(ckpt_dir),
           "files": {name: common.file_sha256(os.path.join(ckpt_dir, name)) for name in loaded_files(ckpt_dir)}}
    pin["pin_sha256"] = _pin_digest(pin)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".tmp", "w") as f:
        json.dump(pin, f, indent=1, sort_keys=True)
    os.replace(out + ".tmp", out)
    return pin


def read_pin(path: str) -> dict:
    """A pin file (write_pin), checked before any entry is used: readable JSON, an object with exactly PIN_KEYS,
    its own sha256, 'files' names with sha256 digests. Else ValueError, one line naming the file."""
    way_out = f"write it again ({PIN_COMMAND})"
    try:
        with open(path) as f:
            pin = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"the pin {path} does not exist; write it with {PIN_COMMAND}") from None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"the pin {path} is damaged (not readable JSON: {type(e).__name__}); {way_out}") from None
    if not isinstance(pin, dict) or set(pin) != set(PIN_KEYS):
        got = sorted(pin) if isinstance(pin, dict) else type(pin).__name__
        raise ValueError(f"the pin {path} is damaged (a pin holds {', '.join(PIN_KEYS)}; this one {got}); {way_out}")
    if pin["pin_sha256"] != _pin_digest(pin):
        raise ValueError(f"the pin {path} is corrupted: its contents do not match the sha256 stored in it; {way_out}")
    files = pin["files"]
    if not (isinstance(files, dict) and files and all(
            isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in files.items())):
        raise ValueError(f"the pin {path} is damaged (its 'files' entry is not names and sha256 digests); {way_out}")
    return pin


def check_pin(ckpt_dir: str, pin: str, sha256: dict[str, str] | None = None) -> None:
    """Every file the pin lists is in ckpt_dir with its pinned sha256, and the loader reads no other: else ValueError,
    one line naming the file. sha256: the digests of ckpt_dir's files, when the caller has them."""
    import common
    files = read_pin(pin)["files"]
    again = f"delete the snapshot and download it again, or pin it again ({PIN_COMMAND}) if it changed on purpose"
    for name, want in sorted(files.items()):
        path = os.path.join(ckpt_dir, name)
        if not os.path.isfile(path):
            raise ValueError(f"{path} is missing, but the pin {pin} lists it; {again}")
        got = sha256[name] if sha256 is not None and name in sha256 else common.file_sha256(path)
        if got != want:
            raise ValueError(f"{path} differs from the pin {pin} (sha256 {got[:12]}..., pinned {want[:12]}...): it "
                             f"links to another blob, or its blob changed; {again}")
    unpinned = [name for name in loaded_files(ckpt_dir) if name not in files]
    if unpinned:
        raise ValueError(f"{os.path.join(ckpt_dir, unpinned[0])} is not in the pin {pin}, and the loader reads it; "
                         f"{again}")


# from_pretrained builds the model under a process-wide meta-device context: a module built meanwhile in another
# thread (a second load, or the relay LayerNorm) gets meta parameters and fails later with "Cannot copy out of meta tensor"
_FROM_PRETRAINED = threading.Lock()


def load_fastdllm(name_or_path: str, use_relay: bool | None = None, dtype: torch.dtype = torch.bfloat16,
                  device: str = "cpu", allow_unverified: bool = False,
                  pin: str | None = None) -> tuple[FastDLLM, PreTrainedTokenizerFast]:
    """Load a Fast-dLLM v2 checkpoint (local dir or hub id), with its tokenizer.

    use_relay=None follows the checkpoint; True on a checkpoint without relay weights attaches a
    fresh zero-initialised relay LayerNorm (the start of a Relay run); False drops them. The files are
    checked first (check_files: a local directory without manifest.json is refused unless allow_unverified;
    a hub snapshot against its blobs, and against the pin file `pin` when given, see write_pin);
    model.files_check says how, for the records of the run that loads it."""
    ckpt_dir = resolve_checkpoint(name_or_path)
    files_check = check_files(ckpt_dir, downloaded=not os.path.isdir(name_or_path) or in_hub_cache(ckpt_dir),
                              allow_unverified=allow_unverified, pin=pin)
    try:
        config = _config_from_json(os.path.join(ckpt_dir, "config.json"))
        files = _weight_files(ckpt_dir)
    except (OSError, ValueError, TypeError) as e:  # a directory that is not a (complete) checkpoint
        raise ValueError(f"{ckpt_dir} is not a readable Fast-dLLM checkpoint ({_first_line(e)})") from None
    with _FROM_PRETRAINED:
        lm = _qwen2_from_pretrained(ckpt_dir, config, dtype)
        model = FastDLLM(lm, use_relay=use_relay)
    model.files_check = files_check
    if model.relay_layer_norm is not None:
        found = {}
        for fname in files:
            with safe_open(fname, framework="pt") as f:
                for k in RELAY_KEYS:
                    if k in f.keys():
                        found[k.rsplit(".", 1)[1]] = f.get_tensor(k)
        if len(found) == 2:
            model.relay_layer_norm.load_state_dict(found)
        elif found:
            raise ValueError(f"{ckpt_dir} holds only part of the relay LayerNorm ({sorted(found)})")
        elif use_relay is None:
            raise ValueError(f"{ckpt_dir}/config.json says use_relay=True but the weights have no {RELAY_KEYS[0]}")
    model.to(device=device, dtype=dtype)
    tokenizer = load_tokenizer_files(ckpt_dir)
    check_tokenizer(tokenizer, model.config)
    return model, tokenizer


def _qwen2_from_pretrained(ckpt_dir: str, config: Qwen2Config, dtype: torch.dtype) -> Qwen2ForCausalLM:
    # the relay keys are not Qwen2's: silence transformers' "UNEXPECTED keys" report, we load them in load_fastdllm
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        dtype_kw = {"dtype": dtype} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": dtype}
        return Qwen2ForCausalLM.from_pretrained(ckpt_dir, config=config, attn_implementation="sdpa", **dtype_kw)
    except Exception as e:  # safetensors and transformers raise many kinds on a damaged file
        raise ValueError(f"cannot load the weights in {ckpt_dir} ({_first_line(e)})") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def load_tokenizer_files(ckpt_dir: str) -> PreTrainedTokenizerFast:
    """The checkpoint's tokenizer, read from its tokenizer files only. config.json stays out of reach on
    purpose: the released one has an auto_map, and transformers would stop to ask whether to run that
    remote code (or fail, since downloads here skip nothing but never import it)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for name in os.listdir(ckpt_dir):
            if name.startswith(TOKENIZER_FILES):
                os.symlink(os.path.abspath(os.path.join(ckpt_dir, name)), os.path.join(tmp, name))
        try:
            return AutoTokenizer.from_pretrained(tmp, trust_remote_code=False)
        except Exception as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ValueError(f"cannot load the tokenizer from {ckpt_dir}: {type(e).__name__}: {msg}") from None


def check_tokenizer(tokenizer, config) -> None:
    """The tokenizer must map |<MASK>| to the model's mask_token_id (151665 for Fast-dLLM v2)."""
    ids = tokenizer.convert_tokens_to_ids([MASK_TOKEN])
    if ids[0] is None or ids[0] == tokenizer.unk_token_id:
        # LMFlow adds it when missing; 151665 then lands inside the existing 151936-row embedding
        tokenizer.add_special_tokens({"additional_special_tokens": [MASK_TOKEN]})
        ids = tokenizer.convert_tokens_to_ids([MASK_TOKEN])
    if ids[0] != config.mask_token_id:
        raise ValueError(f"tokenizer maps {MASK_TOKEN} to {ids[0]} but the model's mask_token_id is {config.mask_token_id}")


def save_fastdllm(model: FastDLLM, tokenizer, out_dir: str, state_dict: dict | None = None,
                  remote_code_dir: str | None = None, info: dict | None = None) -> None:
    """Write config.json + model.safetensors (+ tokenizer files) in the released layout: config class
    names and auto_map of the released Fast_dLLM_Qwen checkpoints, use_relay / relay_layer / bd_size,
    the released tensor names. remote_code_dir: the parent checkpoint's directory; its *.py files (the
    authors' remote code) are copied alongside, so trust_remote_code users and the authors' tools load the
    result as the same model. We never import them.

    state_dict: pass a gathered full state dict when parameters are sharded (ZeRO-3); by
    default the model's own. The tied lm_head.weight is not stored (as transformers does).
    manifest.json comes last (common.write_manifest: the sha256 of every file, with `info`, e.g. the step), and
    model.safetensors says it has one (SHA256_IN): every loader verifies the directory (check_files)."""
    os.makedirs(out_dir, exist_ok=True)
    sd = model.state_dict() if state_dict is None else state_dict
    tied = getattr(model.config, "tie_word_embeddings", False)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in sd.items() if not (tied and k == "lm_head.weight")}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt", SHA256_IN[0]: SHA256_IN[1]})
    config = model.config.to_dict()
    config.update(RELEASED_ARCH)
    config["dtype"] = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    if remote_code_dir is not None:
        import shutil
        for name in sorted(os.listdir(remote_code_dir)):
            if name.endswith(".py"):
                shutil.copyfile(os.path.join(remote_code_dir, name), os.path.join(out_dir, name))
    import common  # the manifest rules shared with the resume state
    common.write_manifest(out_dir, info or {})


# -----------------------------------------------------------------------------
# tiny random model and local tokenizer for CPU tests and config/fastdllm_tiny.py


def make_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer, no merges: 256 byte symbols + the ChatML specials + |<MASK>|.

    Any text round-trips, so the data pipeline runs on real prompts; built locally (no hub)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    # alphabet() comes from an unordered set: sort it, or every call would number the bytes differently
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", MASK_TOKEN])
    fast.chat_template = CHAT_TEMPLATE
    return fast


TINY_CONFIG = dict(
    vocab_size=320,  # > len(make_tiny_tokenizer()) = 260, like Qwen's padded embedding
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=4096, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    hidden_act="silu", attention_dropout=0.0, use_sliding_window=False,
    bd_size=DEFAULT_BD_SIZE, relay_layer=-1,
)


# Efficient-Large-Model/Fast_dLLM_v2_1.5B's config.json (docs/fastdllm.md, "Model"), for random-weight runs
# such as memory profiling that need the real shapes but not the trained weights:
#   make_tiny_fastdllm(**FAST_DLLM_V2_1_5B)
FAST_DLLM_V2_1_5B = dict(
    vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
    num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645, pad_token_id=151645,
    mask_token_id=DEFAULT_MASK_ID, bd_size=DEFAULT_BD_SIZE,
)


def make_tiny_fastdllm(use_relay: bool = False, seed: int = 0, **overrides) -> FastDLLM:
    """Randomly initialised 2-layer Qwen2 (hidden 64, 4 heads, 2 kv heads) with the tiny tokenizer's
    special-token ids, in fp32. overrides: any Qwen2Config / Fast-dLLM field (e.g. bd_size=8)."""
    tok = make_tiny_tokenizer()
    ids = dict(mask_token_id=tok.convert_tokens_to_ids(MASK_TOKEN), bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
               eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    config = Qwen2Config(**{**TINY_CONFIG, **ids, **overrides, "use_relay": use_relay})
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return FastDLLM(Qwen2ForCausalLM(config), use_relay=use_relay)


# -----------------------------------------------------------------------------
# python -m fastdllm.model --pin=Efficient-Large-Model/Fast_dLLM_v2_1.5B --out=fast_dllm_v2_1.5b.pin.json


def main(argv: list[str] | None = None) -> None:
    import configurator
    p = configurator.ArgumentParser(prog="python -m fastdllm.model", allow_abbrev=False,
                                    description="Pin a hub cache snapshot: write the sha256 of every file the loader "
                                    "reads, for later loads' --pin (docs/reliability.md, Hub snapshots and pins).")
    p.add_argument("--pin", required=True, help="a hub id (its cached snapshot; downloaded when missing and online) "
                   "or a snapshot directory in the hub cache")
    p.add_argument("--out", required=True, help="the pin file (JSON) to write")
    args = p.parse_args(argv)
    try:
        pin = write_pin(args.pin, args.out)
    except ValueError as e:
        raise SystemExit(f"python -m fastdllm.model: {e}") from None
    except OSError as e:  # --out in an unwritable place
        raise SystemExit(f"python -m fastdllm.model: --out={args.out}: {_first_line(e)}") from None
    print(f"wrote {args.out}: the sha256 of {len(pin['files'])} files of {pin['snapshot']}")


if __name__ == "__main__":
    main()
