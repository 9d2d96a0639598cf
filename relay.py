"""Relay: carry the last hidden state across the unmasking steps of a masked diffusion model.

Everything here is model-agnostic and needs only torch. A backbone plugs in as a `step_fn`:
any callable `(tokens (B, L), h (B, L, d) or None) -> (logits (B, L, V), h_out (B, L, d))`,
where h=None means "no state yet" (h = 0). To give your own MDM a relay, add one LayerNorm
and feed its output into the first layer:

    class MyRelayMDM(nn.Module):
        def __init__(self, backbone, d):
            super().__init__()
            self.backbone, self.relay_norm = backbone, RelayLayerNorm(d, zero_init=True)
        def forward(self, tokens, h=None):
            x = self.backbone.embed(tokens)
            if h is not None:
                x = x + self.relay_norm(h)            # paper Eq. relay_recurrence: Emb(x) + R(h)
            h_out = self.backbone.layers(x)           # last layer's output = next relay state
            return self.backbone.head(h_out), h_out

    buffer = RolloutBuffer(size=batch_size, mask_id=MASK_ID)
    policy = threshold_policy(tau=0.15, sigma=0.1)    # or partial(block_confidence_unmask, ...)
    for x0, maskable in loader:                       # maskable: cells the model must fill
        buffer.refill(x0, maskable)                   # only finished slots take new data
        out = rollout_loss(model, buffer, K=2, variant="relay", policy=policy, mask_id=MASK_ID)
        out.loss.backward(); opt.step(); opt.zero_grad()

zero_init=True (gamma = beta = 0) makes a pretrained model start exactly where it was; train
from scratch with the default gamma = 1 as the paper's Sudoku models do.
"""
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

MASK = 2  # Sudoku's [MASK] id (sudoku.py); other models pass their own mask_id

StepFn = Callable[[torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]
Policy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
VARIANTS = ("rollout", "relay_sg", "relay")


class RelayLayerNorm(nn.LayerNorm):
    """The relay module R: one affine LayerNorm applied to the carried state (paper App. A.1)."""

    def __init__(self, d: int, eps: float = 1e-5, zero_init: bool = False):
        self.zero_init = zero_init
        super().__init__(d, eps=eps)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.zero_init:  # R(h) = 0 for any h: the host model computes exactly what it did before
            nn.init.zeros_(self.weight)


# ----------------------------------------------------------------------------- unmasking policies

def confidence_unmask(logits: torch.Tensor, candidates: torch.Tensor, tau: float | torch.Tensor) -> torch.Tensor:
    """Cells to commit this step: the relay predictor's rule (design note sudoku.md 4.1).

    Per row: c = max softmax, u = 1 - c at candidate cells; sorted ascending, a cell is committed
    iff the inclusive cumulative sum of u up to it is strictly below tau. A row with candidates
    that commits nothing commits its most confident candidate, so every unfinished row advances.
    logits (B, L, V), candidates (B, L) bool, tau scalar or (B,) -> (B, L) bool.
    """
    conf = logits.detach().float().softmax(-1).amax(-1)  # (B, L)
    u = torch.where(candidates, 1.0 - conf, torch.full_like(conf, float("inf")))
    u_sorted, order = u.sort(dim=-1)
    tau = torch.as_tensor(tau, dtype=conf.dtype, device=conf.device)
    tau = tau.view(-1, 1) if tau.dim() == 1 else tau
    keep_sorted = u_sorted.cumsum(-1) < tau  # inf entries make the sum inf: never kept
    selected = torch.zeros_like(candidates).scatter(-1, order, keep_sorted)
    stuck = candidates.any(-1) & ~selected.any(-1)  # (B,)
    best = torch.where(candidates, conf, torch.full_like(conf, -1.0)).argmax(-1)  # (B,)
    forced = F.one_hot(best, conf.shape[-1]).bool() & stuck[:, None]
    return (selected | forced) & candidates


def block_confidence_unmask(logits: torch.Tensor, candidates: torch.Tensor, threshold: float = 0.85,
                            block_size: int = 32) -> torch.Tensor:
    """Fast-dLLM v2's rule (design note fastdllm_v2.md 3.3 d, 4.2 step 4): commit candidates with
    confidence > threshold, plus the most confident candidate of every block of `block_size`
    positions that still has one. logits (B, L, V), candidates (B, L) -> (B, L) bool."""
    B, L = candidates.shape
    conf = logits.detach().float().softmax(-1).amax(-1)
    conf = torch.where(candidates, conf, torch.full_like(conf, -1.0))
    pad = (-L) % block_size
    blocks = F.pad(conf, (0, pad), value=-1.0).view(B, -1, block_size)  # (B, n_blocks, block_size)
    best = F.one_hot(blocks.argmax(-1), block_size).bool() & (blocks >= 0).any(-1, keepdim=True)
    best = best.view(B, -1)[:, :L]
    return ((conf > threshold) | best) & candidates


def threshold_policy(tau: float = 0.15, sigma: float = 0.1, generator: torch.Generator | None = None) -> Policy:
    """confidence_unmask with a fresh tau = max(0, tau + sigma * eps), eps ~ N(0, 1), drawn once per
    call (= per inner rollout step, one scalar for the whole batch), as the authors' training did.
    sigma = 0 gives the fixed evaluation threshold."""
    def policy(logits: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        t = tau + sigma * torch.randn((), generator=generator).item() if sigma > 0 else tau
        return confidence_unmask(logits, candidates, max(0.0, t))
    return policy


# ----------------------------------------------------------------------------- losses

def masked_ce(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
              reduce_count: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Sum of cross-entropy over `mask` divided by the number of masked tokens (a token mean).

    reduce_count maps the local token count to the denominator; under DDP pass the mean count over
    ranks so that the averaged gradients equal a single process's token mean over the global batch.
    An empty mask gives 0 that is still connected to the graph (every parameter gets a gradient).
    """
    if logits.shape[-1] <= 1024:
        # small vocabularies (Sudoku): CE everywhere, weighted by the mask; no boolean indexing means
        # no host sync and static shapes (torch.compile)
        ce = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), reduction="none")
        ce = (ce * mask.flatten()).sum()
    else:  # LLM vocabularies: an fp32 copy of all (B, L, V) logits would be GBs; take the masked rows first
        ce = F.cross_entropy(logits[mask].float(), targets[mask], reduction="sum")
    count = mask.sum().float()
    if reduce_count is not None:
        count = reduce_count(count)
    return ce / count.clamp(min=1.0)


def mlm_masking(clues: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """MLM noise: t ~ U(0, 1) per sequence, each non-clue cell masked with probability t
    (the linear schedule of paper Eq. mdm_training_objective). clues (B, L) bool -> masked (B, L) bool."""
    B, L = clues.shape
    t = torch.rand(B, 1, generator=generator)
    masked = torch.rand(B, L, generator=generator) < t
    return masked.to(clues.device) & ~clues


def mlm_loss(model: StepFn, x0: torch.Tensor, clues: torch.Tensor, masked: torch.Tensor | None = None,
             mask_id: int = MASK, generator: torch.Generator | None = None,
             reduce_count: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """The MLM baseline. x0 (B, L) solutions, clues (B, L) bool (never masked, never scored).

    Paper Eq. mdm_training_objective weights each sequence's CE by 1/t; the authors' code that
    produced Table 1 takes one token mean over all masked cells of the batch with no 1/t, and so
    do we. `masked` may be given (e.g. drawn for the global batch under DDP), else it is drawn here.
    """
    if masked is None:
        masked = mlm_masking(clues, generator)
    logits, _ = model(torch.where(masked, torch.full_like(x0, mask_id), x0), None)
    return masked_ce(logits, x0, masked, reduce_count)


# ----------------------------------------------------------------------------- rollout buffer

class RolloutBuffer:
    """Per-slot rollout state of Algorithm 1, kept across optimizer steps.

    Slot i holds x0[i] (targets), z[i] (current tokens, teacher-forced so far), maskable[i] (cells
    the model must fill; the rest, e.g. Sudoku clues, are given) and h[i] (carried relay state,
    always stored detached: this is where truncated BPTT cuts). A slot is finished when no
    maskable cell of z is masked; `refill` replaces finished slots with the first rows of the
    incoming batch (the remaining rows are dropped, as in the authors' code) and zeroes their h.
    init="cold": a refilled slot starts with every maskable cell masked (the paper).
    init="staggered": it starts as MLM noise would leave it (each maskable cell masked with
    probability t ~ U(0, 1)), so slots sit at different points of their trajectories.
    Shapes are generic: (size, L) tokens and (size, L, d) states.
    """

    def __init__(self, size: int, mask_id: int = MASK, init: str = "cold"):
        if init not in ("cold", "staggered"):
            raise ValueError(f"buffer init must be 'cold' or 'staggered', got {init!r}")
        self.size, self.mask_id, self.init = size, mask_id, init
        self.x0: torch.Tensor | None = None
        self.z: torch.Tensor | None = None
        self.maskable: torch.Tensor | None = None
        self.h: torch.Tensor | None = None  # allocated by the first relay rollout that stores one

    def masked(self) -> torch.Tensor:
        return (self.z == self.mask_id) & self.maskable  # (size, L)

    def finished(self) -> torch.Tensor:
        if self.z is None:
            return torch.ones(self.size, dtype=torch.bool)
        return ~self.masked().any(-1)  # (size,)

    def refill(self, x0: torch.Tensor, maskable: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Put the first rows of (x0, maskable) (B >= size rows) into the finished slots, in slot
        order; returns how many slots were refilled (a tensor: no host sync on GPUs)."""
        if x0.shape[0] < self.size:
            raise ValueError(f"refill needs at least {self.size} rows (the buffer size), got {x0.shape[0]}")
        x0, maskable = x0[: self.size], maskable[: self.size]
        if self.z is None:
            self.x0, self.maskable, self.z = x0.clone(), maskable.clone(), x0.clone()
            new = torch.ones(self.size, dtype=torch.bool, device=x0.device)
            src = torch.arange(self.size, device=x0.device)
        else:
            new = self.finished()  # (size,)
            src = (new.long().cumsum(0) - 1).clamp(min=0)  # the k-th finished slot takes incoming row k
            self.x0 = torch.where(new[:, None], x0[src], self.x0)
            self.maskable = torch.where(new[:, None], maskable[src], self.maskable)
        hide = self.maskable
        if self.init == "staggered":
            hide = hide & mlm_masking(~hide, generator).to(hide.device)
        self.z = torch.where(new[:, None], torch.where(hide, self.mask_id, self.x0), self.z)
        if self.h is not None:
            self.h = torch.where(new[:, None, None], torch.zeros_like(self.h), self.h)  # a new puzzle starts from h = 0
        return new.sum()

    def state_dict(self) -> dict:
        return {"x0": self.x0, "z": self.z, "maskable": self.maskable, "h": self.h}

    def load_state_dict(self, state: dict) -> None:
        self.x0, self.z, self.maskable, self.h = state["x0"], state["z"], state["maskable"], state["h"]


# ----------------------------------------------------------------------------- K-step rollout loss

@dataclass
class RolloutOutput:
    loss: torch.Tensor  # sum over the K steps of per-step token means (scalar, with graph)
    z: torch.Tensor  # (B, L) tokens after the K teacher-forced steps
    h: torch.Tensor | None  # (B, L, d) detached state to carry into the next window (None for rollout)
    step_losses: list[torch.Tensor]  # detached per-step L_k
    n_masked: list[torch.Tensor]  # masked maskable cells before each step
    n_committed: list[torch.Tensor]  # cells revealed at each step


def rollout_loss(step_fn: StepFn, state: "RolloutBuffer | tuple", K: int = 2, variant: str = "relay",
                 policy: Policy | None = None, mask_id: int = MASK,
                 reduce_count: Callable[[torch.Tensor], torch.Tensor] | None = None) -> RolloutOutput:
    """K on-policy rollout steps with teacher forcing and their summed loss (Algorithm 1).

    step_fn: (z, h) -> (logits, h_out), see the module docstring. Backbones with shifted outputs
        (e.g. causal-LM based MDMs) shift logits and h_out inside step_fn so that position i of
        both belongs to token i.
    state: a RolloutBuffer (its z and h are updated in place) or a tuple (z, x0, maskable, h).
    K: steps per window (paper: 2); gradients span exactly these K forwards.
    variant: "rollout" (no relay: h is always None), "relay_sg" (h detached after every step:
        each step sees the previous state but no gradient crosses steps), "relay" (backprop
        through h across the K steps; paper Eq. relay_two_step_gradient for K = 2).
    policy: (detached logits, candidates) -> cells to commit; default threshold_policy() with
        training tau = max(0, 0.15 + 0.1 eps) drawn per step. Fast-dLLM passes block_confidence_unmask.
    mask_id: the [MASK] token id; reduce_count: see masked_ce (DDP normalisation).
    Returns RolloutOutput(loss, z, h, step_losses, n_masked, n_committed); call loss.backward().
    Step k: candidates = masked maskable cells of z; L_k = token-mean CE over them; commit the
    policy's cells with their TRUE tokens (teacher forcing; the policy only picks positions).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    policy = policy or threshold_policy()
    if isinstance(state, RolloutBuffer):
        if state.z is None:
            raise ValueError("the rollout buffer is empty: call buffer.refill(x0, maskable) first")
        z, x0, maskable, h = state.z, state.x0, state.maskable, state.h
    else:
        z, x0, maskable, h = state
    h = None if variant == "rollout" else (h.detach() if h is not None else None)  # window edge: no grad into the past
    loss = 0.0
    step_losses, n_masked, n_committed = [], [], []
    for _ in range(K):
        candidates = (z == mask_id) & maskable
        logits, h_out = step_fn(z, h)
        loss_k = masked_ce(logits, x0, candidates, reduce_count)  # L_k of paper Eq. relay_rollout_objective
        loss = loss + loss_k
        with torch.no_grad():
            commit = policy(logits.detach(), candidates)
            z = torch.where(commit, x0, z)  # teacher forcing: the unmasking decision is not differentiated
        if variant == "relay":
            h = h_out  # keep the graph: step k+1's loss reaches step k through R(h)
        elif variant == "relay_sg":
            h = h_out.detach()
        step_losses.append(loss_k.detach())
        n_masked.append(candidates.sum())
        n_committed.append(commit.sum())
    h_store = h.detach().float() if h is not None else None
    if isinstance(state, RolloutBuffer):
        state.z = z
        state.h = h_store
    return RolloutOutput(loss, z, h_store, step_losses, n_masked, n_committed)
