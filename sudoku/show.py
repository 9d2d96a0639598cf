"""Decoded Sudoku boards for people: one puzzle filling in step by step (sample.py --puzzle) and every
puzzle's boards after each forward as JSONL (sample.py --dump).

    show_puzzle("out/relay", model, "4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......",
                tau=0.15, max_steps=64, relay_carry=True)
"""
import json
from typing import TextIO

import torch

from sudoku.board import (N_CELLS, count_solutions, digits_to_tokens, format_board, is_legal_partial, is_legal_solution,
                    parse_board, pretty_board, tokens_to_digits)
from sudoku.decode import DecodeResult, decode_puzzles


def board_text(tokens: torch.Tensor) -> str:
    """(81,) token ids -> 81 characters, '.' for a blank."""
    return format_board(tokens_to_digits(tokens.numpy()))


def show_puzzle(path: str, model: torch.nn.Module, text: str, tau: float, max_steps: int, relay_carry: bool) -> None:
    """Print the board as it fills in (cells committed at each step in brackets), then check the result."""
    try:
        digits = parse_board(text)
    except ValueError as e:
        raise SystemExit(f"--puzzle: {e}") from None
    if not is_legal_partial(digits):
        raise SystemExit("--puzzle: the clues repeat a digit in a row, column or box; check the puzzle")
    q = torch.as_tensor(digits_to_tokens(digits), dtype=torch.long).view(1, N_CELLS)
    res = decode_puzzles(model, q, tau=tau, max_steps=max_steps, batch_size=1, relay_carry=relay_carry, record_boards=True)
    print(f"== {path} (τ = {tau:g}) ==\nclues ({int((digits > 0).sum())}):\n{pretty_board(digits)}")
    for step, (board, commit) in enumerate(zip(res.boards[0], res.commits[0]), 1):
        cells = set(commit.nonzero().flatten().tolist())
        print(f"\nforward {step}: {len(cells)} cell{'s' * (len(cells) != 1)} committed [in brackets]")
        print(pretty_board(tokens_to_digits(board.numpy()), highlight=cells))
    final = tokens_to_digits(res.pred[0].numpy())
    n_sol = count_solutions(digits, limit=2)
    legal = is_legal_solution(final)
    # the clues never change, so a legal full board is a solution of this puzzle
    verdict = "legal: a solution of the puzzle" if legal else "NOT legal: unfilled cells or a repeated digit"
    unique = {0: "the puzzle has no solution", 1: "the puzzle has a unique solution, so this is it" if legal
              else "the puzzle has a unique solution", 2: "the puzzle has several solutions"}[n_sol]
    print(f"\n{res.nfe[0].item()} forward passes; {verdict}; {unique}")


def write_boards(out: TextIO, path: str, cohort: str, tau: float, questions: torch.Tensor,
                 answers: torch.Tensor | None, res: DecodeResult) -> None:
    """One JSON line per puzzle of a decode made with record_boards=True: its boards as 81-character text."""
    for i in range(questions.size(0)):
        out.write(json.dumps({
            "ckpt": path, "cohort": cohort, "tau": tau, "index": i,
            "question": board_text(questions[i]),
            "answer": None if answers is None else board_text(answers[i]),
            "prediction": board_text(res.pred[i]), "nfe": res.nfe[i].item(),
            "boards": [board_text(b) for b in res.boards[i]]}) + "\n")
