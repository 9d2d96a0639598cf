"""What both experiments share (train_sudoku.py, train_fastdllm.py, sample.py, eval_code.py, ...), in three
sections: docs/reliability.md.

Devices
- `pick_device` / `uses_bf16`: device `auto` means CUDA, then Apple's MPS, then the CPU; dtype `auto`
  means bf16 autocast on CUDA and fp32 elsewhere.

Checkpoint files that say when they are damaged
- `save_checkpoint` / `load_checkpoint`: torch.save writes an uncompressed zip whose tensor records
  torch.load reads without checking their CRC, so a flipped byte in a weight loads silently.
  save_checkpoint therefore stores `checksum` = sha256 over every entry of the checkpoint (tensors: name,
  dtype, shape and raw bytes; other values: their repr), walked in sorted key order, and load_checkpoint
  recomputes it.
- `save_weights` / `load_weights` / `load_model`: the Sudoku model's files (a train_sudoku.py checkpoint
  or a .safetensors file that carries the sha256 of its tensors and metadata, checked on load); model.py
  holds only the architecture.

One run per out_dir, for both trainers
- `hold(out_dir, patterns, ...)`: refuse a fresh run over an existing one (unless overwrite) and a resume
  with nothing to resume, then hold `out_dir/run.lock` while the run trains. Under torchrun only rank 0
  checks and locks (for every rank); a lock left by a killed run is detected and replaced.
- `ResumeRules` / `resume_config`: which config keys a resume may change, and the record of what did.
- `write_manifest` / `read_manifest` / `verify_manifest` / `swap_in` / `recover`: a directory of files
  (Fast-dLLM's resume state, sharded under DeepSpeed, and its ckpt-N/ checkpoints) written so that a kill
  during a save never leaves a state that loads as valid but wrong, with a sha256 per file and one of the
  manifest itself, checked on load.
- `BatchOrder`: the data order of both trainers: every example once per epoch, a fresh order each
  epoch, nothing dropped at an epoch's end.
- `drop_records_after`: metrics.jsonl after a kill lists every step once.
"""
import fnmatch
import hashlib
import json
import os
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np
import torch

from model import SudokuTransformer, model_from_checkpoint, model_from_config


# =============================================================================
# devices
# =============================================================================


def pick_device(name: str, allow_mps: bool = True) -> str:
    """The device a run asked for; `auto` resolves to cuda, mps (when allow_mps) or cpu, in that order."""
    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if allow_mps and torch.backends.mps.is_available() else "cpu"


def uses_bf16(dtype: str, device_type: str) -> bool:
    """Whether a run with this dtype setting (auto | bfloat16 | float32) runs under bf16 autocast: auto
    does on CUDA (the paper's runs), not elsewhere (bf16 is slow on CPUs without avx512_bf16)."""
    return dtype == "bfloat16" or (dtype == "auto" and device_type == "cuda")


# =============================================================================
# checkpoint files
# =============================================================================

CHECKSUM_KEY = "checksum"
# every entry a train_sudoku.py checkpoint has held, before checksums and since
CHECKPOINT_KEYS = {"model", "model_config", "config", "ema", "optimizer", "step", "data_pos", "train_seconds",
                   "rank_state", "metrics", CHECKSUM_KEY}


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


def load_checkpoint(path: str, map_location="cpu", required: tuple[str, ...] = (), allow_unverified: bool = False
                    ) -> dict:
    """torch.load (weights only) + checksum check; CheckpointError with one line on any problem.

    required: keys the checkpoint must have (a file from another program lacks them). A checkpoint without a
    checksum (written before checksums existed, or with its entry lost) is refused unless allow_unverified
    (scripts/sudoku/export_reference.py --allow_unverified: a verified copy of a file you trust)."""
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
    if saved is None and set(ckpt) - CHECKPOINT_KEYS:  # e.g. a flipped byte in the name "checksum" itself
        raise CheckpointError(f"{path} has no checksum and entries train_sudoku.py never writes "
                              f"({', '.join(sorted(map(repr, set(ckpt) - CHECKPOINT_KEYS)))}): it is damaged, or not "
                              "a train_sudoku.py checkpoint; restore it from a copy or retrain")
    if saved is None and not allow_unverified:
        raise CheckpointError(f"{path} has no checksum (written before checksums were added, or its entry is lost): "
                              "its bytes cannot be verified; restore it from a copy, or export a verified copy of a file "
                              f"you trust: python scripts/sudoku/export_reference.py --ckpt={path} --out=NEW.safetensors "
                              "--allow_unverified")
    if saved is None:
        print(f"warning: {path} has no checksum; its bytes are NOT verified (--allow_unverified)", file=sys.stderr)
    elif saved != checksum(ckpt):
        raise CheckpointError(f"{path} is corrupted: its contents do not match the sha256 checksum stored in it; "
                              "restore it from a copy or retrain")
    return ckpt


# -----------------------------------------------------------------------------
# the Sudoku model's files: a train_sudoku.py checkpoint (checksummed, above) or a .safetensors file
# (model.py holds the architecture only, so that it can be copied with relay.py alone)


WEIGHTS_DIGEST = "sha256"  # the metadata entry of a save_weights file that holds its digest


def weights_digest(state: dict[str, torch.Tensor], metadata: dict[str, str]) -> str:
    """sha256 over every tensor (name, dtype, shape, bytes) and every metadata entry but the digest itself, in
    sorted order: safetensors checks only the header's layout, so a flipped byte in a weight reads back silently."""
    h = hashlib.sha256()
    _feed(h, "tensors", state)
    _feed(h, "metadata", {k: v for k, v in metadata.items() if k != WEIGHTS_DIGEST})
    return h.hexdigest()


def save_weights(model: SudokuTransformer, path: str, metadata: dict[str, str]) -> None:
    """Weights only, as safetensors: fp32 tensors plus the model config, `metadata` (str -> str) and their
    digest (weights_digest), written to path.tmp then renamed."""
    from safetensors.torch import save_file
    # clone: tied embeddings are one tensor under two names, which safetensors refuses to write (on a GPU
    # .cpu() copies them apart; on the CPU nothing else would)
    state = {k: v.detach().float().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    meta = {**metadata, "model_config": json.dumps(asdict(model.config))}
    meta[WEIGHTS_DIGEST] = weights_digest(state, meta)
    save_file(state, path + ".tmp", metadata=meta)
    os.replace(path + ".tmp", path)


def read_weights(path: str, allow_unverified: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of a safetensors file, its digest verified; ValueError with one line naming
    the file on any problem. save_weights puts model_config in every file, so a file that has it but no digest
    is damaged (the digest's name changed, e.g. sha256 -> sha257) or an export from before digests: refused,
    unless allow_unverified (scripts/sudoku/export_reference.py --allow_unverified writes such a file again with
    a digest), which loads it with a warning."""
    from safetensors import safe_open
    fix = "restore it from a copy (git checkout for reference/) or export it again (scripts/sudoku/export_reference.py)"
    try:
        with safe_open(path, "pt") as f:
            meta = dict(f.metadata() or {})
            state = {k: f.get_tensor(k) for k in f.keys()}
    except BaseException as e:  # safetensors' Rust panics derive from BaseException, not Exception
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ValueError(f"{path} is not a readable safetensors file ({detail}): {fix}") from None
    saved = meta.get(WEIGHTS_DIGEST)
    if saved is not None:
        if saved != weights_digest(state, meta):
            raise ValueError(f"{path} is corrupted: its weights or metadata do not match the sha256 stored in it; {fix}")
    elif allow_unverified:
        print(f"warning: {path} carries no sha256: its weights are not verified", file=sys.stderr)
    elif "model_config" in meta:  # (a file without it is no save_weights file: load_weights refuses it)
        raise ValueError(f"{path} has no sha256 although common.save_weights wrote it (its metadata has model_config): "
                         "its digest entry is damaged, or it was exported before digests were added; restore it from a "
                         "copy (git checkout for reference/), or give an older export a digest: python "
                         f"scripts/sudoku/export_reference.py --ckpt={path} --out=NEW.safetensors --allow_unverified")
    return state, meta


def load_weights(path: str, device: str = "cpu", allow_unverified: bool = False) -> tuple[SudokuTransformer, dict]:
    """Load a save_weights file in eval mode. Returns (model, metadata with "config" parsed if present).
    allow_unverified: see read_weights."""
    state, meta = read_weights(path, allow_unverified)
    meta.pop(WEIGHTS_DIGEST, None)
    if "model_config" not in meta:
        raise ValueError(f"{path} has no model_config in its metadata: not written by common.save_weights")
    try:
        model = model_from_config(json.loads(meta.pop("model_config")))
        model.load_state_dict(state)
        meta["config"] = json.loads(meta.get("config", "{}"))
    except (ValueError, TypeError, RuntimeError, KeyError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        detail = "; ".join(line.strip() for line in str(e).splitlines()[1:3] if line.strip())
        raise ValueError(f"{path}: not the weights of a Sudoku model of this repository ({first} {detail})".strip()) \
            from None
    return model.to(device).eval(), meta


def load_model(path: str, device: str = "cpu", ema: bool = True) -> tuple[SudokuTransformer, dict]:
    """Load a train_sudoku.py checkpoint (out_dir or a .pt file) or a .safetensors file in eval mode.

    Uses the EMA weights when the checkpoint has them and ema=True (as the paper's evaluation did),
    else the raw weights. A .safetensors file holds one set of weights (the reference models hold
    their EMA weights). Returns (model, run_config_dict).
    """
    if path.endswith(".safetensors"):
        model, meta = load_weights(path, device)
        return model, meta["config"]
    if os.path.isdir(path):
        path = os.path.join(path, "ckpt.pt")
    if not os.path.exists(path):
        raise ValueError(f"no checkpoint at {path}: train one with `python train_sudoku.py config/cpu_mlm.py`")
    ckpt = load_checkpoint(path, map_location=device, required=("model", "model_config"))
    return model_from_checkpoint(ckpt, device, ema), dict(ckpt.get("config", {}))


# =============================================================================
# the run directory
# =============================================================================

LOCK_FILE = "run.lock"
MANIFEST = "manifest.json"


# -----------------------------------------------------------------------------
# the lock


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True


def lock_holder(out_dir: str) -> str | None:
    """Who holds out_dir's lock ("pid N on HOST"), or None: no lock, or a stale one whose process is gone."""
    path = os.path.join(out_dir, LOCK_FILE)
    try:
        with open(path) as f:
            pid_text, host = (f.read().split() + ["", ""])[:2]
        age = time.time() - os.path.getmtime(path)
    except FileNotFoundError:
        return None
    if not pid_text.isdigit():  # a run between creating the file and writing its pid, or debris of a crash
        return "a run that is just starting" if age < 10 else None
    if host != socket.gethostname():
        return f"pid {pid_text} on {host} (another machine: delete {path} if that run is dead)"
    if int(pid_text) == os.getpid():
        return None  # this process: its own lock is no other run
    return f"pid {pid_text} on {host}" if pid_alive(int(pid_text)) else None


def in_use(out_dir: str, holder: str) -> str:
    return f"out_dir={out_dir} is in use by another run ({holder}); wait for it to finish or choose another out_dir"


def acquire_lock(out_dir: str) -> str:
    """Create out_dir and its lock file (O_EXCL: of two runs at once, exactly one succeeds); a stale lock
    left by a killed run is replaced. Returns the lock's path."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"out_dir={out_dir}: cannot create it ({e.strerror})") from None
    path = os.path.join(out_dir, LOCK_FILE)
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = lock_holder(out_dir)
            if holder is not None:
                raise SystemExit(in_use(out_dir, holder)) from None
            print(f"replacing the stale lock {path}: the run that held it is no longer running")
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            continue
        except OSError as e:
            raise SystemExit(f"out_dir={out_dir}: cannot write its lock file ({e.strerror})") from None
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()} {socket.gethostname()}\n")
        return path
    raise SystemExit(f"out_dir={out_dir}: could not take its lock {path}; another run is starting there")


def release_lock(path: str) -> None:
    try:
        with open(path) as f:
            mine = f.read().split()[:1] == [str(os.getpid())]
        if mine:
            os.remove(path)
    except FileNotFoundError:
        pass


# -----------------------------------------------------------------------------
# the run directory


def run_files(out_dir: str, patterns: tuple[str, ...]) -> list[str]:
    """The names in out_dir that match one of `patterns` (fnmatch), sorted: what makes it hold a run."""
    if not os.path.isdir(out_dir):
        return []
    return sorted(name for name in os.listdir(out_dir) if any(fnmatch.fnmatch(name, p) for p in patterns))


def folder_problem(path: str) -> str | None:
    """Why `path` cannot be a directory to write in ("is a file, not a directory", "is under the file F",
    "is under F, which is not writable"), or None; checked before any work, nothing written."""
    full = os.path.abspath(path)
    existing = full
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return "is a file, not a directory" if existing == full else f"is under the file {existing}"
    if not os.access(existing, os.W_OK):
        return "is not writable" if existing == full else f"is under {existing}, which is not writable"
    return None


def check_run_dir(out_dir: str, patterns: tuple[str, ...], resume: bool, overwrite: bool, resume_path: str) -> None:
    """Refuse, before any work, an out_dir this run must not write to: a file, a directory another live
    run holds, or (without resume/overwrite) one that holds a run a fresh start would destroy."""
    problem = folder_problem(out_dir)
    if problem:
        raise SystemExit(f"out_dir={out_dir} {problem}; choose another out_dir")
    holder = lock_holder(out_dir)
    if holder is not None:
        raise SystemExit(in_use(out_dir, holder))
    if resume and overwrite:
        raise SystemExit("resume=True continues the run in out_dir and overwrite=True deletes it: pass one of them")
    found = run_files(out_dir, patterns)
    if resume and not resumable(resume_path):
        if found:  # a run killed before its first checkpoint: it can only start again
            raise SystemExit(f"resume=True but there is no {resume_path}: the run in out_dir={out_dir} stopped before its "
                             f"first checkpoint; start it afresh with --overwrite=True (deletes {', '.join(found)}) "
                             "instead of --resume, or choose another out_dir")
        raise SystemExit(f"resume=True but there is no {resume_path}; drop --resume to start a new run")
    if found and not resume and not overwrite:
        if not resumable(resume_path):
            raise SystemExit(f"out_dir={out_dir} already holds a run ({', '.join(found)}) that stopped before its first "
                             "checkpoint: pass --overwrite=True to delete it and start afresh, or choose another out_dir")
        raise SystemExit(f"out_dir={out_dir} already holds a run ({', '.join(found)}): continue it with --resume=True, "
                         "or pass --overwrite=True to delete it and start afresh, or choose another out_dir")


def resumable(path: str) -> bool:
    """A resume state is at path, or recover() can put one there."""
    return os.path.exists(path) or any(os.path.isfile(os.path.join(path + end, MANIFEST)) for end in (".tmp", ".old"))


def remove_run_files(out_dir: str, patterns: tuple[str, ...]) -> None:
    """overwrite=True: forget the previous run of out_dir (files and directories matching `patterns`)."""
    for name in run_files(out_dir, patterns):
        path = os.path.join(out_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
        print(f"overwrite=True: removed {path}")


def rank() -> int:
    """This process's rank under torchrun / DeepSpeed (0 for a plain process)."""
    return int(os.environ.get("RANK", 0))


@contextmanager
def hold(out_dir: str, patterns: tuple[str, ...], resume: bool, overwrite: bool, resume_path: str):
    """Check out_dir and hold its lock while the body runs. Rank 0 does both for every rank (a second
    rank taking the lock would find rank 0's and refuse). A run that fails before writing anything
    removes the out_dir it created, so a refused command leaves no trace."""
    if rank() != 0:
        yield
        return
    check_run_dir(out_dir, patterns, resume, overwrite, resume_path)
    created = not os.path.isdir(out_dir)
    lock = acquire_lock(out_dir)
    try:
        # again, under the lock: a run may have finished here since the first check
        check_run_dir(out_dir, patterns, resume, overwrite, resume_path)
        if resume:
            recover(resume_path)
        yield
    finally:
        release_lock(lock)
        if created and not os.listdir(out_dir):
            os.rmdir(out_dir)


# -----------------------------------------------------------------------------
# resume: what may change, and the record of what did


@dataclass(frozen=True)
class ResumeRules:
    """may_change: the budget and the save cadence (extending a run is routine); not_compared: where and
    how the run executes and logs; fixed: keys the saved tensors only fit, refused even with
    allow_config_change. Every other key is a hyperparameter: refused unless allow_config_change."""
    may_change: tuple[str, ...]
    not_compared: tuple[str, ...]
    fixed: tuple[str, ...]


def resume_config(saved: dict, now: dict, default: dict, step: int, rules: ResumeRules, allow_change: bool,
                  path: str) -> dict:
    """The run config of a resumed run: the saved one with the changes this run makes. A changed key a
    resume may not change is refused with one line; every accepted change is appended to
    config["history"] with the step it takes effect from. default: the values of a key newer than the
    saved config (the run ran with them)."""
    changed = {}
    for key, value in now.items():
        old = saved.get(key, default[key])
        if key in rules.not_compared or old == value:
            continue
        if key in rules.fixed or (key not in rules.may_change and not allow_change):
            hint = ("the checkpoint's weights and state only fit its value: pass it, or start a new run with "
                    "--overwrite=True or in another out_dir" if key in rules.fixed else
                    "pass the checkpoint's value, or --allow_config_change=True to go on with the new one, or start "
                    "a new run with --overwrite=True or in another out_dir")
            raise SystemExit(f"resume: {key} changed: {path} has {key}={old!r}, this run {key}={value!r}; {hint}")
        changed[key] = [old, value]
    run_config = saved | {key: new for key, (_, new) in changed.items()}
    if changed:
        run_config["history"] = list(saved.get("history", [])) + [{"step": step, "changed": changed}]
    return run_config


# -----------------------------------------------------------------------------
# a resume state that is a directory: complete or absent, never half


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def directory_files(path: str) -> list[str]:
    """Every file under path (relative, sorted), the manifest excepted."""
    found = [os.path.relpath(os.path.join(d, f), path) for d, _, files in os.walk(path) for f in files]
    return sorted(f for f in found if f != MANIFEST)


MANIFEST_DIGEST = "manifest_sha256"  # the manifest's digest of itself


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest's content (canonical JSON) without its own digest."""
    body = {k: v for k, v in manifest.items() if k != MANIFEST_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def write_manifest(path: str, info: dict) -> None:
    """Write path/manifest.json last, once every file of the state is complete: `info` (step, config,
    ...), the sha256 of every file and the manifest's own sha256. Its presence marks the directory as complete."""
    manifest = dict(info, files={name: file_sha256(os.path.join(path, name)) for name in directory_files(path)})
    manifest[MANIFEST_DIGEST] = manifest_digest(manifest)
    tmp = os.path.join(path, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, os.path.join(path, MANIFEST))


# the entries a manifest must have, by its `info`: checked before any value is used
MANIFEST_FIELDS = {"files": dict, "step": int, "world": int, "config": dict}
MANIFEST_KEYS = set(MANIFEST_FIELDS) | {MANIFEST_DIGEST}  # all a manifest ever holds


def read_manifest(path: str, fields: tuple[str, ...] = ("files", "step", "world", "config"),
                  way_out: str = "restore it from a copy, or start afresh (--overwrite=True or another out_dir)") -> dict | None:
    """path/manifest.json, checked: readable JSON, its own sha256 (manifests written before it had one: a
    warning), and each of `fields` of the right type; None when there is no manifest (a state written before
    manifests existed). Anything else raises CheckpointError, one line naming the file and `way_out`."""
    file = os.path.join(path, MANIFEST)
    try:
        with open(file) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise CheckpointError(f"{file} is damaged (not readable JSON: {type(e).__name__}); {way_out}") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{file} is damaged (not a JSON object); {way_out}")
    unknown = set(manifest) - MANIFEST_KEYS
    if unknown:  # e.g. a flipped byte in the name of the digest entry itself
        raise CheckpointError(f"{file} is damaged (entries a manifest never has: {', '.join(sorted(unknown))}); {way_out}")
    saved = manifest.get(MANIFEST_DIGEST)
    if saved is None:
        print(f"warning: {file} carries no sha256 of its own (written before manifests had one): it is not verified",
              file=sys.stderr)
    elif saved != manifest_digest(manifest):
        raise CheckpointError(f"{file} is corrupted: its contents do not match the sha256 stored in it; {way_out}")
    for key in fields:
        kind = MANIFEST_FIELDS[key]
        value = manifest.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
            raise CheckpointError(f"{file} is damaged (its {key!r} entry is {value!r}, not a {kind.__name__}); {way_out}")
    files = manifest["files"] if "files" in fields else {}
    if not all(isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in files.items()):
        raise CheckpointError(f"{file} is damaged (its 'files' entry is not a list of names and sha256 digests); {way_out}")
    return manifest


def verify_manifest(path: str, manifest: dict, way_out: str = "restore it from a copy or retrain") -> None:
    """Every file the manifest lists exists with its sha256, and no other file is there: else CheckpointError."""
    files = directory_files(path)
    listed = manifest["files"]
    if sorted(listed) != files:
        missing, extra = sorted(set(listed) - set(files)), sorted(set(files) - set(listed))
        raise CheckpointError(f"{path} does not hold the files its manifest lists (missing {missing}, "
                         f"unexpected {extra}); {way_out}")
    for name in files:
        if file_sha256(os.path.join(path, name)) != listed[name]:
            raise CheckpointError(f"{os.path.join(path, name)} is corrupted: its contents do not match the sha256 "
                             f"in {MANIFEST}; {way_out}")


def swap_in(tmp: str, final: str) -> None:
    """Make the complete directory `tmp` the new `final`: final -> final.old, tmp -> final, remove
    final.old. A kill between the two renames leaves no `final`; recover() then finds the state."""
    old = final + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(final):
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def recover(final: str) -> None:
    """After a kill between swap_in's renames there is no `final`: the complete `final.tmp` (it has its
    manifest) is the newer state, else `final.old` the previous one. The other is then debris."""
    if os.path.exists(final):
        return
    tmp, old = final + ".tmp", final + ".old"
    for candidate in (tmp, old):
        if os.path.isfile(os.path.join(candidate, MANIFEST)):
            print(f"{final} is missing (a save was interrupted): using the complete {candidate}")
            os.replace(candidate, final)
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
            return


# -----------------------------------------------------------------------------
# data order and the metrics log


class BatchOrder:
    """Rows of each global batch: a fresh permutation per epoch that is a pure function of
    (seed, epoch), so resuming needs only the sample position. A batch that crosses an epoch's end
    takes the rest of that epoch and the start of the next: every row is seen once per epoch and none
    is dropped. The current epoch's permutation is cached (3.8M rows take ~0.1 s to permute)."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch, self.perm = n, seed, -1, None

    def rows(self, pos: int, batch_size: int) -> np.ndarray:
        rows = []
        while len(rows) < batch_size:
            epoch, off = divmod(pos, self.n)
            if epoch != self.epoch:
                self.epoch, self.perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n)
            take = self.perm[off: off + batch_size - len(rows)]
            rows.extend(take.tolist())
            pos += len(take)
        return np.asarray(rows)


def _parsed(lines: list[str]):
    """(line, record) for every line of metrics.jsonl that parses; a line cut short by a kill mid-write
    does not."""
    for line in lines:
        try:
            yield line, json.loads(line)
        except ValueError:
            continue


def read_records(log_path: str) -> list[dict]:
    """The readable records of metrics.jsonl, in order (none when the file does not exist)."""
    if not os.path.exists(log_path):
        return []
    with open(log_path) as f:
        return [record for _, record in _parsed(f.readlines())]


def drop_records_after(log_path: str, step: int) -> None:
    """Forget the log lines of steps after the checkpoint: a run killed between two checkpoints logged
    steps it is about to redo, and metrics.jsonl must list every step once."""
    if not os.path.exists(log_path):
        return
    with open(log_path) as f:
        lines = f.readlines()
    kept = [line if line.endswith("\n") else line + "\n"
            for line, record in _parsed(lines) if record["step"] <= step]
    if kept != lines:
        tmp = log_path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(kept)
        os.replace(tmp, log_path)  # a kill during the rewrite keeps the old log whole


def append_record(log_path: str, record: dict) -> None:
    with open(log_path, "a") as f:
        f.write(json.dumps(record) + "\n")
