"""Decoding Sudoku boards with relay.decode: the batched loop both training's validation and sample.py
use, and the per-step records behind sample.py's metrics.

    pred, nfe, batch_nfe = decode_boards(model, questions, tau=0.15)   # questions (N, 81) token ids
    res = decode(model, questions, tau=0.15, record_boards=True)       # + violations, boards per step

Every step runs one forward pass on the current board, commits the cells `relay.confidence_unmask`
selects (inclusive cumulative 1-c below τ, else the single most confident cell) with their argmax
values, and, for relay models, feeds the last block's output h back into the next step (h = None at
the first step: the Sudoku model adds R(0) = beta there, paper Eq. 2 with h_0 = 0); plain models never
get h. Clues never change; a puzzle is done when no [MASK] is left; at most `max_steps` loop steps,
then one final forward fills whatever is still masked.

The model runs in eval mode (restored afterwards), by default (dtype="auto") under bf16 autocast on
CUDA as in the authors' evaluation and in fp32 elsewhere (exactly reproducible); dtype="float32" or
"bfloat16" chooses either on any device.
"""
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from tqdm import tqdm

import relay
from devices import uses_bf16
from sudoku import DIGIT0, MASK, N_CELLS, count_violations_batch

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


def decode_boards(model: torch.nn.Module, questions: torch.Tensor, tau: float = 0.15, max_steps: int = 64,
                  batch_size: int = 512, relay_carry: bool = True, early_exit: bool = True,
                  on_step: BoardHook | None = None, progress: bool = False, dtype: str = "auto"
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode (N, 81) questions in batches of batch_size with relay.decode at threshold tau.

    Returns CPU tensors pred (N, 81), nfe (N,) (each puzzle's own forwards) and batch_nfe (N,)
    (the paper's count: 1 + the slowest puzzle's loop steps in the puzzle's batch). on_step gets the
    puzzle indices into `questions` (on the model's device), not the indices within a batch.
    """
    device = device_of(model, questions.device)
    carry = relay_carry and bool(getattr(getattr(model, "config", None), "relay", False))
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
                out = relay.decode(model, pred[s:s + batch_size].to(device), mask_id=MASK, tau=tau,
                                   max_steps=max_steps, carry=carry, early_exit=early_exit, on_step=hook)
                pred[s:s + batch_size] = out.tokens.cpu()
                nfe[s:s + batch_size] = out.nfe.cpu()
                batch_nfe[s:s + batch_size] = out.batch_nfe
    finally:
        model.train(was_training)
    return pred, nfe, batch_nfe


def token_violations(tokens: torch.Tensor) -> torch.Tensor:
    """(N, 81) token ids -> (N,) sudoku.count_violations_batch of their digits, on the tokens' device.

    A digit id 1..9 is filled; anything else, [MASK] included, is blank (as sudoku.tokens_to_digits).
    """
    digits = tokens.long() - DIGIT0
    return count_violations_batch(torch.where((digits >= 1) & (digits <= 9), digits, 0))


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
                         f"found {bad}; build them with sudoku.digits_to_tokens")


def decode(model: torch.nn.Module, questions: torch.Tensor, tau: float = 0.15, max_steps: int = 64,
           batch_size: int = 512, relay_carry: bool = True, early_exit: bool = True,
           record_boards: bool = False, progress: bool = False, dtype: str = "auto") -> DecodeResult:
    """Fill the [MASK] cells of `questions` (N, 81) by confidence-threshold decoding.

    relay_carry: feed h_out back as the next step's h (relay models only; plain models never get h).
    early_exit: finished puzzles leave the batch; with False every batch runs all its rows until its
    slowest puzzle is done, as the paper's code did (same boards and nfe, more compute).
    record_boards: keep every puzzle's board and commit mask after each forward (for --dump / --puzzle).
    dtype: "auto" (bf16 autocast on CUDA, fp32 elsewhere), "bfloat16" or "float32".
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
                                         on_step=on_step, progress=progress, dtype=dtype)
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
