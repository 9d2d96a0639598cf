"""Sudoku inference: confidence-threshold decoding with relay carry, the paper's metrics, Table 1, Figure 2.

    python sample.py --ckpt=out/relay --data=test --n=2000                 # τ sweep, metrics printed
    python sample.py --ckpt=out/mlm_s0,out/mlm_s1,out/relay_s0,out/relay_s1 \\
        --cohort=all,deduction_only --table --plot=pareto.png --out=results.json
    python sample.py --ckpt=out/relay --puzzle=4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......

Decoding (relay.decode, through sudoku_decode.py): every step runs one forward pass on the current board, commits
the cells `relay.confidence_unmask` selects (inclusive cumulative 1-c below τ, else the single most
confident cell) with their argmax values, and, for relay models, feeds the last block's output h back
into the next step (h = 0 at the first step). Clues never change; a puzzle is done when no [MASK] is
left; at most `max_steps` loop steps, then one final forward fills whatever is still masked.

NFE is reported three ways (definitions and the Table 1 columns they match: docs/sudoku_metrics.md):
  nfe         forward passes the puzzle itself took (finished puzzles leave the batch),
  batch_nfe   the authors' count: loop iterations of the puzzle's batch + 1 final forward, i.e.
              1 + the slowest puzzle of its batch. Depends on batch_size (Table 1 unfiltered: 512).
  batch1_nfe  the same count at batch size 1: the puzzle's own loop steps + 1 final forward
              (the basis of the authors' one-puzzle-at-a-time deduction-only runs).
"""
import argparse
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from sudoku_decode import decode_boards, device_of
from sudoku import DIGIT0, MASK, N_CELLS, UNITS  # UNITS: (27, 9) cell indices of rows, columns, boxes

TAUS = (0.05, 0.10, 0.15, 0.20, 0.25)  # the paper's inference sweep
METRIC_KEYS = ("exact_match", "token_accuracy", "mean_nfe", "batch_nfe", "batch1_nfe", "legal_rate",
               "violations_final", "violations_rollout", "violating_snapshots", "cells_per_step", "n")
OBJECTIVE_NAMES = {"mlm": "MLM", "rollout": "Rollout", "relay_sg": "Relay (sg)", "relay": "Relay"}
# one colour per objective in every figure (matplotlib's first four), so plots can be read side by side
OBJECTIVE_COLORS = {"mlm": "C0", "rollout": "C1", "relay_sg": "C2", "relay": "C3"}

# -----------------------------------------------------------------------------
# board checks in torch, so they run on the decoding device without a host sync per step

def count_violations(tokens: torch.Tensor) -> torch.Tensor:
    """(N, 81) token ids -> (N,) sum over the 27 units of (#filled - #distinct filled).

    Filled = a digit 1..9 (anything else, [MASK] included, is blank). Same definition as
    sudoku.count_violations_batch; the paper's exact definition is not known (docs/sudoku_metrics.md).
    """
    digits = tokens.long() - DIGIT0
    digits = torch.where((digits >= 1) & (digits <= 9), digits, 0)
    per_unit = digits[:, torch.as_tensor(UNITS, device=tokens.device)]  # (N, 27, 9)
    counts = torch.nn.functional.one_hot(per_unit, 10)[..., 1:].sum(2)  # (N, 27, 9) count of each digit
    return (counts - 1).clamp(min=0).sum((1, 2))


def violating_snapshots(trajectory: torch.Tensor) -> torch.Tensor:
    """The authors' per-puzzle violation count: how many snapshots of a decode contain any violation.

    trajectory (..., T, 81): the initial board, the board after each loop forward, then the final-fill
    snapshot (the final board; when the loop already finished the puzzle it repeats the last board, so an
    illegal final board counts twice). -> (...) number of boards with count_violations > 0.
    """
    flat = trajectory.reshape(-1, N_CELLS)
    return (count_violations(flat) > 0).view(trajectory.shape[:-1]).sum(-1)


def is_legal(tokens: torch.Tensor) -> torch.Tensor:
    """(N, 81) -> (N,) bool: fully filled with digits 1..9 and no unit repeats a digit."""
    digits = tokens.long() - DIGIT0
    filled = ((digits >= 1) & (digits <= 9)).all(1)
    return filled & (count_violations(tokens) == 0)


# -----------------------------------------------------------------------------
# decoding

@dataclass
class DecodeResult:
    pred: torch.Tensor  # (N, 81) token ids of the final boards
    nfe: torch.Tensor  # (N,) forward passes each puzzle took
    batch_nfe: torch.Tensor  # (N,) the paper's count: 1 + the slowest puzzle's loop steps in its batch
    violations_rollout: torch.Tensor  # (N,) count_violations summed over the boards after each forward
    cells_per_step: torch.Tensor  # (N,) float, cells filled / nfe
    boards: list[torch.Tensor] | None = None  # per puzzle (nfe, 81) board after each forward
    commits: list[torch.Tensor] | None = None  # per puzzle (nfe, 81) bool, the cells committed by that forward
    violating_snapshots: torch.Tensor | None = None  # (N,) violating_snapshots of [question, loop boards, final]
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
           record_boards: bool = False, progress: bool = False) -> DecodeResult:
    """Fill the [MASK] cells of `questions` (N, 81) by confidence-threshold decoding.

    relay_carry: feed h_out back as the next step's h (relay models only; plain models never get h).
    early_exit: finished puzzles leave the batch; with False every batch runs all its rows until its
    slowest puzzle is done, as the paper's code did (same boards and nfe, more compute).
    record_boards: keep every puzzle's board and commit mask after each forward (for --dump / --puzzle).
    """
    check_questions(questions)
    if not tau >= 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    if max_steps < 1 or batch_size < 1:
        raise ValueError(f"max_steps and batch_size must be >= 1, got {max_steps} and {batch_size}")
    N = questions.size(0)
    device = device_of(model, questions.device)
    vio, snap, steps = (torch.zeros(N, dtype=torch.long, device=device) for _ in range(3))
    boards = [[] for _ in range(N)] if record_boards else None
    commits = [[] for _ in range(N)] if record_boards else None

    def on_step(step: int, rows: torch.Tensor, board: torch.Tensor, commit: torch.Tensor) -> None:
        bad = count_violations(board)
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
                                         on_step=on_step, progress=progress)
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
    snap += (count_violations(questions) > 0).long() + (count_violations(pred) > 0).long()
    return DecodeResult(pred, nfe, batch_nfe, vio, cells_per_step, boards, commits, snap, steps + 1)


# -----------------------------------------------------------------------------
# metrics (definitions and their match with the paper: docs/sudoku_metrics.md)

def tau_key(tau: float) -> str:
    return f"{tau:.2f}"


def score(questions: torch.Tensor, answers: torch.Tensor | None, result: DecodeResult) -> dict[str, float | None]:
    """The per-τ metrics of one decode. Exact match and token accuracy are None without answers.

    exact_match        fraction of puzzles whose 81 predicted ids all equal the answer
    token_accuracy     per puzzle, correct / non-clue cells, then the mean over puzzles
    mean_nfe           mean per-puzzle forward passes; batch_nfe the paper's batch-level count
    batch1_nfe         mean of the batch-level count at batch size 1 (own loop steps + 1)
    legal_rate         fraction of final boards fully filled with 1..9 and no repeated digit in a unit
    violations_final   mean count_violations of the final board
    violations_rollout mean over puzzles of count_violations summed over the boards after each forward
    violating_snapshots mean over puzzles of the authors' count of snapshots with any violation
    cells_per_step     mean over puzzles of cells filled / nfe
    """
    pred = result.pred
    m: dict[str, float | None] = {"exact_match": None, "token_accuracy": None}
    if answers is not None:
        answers = answers.to(pred.device).long()
        if answers.shape != pred.shape:
            raise ValueError(f"answers have shape {tuple(answers.shape)}, predictions {tuple(pred.shape)}")
        m["exact_match"] = (pred == answers).all(1).float().mean().item()
        blank = questions.to(pred.device) == MASK
        right = ((pred == answers) & blank).sum(1).float()
        n_blank = blank.sum(1).float()
        m["token_accuracy"] = torch.where(n_blank > 0, right / n_blank.clamp(min=1), 1.0).mean().item()
    m["mean_nfe"] = result.nfe.float().mean().item()
    m["batch_nfe"] = result.batch_nfe.float().mean().item()
    m["legal_rate"] = is_legal(pred).float().mean().item()
    m["violations_final"] = count_violations(pred).float().mean().item()
    m["violations_rollout"] = result.violations_rollout.float().mean().item()
    for key in ("violating_snapshots", "batch1_nfe"):
        value = getattr(result, key)
        m[key] = None if value is None else value.float().mean().item()
    m["cells_per_step"] = result.cells_per_step.mean().item()
    m["n"] = int(pred.size(0))
    return m


def evaluate(model: torch.nn.Module, questions: torch.Tensor, answers: torch.Tensor | None = None,
             taus: tuple[float, ...] = TAUS, max_steps: int = 64, batch_size: int = 512,
             relay_carry: bool = True, progress: bool = False) -> dict[str, dict[str, float | None]]:
    """Decode `questions` at every τ and score them: {"0.15": {metric: value}, ...}."""
    out = {}
    for tau in taus:
        t0 = time.time()
        res = decode(model, questions, tau=tau, max_steps=max_steps, batch_size=batch_size,
                     relay_carry=relay_carry, progress=progress)
        out[tau_key(tau)] = score(questions, answers, res) | {"seconds": round(time.time() - t0, 3)}
    return out


# -----------------------------------------------------------------------------
# Table 1 and the Pareto figure, from the entries written to results.json

def method_name(config: dict) -> str:
    objective = config.get("objective", "?")
    tied = config.get("tie_embeddings")
    tying = "tied" if tied else ("untied" if tied is not None else "?")
    return f"{OBJECTIVE_NAMES.get(objective, objective)}, {tying}"


def group_by_method(entries: list[dict]) -> dict[str, list[dict]]:
    """Checkpoints of one method are its seeds: same label (--labels), else same (objective, tying)."""
    groups: dict[str, list[dict]] = {}
    for e in entries:
        groups.setdefault(e.get("label") or method_name(e["config"]), []).append(e)
    return groups


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample s.d. (ddof=1; nan with one value)."""
    a = np.asarray(values, dtype=float)
    return float(a.mean()), (float(a.std(ddof=1)) if a.size > 1 else math.nan)


def _fmt(values: list, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    m, s = mean_sd([v * scale for v in values])
    return f"{m:.{digits}f}{unit}" + ("" if math.isnan(s) else f" ± {s:.{digits}f}")


def format_table(entries: list[dict], tau: float, batch_size: int = 512) -> str:
    """Table-1-style markdown at τ, mean ± sample s.d. over seeds (see docs/sudoku_metrics.md).

    First Table 1's own columns in its order: Acc (%) and Mean NFE unfiltered, then deduction-only, the
    NFE on the basis each column most likely used (unfiltered: the batch-level count at batch_size,
    512 in the paper; deduction-only: the count at batch size 1). Then the other metrics per cohort.
    """
    cohorts = [c for c in ("all", "deduction_only") if any(c in e["results"] for e in entries)]
    title = {"all": "unfiltered", "deduction_only": "deduction-only"}
    paper_nfe = {"all": ("batch_nfe", f"batch-{batch_size} count"), "deduction_only": ("batch1_nfe", "batch-1 count")}
    other_nfe = {"all": ("batch1_nfe", "batch-1 count"), "deduction_only": ("batch_nfe", f"batch-{batch_size} count")}
    head = ["Objective", "Tying", "seeds"]
    for c in cohorts:
        head += [f"Acc (%) {title[c]}", f"Mean NFE {title[c]} ({paper_nfe[c][1]})"]
    for c in cohorts:
        head += [f"NFE per puzzle {title[c]}", f"NFE {title[c]} ({other_nfe[c][1]})", f"Legal (%) {title[c]}",
                 f"Violating snapshots {title[c]}", f"Violations summed over boards {title[c]}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, group in group_by_method(entries).items():
        tied = group[0]["config"].get("tie_embeddings")
        tying = "?" if tied is None else ("tied" if tied else "untied")
        objective = name if group[0].get("label") else name.rpartition(", ")[0]
        row = [objective, tying, str(len(group))]
        ms = {}
        for c in cohorts:
            found = [e["results"].get(c, {}).get(tau_key(tau)) for e in group]
            ms[c] = [m for m in found if m is not None]
            row += [_fmt([m["exact_match"] for m in ms[c]], 100.0), _fmt([m.get(paper_nfe[c][0]) for m in ms[c]])]
        for c in cohorts:
            row += [_fmt([m["mean_nfe"] for m in ms[c]]), _fmt([m.get(other_nfe[c][0]) for m in ms[c]]),
                    _fmt([m["legal_rate"] for m in ms[c]], 100.0),
                    _fmt([m.get("violating_snapshots") for m in ms[c]]), _fmt([m["violations_rollout"] for m in ms[c]])]
        lines.append("| " + " | ".join(row) + " |")
    n = {c: sorted({e["results"][c][tau_key(tau)]["n"] for e in entries if tau_key(tau) in e["results"].get(c, {})})
         for c in cohorts}
    lines.append(f"τ = {tau:g}; n = " + ", ".join(f"{title[c]} {'/'.join(map(str, n[c]))}" for c in cohorts)
                 + "; the first columns are Table 1's, in its order; definitions in docs/sudoku_metrics.md")
    return "\n".join(lines)


def method_styles(groups: dict[str, list[dict]]) -> dict[str, tuple[str, str]]:
    """(colour, line style) per method: its objective's colour; a second or third method of one objective
    (e.g. another buffer) is dashed or dotted. Unknown objectives take the next free colours."""
    colors, seen, styles = dict(OBJECTIVE_COLORS), {}, {}
    spare = iter(f"C{i}" for i in range(len(OBJECTIVE_COLORS), 10))
    for name, group in groups.items():
        objective = group[0]["config"].get("objective")
        if objective not in colors:
            colors[objective] = next(spare, "k")
        seen[objective] = seen.get(objective, -1) + 1
        styles[name] = (colors[objective], ("-", "--", ":", "-.")[seen[objective] % 4])
    return styles


def plot_pareto(entries: list[dict], path: str, nfe: str = "mean_nfe") -> None:
    """Exact match vs NFE over the τ sweep, one curve per method, ±1 s.d. ribbons; one panel per cohort."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    cohorts = [c for c in ("all", "deduction_only") if any(c in e["results"] for e in entries)]
    fig, axes = plt.subplots(1, len(cohorts), figsize=(5.5 * len(cohorts), 4.2), squeeze=False)
    groups = group_by_method(entries)
    styles = method_styles(groups)
    for ax, cohort in zip(axes[0], cohorts):
        for name, group in groups.items():
            taus = sorted({t for e in group for t in e["results"].get(cohort, {})}, key=float)
            pts = []
            for t in taus:
                ms = [e["results"][cohort][t] for e in group if t in e["results"].get(cohort, {})]
                if not ms or ms[0]["exact_match"] is None:
                    continue
                x, xs = mean_sd([m[nfe] for m in ms])
                y, ys = mean_sd([100 * m["exact_match"] for m in ms])
                pts.append((x, y, 0.0 if math.isnan(xs) else xs, 0.0 if math.isnan(ys) else ys, t))
            if not pts:
                continue
            pts.sort()
            x, y, xs, ys, t = (np.array(v) for v in zip(*pts))
            color, linestyle = styles[name]
            line, = ax.plot(x, y, marker="o", color=color, linestyle=linestyle,
                            label=f"{name} ({len(group)} seed{'s' * (len(group) > 1)})")
            if ax.lines[0] is line:  # τ of each point, on the first curve only to keep the plot readable
                for xi, yi, ti in zip(x, y, t):
                    ax.annotate(f"τ={float(ti):g}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
            ax.fill_between(x, y - ys, y + ys, color=line.get_color(), alpha=0.2, linewidth=0)
            if xs.any():
                ax.errorbar(x, y, xerr=xs, fmt="none", ecolor=line.get_color(), alpha=0.5)
        ax.set_xlabel(("mean NFE per puzzle" if nfe == "mean_nfe" else "batch NFE (paper's count)")
                      + "  (lower τ → more NFE)")
        ax.set_ylabel("exact match (%)")
        ax.set_title({"all": "unfiltered", "deduction_only": "deduction-only"}[cohort])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


# -----------------------------------------------------------------------------
# command line

def _bool(text: str) -> bool:
    if text in ("True", "true", "1"):
        return True
    if text in ("False", "false", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 0.05,0.15, got {text!r}") from None


def get_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Evaluate Sudoku checkpoints: τ sweep, Table 1, Pareto figure, "
                                "or one puzzle step by step.", allow_abbrev=False)
    p.add_argument("--ckpt", default="", help="checkpoint out_dir(s) or .pt file(s), comma-separated; "
                   "checkpoints with the same objective and tying are seeds of one method")
    p.add_argument("--results", default="", help="earlier --out JSON file(s), comma-separated: their checkpoints join "
                   "the table, the plot and --out without decoding again (e.g. one file per seed)")
    p.add_argument("--labels", default="", help="method name per checkpoint, comma-separated (default: objective "
                   "and tying from the run config); checkpoints with the same label are seeds of one method")
    p.add_argument("--ema", type=_bool, default=True, help="use the EMA weights (as the paper's evaluation did)")
    p.add_argument("--data", default="test", help="test | val | train (prepared data) or a CSV/parquet/JSONL/text file")
    p.add_argument("--data_dir", default="data/sudoku", help="where prepare_data.py wrote the splits")
    p.add_argument("--puzzle", default="", help="one puzzle as 81 characters ('.' or '0' blank): print it filling in")
    p.add_argument("--n", type=int, default=2000, help="first N puzzles of each cohort in dataset order (0 = all); "
                   "the paper used 2000")
    p.add_argument("--cohort", default="all", help="all | deduction_only | all,deduction_only "
                   "(deduction_only needs the derived strategies field)")
    p.add_argument("--taus", type=_floats, default=TAUS, help="the τ sweep, comma-separated")
    p.add_argument("--tau", type=float, default=0.15, help="the matched τ of --table, --dump and --puzzle")
    p.add_argument("--max_steps", type=int, default=64, help="decoding steps before the final fill-in forward")
    p.add_argument("--batch_size", type=int, default=512, help="the paper's batch NFE assumes 512")
    p.add_argument("--relay_carry", type=_bool, default=True, help="carry h between steps (relay models)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="", help="write all metrics and each checkpoint's run config as JSON")
    p.add_argument("--table", action="store_true", help="print Table-1-style rows at --tau")
    p.add_argument("--plot", default="", help="draw exact match vs NFE over the τ sweep into this PNG")
    p.add_argument("--plot_nfe", default="mean_nfe", choices=("mean_nfe", "batch_nfe"), help="x axis of --plot")
    p.add_argument("--dump", default="", help="per-puzzle JSONL at --tau: question, answer, prediction, nfe, boards")
    args = p.parse_args(argv)
    if not args.ckpt and not args.results:
        raise SystemExit("give --ckpt=RUN[,RUN...] to evaluate and/or --results=FILE[,FILE...] to merge earlier results")
    if (args.puzzle or args.dump) and not args.ckpt:
        raise SystemExit("--puzzle and --dump need --ckpt (merged --results hold no boards)")
    args.cohort = [c.strip() for c in args.cohort.split(",") if c.strip()]
    for c in args.cohort:
        if c not in ("all", "deduction_only"):
            raise SystemExit(f"--cohort: unknown cohort {c!r}; use all, deduction_only or all,deduction_only")
    if not args.taus or any(t < 0 for t in args.taus) or args.tau < 0:
        raise SystemExit("--taus/--tau: give one or more thresholds >= 0, e.g. --taus=0.05,0.10,0.15")
    if args.tau not in args.taus:
        args.taus = tuple(sorted(args.taus + (args.tau,)))
    if args.n < 0 or args.batch_size < 1 or args.max_steps < 1:
        raise SystemExit("--n must be >= 0, --batch_size and --max_steps >= 1")
    return args


def load_checkpoints(spec: str, device: str, ema: bool) -> list[tuple[str, torch.nn.Module, dict]]:
    from model import load_model
    out = []
    for path in [s.strip() for s in spec.split(",") if s.strip()]:
        try:
            model, config = load_model(path, device=device, ema=ema)
        except (ValueError, RuntimeError, OSError, KeyError, TypeError) as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SystemExit(f"--ckpt {path}: {msg}") from None
        cfg = model.config
        if cfg.vocab_size != 17 or cfg.block_size != N_CELLS:
            raise SystemExit(f"--ckpt {path}: not a Sudoku model (vocab_size {cfg.vocab_size}, block_size "
                             f"{cfg.block_size}; expected 17 and {N_CELLS})")
        out.append((path, model, config))
    if not out:
        raise SystemExit("--ckpt: give at least one checkpoint directory or .pt file")
    return out


def load_cohorts(args: argparse.Namespace) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """{cohort: (questions, answers or None)}: the first --n puzzles of each cohort in dataset order."""
    from prepare_data import deduction_only_mask, load_puzzles
    try:
        puzzles = load_puzzles(args.data, data_dir=args.data_dir)
    except (ValueError, OSError) as e:
        raise SystemExit(f"--data {args.data}: {str(e).strip().splitlines()[0]}") from None
    question = torch.as_tensor(np.asarray(puzzles.question), dtype=torch.long)
    answer = None if puzzles.answer is None else torch.as_tensor(np.asarray(puzzles.answer), dtype=torch.long)
    out = {}
    for cohort in args.cohort:
        if cohort == "deduction_only":
            try:
                keep = torch.as_tensor(np.asarray(deduction_only_mask(puzzles.frame), dtype=bool))
            except ValueError as e:
                raise SystemExit(f"--cohort=deduction_only: {str(e).strip().splitlines()[0]}") from None
            idx = keep.nonzero().squeeze(1)
        else:
            idx = torch.arange(question.size(0))
        if args.n:
            idx = idx[:args.n]
        if idx.numel() == 0:
            raise SystemExit(f"--data {args.data} --cohort={cohort}: no puzzles")
        try:
            check_questions(question[idx])
        except ValueError as e:
            raise SystemExit(f"--data {args.data}: {e}") from None
        out[cohort] = (question[idx], None if answer is None else answer[idx])
    return out


def _board_text(tokens: torch.Tensor) -> str:
    from sudoku import format_board, tokens_to_digits
    return format_board(tokens_to_digits(tokens.numpy()))


def show_puzzle(path: str, model: torch.nn.Module, text: str, tau: float, max_steps: int, relay_carry: bool) -> None:
    """Print the board as it fills in (cells committed at each step in brackets), then check the result."""
    from sudoku import count_solutions, digits_to_tokens, is_legal_partial, is_legal_solution, pretty_board, tokens_to_digits
    try:
        digits = __import__("sudoku").parse_board(text)
    except ValueError as e:
        raise SystemExit(f"--puzzle: {e}") from None
    if not is_legal_partial(digits):
        raise SystemExit("--puzzle: the clues repeat a digit in a row, column or box; check the puzzle")
    q = torch.as_tensor(digits_to_tokens(digits), dtype=torch.long).view(1, N_CELLS)
    res = decode(model, q, tau=tau, max_steps=max_steps, batch_size=1, relay_carry=relay_carry, record_boards=True)
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


def check_output_paths(args: argparse.Namespace) -> None:
    """Files written later must be writable where asked: checked before decoding. --out creates its
    directory; --plot and --dump need an existing one."""
    for flag in ("out", "plot", "dump"):
        path = getattr(args, flag)
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if flag != "out" and not os.path.isdir(folder):
            raise SystemExit(f"--{flag}={path}: the directory {folder} does not exist; create it first")
        if os.path.isdir(path):
            raise SystemExit(f"--{flag}={path} is a directory; give a file name")


def data_source(args: argparse.Namespace, cohorts: dict[str, tuple[torch.Tensor, torch.Tensor | None]]) -> dict:
    """Which puzzles were scored: --data, --data_dir and a sha256 of each cohort's questions and answers
    (in order), so that results computed on different test sets are never merged as seeds."""
    puzzles = {}
    for cohort, (q, a) in cohorts.items():
        h = hashlib.sha256(q.to(torch.int64).contiguous().numpy().tobytes())
        if a is not None:
            h.update(a.to(torch.int64).contiguous().numpy().tobytes())
        puzzles[cohort] = h.hexdigest()
    return {"data": args.data, "data_dir": os.path.abspath(args.data_dir), "puzzles": puzzles}


def check_same_puzzles(where: str, source: dict | None, ref: dict | None) -> None:
    """One-line refusal when two data sources scored different puzzles in a cohort they share."""
    if source is None or ref is None:
        return
    for cohort, digest in source["puzzles"].items():
        if ref["puzzles"].get(cohort, digest) != digest:
            raise SystemExit(f"{where}: its {cohort} puzzles (--data={source['data']}, data_dir {source['data_dir']}) "
                             f"are not those of --data={ref['data']} in {ref['data_dir']}; results on different "
                             "test sets are not seeds of one method")


def load_results(spec: str, args: argparse.Namespace) -> tuple[list[dict], dict | None]:
    """Checkpoint entries of earlier --out files and their common data source; they must come from the
    same settings and the same puzzles (checked against this run's puzzles in main)."""
    entries, ref = [], None
    for path in [s.strip() for s in spec.split(",") if s.strip()]:
        try:
            with open(path) as f:
                saved = json.load(f)
            found = saved["checkpoints"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"--results {path}: not a sample.py --out file ({type(e).__name__})") from None
        for key in ("data", "n", "max_steps", "batch_size", "ema", "relay_carry"):  # batch_nfe depends on batch_size
            if key in saved and saved[key] != getattr(args, key):
                raise SystemExit(f"--results {path}: computed with {key}={saved[key]!r} but this run has "
                                 f"{key}={getattr(args, key)!r}; results from different settings do not compare")
        missing = [t for t in args.taus if not any(tau_key(t) in e["results"].get(c, {}) for e in found for c in e["results"])]
        if missing:
            raise SystemExit(f"--results {path}: has no results at τ = {', '.join(f'{t:g}' for t in missing)}; "
                             f"pass the τ values it has with --taus")
        source = saved.get("data_source")
        if source is None:
            print(f"warning: --results {path} records no data source (written before sources were recorded); "
                  "cannot check that it scored the same puzzles", file=sys.stderr)
        check_same_puzzles(f"--results {path}", source, ref)
        ref = ref or source
        entries.extend(found)
    return entries, ref


# Fast-dLLM v2 (block diffusion with KV cache) lives in its own files; sample.py is the one entry point.
FASTDLLM_COMMANDS = {
    "fastdllm": "fastdllm_generate",  # python sample.py fastdllm --model=DIR --prompt="..." [--relay_carry=True]
    "code_eval": "eval_code",  # python sample.py code_eval --model=DIR --data_path=HumanEvalPlus.jsonl.gz
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in FASTDLLM_COMMANDS:
        import importlib
        importlib.import_module(FASTDLLM_COMMANDS[argv[0]]).main(argv[1:])
        return
    args = get_args(argv)
    check_output_paths(args)
    earlier, source = load_results(args.results, args) if args.results else ([], None)
    ckpts = load_checkpoints(args.ckpt, args.device, args.ema) if args.ckpt else []
    if args.puzzle:
        for path, model, _ in ckpts:
            show_puzzle(path, model, args.puzzle, args.tau, args.max_steps, args.relay_carry)
        return
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else [""] * len(ckpts)
    if len(labels) != len(ckpts):
        raise SystemExit(f"--labels: {len(labels)} labels for {len(ckpts)} checkpoints; give one per checkpoint")
    cohorts = load_cohorts(args) if ckpts else {}
    if ckpts:  # the puzzles decoded now must be those of the merged --results
        mine = data_source(args, cohorts)
        check_same_puzzles(f"--data={args.data}", mine, source)
        source = mine
    dump = open(args.dump, "w") if args.dump else None
    entries = list(earlier)
    names = [f"{label} (seed {config.get('seed', '?')})" if label else os.path.join(*os.path.normpath(path).split(os.sep)[-2:])
             for (path, _, config), label in zip(ckpts, labels)]
    w = max(len(x) for x in names + ["checkpoint"])
    if ckpts:
        # bNFE: batch-level count at --batch_size; b1NFE: at batch size 1; vsnap: the authors' violating
        # snapshots; vsum: violations summed over the boards after each forward (docs/sudoku_metrics.md)
        print(f"{'checkpoint':<{w}} {'cohort':<14} {'τ':>5} {'exact%':>7} {'tok%':>7} {'NFE':>6} {'bNFE':>6} "
              f"{'b1NFE':>6} {'legal%':>7} {'viol':>6} {'vsnap':>6} {'vsum':>7} {'cells/f':>7}")
    for (path, model, config), label, name in zip(ckpts, labels, names):
        entry = {"path": path, "label": label, "config": config, "results": {}}
        for cohort, (q, a) in cohorts.items():
            entry["results"][cohort] = {}
            for tau in args.taus:
                record = dump is not None and tau == args.tau
                t0 = time.time()
                res = decode(model, q, tau=tau, max_steps=args.max_steps, batch_size=args.batch_size,
                             relay_carry=args.relay_carry, record_boards=record, progress=True)
                m = score(q, a, res) | {"seconds": round(time.time() - t0, 3)}
                entry["results"][cohort][tau_key(tau)] = m
                pct = lambda v: "n/a" if v is None else f"{100 * v:.2f}"  # noqa: E731
                print(f"{name:<{w}} {cohort:<14} {tau:5.2f} {pct(m['exact_match']):>7} {pct(m['token_accuracy']):>7} "
                      f"{m['mean_nfe']:6.2f} {m['batch_nfe']:6.2f} {m['batch1_nfe']:6.2f} {100 * m['legal_rate']:7.2f} "
                      f"{m['violations_final']:6.2f} {m['violating_snapshots']:6.2f} {m['violations_rollout']:7.2f} "
                      f"{m['cells_per_step']:7.2f}", flush=True)
                if record:
                    for i in range(q.size(0)):
                        dump.write(json.dumps({
                            "ckpt": path, "cohort": cohort, "tau": tau, "index": i,
                            "question": _board_text(q[i]),
                            "answer": None if a is None else _board_text(a[i]),
                            "prediction": _board_text(res.pred[i]), "nfe": res.nfe[i].item(),
                            "boards": [_board_text(b) for b in res.boards[i]]}) + "\n")
        entries.append(entry)
    if dump is not None:
        dump.close()
        print(f"wrote per-puzzle boards at τ = {args.tau:g} to {args.dump}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        meta = {k: getattr(args, k) for k in ("data", "n", "cohort", "taus", "tau", "max_steps", "batch_size",
                                              "ema", "relay_carry", "device")}
        with open(args.out, "w") as f:
            json.dump(meta | {"data_source": source, "checkpoints": entries}, f, indent=1)
        print(f"wrote {args.out}")
    if args.table:
        print("\n" + format_table(entries, args.tau, args.batch_size))
    if args.plot:
        plot_pareto(entries, args.plot, nfe=args.plot_nfe)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
