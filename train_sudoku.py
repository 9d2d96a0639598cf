"""Train a Sudoku MDM with one of the four objectives of Table 1: mlm, rollout, relay_sg, relay.

    python prepare_data.py                                     # once: data/sudoku
    python prepare_data.py --source=hf --out_dir=data/sudoku-extreme   # once: the paper configs' data
    python train_sudoku.py config/relay_tied.py --seed=2       # the paper's run (one GPU, bf16)
    python train_sudoku.py config/cpu_relay.py                 # a small run that learns on a laptop CPU
    python train_sudoku.py config/cpu_relay.py --resume=True   # continue out_dir/ckpt.pt exactly
    python train_sudoku.py config/cpu_relay.py --init_from=out/cpu_mlm   # adapt an MLM checkpoint
    python train_sudoku.py config/cpu_relay.py --init_from=reference/relay.safetensors   # from a shipped model
    torchrun --standalone --nproc_per_node=2 train_sudoku.py config/cpu_mlm.py   # DDP

Config: the TrainConfig fields below (preset files + --key=value, see configurator.py). The loop
(train_locked: setup -> train_step -> evaluate / save) is explicit: AdamW, linear warmup then constant, clip, EMA of the weights (used for evaluation and
saved), validation by confidence decoding at tau=0.15 every eval_interval steps, atomic checkpoints
that hold everything needed to resume bit-exactly on CPU. A run holds out_dir locked, never starts
afresh over another run (--overwrite=True to replace one), refuses changed hyperparameters on resume
(--allow_config_change=True to accept and record them) and checks its checkpoint's sha256: the rules
of common.py, shared with train_fastdllm.py (docs/reliability.md).
"""
import copy
import json
import math
import os
import random
import re
import sys
import time
import types
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import common
from common import CheckpointError, load_checkpoint, pick_device, save_checkpoint, uses_bf16
from configurator import ConfigError, config_to_dict, load_config, print_config
from model import ModelConfig, SudokuTransformer
from relay import RolloutBuffer
from sudoku.decode import decode_boards, is_legal
from sudoku.board import MASK
import sudoku.data
# the step and the state it works on, in sudoku/step.py: sudoku/cuda_graph.py replays the same body
from sudoku.step import EMA, SudokuRun, lr_at, make_loss_fn, train_step  # noqa: F401 (lr_at: ts.lr_at stays the schedule)

OBJECTIVES = ("mlm", "rollout", "relay_sg", "relay")


@dataclass
class TrainConfig:
    # I/O
    out_dir: str = "out/sudoku"
    data_dir: str = "data/sudoku"
    paper_config: bool = False  # set by the eight Table 1 presets: data_dir must hold the hub's Sudoku-Extreme
    allow_any_data: bool = False  # let a paper config train on other data (tests, smoke runs); not comparable with the paper
    eval_interval: int = 5000  # steps between validations, each saving ckpt.pt (as nanoGPT); 0 = only at the end
    keep_interval: int = 0  # also keep the EMA weights every this many steps: out_dir/kept/step_N.safetensors (0 = off)
    eval_split: str = "val"  # prepared split for validation (the authors validated on the test split)
    eval_puzzles: int = 2048  # its first puzzles used (paper: 51,200)
    eval_batch_size: int = 512
    log_interval: int = 100
    resume: bool = False  # continue out_dir/ckpt.pt: model, EMA, optimizer, step, RNG, data position, buffer
    overwrite: bool = False  # start afresh in an out_dir that holds a run, deleting its ckpt.pt and metrics.jsonl
    allow_config_change: bool = False  # resume with changed hyperparameters (recorded in the config's history)
    init_from: str = ""  # start from another run's checkpoint (dir or .pt) with a fresh optimizer
    init_from_ema: bool = True  # take the parent's EMA weights (what its evaluation used)
    wandb_log: bool = False
    wandb_project: str = "relay-sudoku"
    wandb_run_name: str = ""
    # objective
    objective: str = "relay"  # mlm | rollout | relay_sg | relay
    K: int = 2  # rollout steps per optimizer step (truncated BPTT window)
    train_tau: float = 0.15  # training threshold tau = max(0, train_tau + train_tau_sigma * eps) per step
    train_tau_sigma: float = 0.1
    buffer_init: str = "cold"  # cold (paper: refilled slots start all-masked) | staggered
    eval_tau: float = 0.15
    eval_max_steps: int = 64
    stop_on_collapse: bool = False  # stop at a collapsed validation (collapse_message): exact and legal 0, not learning
    # model
    n_layer: int = 4
    n_head: int = 6
    n_embd: int = 384
    d_ff: int = 1536
    dropout: float = 0.1
    tie_embeddings: bool = False
    pos_emb: bool = False  # learned absolute positions: not in the paper, used by the CPU presets (see model.py)
    # optimisation
    batch_size: int = 512  # global: split over DDP ranks (train_fastdllm.py: device_batch_size per device)
    max_iters: int = 300_000
    max_minutes: float = 0.0  # also stop after this much training time (evaluation excluded); 0 = no limit
    learning_rate: float = 5e-4
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    warmup_iters: int = 2000
    grad_clip: float = 0.5  # 0 = off
    ema_decay: float = 0.9999  # 0 = no EMA (evaluate and save the raw weights only)
    # system
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto (bf16 autocast on CUDA, fp32 elsewhere) | bfloat16 | float32
    compile: bool = False  # the training step's loss region as one torch.compile graph (DDP: the model only)
    cuda_graph: bool = False  # CUDA, one process: the whole step (draws, loss, backward, clip, AdamW, EMA) replayed
    # as one CUDA graph, so that the host only launches it (sudoku/cuda_graph.py); the same steps in distribution,
    # not bit for bit: its draws come from the device's default generator
    seed: int = 1  # the first of Table 1's seeds 1, 2, 3 (train_fastdllm.py's default is the authors' 42)


# -----------------------------------------------------------------------------
# helpers


def check_config(cfg: TrainConfig) -> None:
    check_ranges(cfg)
    if cfg.objective not in OBJECTIVES:
        raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, got {cfg.objective!r}")
    if cfg.buffer_init not in ("cold", "staggered"):
        raise ConfigError(f"buffer_init must be cold or staggered, got {cfg.buffer_init!r}")
    if cfg.dtype not in ("auto", "bfloat16", "float32"):
        raise ConfigError(f"dtype must be auto, bfloat16 or float32, got {cfg.dtype!r}")
    if not 1 <= cfg.K <= 8:
        raise ConfigError(f"K must be between 1 and 8, got {cfg.K}")
    if cfg.batch_size < 1 or cfg.max_iters < 0 or cfg.n_embd % cfg.n_head:
        raise ConfigError("need batch_size >= 1, max_iters >= 0 and n_embd divisible by n_head")
    if cfg.cuda_graph and cfg.device in ("cpu", "mps"):
        raise ConfigError(f"cuda_graph=True needs a CUDA device, got device={cfg.device}")


DEVICE_NAMES = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_ranges(cfg: TrainConfig) -> None:
    """Every key with a range, checked before any work: a ConfigError naming the key and its rule."""
    def need(ok: bool, key: str, rule: str) -> None:
        if not ok:  # written so that NaN fails every rule
            raise ConfigError(f"{key} must be {rule}, got {getattr(cfg, key)!r}")

    for key in ("n_layer", "n_head", "n_embd", "d_ff", "batch_size", "max_iters", "log_interval", "eval_batch_size",
                "eval_max_steps"):
        need(getattr(cfg, key) >= 1, key, ">= 1")
    for key in ("eval_interval", "keep_interval", "eval_puzzles", "warmup_iters", "seed"):  # eval_interval 0 / eval_puzzles 0: off
        need(getattr(cfg, key) >= 0, key, ">= 0")
    need(cfg.n_embd % cfg.n_head == 0, "n_head", f"a divisor of n_embd={cfg.n_embd}")
    need(0 < cfg.learning_rate < math.inf, "learning_rate", "a finite number > 0")
    for key in ("weight_decay", "grad_clip", "max_minutes", "train_tau", "train_tau_sigma", "eval_tau"):
        need(0 <= getattr(cfg, key) < math.inf, key, "a finite number >= 0")  # grad_clip / max_minutes 0: off
    for key in ("dropout", "beta1", "beta2"):
        need(0 <= getattr(cfg, key) < 1, key, "in [0, 1)")
    need(0 <= cfg.ema_decay <= 1, "ema_decay", "in [0, 1] (0 = no EMA)")
    need(cfg.out_dir.strip() != "", "out_dir", "a directory path")
    need(cfg.eval_split in sudoku.data.SPLITS, "eval_split", "train, val or test")
    need(DEVICE_NAMES.fullmatch(cfg.device) is not None, "device", "auto, cpu, cuda, cuda:N or mps")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={cfg.device} but this torch has no usable CUDA device; use --device=cpu or auto")
    if cfg.device.startswith("cuda:") and int(cfg.device[5:]) >= torch.cuda.device_count():
        raise ConfigError(f"device={cfg.device} but only {torch.cuda.device_count()} CUDA device(s) are visible")
    if cfg.device == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device=mps but MPS is not available here; use --device=cpu or auto")
    if cfg.init_from and not os.path.exists(cfg.init_from):
        raise ConfigError(f"init_from={cfg.init_from}: no such checkpoint file or run directory")


# -----------------------------------------------------------------------------
# run directory (common.py, shared with train_fastdllm.py): one run per out_dir, held by a lock file
# while it trains, resume rules (docs/reliability.md)

RUN_FILES = ("ckpt.pt", "metrics.jsonl", "kept")  # out_dir holds a run when it has one of these
OVERWRITES = RUN_FILES + ("ckpt.pt.tmp",)  # what overwrite=True deletes
LOCK_FILE = common.LOCK_FILE
RESUME_KEYS = ("model", "model_config", "config", "optimizer", "step", "data_pos", "rank_state")
RESUME_RULES = common.ResumeRules(
    may_change=("max_iters", "max_minutes", "eval_interval", "keep_interval"),
    not_compared=("out_dir", "resume", "overwrite", "allow_config_change", "log_interval", "device", "compile",
                  "cuda_graph", "wandb_log", "wandb_project", "wandb_run_name"),
    fixed=("objective", "n_layer", "n_head", "n_embd", "d_ff", "tie_embeddings", "pos_emb", "batch_size"))


def load_resume(ckpt_path: str) -> dict:
    try:
        return load_checkpoint(ckpt_path, required=RESUME_KEYS)
    except CheckpointError as e:
        raise SystemExit(f"resume: {e}") from None


def checked_resume_config(resume: dict, cfg: TrainConfig, ckpt_path: str) -> dict:
    """The checkpoint's run config with this run's accepted changes (common.resume_config)."""
    return common.resume_config(resume["config"], config_to_dict(cfg), config_to_dict(TrainConfig()), resume["step"],
                                 RESUME_RULES, cfg.allow_config_change, ckpt_path)


def model_config(cfg: TrainConfig) -> ModelConfig:
    return ModelConfig(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, d_ff=cfg.d_ff, dropout=cfg.dropout,
                       tie_embeddings=cfg.tie_embeddings, relay=cfg.objective in ("relay_sg", "relay"),
                       pos_emb=cfg.pos_emb)


def cpu_has_fast_bf16() -> bool:
    """Linux: does the CPU have bf16 matmul instructions? Without them bf16 autocast is several times slower."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return True  # unknown: trust the user's choice
    return "avx512_bf16" in flags or "amx_bf16" in flags


def optimizer_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    # As the authors: no decay on anything named bias or norm (LayerNorms incl. the relay LN, FFN biases)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if "bias" in name or "norm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def check_data(cfg: TrainConfig) -> None:
    """Refuse a Table 1 config (paper_config=True) on data other than the paper's Sudoku-Extreme.

    prepare_data.py records the data's origin in data_dir/meta.json (key.source: hf, generate or file);
    only hf (the hub set, or a local copy of it loaded through RELAY_SUDOKU_HF_DATASET) is the paper's.
    allow_any_data=True lets the run start and says that it is not comparable with the paper.
    eval_puzzles above the size of the eval split: an error for a paper config, a notice otherwise.
    """
    paper = cfg.paper_config and not cfg.allow_any_data
    hub = f"python prepare_data.py --source=hf --out_dir={cfg.data_dir}"
    say = print if int(os.environ.get("RANK", 0)) == 0 else (lambda *a: None)
    meta_path = os.path.join(cfg.data_dir, "meta.json")
    try:
        with open(meta_path) as f:
            key = json.load(f)["key"]
        source = key["source"]
    except (OSError, ValueError, KeyError, TypeError):
        key, source = {}, None
    if cfg.paper_config and source != "hf":
        found = (f"{cfg.data_dir} holds data from source={source}" if source else f"{meta_path} is missing or unreadable"
                 if os.path.isdir(cfg.data_dir) else f"there is no {cfg.data_dir}")
        if paper:
            raise SystemExit(f"this Table 1 config trains on the paper's Sudoku-Extreme, but {found}: run `{hub}` "
                             "(or pass --allow_any_data=True for a run that is not comparable with the paper)")
        say(f"notice: allow_any_data=True and {found}: this run is NOT comparable with the paper's Table 1")
    if paper and key.get("n_train") is not None:
        say(f"notice: {cfg.data_dir} keeps only the first {key['n_train']:,} hub training puzzles (the paper used all)")

    def n_rows(split: str) -> int | None:
        path = sudoku.data.split_path(cfg.data_dir, split)
        if not os.path.exists(path):
            if paper and not os.path.exists(os.path.join(cfg.data_dir, f"{split}.parquet")):
                raise SystemExit(f"{path} not found: build the paper's data with `{hub}`")
            return None  # load_training_split says what to run (also for data written by an older prepare_data.py)
        try:
            return len(np.load(path, mmap_mode="r"))  # reads the header only
        except (OSError, ValueError) as e:  # truncated or not an array file at all
            rebuild = hub if cfg.paper_config else f"python prepare_data.py --out_dir={cfg.data_dir}"
            raise SystemExit(f"{path} is not a readable array file ({type(e).__name__}): rebuild it with "
                             f"`{rebuild} --force`") from None

    n_rows("train")
    n_eval = n_rows(cfg.eval_split) if cfg.eval_puzzles > 0 else None
    if n_eval is not None and cfg.eval_puzzles > n_eval:
        if paper:
            raise SystemExit(f"eval_puzzles={cfg.eval_puzzles:,} but {cfg.data_dir}/{cfg.eval_split} has only "
                             f"{n_eval:,} puzzles; the paper validates on the first 51,200 of the hub's 422,786 test "
                             f"puzzles: rebuild with the whole test split, `{hub} --force`")
        say(f"notice: eval_puzzles={cfg.eval_puzzles:,} but the {cfg.eval_split} split of {cfg.data_dir} has "
            f"{n_eval:,} puzzles: validating on all {n_eval:,}")


def load_training_split(split: str, data_dir: str) -> types.SimpleNamespace:
    """A prepared split (data_dir/{split}.npy, read in one call): .question / .answer (N, 81) uint8 token arrays."""
    question, answer = sudoku.data.split_tokens(sudoku.data.load_split(split, data_dir))
    return types.SimpleNamespace(question=question, answer=answer)


def as_tensor(a) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(a))
    if t.dim() != 2 or t.size(1) != 81:
        raise SystemExit(f"Sudoku data must be (N, 81) token arrays, got shape {tuple(t.shape)}")
    return t.to(torch.uint8)  # ids < 17: a quarter of the memory of int64 for the 3.8M-puzzle split


@torch.no_grad()
def validate(model: SudokuTransformer, questions: torch.Tensor, answers: torch.Tensor, cfg: TrainConfig) -> dict:
    """Exact match, legal rate and NFE of confidence decoding at eval_tau (sudoku.decode.decode_boards)."""
    pred, nfe, batch_nfe = decode_boards(model, questions.long(), tau=cfg.eval_tau, max_steps=cfg.eval_max_steps,
                                         batch_size=cfg.eval_batch_size, relay_carry=True)
    nfe, batch_nfe = nfe.float(), batch_nfe.float()
    right, blank = pred.cpu() == answers.long(), questions == MASK
    exact = right.all(1).float().mean().item()
    # blanks filled correctly, per puzzle then averaged: moves long before exact match does
    token_acc = ((right & blank).sum(1) / blank.sum(1).clamp(min=1)).mean().item()
    legal = is_legal(pred).float().mean().item()  # 0 together with exact: a collapsed run (collapse_message)
    return {"exact": exact, "token_acc": token_acc, "nfe": nfe.mean().item(), "batch_nfe": batch_nfe.mean().item(),
            "legal": legal}


def collapse_message(metrics: dict, cfg: TrainConfig, earlier: list[dict] = ()) -> str | None:
    """The loud line for a collapsed run, or None: past warm-up, a validation with exact match and legal rate
    both 0, token accuracy not above the previous validation's, and no earlier validation that solved a
    puzzle (`earlier`: the run's earlier validation records, earlier_validations). Runs of the paper's
    setup that collapsed (4 of 48 known tied 300k-step runs) sat there from their first validation on and
    never recovered, so the first such validation is worth announcing. On hard puzzles a healthy small
    model also solves none for a long while, or solves one in 300 and then none again; a rising token
    accuracy, or any earlier solved puzzle, tells it apart."""
    if metrics.get("step", 0) < cfg.warmup_iters or metrics.get("exact") != 0 or metrics.get("legal") != 0:
        return None
    previous_token_acc = next((r["val/token_acc"] for r in reversed(earlier) if "val/token_acc" in r), None)
    if previous_token_acc is not None and metrics.get("token_acc", 0.0) > previous_token_acc:
        return None  # still learning, just not solving yet
    if any(r.get("val/exact", 0.0) > 0 for r in earlier):
        return None  # a weak run near 0 on hard puzzles, not one stuck from the start
    then = "stopping (stop_on_collapse=True)" if cfg.stop_on_collapse else "--stop_on_collapse=True stops such runs"
    return (f"!!! COLLAPSED at step {metrics['step']}: validation exact match 0 and legal rate 0 past warm-up, "
            f"token accuracy not rising; such runs of the paper's setup did not recover, restart with another "
            f"seed; {then} !!!")


def earlier_validations(log_path: str, step: int) -> list[dict]:
    """The validation records of metrics.jsonl before `step`, oldest first (none: no file yet)."""
    return [r for r in common.read_records(log_path) if "val/exact" in r and r["step"] < step]


def rng_state(gen: torch.Generator | None, device: str) -> dict:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "gen": gen.get_state() if gen is not None else None,
            "python": random.getstate(),
            "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
            "cuda": torch.cuda.get_rng_state(device) if device.startswith("cuda") else None}


def set_rng_state(state: dict, gen: torch.Generator | None, device: str) -> None:
    torch.set_rng_state(state["torch"])
    if gen is not None and state["gen"] is not None:  # None: draws from the device's default generator
        try:
            gen.set_state(state["gen"])
        except RuntimeError:  # a CUDA run saved by a version that drew its data noise on the host
            print("warning: the checkpoint's data-noise generator was a host one; this run draws on the device "
                  "from a fresh stream (the same distribution, not the same draws)", file=sys.stderr)
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    if state["cuda"] is not None and device.startswith("cuda"):
        torch.cuda.set_rng_state(state["cuda"], device)


def to_device(state, device):
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {k: to_device(v, device) for k, v in state.items()}
    return state


def read_parent(path: str) -> dict:
    """A checkpoint's entries; a .safetensors file (reference/*.safetensors: one set of weights, the EMA
    weights of a finished run) reads as a checkpoint whose model holds those weights and has no separate
    EMA; "model_is_ema" says whether its metadata names them EMA weights."""
    if not path.endswith(".safetensors"):
        return load_checkpoint(path, required=("model", "model_config"))
    weights, meta = common.load_weights(path)
    step = meta.get("step")
    return {"model": weights.state_dict(), "model_config": asdict(weights.config), "config": meta["config"],
            "ema": None, "model_is_ema": meta.get("weights") == "ema", "step": int(step) if step is not None else None}


def load_parent(cfg: TrainConfig, model: SudokuTransformer) -> dict:
    """init_from: load another run's weights into `model`; a missing relay LN starts at gamma = beta = 0."""
    path = os.path.join(cfg.init_from, "ckpt.pt") if os.path.isdir(cfg.init_from) else cfg.init_from
    try:
        parent = read_parent(path)
    except (CheckpointError, ValueError) as e:
        raise SystemExit(f"init_from={cfg.init_from}: not a readable train_sudoku.py checkpoint: {e}") from None
    pcfg, pmodel = parent["model_config"], parent["model"]
    mine = asdict(model.config)
    for key in ("tie_embeddings", "n_embd", "vocab_size", "n_layer", "n_head", "d_ff", "block_size", "pos_emb"):
        if pcfg.get(key, False) != mine[key]:
            raise SystemExit(f"init_from={cfg.init_from}: the parent has {key}={pcfg.get(key)!r} but this run "
                             f"{key}={mine[key]!r}; the two must match")
    if pcfg.get("relay") and not mine["relay"]:
        raise SystemExit(f"init_from={cfg.init_from}: the parent has a relay LayerNorm but objective={cfg.objective} "
                         "uses none; start from a non-relay checkpoint or use objective=relay/relay_sg")
    state = dict(pmodel)
    if cfg.init_from_ema and parent.get("ema") is not None:
        state.update(parent["ema"]["shadow"])
        if mine["tie_embeddings"]:
            state["head.weight"] = state["tok_emb.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"relay_norm.weight", "relay_norm.bias"}:
        raise SystemExit(f"init_from={cfg.init_from}: weights do not fit this model (missing {missing}, unexpected {unexpected})")
    if missing:
        # adding a relay to a trained model: R(h) = 0 at first, so the first forward equals the parent exactly
        with torch.no_grad():
            model.relay_norm.weight.zero_()
            model.relay_norm.bias.zero_()
    return {"path": path, "config": parent.get("config", {}), "step": parent.get("step"),
            # ema: the child starts from a run's EMA weights (its checkpoint's shadow, or an exported EMA file)
            "ema": bool(cfg.init_from_ema and parent.get("ema") is not None) or parent.get("model_is_ema", False),
            "relay_added": bool(missing)}


# -----------------------------------------------------------------------------
# training


def train(cfg: TrainConfig, train_data=None, val_data=None) -> dict:
    """Run (or resume) training in cfg.out_dir, which this run holds locked; returns the last metrics.
    train_data / val_data: objects with .question and .answer (N, 81) token arrays; default:
    prepare_data.load_puzzles from data_dir."""
    check_config(cfg)
    with common.hold(cfg.out_dir, RUN_FILES, cfg.resume, cfg.overwrite, os.path.join(cfg.out_dir, "ckpt.pt")):
        return train_locked(cfg, train_data, val_data)


def start_processes(cfg: TrainConfig) -> tuple[str, int, int, bool]:
    """The device and (rank, world) of this process; under torchrun, joins the DDP process group."""
    ddp = int(os.environ.get("RANK", -1)) != -1
    device = pick_device(cfg.device)
    if ddp:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if device.startswith("cuda"):
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    else:
        rank, world = 0, 1
    return device, rank, world, ddp


def setup(cfg: TrainConfig, train_data=None, val_data=None) -> SudokuRun:
    """Processes, data, model, optimizer, EMA and rollout buffer, restored from out_dir/ckpt.pt on resume."""
    device, rank, world, ddp = start_processes(cfg)
    master = rank == 0
    if cfg.batch_size % world:
        raise SystemExit(f"batch_size={cfg.batch_size} must be divisible by the {world} DDP processes")
    local_bs = cfg.batch_size // world
    device_type = device.split(":")[0]
    use_bf16 = uses_bf16(cfg.dtype, device_type)
    # a CUDA graph replays its casts: autocast's cache of cast weights would go stale (cache_enabled=False)
    amp = torch.autocast(device_type, dtype=torch.bfloat16, cache_enabled=not cfg.cuda_graph) if use_bf16 \
        else nullcontext()
    if cfg.cuda_graph and (device_type != "cuda" or ddp):
        raise SystemExit(f"cuda_graph=True needs one process on a CUDA device (here: {device}, {world} process(es))")
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    log_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    resume = load_resume(ckpt_path) if cfg.resume else None
    run_config = checked_resume_config(resume, cfg, ckpt_path) if resume is not None else config_to_dict(cfg)

    x0_all, q_all, val_q, val_a = load_data(cfg, train_data, val_data, master)
    x0_all, q_all = x0_all.to(device), q_all.to(device)  # the step gathers its rows where it runs

    # model, optimizer, state
    torch.manual_seed(cfg.seed + rank)  # dropout differs per rank
    gen = None if cfg.cuda_graph else torch.Generator(device=device if device_type == "cuda" else "cpu")
    if gen is not None:
        gen.manual_seed(cfg.seed)
    mcfg = model_config(cfg)
    model = SudokuTransformer(mcfg)
    if resume is not None:
        model.load_state_dict(resume["model"])
    elif cfg.init_from:
        parent = load_parent(cfg, model)
        run_config["parent"] = parent
        if master:
            print(f"init_from {parent['path']} (step {parent['step']}, {'EMA' if parent['ema'] else 'raw'} weights"
                  f"{', relay LayerNorm added at zero' if parent['relay_added'] else ''})")
    model.to(device)
    # under a CUDA graph the learning rate is a tensor the host refills each step (warm-up needs no new graph)
    lr = torch.tensor(cfg.learning_rate, device=device) if cfg.cuda_graph else cfg.learning_rate
    optimizer = torch.optim.AdamW(optimizer_groups(model, cfg.weight_decay), lr=lr, betas=(cfg.beta1, cfg.beta2),
                                  fused=device_type == "cuda", capturable=cfg.cuda_graph)
    ema = EMA(model, cfg.ema_decay) if cfg.ema_decay > 0 else None
    buffer = RolloutBuffer(local_bs, MASK, cfg.buffer_init) if cfg.objective != "mlm" else None
    run = SudokuRun(cfg=cfg, device=device, rank=rank, world=world, ddp=ddp, model=model, raw_model=model, mcfg=mcfg,
                    optimizer=optimizer, ema=ema, buffer=buffer, gen=gen, loss_fn=None, reduce=None,
                    x0_all=x0_all, q_all=q_all, val_q=val_q, val_a=val_a, order=common.BatchOrder(len(x0_all), cfg.seed),
                    run_config=run_config, ckpt_path=ckpt_path, log_path=log_path, wandb=None)
    if resume is not None:
        restore(run, resume)
    if buffer is not None and buffer.z is None:
        # every slot empty (the first refill fills them all) and h = 0 for the relay objectives: explicit
        # zeros rather than None, so the relay LN takes part in every step (DDP needs that), and the
        # first step runs the same code as every later one (one compiled graph)
        buffer.allocate(81, device, state_dim=cfg.n_embd if mcfg.relay else None)
    if master:
        if cfg.overwrite:
            common.remove_run_files(cfg.out_dir, OVERWRITES)
        print_config(cfg)
        if use_bf16 and device_type == "cpu" and not cpu_has_fast_bf16():
            print("warning: dtype=bfloat16 on a CPU without avx512_bf16/amx_bf16 is several times slower than "
                  "float32 here; use --dtype=float32")
        print(f"{model.num_params():,} parameters | device {device} | {'bf16 autocast' if use_bf16 else 'fp32'}"
              f" | {world} process(es) | {len(x0_all):,} training puzzles")
    if cfg.compile and ddp:
        model = torch.compile(model)  # the DDP-wrapped model cannot sit inside one fullgraph region
    if ddp:
        model = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])] if device_type == "cuda" else None)

    # under DDP each rank normalises by the mean token count over ranks, so that DDP's gradient
    # average equals one process's token mean over the global batch
    def reduce_count(n: torch.Tensor) -> torch.Tensor:
        n = n.clone()
        dist.all_reduce(n)
        return n / world

    def forward(z, h):
        with amp:
            return model(z, h)

    run.model, run.reduce = model, reduce_count if ddp else None
    run.loss_fn = make_loss_fn(cfg, forward, buffer, run.reduce)
    if cfg.compile and not ddp:
        # the training step's loss region as ONE graph: a graph break or a host sync (.item(), bool())
        # inside it is an error here, not a silent slowdown; the sampler stays eager (early exit)
        run.loss_fn = torch.compile(run.loss_fn, fullgraph=True)
    if cfg.cuda_graph:
        from sudoku.cuda_graph import GraphedStep
        run.graphed = GraphedStep(run)
    if cfg.wandb_log and master:
        try:
            import wandb
        except ImportError:
            raise SystemExit("wandb_log=True needs the wandb package: pip install wandb (or drop --wandb_log)") from None
        wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or None, config=run_config)
        run.wandb = wandb
    return run


def load_data(cfg: TrainConfig, train_data, val_data, master: bool) -> tuple:
    """Training answers and questions, and (on the master, when validating) the first eval_puzzles of eval_split."""
    train_data = train_data if train_data is not None else load_training_split("train", cfg.data_dir)
    x0_all, q_all = as_tensor(train_data.answer), as_tensor(train_data.question)
    # checked once here, so that a bad row is a clear error at load; the per-step check in relay.py is
    # then a device-side assert on GPUs (no host sync per step)
    bad = (x0_all == MASK).any(1).nonzero()
    if len(bad):
        raise SystemExit(f"training data: answer row {int(bad[0])} holds [MASK] ({len(bad)} such rows); "
                         "answers must be complete solutions")
    val_q = val_a = None
    if master and cfg.eval_puzzles > 0:
        val_data = val_data if val_data is not None else load_training_split(cfg.eval_split, cfg.data_dir)
        val_q = as_tensor(val_data.question)[: cfg.eval_puzzles]
        val_a = as_tensor(val_data.answer)[: cfg.eval_puzzles]
    return x0_all, q_all, val_q, val_a


def restore(run: SudokuRun, resume: dict) -> None:
    """Resume: optimizer, EMA, step, data position, training time, this rank's RNG and rollout buffer."""
    cfg, device = run.cfg, run.device
    run.optimizer.load_state_dict(resume["optimizer"])
    for group, decay in zip(run.optimizer.param_groups, (cfg.weight_decay, 0.0)):
        group.update(betas=(cfg.beta1, cfg.beta2), weight_decay=decay)  # the saved ones, unless allowed to change
    if run.ema is not None and resume.get("ema") is not None:
        run.ema.load_state_dict(to_device(resume["ema"], device))
    run.step, run.pos, run.train_seconds = resume["step"], resume["data_pos"], resume.get("train_seconds", 0.0)
    ranks = resume["rank_state"]
    if len(ranks) != run.world:
        raise SystemExit(f"resume: {run.ckpt_path} was written by {len(ranks)} processes, now {run.world}; use the same count")
    set_rng_state(ranks[run.rank]["rng"], run.gen, device)
    if run.buffer is not None and ranks[run.rank]["buffer"] is not None:
        run.buffer.load_state_dict(to_device(ranks[run.rank]["buffer"], device))
    if run.master:
        common.drop_records_after(run.log_path, run.step)


def evaluate(run: SudokuRun) -> dict:
    """Validation metrics of the EMA weights (the raw ones without EMA); {} when validation is off."""
    if run.val_q is None:
        return {}
    m = run.raw_model
    if run.ema is not None:
        m = copy.deepcopy(run.raw_model)  # deepcopy draws no random numbers: resume stays exact
        run.ema.copy_to(m)
    return validate(m, run.val_q, run.val_a, run.cfg)


def keep_weights(run: SudokuRun) -> str:
    """out_dir/kept/step_N.safetensors: the weights validation uses (EMA, or raw without it), small and
    loadable like a reference model (sample.py --ckpt=...), so a run's learning curve can be evaluated later."""
    m = run.raw_model
    if run.ema is not None:
        m = copy.deepcopy(run.raw_model)
        run.ema.copy_to(m)
    path = os.path.join(run.cfg.out_dir, "kept", f"step_{run.step}.safetensors")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    common.save_weights(m, path, {"config": json.dumps(run.run_config), "step": str(run.step),
                                  "weights": "ema" if run.ema is not None else "raw"})
    return path


def stop_if_collapsed(run: SudokuRun, metrics: dict) -> bool:
    """Announce a collapsed run (collapse_message); True when it should stop (every rank decides alike)."""
    message = None
    if run.master:
        step = metrics.get("step", 0)
        message = collapse_message(metrics, run.cfg, earlier_validations(run.log_path, step))
    if message:
        print(message, file=sys.stderr, flush=True)
    stop = torch.tensor(float(bool(message) and run.cfg.stop_on_collapse), device=run.device if run.ddp else "cpu")
    if run.ddp:  # only the master validates; the others follow its decision
        dist.broadcast(stop, 0)
    return bool(stop)


def save(run: SudokuRun, metrics: dict) -> None:
    """out_dir/ckpt.pt: everything a bit-exact resume needs, every rank's RNG and rollout buffer included."""
    buffer = run.buffer
    if run.graphed is not None:
        run.graphed.before_host_reads()  # the EMA's step count, kept on the device
    rank_state = {"rng": rng_state(run.gen, run.device), "buffer": to_device(buffer.state_dict(), "cpu") if buffer else None}
    ranks = [None] * run.world
    if run.ddp:
        dist.all_gather_object(ranks, rank_state)
    else:
        ranks = [rank_state]
    if run.master:
        save_checkpoint({"model": run.raw_model.state_dict(), "model_config": asdict(run.mcfg), "config": run.run_config,
                         "ema": run.ema.state_dict() if run.ema else None, "optimizer": run.optimizer.state_dict(),
                         "step": run.step, "data_pos": run.pos, "train_seconds": run.train_seconds, "rank_state": ranks,
                         "metrics": metrics}, run.ckpt_path)


def log(run: SudokuRun, record: dict) -> None:
    common.append_record(run.log_path, record)
    if run.wandb is not None:
        run.wandb.log(record, step=record["step"])


def train_locked(cfg: TrainConfig, train_data=None, val_data=None) -> dict:
    run = setup(cfg, train_data, val_data)
    device_type, world = run.device.split(":")[0], run.world
    run.model.train()
    metrics: dict = {}
    t0, loss_acc, n_acc, new_acc, log_seconds = time.time(), 0.0, 0, 0, 0.0
    done = run.step >= cfg.max_iters or (cfg.max_minutes > 0 and run.train_seconds >= 60 * cfg.max_minutes)
    while not done:
        lr, loss, new = train_step(run)
        step = run.step
        loss_acc += loss
        n_acc += 1
        new_acc += new
        done = step >= cfg.max_iters
        if cfg.max_minutes > 0:
            # the vote runs on the run's device under DDP (NCCL refuses CPU tensors), on the CPU otherwise (no sync)
            out_of_time = torch.tensor(float(run.train_seconds + time.time() - t0 >= 60 * cfg.max_minutes),
                                       device=run.device if run.ddp else "cpu")
            if run.ddp:  # every rank must stop at the same step
                dist.all_reduce(out_of_time, op=dist.ReduceOp.MAX)
            done = done or bool(out_of_time)

        log_now = step % cfg.log_interval == 0 or done
        eval_now = done or (cfg.eval_interval > 0 and step % cfg.eval_interval == 0)
        keep_now = cfg.keep_interval > 0 and step % cfg.keep_interval == 0
        if log_now or eval_now or keep_now:
            if device_type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.time() - t0
            run.train_seconds += elapsed
            log_seconds += elapsed
        if log_now:
            loss_val = (loss_acc / n_acc).item()  # the only host sync per log interval
            dt = log_seconds / n_acc
            record = {"step": step, "loss": round(loss_val, 5), "lr": lr, "ms_per_step": round(1000 * dt, 1),
                      "puzzles_per_s": round(cfg.batch_size / dt, 1), "train_seconds": round(run.train_seconds, 2)}
            line = f"step {step} | loss {loss_val:.4f} | lr {lr:.2e} | {1000 * dt:.0f} ms/step | {cfg.batch_size / dt:.0f} puzzles/s"
            if run.buffer is not None:
                record["new_puzzles_per_step"] = float(new_acc) * world / n_acc
                line += f" | {record['new_puzzles_per_step']:.1f} new puzzles/step"
            if run.master:
                print(line, flush=True)
                log(run, record)
            loss_acc, n_acc, new_acc, log_seconds = 0.0, 0, 0, 0.0
        if keep_now and run.master:
            keep_weights(run)  # before save: a run killed in between redoes these steps and writes the same file
        if eval_now:
            if run.master:
                t_eval = time.time()
                metrics = {"step": step} | evaluate(run)
                if "exact" in metrics:
                    print(f"step {step} | val exact {metrics['exact']:.4f} | token acc {metrics['token_acc']:.4f} | "
                          f"nfe {metrics['nfe']:.2f} | "
                          f"batch nfe {metrics['batch_nfe']:.2f} | legal {metrics['legal']:.4f} | "
                          f"{time.time() - t_eval:.1f} s", flush=True)
                    log(run, {f"val/{k}" if k != "step" else k: v for k, v in metrics.items()})
            save(run, metrics)
            done = stop_if_collapsed(run, metrics) or done
        if log_now or eval_now or keep_now:
            t0 = time.time()  # evaluation, logging and saving do not count as training time
    if run.ddp:
        dist.barrier()
    return metrics


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = load_config(TrainConfig, argv)
        check_config(cfg)
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    check_data(cfg)
    train(cfg)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
