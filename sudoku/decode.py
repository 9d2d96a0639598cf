"""Decoding Sudoku boards with relay.decode: the batched loop both training's validation and sample.py
use, and the per-step records behind sample.py's metrics.

    pred, nfe, batch_nfe = decode_boards(model, questions, tau=0.15)      # questions (N, 81) token ids
    res = decode_puzzles(model, questions, tau=0.15, record_boards=True)  # + violations, boards per step
    res = decode_puzzles(model, questions, temperature=1.5)               # a sampler knob (see sampler_knobs)

Every step runs one forward pass on the current board, commits the cells `relay.confidence_unmask`
selects (inclusive cumulative 1-c below τ, else the single most confident cell) with their argmax
values, and, for relay models, feeds the last block's output h back into the next step (h = None at
the first step: the Sudoku model adds R(0) = beta there, paper Eq. 2 with h_0 = 0); plain models never
get h. Clues never change; a puzzle is done when no [MASK] is left; at most `max_steps` loop steps,
then one final forward fills whatever is still masked.

The model runs in eval mode (restored afterwards), by default (dtype="auto") under bf16 autocast on
CUDA as in the authors' evaluation and in fp32 elsewhere (exactly reproducible); dtype="float32" or
"bfloat16" chooses either on any device.

Sampler knobs (not in the paper; its decoding is temperature 1 and no noise, the defaults here):
temperature T divides the logits, so the confidences the threshold rule reads are softmax(logits / T)
(the argmax is unchanged for T > 0); state_noise adds N(0, state_noise^2) to the carried relay state h
before each step that receives one (relay models only; the first step's h_0 = 0 gets none).
"""
import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from tqdm import tqdm

import relay
from common import uses_bf16
from sudoku.board import DIGIT0, MASK, N_CELLS, count_violations_batch

# (step, puzzle indices into `questions`, their boards after that forward, cells it committed)
BoardHook = relay.StepHook


def device_of(model: torch.nn.Module, fallback: torch.device) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else fallback


DTYPES = ("auto", "bfloat16", "float32")


def autocast(device: torch.device, dtype: str = "auto"):
    """The decoding precision: "auto" = bf16 autocast on CUDA, fp32 elsewhere; "bfloat16" / "float32" on any device."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return torch.autocast(device.type, dtype=torch.bfloat16) if uses_bf16(dtype, device.type) else nullcontext()


def check_knobs(temperature: float, state_noise: float, carry: bool) -> None:
    """ValueError unless temperature is finite and > 0 and state_noise finite and >= 0 (and, when > 0,
    there is a carried state to perturb)."""
    if not (0 < temperature < math.inf):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    if not (0 <= state_noise < math.inf):
        raise ValueError(f"state_noise must be a finite number >= 0, got {state_noise}")
    if state_noise > 0 and not carry:
        raise ValueError("state_noise perturbs the carried relay state, but this decode carries none "
                         "(not a relay model, or relay_carry=False)")


def sampler_knobs(model: torch.nn.Module, temperature: float = 1.0, state_noise: float = 0.0,
                  generator: torch.Generator | None = None):
    """The model as a relay.decode step function with the sampler knobs applied; the model itself at the
    defaults (temperature 1, no noise), so the paper's decoding runs exactly the unwrapped model."""
    if temperature == 1.0 and state_noise == 0.0:
        return model

    def step(tokens: torch.Tensor, h: torch.Tensor | None = None):
        if h is not None and state_noise > 0:  # h is None at the first step: h_0 = 0 stays exact
            h = h + state_noise * torch.randn(h.shape, generator=generator, device=h.device, dtype=h.dtype)
        logits, h_out = model(tokens, h)
        return (logits.float() / temperature if temperature != 1.0 else logits), h_out
    return step


def decode_boards(model: torch.nn.Module, questions: torch.Tensor, tau: float = 0.15, max_steps: int = 64,
                  batch_size: int = 512, relay_carry: bool = True, early_exit: bool = True,
                  on_step: BoardHook | None = None, progress: bool = False, dtype: str = "auto",
                  temperature: float = 1.0, state_noise: float = 0.0, generator: torch.Generator | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode (N, 81) questions in batches of batch_size with relay.decode at threshold tau.

    Returns CPU tensors pred (N, 81), nfe (N,) (each puzzle's own forwards) and batch_nfe (N,)
    (the paper's count: 1 + the slowest puzzle's loop steps in the puzzle's batch). on_step gets the
    puzzle indices into `questions` (on the model's device), not the indices within a batch.
    temperature, state_noise: the sampler knobs (module docstring); generator draws the noise (on the
    model's device; None = torch's global generator).
    """
    device = device_of(model, questions.device)
    carry = relay_carry and bool(getattr(getattr(model, "config", None), "relay", False))
    check_knobs(temperature, state_noise, carry)
    step_fn = sampler_knobs(model, temperature, state_noise, generator)
    amp = autocast(device, dtype)
    questions = questions.cpu()
    N = questions.size(0)
    pred = questions.clone().long()
    nfe, batch_nfe = torch.zeros(N, dtype=torch.long), torch.zeros(N, dtype=torch.long)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), amp:
            # disable=None: the bar shows only on a terminal, so logs of driver scripts stay clean
            starts = tqdm(range(0, N, batch_size), desc=f"decode tau={tau:g}", unit="batch",
                          disable=None if progress else True, leave=False)
            for s in starts:
                hook = None if on_step is None else (lambda k, rows, b, c, s=s: on_step(k, rows + s, b, c))
                out = relay.decode(step_fn, pred[s:s + batch_size].to(device), mask_id=MASK, tau=tau,
                                   max_steps=max_steps, carry=carry, early_exit=early_exit, on_step=hook)
                pred[s:s + batch_size] = out.tokens.cpu()
                nfe[s:s + batch_size] = out.nfe.cpu()
                batch_nfe[s:s + batch_size] = out.batch_nfe
    finally:
        model.train(was_training)
    return pred, nfe, batch_nfe


def token_violations(tokens: torch.Tensor) -> torch.Tensor:
    """(N, 81) token ids -> (N,) sudoku.board.count_violations_batch of their digits, on the tokens' device.

    A digit id 1..9 is filled; anything else, [MASK] included, is blank (as sudoku.board.tokens_to_digits).
    """
    digits = tokens.long() - DIGIT0
    return count_violations_batch(torch.where((digits >= 1) & (digits <= 9), digits, 0))


def batch_level_nfe(batch1_nfe: torch.Tensor, batch_size: int) -> torch.Tensor:
    """The authors' batch-level count from per-puzzle batch-1 counts (own loop steps + 1): every puzzle
    of a batch of `batch_size` consecutive puzzles (dataset order) is charged 1 + the slowest one's loop
    steps, i.e. the largest batch-1 count of its batch. Valid because decoding is batch-invariant: a
    puzzle's boards, hence its loop steps, do not depend on the puzzles beside it."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return torch.cat([chunk.max().expand(len(chunk)) for chunk in batch1_nfe.split(batch_size)]) \
        if batch1_nfe.numel() else batch1_nfe.clone()


def is_legal(tokens: torch.Tensor) -> torch.Tensor:
    """(N, 81) -> (N,) bool: fully filled with digits 1..9 and no unit repeats a digit."""
    filled = ((tokens >= DIGIT0 + 1) & (tokens <= DIGIT0 + 9)).all(1)
    return filled & (token_violations(tokens) == 0)


@dataclass
class DecodeResult:
    pred: torch.Tensor  # (N, 81) token ids of the final boards
    nfe: torch.Tensor  # (N,) forward passes each puzzle took
    batch_nfe: torch.Tensor  # (N,) the paper's count: 1 + the slowest puzzle's loop steps in its batch
    violations_rollout: torch.Tensor  # (N,) token_violations summed over the boards after each forward
    cells_per_step: torch.Tensor  # (N,) float, cells filled / nfe
    boards: list[torch.Tensor] | None = None  # per puzzle (nfe, 81) board after each forward
    commits: list[torch.Tensor] | None = None  # per puzzle (nfe, 81) bool, the cells committed by that forward
    violating_snapshots: torch.Tensor | None = None  # (N,) boards with a violation among [question, loop boards, final]
    batch1_nfe: torch.Tensor | None = None  # (N,) the puzzle's own loop steps + 1 final forward


def check_questions(questions: torch.Tensor) -> None:
    """ValueError unless questions is an integer (N, 81) tensor of [MASK] and digit ids 1..9."""
    if not isinstance(questions, torch.Tensor) or questions.dim() != 2 or questions.size(1) != N_CELLS:
        shape = tuple(questions.shape) if isinstance(questions, torch.Tensor) else type(questions).__name__
        raise ValueError(f"questions must be a (N, {N_CELLS}) tensor of token ids, got {shape}")
    if questions.dtype.is_floating_point or questions.dtype == torch.bool:
        raise ValueError(f"questions must hold integer token ids, got dtype {questions.dtype}")
    ok = (questions == MASK) | ((questions >= DIGIT0 + 1) & (questions <= DIGIT0 + 9))
    if not bool(ok.all()):
        bad = questions[~ok][0].item()
        raise ValueError(f"questions may only hold [MASK]={MASK} and digit ids {DIGIT0 + 1}..{DIGIT0 + 9}, "
                         f"found {bad}; build them with sudoku.board.digits_to_tokens")


def decode_puzzles(model: torch.nn.Module, questions: torch.Tensor, tau: float = 0.15, max_steps: int = 64,
                   batch_size: int = 512, relay_carry: bool = True, early_exit: bool = True,
                   record_boards: bool = False, progress: bool = False, dtype: str = "auto",
                   temperature: float = 1.0, state_noise: float = 0.0, generator: torch.Generator | None = None
                   ) -> DecodeResult:
    """Fill the [MASK] cells of `questions` (N, 81) by confidence-threshold decoding.

    relay_carry: feed h_out back as the next step's h (relay models only; plain models never get h).
    early_exit: finished puzzles leave the batch; with False every batch runs all its rows until its
    slowest puzzle is done, as the paper's code did (same boards and nfe, more compute).
    record_boards: keep every puzzle's board and commit mask after each forward (for --dump / --puzzle).
    dtype: "auto" (bf16 autocast on CUDA, fp32 elsewhere), "bfloat16" or "float32".
    temperature, state_noise, generator: the sampler knobs (module docstring; defaults = the paper's).
    """
    check_questions(questions)
    if not tau >= 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    if max_steps < 1 or batch_size < 1:
        raise ValueError(f"max_steps and batch_size must be >= 1, got {max_steps} and {batch_size}")
    autocast(torch.device("cpu"), dtype)  # an unknown dtype fails here, before any work
    N = questions.size(0)
    device = device_of(model, questions.device)
    vio, snap, steps = (torch.zeros(N, dtype=torch.long, device=device) for _ in range(3))
    boards = [[] for _ in range(N)] if record_boards else None
    commits = [[] for _ in range(N)] if record_boards else None

    def on_step(step: int, rows: torch.Tensor, board: torch.Tensor, commit: torch.Tensor) -> None:
        bad = token_violations(board)
        vio.index_add_(0, rows, bad)  # summed over the boards after each forward
        if step < max_steps:  # a loop forward; the final fill (step == max_steps) is the final snapshot below
            snap.index_add_(0, rows, (bad > 0).long())
            steps.index_add_(0, rows, torch.ones_like(rows))
        if record_boards:
            board, commit = board.cpu(), commit.cpu()
            for i, r in enumerate(rows.tolist()):
                boards[r].append(board[i])
                commits[r].append(commit[i])

    pred, nfe, batch_nfe = decode_boards(model, questions, tau, max_steps, batch_size, relay_carry, early_exit,
                                         on_step=on_step, progress=progress, dtype=dtype,
                                         temperature=temperature, state_noise=state_noise, generator=generator)
    vio, snap, steps = vio.cpu(), snap.cpu(), steps.cpu()
    questions = questions.cpu()
    # cells actually filled per forward (a committed argmax of [MASK] leaves the cell open for later)
    n_filled = ((questions == MASK) & (pred != MASK)).sum(1).float()
    cells_per_step = torch.where(nfe > 0, n_filled / nfe.clamp(min=1), torch.zeros_like(n_filled))
    if record_boards:
        empty = torch.zeros(0, N_CELLS, dtype=torch.long)
        boards = [torch.stack(b) if b else empty for b in boards]
        commits = [torch.stack(c) if c else empty.bool() for c in commits]
    # the authors' snapshots: the initial board, the loop boards (counted above), the final-fill board
    snap += (token_violations(questions) > 0).long() + (token_violations(pred) > 0).long()
    return DecodeResult(pred, nfe, batch_nfe, vio, cells_per_step, boards, commits, snap, steps + 1)
