"""Sudoku evaluation: the paper's metrics over a τ sweep, and the command line that prints and saves them.

    python sample.py --ckpt=out/relay --data=test --n=2000                 # τ sweep, metrics printed
    python sample.py --ckpt=out/mlm_s0,out/mlm_s1,out/relay_s0,out/relay_s1 \\
        --cohort=all,deduction_only --table --plot=pareto.png --out=results.json
    python sample.py --ckpt=out/relay --puzzle=4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......

Decoding lives in sudoku_decode.py, Table 1 / the Pareto figure / merging of --out files in
sudoku_report.py, the --puzzle viewer and --dump in sudoku_show.py.

NFE is reported three ways (definitions and the Table 1 columns they match: docs/sudoku_metrics.md):
  nfe         forward passes the puzzle itself took (finished puzzles leave the batch),
  batch_nfe   the authors' count: loop iterations of the puzzle's batch + 1 final forward, i.e.
              1 + the slowest puzzle of its batch. Depends on batch_size (Table 1 unfiltered: 512).
  batch1_nfe  the same count at batch size 1: the puzzle's own loop steps + 1 final forward
              (the basis of the authors' one-puzzle-at-a-time deduction-only runs).
"""
import argparse
import json
import os
import time

import numpy as np
import torch

from sudoku import DIGIT0, MASK, N_CELLS
from sudoku_decode import DTYPES, DecodeResult, check_questions, decode, token_violations
from sudoku_report import check_same_puzzles, data_source, format_table, load_results, plot_pareto, tau_key
from sudoku_show import show_puzzle, write_boards

TAUS = (0.05, 0.10, 0.15, 0.20, 0.25)  # the paper's inference sweep
METRIC_KEYS = ("exact_match", "token_accuracy", "mean_nfe", "batch_nfe", "batch1_nfe", "legal_rate",
               "violations_final", "violations_rollout", "violating_snapshots", "cells_per_step", "n")


# -----------------------------------------------------------------------------
# metrics (definitions and their match with the paper: docs/sudoku_metrics.md)

def violating_snapshots(trajectory: torch.Tensor) -> torch.Tensor:
    """The authors' per-puzzle violation count: how many snapshots of a decode contain any violation.

    trajectory (..., T, 81): the initial board, the board after each loop forward, then the final-fill
    snapshot (the final board; when the loop already finished the puzzle it repeats the last board, so an
    illegal final board counts twice). -> (...) number of boards with any violation.
    """
    flat = trajectory.reshape(-1, N_CELLS)
    return (token_violations(flat) > 0).view(trajectory.shape[:-1]).sum(-1)


def is_legal(tokens: torch.Tensor) -> torch.Tensor:
    """(N, 81) -> (N,) bool: fully filled with digits 1..9 and no unit repeats a digit."""
    filled = ((tokens >= DIGIT0 + 1) & (tokens <= DIGIT0 + 9)).all(1)
    return filled & (token_violations(tokens) == 0)


def score(questions: torch.Tensor, answers: torch.Tensor | None, result: DecodeResult) -> dict[str, float | None]:
    """The per-τ metrics of one decode. Exact match and token accuracy are None without answers.

    exact_match        fraction of puzzles whose 81 predicted ids all equal the answer
    token_accuracy     per puzzle, correct / non-clue cells, then the mean over puzzles
    mean_nfe           mean per-puzzle forward passes; batch_nfe the paper's batch-level count
    batch1_nfe         mean of the batch-level count at batch size 1 (own loop steps + 1)
    legal_rate         fraction of final boards fully filled with 1..9 and no repeated digit in a unit
    violations_final   mean violation count (sudoku.count_violations_batch) of the final board
    violations_rollout mean over puzzles of that count summed over the boards after each forward
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
    m["violations_final"] = token_violations(pred).float().mean().item()
    m["violations_rollout"] = result.violations_rollout.float().mean().item()
    for key in ("violating_snapshots", "batch1_nfe"):
        value = getattr(result, key)
        m[key] = None if value is None else value.float().mean().item()
    m["cells_per_step"] = result.cells_per_step.mean().item()
    m["n"] = int(pred.size(0))
    return m


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
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="auto: bf16 autocast on CUDA (the authors' evaluation), fp32 elsewhere; or force one")
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


def main(argv: list[str] | None = None) -> None:
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
                             relay_carry=args.relay_carry, record_boards=record, progress=True, dtype=args.dtype)
                m = score(q, a, res) | {"seconds": round(time.time() - t0, 3)}
                entry["results"][cohort][tau_key(tau)] = m
                pct = lambda v: "n/a" if v is None else f"{100 * v:.2f}"  # noqa: E731
                print(f"{name:<{w}} {cohort:<14} {tau:5.2f} {pct(m['exact_match']):>7} {pct(m['token_accuracy']):>7} "
                      f"{m['mean_nfe']:6.2f} {m['batch_nfe']:6.2f} {m['batch1_nfe']:6.2f} {100 * m['legal_rate']:7.2f} "
                      f"{m['violations_final']:6.2f} {m['violating_snapshots']:6.2f} {m['violations_rollout']:7.2f} "
                      f"{m['cells_per_step']:7.2f}", flush=True)
                if record:
                    write_boards(dump, path, cohort, tau, q, a, res)
        entries.append(entry)
    if dump is not None:
        dump.close()
        print(f"wrote per-puzzle boards at τ = {args.tau:g} to {args.dump}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        meta = {k: getattr(args, k) for k in ("data", "n", "cohort", "taus", "tau", "max_steps", "batch_size",
                                              "ema", "relay_carry", "device", "dtype")}
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
