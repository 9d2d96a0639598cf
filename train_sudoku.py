"""Train a Sudoku MDM with one of the four objectives of Table 1: mlm, rollout, relay_sg, relay.

    python prepare_data.py                                     # once: data/sudoku
    python train_sudoku.py config/relay_tied.py --seed=2       # the paper's run (one GPU, bf16)
    python train_sudoku.py config/cpu_relay.py                 # a small run that learns on a laptop CPU
    python train_sudoku.py config/cpu_relay.py --resume=True   # continue out_dir/ckpt.pt exactly
    python train_sudoku.py config/cpu_relay.py --init_from=out/cpu_mlm   # adapt an MLM checkpoint
    torchrun --standalone --nproc_per_node=2 train_sudoku.py config/cpu_mlm.py   # DDP

Config: the TrainConfig fields below (preset files + --key=value, see configurator.py). The loop is
explicit: AdamW, linear warmup then constant, clip, EMA of the weights (used for evaluation and
saved), validation by confidence decoding at tau=0.15 every eval_interval steps, atomic checkpoints
that hold everything needed to resume bit-exactly on CPU.
"""
import copy
import json
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import ConfigError, config_to_dict, load_config, print_config
from model import ModelConfig, SudokuTransformer
from relay import RolloutBuffer, mlm_loss, mlm_masking, rollout_loss, threshold_policy
from sudoku_decode import decode_boards
from sudoku import MASK

OBJECTIVES = ("mlm", "rollout", "relay_sg", "relay")


@dataclass
class TrainConfig:
    # I/O
    out_dir: str = "out/sudoku"
    data_dir: str = "data/sudoku"
    eval_interval: int = 5000  # steps between validations and checkpoints; 0 = only at the end
    eval_split: str = "val"  # prepared split for validation (the authors validated on the test split)
    eval_puzzles: int = 2048  # its first puzzles used (paper: 51,200)
    eval_batch_size: int = 512
    log_interval: int = 100
    resume: bool = False  # continue out_dir/ckpt.pt: model, EMA, optimizer, step, RNG, data position, buffer
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
    # model
    n_layer: int = 4
    n_head: int = 6
    n_embd: int = 384
    d_ff: int = 1536
    dropout: float = 0.1
    tie_embeddings: bool = False
    pos_emb: bool = False  # learned absolute positions: not in the paper, used by the CPU presets (see model.py)
    # optimisation
    batch_size: int = 512  # global: split over DDP ranks
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
    compile: bool = False
    seed: int = 1


# -----------------------------------------------------------------------------
# helpers


def check_config(cfg: TrainConfig) -> None:
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


def model_config(cfg: TrainConfig) -> ModelConfig:
    return ModelConfig(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, d_ff=cfg.d_ff, dropout=cfg.dropout,
                       tie_embeddings=cfg.tie_embeddings, relay=cfg.objective in ("relay_sg", "relay"),
                       pos_emb=cfg.pos_emb)


def pick_device(name: str) -> str:
    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if torch.backends.mps.is_available() else "cpu"


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


def lr_at(it: int, cfg: TrainConfig) -> float:
    # linear warmup then constant (HF constant_with_warmup, as the authors)
    return cfg.learning_rate * min(1.0, (it + 1) / cfg.warmup_iters) if cfg.warmup_iters > 0 else cfg.learning_rate


class EMA:
    """Exponential moving average of the parameters, torch_ema style: the decay warms up as
    min(decay, (1 + n) / (10 + n)) with n the number of updates so far."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay, self.num_updates = decay, 0
        self.shadow = {n: p.detach().float().clone() for n, p in model.named_parameters()}

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.num_updates += 1
        d = min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))
        names = list(self.shadow)
        params = dict(model.named_parameters())
        torch._foreach_lerp_([self.shadow[n] for n in names], [params[n].detach().float() for n in names], 1.0 - d)

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module) -> None:
        for n, p in model.named_parameters():
            p.copy_(self.shadow[n])

    def state_dict(self) -> dict:
        return {"shadow": self.shadow, "num_updates": self.num_updates}

    def load_state_dict(self, state: dict) -> None:
        self.shadow = {n: t.clone() for n, t in state["shadow"].items()}
        self.num_updates = state["num_updates"]


def load_split(split: str, data_dir: str):
    """The data engineer's loader: an object with .question / .answer int64 (N, 81) token arrays."""
    hint = f"run `python prepare_data.py --out_dir={data_dir}` first"
    try:
        from prepare_data import load_puzzles
    except ImportError:
        raise SystemExit(f"cannot import prepare_data.load_puzzles: {hint}") from None
    try:
        return load_puzzles(split, data_dir)
    except (FileNotFoundError, OSError) as e:
        raise SystemExit(f"no Sudoku {split} data in {data_dir} ({e.__class__.__name__}): {hint}") from None


def as_tensor(a) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(a))
    if t.dim() != 2 or t.size(1) != 81:
        raise SystemExit(f"Sudoku data must be (N, 81) token arrays, got shape {tuple(t.shape)}")
    return t.to(torch.uint8)  # ids < 17: a quarter of the memory of int64 for the 3.8M-puzzle split


class BatchOrder:
    """Rows of each global batch: a fresh permutation per epoch that is a pure function of
    (seed, epoch), so resuming needs only the sample position. The current epoch's permutation
    is cached (3.8M rows take ~0.1 s to permute)."""

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


@torch.no_grad()
def validate(model: SudokuTransformer, questions: torch.Tensor, answers: torch.Tensor, cfg: TrainConfig) -> dict:
    """Exact match and NFE of confidence decoding at eval_tau (sudoku_decode.decode_boards)."""
    pred, nfe, batch_nfe = decode_boards(model, questions.long(), tau=cfg.eval_tau, max_steps=cfg.eval_max_steps,
                                         batch_size=cfg.eval_batch_size, relay_carry=True)
    nfe, batch_nfe = nfe.float(), batch_nfe.float()
    right, blank = pred.cpu() == answers.long(), questions == MASK
    exact = right.all(1).float().mean().item()
    # blanks filled correctly, per puzzle then averaged: moves long before exact match does
    token_acc = ((right & blank).sum(1) / blank.sum(1).clamp(min=1)).mean().item()
    return {"exact": exact, "token_acc": token_acc, "nfe": nfe.mean().item(), "batch_nfe": batch_nfe.mean().item()}


def rng_state(gen: torch.Generator, device: str) -> dict:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "gen": gen.get_state(), "python": random.getstate(),
            "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
            "cuda": torch.cuda.get_rng_state(device) if device.startswith("cuda") else None}


def set_rng_state(state: dict, gen: torch.Generator, device: str) -> None:
    torch.set_rng_state(state["torch"])
    gen.set_state(state["gen"])
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    if state["cuda"] is not None and device.startswith("cuda"):
        torch.cuda.set_rng_state(state["cuda"], device)


def save_atomic(obj: dict, path: str) -> None:
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)  # a crash mid-write never leaves a truncated ckpt.pt


def to_device(state, device):
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {k: to_device(v, device) for k, v in state.items()}
    return state


def load_parent(cfg: TrainConfig, model: SudokuTransformer) -> dict:
    """init_from: load another run's weights into `model`; a missing relay LN starts at gamma = beta = 0."""
    path = os.path.join(cfg.init_from, "ckpt.pt") if os.path.isdir(cfg.init_from) else cfg.init_from
    try:
        parent = torch.load(path, map_location="cpu", weights_only=True)
        pcfg, pmodel = parent["model_config"], parent["model"]
    except Exception as e:
        raise SystemExit(f"init_from={cfg.init_from}: not a readable train_sudoku.py checkpoint ({type(e).__name__})")
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
            "ema": bool(cfg.init_from_ema and parent.get("ema") is not None), "relay_added": bool(missing)}


# -----------------------------------------------------------------------------
# training


def drop_records_after(log_path: str, step: int) -> None:
    """Forget the log lines of steps after the checkpoint: a run killed between two checkpoints logged
    steps it is about to redo, and metrics.jsonl must list every step once."""
    if not os.path.exists(log_path):
        return
    with open(log_path) as f:
        lines = [line for line in f if line.strip()]
    kept = [line for line in lines if json.loads(line)["step"] <= step]
    if len(kept) < len(lines):
        with open(log_path, "w") as f:
            f.writelines(kept)


def train(cfg: TrainConfig, train_data=None, val_data=None) -> dict:
    """Run (or resume) training; returns the last metrics. train_data / val_data: objects with
    .question and .answer (N, 81) token arrays; default: prepare_data.load_puzzles from data_dir."""
    check_config(cfg)
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
    master = rank == 0
    if cfg.batch_size % world:
        raise SystemExit(f"batch_size={cfg.batch_size} must be divisible by the {world} DDP processes")
    local_bs = cfg.batch_size // world
    device_type = device.split(":")[0]
    use_bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device_type == "cuda")
    amp = torch.autocast(device_type, dtype=torch.bfloat16) if use_bf16 else nullcontext()
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    log_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    if cfg.resume and not os.path.exists(ckpt_path):
        raise SystemExit(f"resume=True but there is no {ckpt_path}; drop --resume to start a new run")

    # data
    train_data = train_data if train_data is not None else load_split("train", cfg.data_dir)
    x0_all, q_all = as_tensor(train_data.answer), as_tensor(train_data.question)
    if master and cfg.eval_puzzles > 0:
        val_data = val_data if val_data is not None else load_split(cfg.eval_split, cfg.data_dir)
        val_q = as_tensor(val_data.question)[: cfg.eval_puzzles]
        val_a = as_tensor(val_data.answer)[: cfg.eval_puzzles]
    else:
        val_q = None

    # model, optimizer, state
    resume = None
    if cfg.resume:
        resume = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        saved = resume["config"]
        for key in ("objective", "n_layer", "n_head", "n_embd", "d_ff", "tie_embeddings", "pos_emb", "batch_size",
                    "seed", "K"):
            if saved.get(key) != getattr(cfg, key):
                raise SystemExit(f"resume: {ckpt_path} was trained with {key}={saved.get(key)!r}, not "
                                 f"{getattr(cfg, key)!r}; pass the same config")
    torch.manual_seed(cfg.seed + rank)  # dropout differs per rank
    gen = torch.Generator().manual_seed(cfg.seed)  # data noise (MLM masks, tau): the same stream on every rank
    mcfg = model_config(cfg)
    model = SudokuTransformer(mcfg)
    run_config = config_to_dict(cfg)
    if resume is not None:
        model.load_state_dict(resume["model"])
        run_config = resume["config"] | {"max_iters": cfg.max_iters, "eval_interval": cfg.eval_interval}
    elif cfg.init_from:
        parent = load_parent(cfg, model)
        run_config["parent"] = parent
        if master:
            print(f"init_from {parent['path']} (step {parent['step']}, {'EMA' if parent['ema'] else 'raw'} weights"
                  f"{', relay LayerNorm added at zero' if parent['relay_added'] else ''})")
    model.to(device)
    raw_model = model
    optimizer = torch.optim.AdamW(optimizer_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                                  betas=(cfg.beta1, cfg.beta2), fused=device_type == "cuda")
    ema = EMA(model, cfg.ema_decay) if cfg.ema_decay > 0 else None
    buffer = RolloutBuffer(local_bs, MASK, cfg.buffer_init) if cfg.objective != "mlm" else None
    step, pos, train_seconds = 0, 0, 0.0
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        if ema is not None and resume.get("ema") is not None:
            ema.load_state_dict(to_device(resume["ema"], device))
        step, pos, train_seconds = resume["step"], resume["data_pos"], resume.get("train_seconds", 0.0)
        ranks = resume["rank_state"]
        if len(ranks) != world:
            raise SystemExit(f"resume: {ckpt_path} was written by {len(ranks)} processes, now {world}; use the same count")
        set_rng_state(ranks[rank]["rng"], gen, device)
        if buffer is not None and ranks[rank]["buffer"] is not None:
            buffer.load_state_dict(to_device(ranks[rank]["buffer"], device))
        if master:
            drop_records_after(log_path, step)
    if master:
        os.makedirs(cfg.out_dir, exist_ok=True)
        print_config(cfg)
        if use_bf16 and device_type == "cpu" and not cpu_has_fast_bf16():
            print("warning: dtype=bfloat16 on a CPU without avx512_bf16/amx_bf16 is several times slower than "
                  "float32 here; use --dtype=float32")
        print(f"{raw_model.num_params():,} parameters | device {device} | {'bf16 autocast' if use_bf16 else 'fp32'}"
              f" | {world} process(es) | {len(x0_all):,} training puzzles")
    if cfg.compile:
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])] if device_type == "cuda" else None)

    # under DDP each rank normalises by the mean token count over ranks, so that DDP's gradient
    # average equals one process's token mean over the global batch
    def reduce_count(n: torch.Tensor) -> torch.Tensor:
        n = n.clone()
        dist.all_reduce(n)
        return n / world
    reduce = reduce_count if ddp else None
    policy = threshold_policy(cfg.train_tau, cfg.train_tau_sigma, gen)
    variant = cfg.objective

    def step_fn(z, h):
        with amp:
            return model(z, h)

    wandb = None
    if cfg.wandb_log and master:
        try:
            import wandb
        except ImportError:
            raise SystemExit("wandb_log=True needs the wandb package: pip install wandb (or drop --wandb_log)") from None
        wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or None, config=run_config)

    def evaluate() -> dict:
        if val_q is None:
            return {}
        m = raw_model
        if ema is not None:
            m = copy.deepcopy(raw_model)  # deepcopy draws no random numbers: resume stays exact
            ema.copy_to(m)
        return validate(m, val_q, val_a, cfg)

    def save(metrics: dict) -> None:
        rank_state = {"rng": rng_state(gen, device), "buffer": to_device(buffer.state_dict(), "cpu") if buffer else None}
        ranks = [None] * world
        if ddp:
            dist.all_gather_object(ranks, rank_state)
        else:
            ranks = [rank_state]
        if master:
            save_atomic({"model": raw_model.state_dict(), "model_config": asdict(mcfg), "config": run_config,
                         "ema": ema.state_dict() if ema else None, "optimizer": optimizer.state_dict(),
                         "step": step, "data_pos": pos, "train_seconds": train_seconds, "rank_state": ranks,
                         "metrics": metrics}, ckpt_path)

    def log(record: dict) -> None:
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if wandb is not None:
            wandb.log(record, step=record["step"])

    order = BatchOrder(len(x0_all), cfg.seed)
    model.train()
    metrics: dict = {}
    t0, loss_acc, n_acc, new_acc, log_seconds = time.time(), 0.0, 0, 0, 0.0
    done = step >= cfg.max_iters
    while not done:
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        rows = order.rows(pos, cfg.batch_size)
        pos += cfg.batch_size
        mine = slice(rank * local_bs, (rank + 1) * local_bs)
        x0 = x0_all[rows].long()
        maskable = q_all[rows] == MASK  # clues are the given cells
        if cfg.objective == "mlm":
            masked = mlm_masking(maskable=maskable, generator=gen)[mine]  # drawn for the global batch: identical under DDP
            loss = mlm_loss(step_fn, x0[mine].to(device), maskable=maskable[mine].to(device), mask_id=MASK,
                            masked=masked.to(device), reduce_count=reduce)
        else:
            new_acc += buffer.refill(x0[mine].to(device), maskable[mine].to(device), gen)
            if variant != "rollout" and buffer.h is None:
                # explicit zeros rather than None, so the relay LN takes part in every step (DDP needs that)
                buffer.h = torch.zeros(local_bs, 81, cfg.n_embd, device=device)
            out = rollout_loss(step_fn, buffer, K=cfg.K, variant=variant, policy=policy, mask_id=MASK,
                               reduce_count=reduce)
            loss = out.loss
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if ema is not None:
            ema.update(raw_model)
        step += 1
        loss_acc += loss.detach()
        n_acc += 1
        done = step >= cfg.max_iters
        if cfg.max_minutes > 0:
            out_of_time = torch.tensor(float(train_seconds + time.time() - t0 >= 60 * cfg.max_minutes))
            if ddp:  # every rank must stop at the same step
                dist.all_reduce(out_of_time, op=dist.ReduceOp.MAX)
            done = done or bool(out_of_time)

        log_now = step % cfg.log_interval == 0 or done
        eval_now = done or (cfg.eval_interval > 0 and step % cfg.eval_interval == 0)
        if log_now or eval_now:
            if device_type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.time() - t0
            train_seconds += elapsed
            log_seconds += elapsed
        if log_now:
            loss_val = (loss_acc / n_acc).item()  # the only host sync per log interval
            dt = log_seconds / n_acc
            record = {"step": step, "loss": round(loss_val, 5), "lr": lr, "ms_per_step": round(1000 * dt, 1),
                      "puzzles_per_s": round(cfg.batch_size / dt, 1), "train_seconds": round(train_seconds, 2)}
            line = f"step {step} | loss {loss_val:.4f} | lr {lr:.2e} | {1000 * dt:.0f} ms/step | {cfg.batch_size / dt:.0f} puzzles/s"
            if buffer is not None:
                record["new_puzzles_per_step"] = float(new_acc) * world / n_acc
                line += f" | {record['new_puzzles_per_step']:.1f} new puzzles/step"
            if master:
                print(line, flush=True)
                log(record)
            loss_acc, n_acc, new_acc, log_seconds = 0.0, 0, 0, 0.0
        if eval_now:
            if master:
                t_eval = time.time()
                metrics = {"step": step} | evaluate()
                if "exact" in metrics:
                    print(f"step {step} | val exact {metrics['exact']:.4f} | token acc {metrics['token_acc']:.4f} | "
                          f"nfe {metrics['nfe']:.2f} | "
                          f"batch nfe {metrics['batch_nfe']:.2f} | {time.time() - t_eval:.1f} s", flush=True)
                    log({f"val/{k}" if k != "step" else k: v for k, v in metrics.items()})
            save(metrics)
        if log_now or eval_now:
            t0 = time.time()  # evaluation, logging and saving do not count as training time
    if ddp:
        dist.barrier()
    return metrics


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = load_config(TrainConfig, argv)
        check_config(cfg)
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    train(cfg)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
