"""Sudoku boards through relay.decode, in batches: what sample.py's evaluation and train_sudoku.py's
validation share.

    pred, nfe, batch_nfe = decode_boards(model, questions, tau=0.15)   # questions (N, 81) token ids

The model runs in eval mode (restored afterwards), under bf16 autocast on CUDA as in the authors'
evaluation and in fp32 on the CPU (exactly reproducible). Relay models carry h between steps
(h = None at the first step: the Sudoku model adds R(0) = beta there, paper Eq. 2 with h_0 = 0);
plain models never get h. Every step fills [MASK] cells; clues never change.
"""
from contextlib import nullcontext

import torch
from tqdm import tqdm

import relay
from sudoku import MASK

# (step, puzzle indices into `questions`, their boards after that forward, cells it committed)
BoardHook = relay.StepHook


def device_of(model: torch.nn.Module, fallback: torch.device) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else fallback


def decode_boards(model: torch.nn.Module, questions: torch.Tensor, tau: float = 0.15, max_steps: int = 64,
                  batch_size: int = 512, relay_carry: bool = True, early_exit: bool = True,
                  on_step: BoardHook | None = None, progress: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode (N, 81) questions in batches of batch_size with relay.decode at threshold tau.

    Returns CPU tensors pred (N, 81), nfe (N,) (each puzzle's own forwards) and batch_nfe (N,)
    (the paper's count: 1 + the slowest puzzle's loop steps in the puzzle's batch). on_step gets the
    puzzle indices into `questions` (on the model's device), not the indices within a batch.
    """
    device = device_of(model, questions.device)
    carry = relay_carry and bool(getattr(getattr(model, "config", None), "relay", False))
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
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
