"""One training step of train_sudoku.py, and the state it works on: the learning rate, the next batch's
rows, the random draws, the loss of the objective (Table 1: mlm, rollout, relay_sg, relay), backward, clip,
AdamW and the EMA of the weights.

train_sudoku.py runs it eagerly in its loop (train_step); sudoku/cuda_graph.py captures the same body
(learn) once as a CUDA graph and replays it. train_sudoku.setup builds the SudokuRun both work on.
"""
from dataclasses import dataclass
from functools import partial

import torch

import common
import relay
from model import ModelConfig, SudokuTransformer
from relay import RolloutBuffer, draw_taus, mlm_loss, mlm_masking, rollout_loss
from sudoku.board import MASK


def lr_at(it: int, cfg) -> float:
    """The learning rate of step `it` (cfg: train_sudoku.TrainConfig)."""
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
        self.blend(model, 1.0 - d)

    @torch.no_grad()
    def blend(self, model: torch.nn.Module, weight: float | torch.Tensor) -> None:
        """shadow += weight * (parameter - shadow), every parameter; weight a float or a device scalar."""
        names = list(self.shadow)
        params = dict(model.named_parameters())
        weights = [weight] * len(names) if isinstance(weight, torch.Tensor) else weight
        torch._foreach_lerp_([self.shadow[n] for n in names], [params[n].detach().float() for n in names], weights)

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module) -> None:
        for n, p in model.named_parameters():
            p.copy_(self.shadow[n])

    def state_dict(self) -> dict:
        return {"shadow": self.shadow, "num_updates": self.num_updates}

    def load_state_dict(self, state: dict) -> None:
        self.shadow = {n: t.clone() for n, t in state["shadow"].items()}
        self.num_updates = state["num_updates"]


@dataclass
class SudokuRun:
    """What the loop and its step work on, built by train_sudoku.setup: processes, data, model, optimizer and the run's position."""
    cfg: object  # train_sudoku.TrainConfig: the run's settings
    device: str
    rank: int
    world: int
    ddp: bool
    model: torch.nn.Module  # what the loop calls: compiled and/or DDP-wrapped
    raw_model: SudokuTransformer  # what is saved, averaged and evaluated
    mcfg: ModelConfig
    optimizer: torch.optim.Optimizer
    ema: EMA | None
    buffer: RolloutBuffer | None
    gen: torch.Generator | None  # data noise (MLM masks, tau), on the run's device: the same stream on every rank
    # (None under cuda_graph: the device's default generator, which a CUDA graph advances by itself)
    loss_fn: object  # the step's loss (make_loss_fn), compiled as one graph when compile=True
    reduce: object  # DDP token-count reduction for the losses, or None
    x0_all: torch.Tensor
    q_all: torch.Tensor
    val_q: torch.Tensor | None
    val_a: torch.Tensor | None
    order: common.BatchOrder
    run_config: dict
    ckpt_path: str
    log_path: str
    wandb: object  # the wandb module when logging there, else None
    step: int = 0
    pos: int = 0  # samples drawn so far: the position in BatchOrder
    train_seconds: float = 0.0
    graphed: object = None  # cuda_graph=True: the captured step (sudoku.cuda_graph.GraphedStep)

    @property
    def master(self) -> bool:
        return self.rank == 0

    @property
    def local_bs(self) -> int:
        return self.cfg.batch_size // self.world


def make_loss_fn(cfg, forward, buffer: RolloutBuffer | None, reduce):
    """The step's loss as a function of this rank's batch and the step's random draws, all tensors:
    (x0 (b, 81) uint8, maskable (b, 81) bool, *draws) -> (loss, puzzles new to the buffer). It holds no
    host sync and no random draw, so that torch.compile makes it one graph that never recompiles.
    cfg: the run's train_sudoku.TrainConfig (objective, K)."""
    if cfg.objective == "mlm":
        def mlm_step(x0, maskable, masked):
            return mlm_loss(forward, x0.long(), maskable=maskable, mask_id=MASK, masked=masked, reduce_count=reduce), None
        return mlm_step

    def rollout_step(x0, maskable, taus, start_masked=None):
        new = buffer.refill(x0.long(), maskable, start_masked=start_masked)
        policies = [partial(relay.confidence_unmask, tau=tau) for tau in taus]  # step k commits at threshold taus[k]
        out = rollout_loss(forward, **buffer.inputs(), K=cfg.K, variant=cfg.objective, policy=policies,
                           reduce_count=reduce)
        buffer.update(out)
        return out.loss, new
    return rollout_step


def draw_step_noise(run: SudokuRun, maskable: torch.Tensor, mine: slice) -> list[torch.Tensor]:
    """The step's random draws from run.gen, in the order the losses would make them: MLM: the masks of
    the global batch (identical under DDP), this rank's rows; rollout objectives: the staggered start
    masks (buffer_init=staggered), then the K thresholds tau = max(0, train_tau + train_tau_sigma * eps)
    (paper: 0.15 and 0.1). Drawn where run.gen lives (the run's GPU, else the host; under cuda_graph the
    device's default generator), so on a GPU no draw crosses to the device."""
    cfg = run.cfg
    if cfg.objective == "mlm":
        return [mlm_masking(maskable=maskable, generator=run.gen)[mine]]
    start = []
    if cfg.buffer_init == "staggered":
        ones = torch.ones(run.local_bs, 81, dtype=torch.bool, device=maskable.device)
        start = [mlm_masking(maskable=ones, generator=run.gen)]
    return [draw_taus(cfg.K, cfg.train_tau, cfg.train_tau_sigma, run.gen, device=run.device)] + start


def batch_rows(run: SudokuRun) -> torch.Tensor:
    """The next global batch's row indices (common.BatchOrder, on the host: the same order on every device,
    resumable from the position alone), on the run's device: 8 bytes a row cross, not the boards."""
    rows = torch.from_numpy(run.order.rows(run.pos, run.cfg.batch_size))
    run.pos += run.cfg.batch_size
    if run.device.startswith("cuda"):  # pinned and non-blocking: no host sync
        return rows.pin_memory().to(run.device, non_blocking=True)
    return rows.to(run.device)


def train_step(run: SudokuRun) -> tuple[float, torch.Tensor, torch.Tensor | int]:
    """One optimizer step on the next global batch; returns (lr, loss, puzzles new to the rollout buffer).
    No host sync on CUDA: the training data lives on the device, only the row indices travel (non-blocking),
    and the random draws are made there. Under cuda_graph, one replay of the captured step (sudoku/cuda_graph.py)."""
    if run.graphed is not None:
        return run.graphed.step(run)
    cfg = run.cfg
    lr = lr_at(run.step, cfg)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    mine = slice(run.rank * run.local_bs, (run.rank + 1) * run.local_bs)
    loss, new = learn(run, batch_rows(run), mine, run.ema)
    run.optimizer.zero_grad(set_to_none=True)
    run.step += 1
    return lr, loss.detach(), new if new is not None else 0


def learn(run: SudokuRun, rows: torch.Tensor, mine: slice, ema) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The step's body on the global batch's rows (this rank's slice `mine`): gather, draw, loss, backward,
    clip, AdamW, then ema.update (EMA, or the graphed step's device-side one). Returns (loss, new puzzles)."""
    maskable = run.q_all[rows] == MASK  # clues are the given cells
    draws = draw_step_noise(run, maskable, mine)
    loss, new = run.loss_fn(run.x0_all[rows][mine], maskable[mine], *draws)
    loss.backward()
    if run.cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.raw_model.parameters(), run.cfg.grad_clip)
    run.optimizer.step()
    if ema is not None:
        ema.update(run.raw_model)
    return loss, new
