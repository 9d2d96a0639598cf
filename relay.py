"""Relay for any masked diffusion model (MDM): training and decoding, torch only, in one file.

Method of "Learned Relay Representations for Forward-Thinking Discrete Diffusion Models"
(Sec. 3): a continuous state h is carried from one unmasking step to the next. Step k computes
    h_{k+1} = f(Emb(x_k) + R(h_k)),   logits_k = head(h_{k+1}),   h_0 = 0          (paper Eq. 2)
with R one affine LayerNorm (RelayLayerNorm), and is trained on K-step on-policy rollouts with
teacher-forced tokens and backpropagation through h across the K steps (Algorithm 1, Eq. 5, Eq. 7).

YOUR MODEL AS A step_fn. Everything here talks to the backbone through one callable
    step_fn(tokens (B, L) long, h (B, L, d) float or None, **extras) -> (logits (B, L, V), h_out (B, L, d))
  - h=None means "no state yet": the first step of a trajectory, h_0 = 0 of Eq. 2. A step_fn must
    give the same result for h=None and h=zeros, because the rollout buffer restarts finished slots
    with zeros while fresh batches and decode's first step pass None (check_step_fn tests this).
    R(0) = beta, not 0, so "h=None" must add beta, not skip R: e.g. R(zeros) or R.bias, as below.
    (The paper's Sudoku model does so at every first step; its Fast-dLLM v2 decoder, a KV-cached
    block loop of its own, gives the first forward of each block no relay at all.)
  - h_out is the state the next step reads: the last hidden state the head reads (for a pre-LN
    model the last block's output, before or after the final norm; R re-normalises it either way).
    Position i of logits and of h_out must belong to token i (shift them inside step_fn for
    next-token-predicting backbones).
  - extras are per-row tensors (e.g. attention_mask) given to RolloutBuffer.refill or decode; they
    reach step_fn sliced to exactly the rows of `tokens`, in the same order.

    class MyRelayMDM(nn.Module):
        def __init__(self, backbone, d):
            super().__init__()
            self.backbone, self.relay_norm = backbone, RelayLayerNorm(d, zero_init=True)
        def forward(self, tokens, h=None):
            x = self.backbone.embed(tokens)
            h = torch.zeros_like(x) if h is None else h   # h=None is h_0 = 0, and R(0) = beta
            h_out = self.backbone.layers(x + self.relay_norm(h))   # Eq. 2: Emb(x) + R(h)
            return self.backbone.head(h_out), h_out

    model = MyRelayMDM(backbone, d)
    buffer = RolloutBuffer(size=batch_size, mask_id=MASK_ID)
    policy = threshold_policy(tau=0.15, sigma=0.1)    # or partial(block_confidence_unmask, ...)
    for x0, maskable in loader:                       # maskable: cells the model must fill
        buffer.refill(x0, maskable)                   # only finished slots take new rows
        out = rollout_loss(model, buffer, K=2, variant="relay", policy=policy)
        out.loss.backward(); opt.step(); opt.zero_grad()
    model.eval()
    result = decode(model, prompts, mask_id=MASK_ID, tau=0.15)   # result.tokens, result.nfe

INITIALISATION. RelayLayerNorm(d, zero_init=True) starts with gamma = beta = 0, so R(h) = 0 and the
host model computes exactly what it computed before; use it when adapting a pretrained model and
for any backbone whose embeddings are far from unit scale (Hugging Face models initialise
embeddings with std 0.02: a gamma = 1 relay of unit scale then drowns the token identity and the
model may not learn at all). The default gamma = 1, beta = 0 is the paper's choice for its Sudoku
models trained from scratch, whose embeddings are N(0, 1) (Appendix A.1.2).
WHERE R(h) GOES: into the residual stream before layer 0, i.e. onto the OUTPUT of the backbone's
embedding module (after its position embeddings and embedding LayerNorm, if it has them). Added to
raw small-scale word embeddings that an embedding LayerNorm then normalises, R(h) outgrows the token
identity as soon as gamma grows, even from zero_init (a BERT example learned nothing that way).

COSTS. rollout_loss runs K forwards and one backward through all K per optimizer step (the paper
uses K = 2: about twice an MLM step's compute; activations of the K forwards are held together).
The buffer keeps one trajectory per slot across optimizer steps; refill takes only as many rows of
each offered batch as slots have finished and DROPS the rest (with trajectories of n steps and K
steps per window, about K/n of the offered rows are used). decode runs one forward per step.
"""
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

StepFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
Policy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
VARIANTS = ("rollout", "relay_sg", "relay")


class RelayLayerNorm(nn.LayerNorm):
    """The relay module R: one affine LayerNorm on the carried state (paper Appendix A.1.2).

    zero_init=False: gamma = 1, beta = 0 (PyTorch default; the paper's Sudoku models from scratch).
    zero_init=True: gamma = beta = 0, so R(h) = 0 at the start: for pretrained models and for
    backbones whose embedding scale is far from 1 (see the module docstring)."""

    def __init__(self, d: int, eps: float = 1e-5, zero_init: bool = False):
        self.zero_init = zero_init
        super().__init__(d, eps=eps)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.zero_init:  # bias is already 0; with weight 0 too, R(h) = 0 for any h
            nn.init.zeros_(self.weight)


# ----------------------------------------------------------------------------- unmasking policies

def confidence_unmask(logits: torch.Tensor, candidates: torch.Tensor, tau: float | torch.Tensor) -> torch.Tensor:
    """Cells to commit this step: the confidence-threshold rule of the paper's Sudoku experiments
    (Sec. 4.1; threshold tau on the maximum softmax probability, Appendix A.1.3).

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
    """Fast-dLLM v2's rule (the paper's Sec. 4.2 model, evaluated at threshold 0.85): commit
    candidates with confidence > threshold, plus the most confident candidate of every block of
    `block_size` positions that still has one. logits (B, L, V), candidates (B, L) -> (B, L) bool."""
    B, L = candidates.shape
    conf = logits.detach().float().softmax(-1).amax(-1)
    conf = torch.where(candidates, conf, torch.full_like(conf, -1.0))
    pad = (-L) % block_size
    blocks = F.pad(conf, (0, pad), value=-1.0).view(B, -1, block_size)  # (B, n_blocks, block_size)
    best = F.one_hot(blocks.argmax(-1), block_size).bool() & (blocks >= 0).any(-1, keepdim=True)
    best = best.view(B, -1)[:, :L]
    return ((conf > threshold) | best) & candidates


def _draw_tau(tau: float, sigma: float, generator: torch.Generator | None) -> float:
    t = tau + sigma * torch.randn((), generator=generator).item() if sigma > 0 else tau
    return max(0.0, t)


def threshold_policy(tau: float = 0.15, sigma: float = 0.1, generator: torch.Generator | None = None) -> Policy:
    """confidence_unmask with a fresh tau = max(0, tau + sigma * eps), eps ~ N(0, 1), drawn once per
    call (= per rollout step, one scalar for the whole batch): the paper's training threshold
    0.15 perturbed by N(0, 0.1^2) (Appendix A.1.3). sigma = 0 gives the fixed evaluation threshold.
    The draw is a host-side .item(): inside torch.compile use draw_taus instead."""
    def policy(logits: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        return confidence_unmask(logits, candidates, _draw_tau(tau, sigma, generator))
    return policy


def draw_taus(n: int, tau: float = 0.15, sigma: float = 0.1, generator: torch.Generator | None = None) -> torch.Tensor:
    """The thresholds of n successive calls of a threshold_policy(tau, sigma, generator) policy, drawn
    now, with the same draws in the same order: a float64 (n,) tensor on the CPU (float64 holds each
    value exactly as the policy's Python float; confidence_unmask rounds both alike). For a compiled
    training step: draw them outside the compiled region (a .item() inside it breaks the graph) and
    pass rollout_loss one policy per step, [partial(confidence_unmask, tau=t) for t in taus]."""
    return torch.tensor([_draw_tau(tau, sigma, generator) for _ in range(n)], dtype=torch.float64)


# ----------------------------------------------------------------------------- input checks

def _check_tokens(x0: torch.Tensor, maskable: torch.Tensor, mask_id: int, what: str) -> None:
    """ValueError unless x0 is (B, L) integer, maskable a bool of the same shape, and no cell to fill
    holds mask_id in x0 (a target of [MASK] would be trained, and teacher forcing would never finish)."""
    if not isinstance(mask_id, int) or isinstance(mask_id, bool):
        raise ValueError(f"{what}: mask_id must be an int token id, got {mask_id!r}")
    if x0.dim() != 2 or x0.dtype.is_floating_point or x0.dtype == torch.bool:
        raise ValueError(f"{what}: x0 must be (B, L) integer token ids, got {x0.dtype} {tuple(x0.shape)}")
    if maskable.dtype != torch.bool or maskable.shape != x0.shape:
        raise ValueError(f"{what}: maskable must be a bool tensor of x0's shape {tuple(x0.shape)} (True = a cell "
                         f"to fill), got {maskable.dtype} {tuple(maskable.shape)}")
    _check_values(((x0 == mask_id) & maskable).any(), f"{what}: x0 holds mask_id={mask_id} at a cell to fill; "
                  f"x0 must be the clean targets (is mask_id right?)")


def _check_values(bad: torch.Tensor, message: str) -> None:
    """Raise when the 0-d bool tensor `bad` is True: eagerly a ValueError (CPU, MPS). On CUDA, bool(bad)
    would make the host wait for the device at every training step, and under torch.compile it breaks
    the graph; there a device-side assert checks the same without a sync (compiled on the CPU: a
    RuntimeError with this message; on CUDA: a device-side assert error that ends the process at its
    next sync). A training loop can check its whole data set once at load (the Sudoku trainer does)."""
    if bad.device.type == "cuda" or torch.compiler.is_compiling():
        torch._assert_async(~bad, message)  # kernels for CPU and CUDA only (not MPS)
    elif bool(bad):
        raise ValueError(message)


def _check_state(h: torch.Tensor | None, tokens: torch.Tensor, what: str) -> None:
    """ValueError unless h is None or a floating (B, L, d) tensor matching tokens (B, L)."""
    if h is None:
        return
    if not isinstance(h, torch.Tensor) or not h.dtype.is_floating_point or h.dim() != 3 \
            or h.shape[:2] != tokens.shape:
        desc = f"{h.dtype} {tuple(h.shape)}" if isinstance(h, torch.Tensor) else type(h).__name__
        raise ValueError(f"{what} must be a floating (B, L, d) = ({tokens.shape[0]}, {tokens.shape[1]}, d) "
                         f"relay state or None, got {desc}")


def _check_step_output(logits: torch.Tensor, h_out: torch.Tensor | None, tokens: torch.Tensor, need_h: bool) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != tokens.shape:
        desc = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"step_fn must return logits of shape (B, L, V) with (B, L) = {tuple(tokens.shape)}, got {desc}")
    if need_h and h_out is None:
        raise ValueError("step_fn returned h_out=None, but a relay variant carries h: return the state (B, L, d)")
    _check_state(h_out, tokens, "step_fn's h_out")


def _call(step_fn: StepFn, tokens: torch.Tensor, h: torch.Tensor | None, extras: dict | None):
    return step_fn(tokens, h, **extras) if extras else step_fn(tokens, h)


def check_step_fn(step_fn: StepFn, tokens: torch.Tensor, d: int, atol: float = 1e-6,
                  extras: dict[str, torch.Tensor] | None = None) -> None:
    """Run step_fn once and check the contract of the module docstring: output shapes, and that
    h=None gives the same logits and h_out as h=zeros. Call it once on a small batch, with the model
    in eval mode (dropout would make the two runs differ). Raises ValueError on a violation."""
    with torch.no_grad():
        logits, h_out = _call(step_fn, tokens, None, extras)
        _check_step_output(logits, h_out, tokens, need_h=True)
        if h_out.shape[-1] != d:
            raise ValueError(f"step_fn's h_out has size {h_out.shape[-1]} in the last dimension, expected d={d}")
        zeros = torch.zeros(*tokens.shape, d, dtype=h_out.dtype, device=h_out.device)
        logits0, h_out0 = _call(step_fn, tokens, zeros, extras)
    if not (torch.allclose(logits.float(), logits0.float(), atol=atol) and torch.allclose(h_out.float(), h_out0.float(), atol=atol)):
        raise ValueError("step_fn gives different outputs for h=None and h=zeros: h=None must mean h_0 = 0 "
                         "(e.g. add R(zeros) = beta, do not skip R), else a refilled buffer slot starts "
                         "differently from a fresh one")


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


def mlm_masking(*, maskable: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """MLM noise: t ~ U(0, 1) per sequence, each maskable cell masked with probability t (the linear
    schedule of paper Eq. 1). maskable (B, L) bool (True = a cell to fill) -> masked (B, L) bool."""
    B, L = maskable.shape
    t = torch.rand(B, 1, generator=generator)
    masked = torch.rand(B, L, generator=generator) < t
    return masked.to(maskable.device) & maskable


def mlm_loss(model: StepFn, x0: torch.Tensor, *, maskable: torch.Tensor, mask_id: int,
             masked: torch.Tensor | None = None, generator: torch.Generator | None = None,
             reduce_count: Callable[[torch.Tensor], torch.Tensor] | None = None,
             extras: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The MLM baseline: x0 (B, L) clean tokens, maskable (B, L) bool (cells to fill; the others,
    e.g. prompts or Sudoku clues, are never masked and never scored), mask_id the [MASK] id.

    Paper Eq. 1 weights each sequence's CE by 1/t; the code that produced the paper's Table 1 takes
    one token mean over all masked cells of the batch with no 1/t, and so do we. `masked` may be
    given (e.g. drawn for the global batch under DDP; it must lie inside maskable), else it is drawn
    here. The model gets h=None (no relay). extras: per-row tensors passed on to the model.
    """
    _check_tokens(x0, maskable, mask_id, "mlm_loss")
    if masked is None:
        masked = mlm_masking(maskable=maskable, generator=generator)
    elif masked.shape != x0.shape:
        raise ValueError("mlm_loss: `masked` must have x0's shape and mask only maskable cells")
    else:
        _check_values((masked & ~maskable).any(), "mlm_loss: `masked` must have x0's shape and mask only maskable cells")
    logits, _ = _call(model, torch.where(masked, torch.full_like(x0, mask_id), x0), None, extras)
    return masked_ce(logits, x0, masked, reduce_count)


# ----------------------------------------------------------------------------- rollout buffer

class RolloutBuffer:
    """Per-slot rollout state of Algorithm 1, kept across optimizer steps.

    Slot i holds x0[i] (targets), z[i] (current tokens, teacher-forced so far), maskable[i] (cells
    the model must fill; the rest, e.g. prompts or Sudoku clues, are given), h[i] (carried relay
    state, always stored detached: this is where truncated BPTT cuts) and extras[name][i] (per-row
    model inputs such as an attention mask). A slot is finished when no maskable cell of z is masked;
    `refill` puts the first rows of the incoming batch into the finished slots (the remaining rows
    are dropped) and zeroes their h.
    init="cold": a refilled slot starts with every maskable cell masked (Algorithm 1).
    init="staggered": it starts as MLM noise would leave it (each maskable cell masked with
    probability t ~ U(0, 1)), so slots sit at different points of their trajectories.
    Shapes are generic: (size, L) tokens and (size, L, d) states.
    refill and rollout_loss replace the buffer's tensors rather than write into them: under
    torch.compile, in-place writes to the buffer let the compiled backward read a tensor the step had
    already rewritten (seen here: wrong relay gradients, with a correct loss).
    """

    def __init__(self, size: int, mask_id: int, init: str = "cold"):
        if init not in ("cold", "staggered"):
            raise ValueError(f"buffer init must be 'cold' or 'staggered', got {init!r}")
        if not isinstance(mask_id, int) or isinstance(mask_id, bool):
            raise ValueError(f"RolloutBuffer: mask_id must be an int token id, got {mask_id!r}")
        self.size, self.mask_id, self.init = size, mask_id, init
        self.x0: torch.Tensor | None = None
        self.z: torch.Tensor | None = None
        self.maskable: torch.Tensor | None = None
        self.h: torch.Tensor | None = None  # allocated by the first relay rollout that stores one
        self.extras: dict[str, torch.Tensor] = {}

    def allocate(self, length: int, device: torch.device | str | None = None, state_dim: int | None = None,
                 dtype: torch.dtype = torch.long, extras: dict[str, torch.Tensor] | None = None) -> None:
        """Set up every slot now, empty and therefore finished: the next refill fills them all, as a
        first refill would. state_dim: h too, as float32 zeros (size, length, state_dim). extras:
        (size, ...) tensors giving each extra's shape and dtype (their values are not used).
        Optional (refill allocates on first use); a training loop that allocates up front runs the
        same code at its first step as at every other (one torch.compile graph, no recompile)."""
        self.x0 = torch.zeros(self.size, length, dtype=dtype, device=device)
        self.z = self.x0.clone()
        self.maskable = torch.zeros(self.size, length, dtype=torch.bool, device=device)
        self.h = torch.zeros(self.size, length, state_dim, device=device) if state_dim is not None else None
        self.extras = {k: torch.zeros_like(v[: self.size]) for k, v in (extras or {}).items()}

    def masked(self) -> torch.Tensor:
        return (self.z == self.mask_id) & self.maskable  # (size, L)

    def finished(self) -> torch.Tensor:
        if self.z is None:
            return torch.ones(self.size, dtype=torch.bool)
        return ~self.masked().any(-1)  # (size,)

    def refill(self, x0: torch.Tensor, maskable: torch.Tensor, generator: torch.Generator | None = None,
               extras: dict[str, torch.Tensor] | None = None, start_masked: torch.Tensor | None = None) -> torch.Tensor:
        """Put the first rows of (x0, maskable, extras) (B >= size rows) into the finished slots, in
        slot order; returns how many slots were refilled (a tensor: no host sync on GPUs). The share
        of the offered rows that is used is refilled / B; the others are dropped.
        init="staggered" draws which cells of a refilled slot start masked with
        mlm_masking(generator); start_masked, a (size, L) bool tensor, gives that draw instead
        (mlm_masking(maskable=all True, generator=...) is the same draw, made e.g. outside a compiled region)."""
        _check_tokens(x0, maskable, self.mask_id, "RolloutBuffer.refill")
        extras = dict(extras or {})
        if x0.shape[0] < self.size:
            raise ValueError(f"refill needs at least {self.size} rows (the buffer size), got {x0.shape[0]}")
        if self.z is not None and (x0.shape[1] != self.z.shape[1] or set(extras) != set(self.extras)):
            raise ValueError(f"refill: got length {x0.shape[1]} and extras {sorted(extras)}, but the buffer holds "
                             f"length {self.z.shape[1]} and extras {sorted(self.extras)}")
        for name, v in extras.items():
            if v.shape[0] != x0.shape[0]:
                raise ValueError(f"refill: extras[{name!r}] has {v.shape[0]} rows, x0 has {x0.shape[0]}")
        x0, maskable = x0[: self.size], maskable[: self.size]
        extras = {k: v[: self.size] for k, v in extras.items()}
        if self.z is None:  # first use: every slot empty (finished), so all of them take a row
            h = self.h
            self.allocate(x0.shape[1], x0.device, dtype=x0.dtype, extras=extras)
            self.h = h
        new = self.finished()  # (size,)
        src = (new.long().cumsum(0) - 1).clamp(min=0)  # the k-th finished slot takes incoming row k

        def take(incoming: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
            return torch.where(new.view(-1, *[1] * (current.dim() - 1)), incoming[src], current)
        self.x0, self.maskable = take(x0, self.x0), take(maskable, self.maskable)
        self.extras = {k: take(extras[k], v) for k, v in self.extras.items()}
        hide = self.maskable
        if self.init == "staggered":
            if start_masked is None:
                start_masked = mlm_masking(maskable=hide, generator=generator)
            hide = hide & start_masked.to(hide.device)
        self.z = torch.where(new[:, None], torch.where(hide, self.mask_id, self.x0), self.z)
        if self.h is not None:
            self.h = torch.where(new[:, None, None], torch.zeros_like(self.h), self.h)  # a new trajectory starts from h = 0
        return new.sum()

    def state_dict(self) -> dict[str, torch.Tensor | None]:
        """Tensors (or None) only, so callers can move every entry with .to(device)."""
        return {"x0": self.x0, "z": self.z, "maskable": self.maskable, "h": self.h,
                "mask_id": torch.tensor(self.mask_id), **{f"extras.{k}": v for k, v in self.extras.items()}}

    def load_state_dict(self, state: dict) -> None:
        saved_mask_id = state.get("mask_id")
        if saved_mask_id is not None and int(saved_mask_id) != self.mask_id:
            raise ValueError(f"buffer state was saved with mask_id={int(saved_mask_id)}, this buffer has {self.mask_id}")
        if state["z"] is not None:
            _check_state(state["h"], state["z"], "the buffer state's h")
        self.x0, self.z, self.maskable, self.h = state["x0"], state["z"], state["maskable"], state["h"]
        self.extras = {k[len("extras."):]: v for k, v in state.items() if k.startswith("extras.")}


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
                 policy: Policy | Sequence[Policy] | None = None, mask_id: int | None = None,
                 reduce_count: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 extras: dict[str, torch.Tensor] | None = None) -> RolloutOutput:
    """K on-policy rollout steps with teacher forcing and their summed loss (Algorithm 1, Eq. 5).

    step_fn: (z, h, **extras) -> (logits, h_out), see the module docstring.
    state: a RolloutBuffer (its z and h are updated in place; its extras reach step_fn) or a tuple
        (z, x0, maskable, h) with h None or (B, L, d), plus `extras` here if step_fn needs them.
    K: steps per window (paper: 2). Cost: K forwards, and the backward of loss runs through all K.
    variant: "rollout" (no relay: h is always None), "relay_sg" (h detached after every step:
        each step sees the previous state but no gradient crosses steps), "relay" (backprop
        through h across the K steps: Eq. 7, the two-step gradient of Sec. 3.2 for K = 2).
    policy: (detached logits, candidates) -> cells to commit; default threshold_policy() with
        training tau = max(0, 0.15 + 0.1 eps) drawn per step. Fast-dLLM passes block_confidence_unmask.
        A list of K policies gives step k the k-th (e.g. thresholds drawn by draw_taus outside torch.compile).
    mask_id: the [MASK] id; taken from the buffer (an error if given and different), required with a tuple.
    reduce_count: see masked_ce (DDP normalisation).
    Returns RolloutOutput(loss, z, h, step_losses, n_masked, n_committed); call loss.backward().
    Step k: candidates = masked maskable cells of z; L_k = token-mean CE over them; commit the
    policy's cells with their TRUE tokens (teacher forcing; the policy only picks positions).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    policies = list(policy) if isinstance(policy, (list, tuple)) else [policy or threshold_policy()] * K
    if len(policies) != K:
        raise ValueError(f"rollout_loss: got {len(policies)} policies for K={K} steps")
    if isinstance(state, RolloutBuffer):
        if state.z is None:
            raise ValueError("the rollout buffer is empty: call buffer.refill(x0, maskable) first")
        if mask_id is not None and mask_id != state.mask_id:
            raise ValueError(f"rollout_loss got mask_id={mask_id} but the buffer uses mask_id={state.mask_id}")
        if extras is not None:
            raise ValueError("rollout_loss: the buffer carries its own extras; give them to buffer.refill")
        z, x0, maskable, h = state.z, state.x0, state.maskable, state.h
        mask_id, extras = state.mask_id, state.extras
    else:
        if mask_id is None:
            raise ValueError("rollout_loss: pass mask_id=... (the [MASK] token id) with a tuple state")
        z, x0, maskable, h = state
        _check_tokens(x0, maskable, mask_id, "rollout_loss")
        if z.shape != x0.shape:
            raise ValueError(f"rollout_loss: z has shape {tuple(z.shape)}, x0 {tuple(x0.shape)}")
    _check_state(h, z, "the relay state h")
    h = None if variant == "rollout" else (h.detach() if h is not None else None)  # window edge: no grad into the past
    loss = 0.0
    step_losses, n_masked, n_committed = [], [], []
    for policy in policies:
        candidates = (z == mask_id) & maskable
        logits, h_out = _call(step_fn, z, h, extras)
        _check_step_output(logits, h_out, z, need_h=variant != "rollout")
        loss_k = masked_ce(logits, x0, candidates, reduce_count)  # L_k of paper Eq. 5
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


# ----------------------------------------------------------------------------- decoding

@dataclass
class DecodeOutput:
    tokens: torch.Tensor  # (B, L) final tokens
    nfe: torch.Tensor  # (B,) forwards each row took: its loop steps, + 1 if it needed the final fill
    steps: torch.Tensor  # (B,) loop steps each row took part in (the final fill not counted)
    batch_nfe: int  # loop iterations of the whole batch + 1 final forward = 1 + max(steps); Table 1: steps + 1


StepHook = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]


def decode(step_fn: StepFn, tokens: torch.Tensor, *, mask_id: int, tau: float = 0.15, max_steps: int = 64,
           maskable: torch.Tensor | None = None, carry: bool = True, early_exit: bool = True,
           allowed: Sequence[int] | torch.Tensor | None = None, extras: dict[str, torch.Tensor] | None = None,
           on_step: StepHook | None = None) -> DecodeOutput:
    """Confidence-threshold unmasking with the relay carry (the paper's Sudoku inference, Sec. 4.1).

    tokens (B, L): the prompt, mask_id where the model fills in (not modified). Each step runs one
    forward on the rows that still have a cell to fill, commits the cells confidence_unmask(tau)
    selects (at least one per row) with their argmax token, and feeds h_out back as the next step's h
    (h = None at the first step). After max_steps loop steps, one final forward fills every cell
    still masked with its argmax. A committed argmax can be mask_id itself (the argmax runs over the
    whole vocabulary, as the paper's Sudoku evaluation did); such a cell stays open for later steps.

    maskable: optional (B, L) bool, the cells that may be filled (default: every mask_id cell).
    carry: feed h_out back (relay models); False gives every forward h=None.
    early_exit: finished rows leave the batch (no forward is spent on them); False forwards every
        row until the slowest is done, as the paper's code did (same tokens and nfe, more compute).
    allowed: optional token ids the decoder may write; the other logits are set to -inf before the
        confidence and the argmax. It must not contain mask_id.
    extras: per-row tensors for step_fn, sliced to the rows of each forward.
    on_step(step, rows, tokens, committed): called after each forward with its index (0, 1, ...;
        the final fill gets the next index), the (b,) batch indices of the rows that still had a cell
        to fill, their (b, L) tokens after the forward and the (b, L) bool cells it committed.
    NFE: nfe counts each row's own forwards; batch_nfe = 1 + max(steps) charges every row of the batch
    for its slowest row, plus a final forward. The paper's Table 1 counts at batch size 1: steps + 1
    per row (its authors' validation logs count batches of 512).
    Put the model in eval mode first (an nn.Module step_fn in training mode is an error).
    """
    if isinstance(step_fn, nn.Module) and step_fn.training:
        raise ValueError("decode: the model is in training mode (dropout on); call model.eval() first")
    if tokens.dim() != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"decode: tokens must be (B, L) integer ids, got {tokens.dtype} {tuple(tokens.shape)}")
    if not tau >= 0 or max_steps < 1:
        raise ValueError(f"decode: need tau >= 0 and max_steps >= 1, got {tau} and {max_steps}")
    if maskable is not None and (maskable.dtype != torch.bool or maskable.shape != tokens.shape):
        raise ValueError(f"decode: maskable must be a bool tensor of shape {tuple(tokens.shape)}")
    if allowed is not None:
        allowed = torch.as_tensor(allowed, dtype=torch.long, device=tokens.device).flatten()
        if bool((allowed == mask_id).any()):
            raise ValueError(f"decode: allowed contains mask_id={mask_id}; the decoder could commit [MASK] forever")
    extras = extras or {}
    B = tokens.shape[0]
    with torch.no_grad():
        x = tokens.clone()
        fill = (x == mask_id) if maskable is None else (x == mask_id) & maskable
        steps = torch.zeros(B, dtype=torch.long, device=x.device)
        rows = torch.arange(B, device=x.device)  # the rows the next forward runs on
        h = None  # relay state of `rows`

        banned = None  # (V,) bool, the ids `allowed` leaves out; built at the first forward (V unknown before)

        def forward(cur: torch.Tensor, h: torch.Tensor | None):
            nonlocal banned
            logits, h_out = _call(step_fn, cur, h if carry else None, {k: v[rows] for k, v in extras.items()})
            _check_step_output(logits, h_out, cur, need_h=False)
            if allowed is not None and banned is None:
                V = logits.shape[-1]
                if bool(((allowed < 0) | (allowed >= V)).any()):
                    raise ValueError(f"decode: allowed ids must lie in 0..{V - 1}, got {allowed.tolist()}")
                banned = torch.ones(V, dtype=torch.bool, device=logits.device).index_fill(0, allowed.to(logits.device), False)
            if banned is not None:
                logits = logits.masked_fill(banned, float("-inf"))
            return logits, h_out

        n_forward = 0
        for _ in range(max_steps):
            cur, cand = x[rows], fill[rows] & (x[rows] == mask_id)
            live = cand.any(1)
            n_live = int(live.sum())  # the one host sync per step
            if n_live == 0:
                break
            if early_exit and n_live < len(rows):
                rows, cur, cand = rows[live], cur[live], cand[live]
                h = h[live] if h is not None else None
                live = live[live]
            logits, h = forward(cur, h)
            commit = confidence_unmask(logits.float(), cand, tau)
            cur = torch.where(commit, logits.argmax(-1), cur)
            x[rows] = cur
            steps[rows[live]] += 1
            if on_step is not None:
                on_step(n_forward, rows[live], cur[live], commit[live])
            n_forward += 1
        nfe = steps.clone()
        left = (fill[rows] & (x[rows] == mask_id)).any(1)
        if bool(left.any()):  # max_steps reached: one final forward fills every remaining [MASK]
            if early_exit:
                rows, h = rows[left], (h[left] if h is not None else None)
                left = left[left]
            cur = x[rows]
            logits, _ = forward(cur, h)
            commit = fill[rows] & (cur == mask_id) & left[:, None]
            cur = torch.where(commit, logits.argmax(-1), cur)
            x[rows] = cur
            nfe[rows[left]] += 1
            if on_step is not None:
                on_step(n_forward, rows[left], cur[left], commit[left])
    return DecodeOutput(x, nfe, steps, 1 + int(steps.max()) if B else 1)
