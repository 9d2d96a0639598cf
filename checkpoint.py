"""Checkpoint files that say when they are damaged: a sha256 checksum in the checkpoint, checked on load.

torch.save writes an uncompressed zip whose tensor records torch.load reads without checking their
CRC, so a flipped byte in a weight loads silently. save_checkpoint therefore stores
`checksum` = sha256 over every entry of the checkpoint (tensors: name, dtype, shape and raw bytes;
other values: their repr), walked in sorted key order, and load_checkpoint recomputes it.
See docs/reliability.md.
"""
import hashlib
import os
import sys

import torch

CHECKSUM_KEY = "checksum"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line naming the file."""


def _feed(h: "hashlib._Hash", name: str, value) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"{name}:tensor:{t.dtype}:{tuple(value.shape)}:".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        h.update(f"{name}:dict:{len(value)}:".encode())
        for key in sorted(value, key=repr):
            _feed(h, f"{name}/{key!r}", value[key])
    elif isinstance(value, (list, tuple)):
        h.update(f"{name}:{type(value).__name__}:{len(value)}:".encode())
        for i, item in enumerate(value):
            _feed(h, f"{name}/{i}", item)
    else:  # int, float, str, bool, None, torch.Size ...
        h.update(f"{name}:{type(value).__name__}:{value!r};".encode())


def checksum(ckpt: dict) -> str:
    """sha256 hex digest of every entry of `ckpt` except the checksum itself, in a fixed order."""
    h = hashlib.sha256()
    _feed(h, "", {k: v for k, v in ckpt.items() if k != CHECKSUM_KEY})
    return h.hexdigest()


def save_checkpoint(ckpt: dict, path: str) -> None:
    """torch.save with the checksum added, written to path.tmp then renamed: a crash mid-write never
    leaves a truncated file at `path`."""
    tmp = path + ".tmp"
    torch.save(ckpt | {CHECKSUM_KEY: checksum(ckpt)}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str, map_location="cpu", required: tuple[str, ...] = ()) -> dict:
    """torch.load (weights only) + checksum check; CheckpointError with one line on any problem.

    required: keys the checkpoint must have (a file from another program lacks them). A checkpoint
    written before checksums existed loads with a warning on stderr."""
    if os.path.isdir(path):
        raise CheckpointError(f"{path} is a directory, not a checkpoint file")
    if not os.path.exists(path):
        raise CheckpointError(f"no checkpoint at {path}")
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): not a checkpoint")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated zip, foreign pickle, ...: torch raises many types
        detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise CheckpointError(f"cannot read checkpoint {path} ({type(e).__name__}{': ' + detail if detail else ''})") from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} holds a {type(ckpt).__name__}, not a checkpoint dict")
    missing = [k for k in required if k not in ckpt]
    if missing:
        raise CheckpointError(f"{path} is not a train_sudoku.py checkpoint (no {', '.join(map(repr, missing))} entries)")
    saved = ckpt.get(CHECKSUM_KEY)
    if saved is None:
        print(f"warning: {path} has no checksum (written before checksums were added); its bytes are not verified",
              file=sys.stderr)
    elif saved != checksum(ckpt):
        raise CheckpointError(f"{path} is corrupted: its contents do not match the sha256 checksum stored in it; "
                              "restore it from a copy or retrain")
    return ckpt
