"""Relay for any masked diffusion model (MDM), torch only: the one file to copy next to your code.

"Learned Relay Representations for Forward-Thinking Discrete Diffusion Models", Sec. 3: a state h is
carried across unmasking steps, h_{k+1} = f(Emb(x_k) + R(h_k)), logits_k = head(h_{k+1}), h_0 = 0 (Eq. 2),
R a LayerNorm, trained on K-step on-policy rollouts with teacher-forced tokens and backpropagation
through h across the K steps (Algorithm 1, Eq. 5, Eq. 7).

THE CONTRACT: step_fn(tokens (B, L) long, h (B, L, d) or None, **extras) -> (logits (B, L, V), h_out
(B, L, d)), h_out the hidden state the head reads, position i belonging to token i; extras are per-row
tensors. h=None is h_0 = 0 and must act as h=zeros (check_step_fn tests it): R(0) = beta, so add
R(zeros), never skip R.

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
    for x0, maskable in loader:                        # maskable: the cells the model must fill
        buffer.refill(x0, maskable)                    # only finished slots take new rows
        policy = [partial(confidence_unmask, tau=t) for t in draw_taus(2, tau=0.15, sigma=0.1)]
        out = rollout_loss(model, **buffer.inputs(), K=2, variant="relay", policy=policy)
        buffer.update(out)                             # the slots move on to the rolled-out z and h
        out.loss.backward(); opt.step(); opt.zero_grad()
    result = decode(model.eval(), prompts, mask_id=MASK_ID, tau=0.15)   # result.tokens, result.nfe

The guide (initialisation, costs, torch.compile, errors): docs/relay_api in this file's repository.
"""
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

StepFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
Policy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (detached logits, candidates) -> cells to commit
StepHook = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]
VARIANTS = ("rollout", "relay_sg", "relay")


def _call(step_fn: StepFn, tokens: torch.Tensor, h: torch.Tensor | None, extras: dict | None):
    return step_fn(tokens, h, **extras) if extras else step_fn(tokens, h)


class RelayLayerNorm(nn.LayerNorm):
    """The relay module R: one affine LayerNorm (paper Appendix A.1.2), by default gamma = 1, beta = 0 as
    the paper's Sudoku models. zero_init=True: gamma = beta = 0, so R(h) = 0 and the host model starts as it was: for
    pretrained models and small embeddings (Hugging Face's std 0.02), which a unit-scale R(h) drowns."""

    def __init__(self, d: int, eps: float = 1e-5, zero_init: bool = False):
        self.zero_init = zero_init
        super().__init__(d, eps=eps)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.zero_init:  # bias is already 0; with weight 0 too, R(h) = 0 for any h
            nn.init.zeros_(self.weight)


# ----------------------------------------------------------------------------- the unmasking rule

def confidence_unmask(logits: torch.Tensor, candidates: torch.Tensor, tau: float | torch.Tensor) -> torch.Tensor:
    """The paper's confidence-threshold rule (Sec. 4.1, Appendix A.1.3): per row, u = 1 - max softmax at
    candidate cells, sorted ascending; a cell is committed iff the inclusive cumulative sum of u up to it
    is below tau, else the most confident candidate alone, so every unfinished row advances.
    logits (B, L, V), candidates (B, L) bool, tau scalar or (B,) -> (B, L) bool."""
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


def draw_taus(n: int, tau: float = 0.15, sigma: float = 0.1, generator: torch.Generator | None = None,
              device: torch.device | str | None = None) -> torch.Tensor:
    """n training thresholds max(0, tau + sigma * eps), eps ~ N(0, 1) (the paper: 0.15, 0.1, Appendix
    A.1.3), one per rollout step: policy=[partial(confidence_unmask, tau=t) for t in taus]. Drawn outside
    rollout_loss, so that it draws nothing and compiles in one graph. On the host (a CPU generator, or no
    generator and no device): one scalar draw each, float64. On a GPU (a CUDA generator, or device=cuda
    with the default generator): one draw of n on the device, no host sync (a CUDA graph can hold it)."""
    on = generator.device if generator is not None else torch.device(device or "cpu")
    if on.type != "cpu":
        eps = torch.randn(n, generator=generator, device=on) if sigma > 0 else torch.zeros(n, device=on)
        return (tau + sigma * eps).clamp(min=0.0)
    eps = [torch.randn((), generator=generator).item() if sigma > 0 else 0.0 for _ in range(n)]
    return torch.tensor([max(0.0, tau + sigma * e) for e in eps], dtype=torch.float64)


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


# ----------------------------------------------------------------------------- the MLM loss

def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """bf16 / fp16 up to float32 for losses and the stored relay state; float32 and float64 as they are
    (a plain .float() would round a float64 run down to float32, e.g. a golden test's)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def masked_ce(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
              reduce_count: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Cross-entropy summed over `mask` / the number of masked tokens (a token mean); an empty mask gives
    a 0 still connected to the graph. reduce_count maps the local count to the denominator: under DDP
    the mean count over ranks, so that averaged gradients equal one process's token mean."""
    if logits.shape[-1] <= 1024:
        # small vocabularies (Sudoku): CE everywhere, weighted by the mask; no boolean indexing means
        # no host sync and static shapes (torch.compile)
        ce = F.cross_entropy(at_least_fp32(logits.flatten(0, -2)), targets.flatten(), reduction="none")
        ce = (ce * mask.flatten()).sum()
    else:  # LLM vocabularies: an fp32 copy of all (B, L, V) logits would be GBs; take the masked rows first
        ce = F.cross_entropy(at_least_fp32(logits[mask]), targets[mask], reduction="sum")
    count = mask.sum().float()
    if reduce_count is not None:
        count = reduce_count(count)
    return ce / count.clamp(min=1.0)


def mlm_masking(*, maskable: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """MLM noise: t ~ U(0, 1) per sequence, each maskable cell masked with probability t (the linear
    schedule of paper Eq. 1). maskable (B, L) bool (True = a cell to fill) -> masked (B, L) bool."""
    B, L = maskable.shape
    on = generator.device if generator is not None else maskable.device  # drawn where the generator lives
    t = torch.rand(B, 1, generator=generator, device=on)
    masked = torch.rand(B, L, generator=generator, device=on) < t
    return masked.to(maskable.device) & maskable


def mlm_loss(model: StepFn, x0: torch.Tensor, *, maskable: torch.Tensor, mask_id: int,
             masked: torch.Tensor | None = None, generator: torch.Generator | None = None,
             reduce_count: Callable[[torch.Tensor], torch.Tensor] | None = None,
             extras: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The MLM baseline (paper Eq. 1): x0 (B, L) clean tokens, maskable (B, L) bool (cells to fill; the
    others, e.g. prompts or clues, are never masked nor scored). The code behind the paper's Table 1
    takes one token mean over the batch without Eq. 1's 1/t, and so do we. `masked` may be given
    (drawn for the global batch under DDP, or outside torch.compile). The model gets h=None."""
    _check_tokens(x0, maskable, mask_id, "mlm_loss")
    if masked is None:
        masked = mlm_masking(maskable=maskable, generator=generator)
    else:
        _check_masked(masked, maskable)
    logits, _ = _call(model, torch.where(masked, torch.full_like(x0, mask_id), x0), None, extras)
    return masked_ce(logits, x0, masked, reduce_count)  # Eq. 1 without 1/t


# ----------------------------------------------------------------------------- the rollout buffer

class RolloutBuffer:
    """Per-slot state of Algorithm 1 across optimizer steps: x0, z, maskable, h (stored detached: where
    truncated BPTT cuts) and per-row extras; a slot is finished when no maskable cell of z is masked.
    init="cold": a new slot starts fully masked (Algorithm 1); "staggered": as MLM noise leaves it.
    The tensors are replaced, never written in place: under torch.compile the backward would read a
    tensor the step had rewritten (seen: wrong relay gradients)."""

    def __init__(self, size: int, mask_id: int, init: str = "cold"):
        _check_buffer(mask_id, init)
        self.size, self.mask_id, self.init = size, mask_id, init
        self.x0 = self.z = self.maskable = self.h = None  # h: set by the first relay rollout (or allocate)
        self.extras: dict[str, torch.Tensor] = {}
        self.awaiting_update = False  # inputs() handed out, update(out) not yet called

    def allocate(self, length: int, device: torch.device | str | None = None, state_dim: int | None = None,
                 dtype: torch.dtype = torch.long, extras: dict[str, torch.Tensor] | None = None) -> None:
        """Optional: every slot now, empty (finished), so that the first step runs the code of the others (one
        compiled graph). state_dim: h as float32 zeros too; extras: tensors giving shapes and dtypes."""
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
        """Alg. 1 lines 2-3: the first rows of (x0, maskable, extras) go into the finished slots, with h = 0;
        the other rows are DROPPED. Returns how many (a tensor: no host sync). start_masked replaces
        staggered's draw, e.g. mlm_masking(maskable=all True, generator=g) made outside torch.compile."""
        if self.awaiting_update:  # else the next step silently rolls out the same window again
            raise RuntimeError("RolloutBuffer.refill: call buffer.update(out) with rollout_loss's output first")
        extras = dict(extras or {})
        _check_refill(self, x0, maskable, extras)
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
        self.z = torch.where(new[:, None], torch.where(hide, self.mask_id, self.x0), self.z)  # z <- [MASK]^L
        if self.h is not None:
            self.h = torch.where(new[:, None, None], torch.zeros_like(self.h), self.h)  # h <- 0
        return new.sum()

    def inputs(self) -> dict:
        """The keyword arguments of rollout_loss: rollout_loss(step_fn, **buffer.inputs(), ...). The
        buffer is the one source of mask_id (passing mask_id= as well is a TypeError)."""
        if self.z is None:
            raise ValueError("the rollout buffer is empty: call buffer.refill(x0, maskable) first")
        self.awaiting_update = True
        return dict(x0=self.x0, z=self.z, maskable=self.maskable, h=self.h, mask_id=self.mask_id, extras=self.extras)

    def update(self, out: "RolloutOutput") -> None:
        """Move every slot on to the tokens and (detached) state its rollout ended in."""
        self.z, self.h = out.z, out.h
        self.awaiting_update = False

    def state_dict(self) -> dict[str, torch.Tensor | None]:
        """Tensors (or None) only, so callers can move every entry with .to(device)."""
        return {"x0": self.x0, "z": self.z, "maskable": self.maskable, "h": self.h,
                "mask_id": torch.tensor(self.mask_id), **{f"extras.{k}": v for k, v in self.extras.items()}}

    def load_state_dict(self, state: dict) -> None:
        _check_buffer_state(state, self.mask_id)
        self.x0, self.z, self.maskable, self.h = state["x0"], state["z"], state["maskable"], state["h"]
        self.awaiting_update = False
        self.extras = {k[len("extras."):]: v for k, v in state.items() if k.startswith("extras.")}


# ----------------------------------------------------------------------------- the K-step rollout loss

@dataclass
class RolloutOutput:
    loss: torch.Tensor  # sum over the K steps of per-step token means (scalar, with graph)
    z: torch.Tensor  # (B, L) tokens after the K teacher-forced steps
    h: torch.Tensor | None  # (B, L, d) detached float state to carry into the next window (None for rollout)
    step_losses: list[torch.Tensor]  # detached per-step L_k
    n_masked: list[torch.Tensor]  # masked maskable cells before each step
    n_committed: list[torch.Tensor]  # cells revealed at each step


def rollout_loss(step_fn: StepFn, *, x0: torch.Tensor, z: torch.Tensor, maskable: torch.Tensor,
                 h: torch.Tensor | None, mask_id: int, policy: Policy | Sequence[Policy], K: int = 2,
                 variant: str = "relay", reduce_count: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 extras: dict[str, torch.Tensor] | None = None) -> RolloutOutput:
    """K on-policy rollout steps with teacher forcing and their summed loss (Algorithm 1 lines 4-10, Eq. 5)
    from the state: x0 (B, L) targets, z (B, L) current tokens, maskable (B, L) bool, h None or (B, L, d),
    extras for step_fn; usually **buffer.inputs(), then buffer.update(out). K forwards, one backward.
    variant: "rollout" (no relay: h is always None), "relay_sg" (h detached after every step), "relay"
        (backpropagation through h across the K steps: Eq. 7, Sec. 3.2's two-step gradient for K = 2).
    policy: (detached logits, candidates) -> cells to commit, or a list of K of them, step k using the
        k-th: [partial(confidence_unmask, tau=t) for t in draw_taus(K)] (Sudoku), or
        partial(block_confidence_unmask, ...) (Fast-dLLM v2). reduce_count: see masked_ce."""
    policies = list(policy) if isinstance(policy, (list, tuple)) else [policy] * K
    _check_rollout(x0, z, maskable, h, mask_id, K, variant, policies)
    h = None if variant == "rollout" else (h.detach() if h is not None else None)  # window edge: no grad into the past
    loss = 0.0  # Alg. 1 line 4: L <- 0
    step_losses, n_masked, n_committed = [], [], []
    for policy in policies:  # Alg. 1 line 5: for k in 0..K-1
        candidates = (z == mask_id) & maskable  # M(z): the still-masked cells to fill
        logits, h_out = _call(step_fn, z, h, extras)  # Alg. 1 lines 6-7: h <- f(Emb(z) + R(h)), logits <- head(h)
        _check_step_output(logits, h_out, z, need_h=variant != "rollout")
        loss_k = masked_ce(logits, x0, candidates, reduce_count)  # L_k of Eq. 5, a token mean as the paper's code
        loss = loss + loss_k  # Alg. 1 line 8: L <- L + L_k, masked positions only
        with torch.no_grad():  # Sec. 3.2: the unmasking decision is not differentiated
            commit = policy(logits.detach(), candidates)  # Alg. 1 line 9: U ~ u(. | logits, z)
            z = torch.where(commit, x0, z)  # Alg. 1 line 10: z^i <- x0^i for i in U (teacher forcing)
        if variant == "relay":
            h = h_out  # keep the graph: step k+1's loss reaches step k through R(h) (Eq. 6-7)
        elif variant == "relay_sg":
            h = h_out.detach()
        step_losses.append(loss_k.detach())
        n_masked.append(candidates.sum())
        n_committed.append(commit.sum())
    h_store = at_least_fp32(h.detach()) if h is not None else None  # the truncation of truncated BPTT
    return RolloutOutput(loss, z, h_store, step_losses, n_masked, n_committed)  # Alg. 1 line 11 (update): the caller's


# ----------------------------------------------------------------------------- decoding

@dataclass
class DecodeOutput:
    tokens: torch.Tensor  # (B, L) final tokens
    nfe: torch.Tensor  # (B,) forwards each row took: its loop steps, + 1 if it needed the final fill
    steps: torch.Tensor  # (B,) loop steps each row took part in (the final fill not counted)
    batch_nfe: int  # loop iterations of the whole batch + 1 final forward = 1 + max(steps); Table 1: steps + 1


def decode(step_fn: StepFn, tokens: torch.Tensor, *, mask_id: int, tau: float = 0.15, max_steps: int = 64,
           maskable: torch.Tensor | None = None, carry: bool = True, early_exit: bool = True,
           extras: dict[str, torch.Tensor] | None = None, on_step: StepHook | None = None) -> DecodeOutput:
    """Confidence-threshold unmasking with the relay carry (the paper's Sudoku inference, Sec. 4.1).

    tokens (B, L): the prompt, mask_id where to fill. Each step runs one forward on the rows with a cell
    left, commits the cells confidence_unmask(tau) selects with their argmax (over the whole vocabulary,
    as the paper; restrict it with -inf logits in step_fn) and feeds h_out back as the next h (None
    first; carry=False: always None). After max_steps, one final forward fills what is still masked.
    maskable: the cells that may be filled (default: every mask_id cell). early_exit=False forwards
    every row until the slowest is done, as the paper's code (same result). on_step(step, rows, tokens,
    committed) is called after each forward (the final fill's step is max_steps) with the (b,) batch
    indices of the rows that had a cell left, their (b, L) tokens and (b, L) committed cells.
    nfe: each row's forwards; batch_nfe = 1 + max(steps): the paper's Table 1 count at batch size 1.
    """
    _check_decode(step_fn, tokens, tau, max_steps, maskable)
    extras = extras or {}
    B = tokens.shape[0]
    with torch.no_grad():
        x = tokens.clone()
        fill = (x == mask_id) if maskable is None else (x == mask_id) & maskable
        steps = torch.zeros(B, dtype=torch.long, device=x.device)
        rows = torch.arange(B, device=x.device)  # the rows the next forward runs on
        h = None  # relay state of `rows`

        def forward(cur: torch.Tensor, h: torch.Tensor | None):
            logits, h_out = _call(step_fn, cur, h if carry else None, {k: v[rows] for k, v in extras.items()})
            _check_step_output(logits, h_out, cur, need_h=False)
            return logits, h_out

        for step in range(max_steps):
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
                on_step(step, rows[live], cur[live], commit[live])
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
                on_step(max_steps, rows[left], cur[left], commit[left])  # the loop ran all max_steps
    return DecodeOutput(x, nfe, steps, 1 + int(steps.max()) if B else 1)


# ----------------------------------------------------------------------------- argument checks

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
    if not (torch.allclose(logits.float(), logits0.float(), atol=atol)
            and torch.allclose(h_out.float(), h_out0.float(), atol=atol)):
        raise ValueError("step_fn gives different outputs for h=None and h=zeros: h=None must mean h_0 = 0 (add "
                         "R(zeros) = beta, do not skip R), else a refilled buffer slot starts unlike a fresh one")


def _check_values(bad: torch.Tensor, message: str) -> None:
    """A ValueError when the 0-d bool `bad` is True; on CUDA and under torch.compile a device-side assert
    (bool(bad) would sync the host every step, or break the graph), so check data once at load."""
    if bad.device.type == "cuda" or torch.compiler.is_compiling():
        torch._assert_async(~bad, message)  # kernels for CPU and CUDA only (not MPS)
    elif bool(bad):
        raise ValueError(message)


def _check_tokens(x0: torch.Tensor, maskable: torch.Tensor, mask_id: int, what: str) -> None:
    """x0 (B, L) integer, maskable a bool of its shape, and no cell to fill holding mask_id in x0 (a
    target of [MASK] would be trained, and teacher forcing would never finish)."""
    _check_mask_id(mask_id, what)
    if x0.dim() != 2 or x0.dtype.is_floating_point or x0.dtype == torch.bool:
        raise ValueError(f"{what}: x0 must be (B, L) integer token ids, got {x0.dtype} {tuple(x0.shape)}")
    if maskable.dtype != torch.bool or maskable.shape != x0.shape:
        raise ValueError(f"{what}: maskable must be a bool tensor of x0's shape {tuple(x0.shape)} (True = a cell "
                         f"to fill), got {maskable.dtype} {tuple(maskable.shape)}")
    _check_values(((x0 == mask_id) & maskable).any(), f"{what}: x0 holds mask_id={mask_id} at a cell to fill; "
                  f"x0 must be the clean targets (is mask_id right?)")


def _check_mask_id(mask_id: int, what: str) -> None:
    if not isinstance(mask_id, int) or isinstance(mask_id, bool):
        raise ValueError(f"{what}: mask_id must be an int token id, got {mask_id!r}")


def _check_masked(masked: torch.Tensor, maskable: torch.Tensor) -> None:
    message = "mlm_loss: `masked` must have x0's shape and mask only maskable cells"
    if masked.shape != maskable.shape:
        raise ValueError(message)
    _check_values((masked & ~maskable).any(), message)


def _check_state(h: torch.Tensor | None, tokens: torch.Tensor, what: str) -> None:
    if h is not None and (not isinstance(h, torch.Tensor) or not h.dtype.is_floating_point or h.dim() != 3
                          or h.shape[:2] != tokens.shape):
        desc = f"{h.dtype} {tuple(h.shape)}" if isinstance(h, torch.Tensor) else type(h).__name__
        raise ValueError(f"{what} must be a floating (B, L, d) = ({tokens.shape[0]}, {tokens.shape[1]}, d) "
                         f"relay state or None, got {desc}")


def _check_step_output(logits: torch.Tensor, h_out: torch.Tensor | None, tokens: torch.Tensor, need_h: bool) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != tokens.shape:
        desc = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"step_fn must return logits of shape (B, L, V) with (B, L) = {tuple(tokens.shape)}, "
                         f"got {desc}")
    if need_h and h_out is None:
        raise ValueError("step_fn returned h_out=None, but a relay variant carries h: return the state (B, L, d)")
    _check_state(h_out, tokens, "step_fn's h_out")


def _check_buffer(mask_id: int, init: str) -> None:
    if init not in ("cold", "staggered"):
        raise ValueError(f"buffer init must be 'cold' or 'staggered', got {init!r}")
    _check_mask_id(mask_id, "RolloutBuffer")


def _check_refill(buf: RolloutBuffer, x0: torch.Tensor, maskable: torch.Tensor, extras: dict) -> None:
    _check_tokens(x0, maskable, buf.mask_id, "RolloutBuffer.refill")
    if x0.shape[0] < buf.size:
        raise ValueError(f"refill needs at least {buf.size} rows (the buffer size), got {x0.shape[0]}")
    if buf.z is not None and (x0.shape[1] != buf.z.shape[1] or set(extras) != set(buf.extras)):
        raise ValueError(f"refill: got length {x0.shape[1]} and extras {sorted(extras)}, but the buffer holds "
                         f"length {buf.z.shape[1]} and extras {sorted(buf.extras)}")
    for name, v in extras.items():
        if v.shape[0] != x0.shape[0]:
            raise ValueError(f"refill: extras[{name!r}] has {v.shape[0]} rows, x0 has {x0.shape[0]}")


def _check_buffer_state(state: dict, mask_id: int) -> None:
    saved = state.get("mask_id")
    if saved is not None and int(saved) != mask_id:
        raise ValueError(f"buffer state was saved with mask_id={int(saved)}, this buffer has {mask_id}")
    if state["z"] is not None:
        _check_state(state["h"], state["z"], "the buffer state's h")


def _check_rollout(x0, z, maskable, h, mask_id: int, K: int, variant: str, policies: list) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    if len(policies) != K:
        raise ValueError(f"rollout_loss: got {len(policies)} policies for K={K} steps")
    _check_tokens(x0, maskable, mask_id, "rollout_loss")
    if z.shape != x0.shape:
        raise ValueError(f"rollout_loss: z has shape {tuple(z.shape)}, x0 {tuple(x0.shape)}")
    _check_state(h, z, "the relay state h")


def _check_decode(step_fn: StepFn, tokens: torch.Tensor, tau: float, max_steps: int, maskable) -> None:
    if isinstance(step_fn, nn.Module) and step_fn.training:
        raise ValueError("decode: the model is in training mode (dropout on); call model.eval() first")
    if tokens.dim() != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"decode: tokens must be (B, L) integer ids, got {tokens.dtype} {tuple(tokens.shape)}")
    if not tau >= 0 or max_steps < 1:
        raise ValueError(f"decode: need tau >= 0 and max_steps >= 1, got {tau} and {max_steps}")
    if maskable is not None and (maskable.dtype != torch.bool or maskable.shape != tokens.shape):
        raise ValueError(f"decode: maskable must be a bool tensor of shape {tuple(tokens.shape)}")
