"""Sudoku evaluation: the paper's metrics over a τ sweep, and the command line that prints and saves them.

    python sample.py --ckpt=out/relay --data=test --n=2000                 # τ sweep, metrics printed
    python sample.py --ckpt=out/mlm_s0,out/mlm_s1,out/relay_s0,out/relay_s1 \\
        --cohort=all,deduction_only --table --plot=pareto.png --out=results.json
    python sample.py --ckpt=out/mlm_s1,out/relay_s1 --frontier                # accuracy at matched NFE budgets
    python sample.py --ckpt=out/relay --temperature=1.5                     # a sampler knob; read it against NFE
    python sample.py --ckpt=out/relay --state_noise=1 --samples_per_puzzle=8  # pass@8 and avg@8
    python sample.py --ckpt=out/relay --puzzle=4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......

Decoding lives in sudoku/decode.py, Table 1 / the Pareto figure / merging of --out files in
sudoku/report.py, the --puzzle viewer and --dump in sudoku/show.py.

NFE is reported four ways (definitions and the Table 1 columns they match: docs/sudoku_metrics.md):
  batch1_nfe    Table 1's count (both columns): the authors decoded one puzzle at a time, so a puzzle
                costs its own loop steps + 1 final forward. Independent of --batch_size.
  batch512_nfe  the authors' count in batches of 512 (their W&B validation logs): every puzzle is charged
                1 + the slowest loop of its 512 (dataset order). Computed from the batch-1 counts, so
                also independent of --batch_size.
  batch_nfe     the same batch-level count as measured at --batch_size.
  nfe           forward passes the puzzle itself took (finished puzzles leave the batch).
"""
import argparse
import json
import os
import time

import numpy as np
import torch

from common import folder_problem, load_model, pick_device
from sudoku.board import MASK, N_CELLS
from sudoku.frontier import AUTHORS_BUDGETS, AUTHORS_TAUS
from sudoku.decode import (DTYPES, DecodeResult, batch_level_nfe, check_questions, decode_puzzles, device_of, is_legal,
                           token_violations)
from sudoku.report import (NFE_AXES, check_same_puzzles, data_source, format_frontier, format_table, is_collapsed,
                           load_results, plot_pareto, tau_key)
from sudoku.show import show_puzzle, write_boards
import configurator

TAUS = (0.05, 0.10, 0.15, 0.20, 0.25)  # the paper's inference sweep
AUTHORS_BATCH = 512  # the batch size of the authors' validation (their batch-level NFE)
METRIC_KEYS = ("exact_match", "token_accuracy", "mean_nfe", "batch_nfe", "batch1_nfe", "batch512_nfe", "legal_rate",
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


def score(questions: torch.Tensor, answers: torch.Tensor | None, result: DecodeResult) -> dict[str, float | None]:
    """The per-τ metrics of one decode. Exact match and token accuracy are None without answers.

    exact_match        fraction of puzzles whose 81 predicted ids all equal the answer
    token_accuracy     per puzzle, correct / non-clue cells, then the mean over puzzles
    mean_nfe           mean per-puzzle forward passes; batch_nfe the batch-level count at the decode's batch size
    batch1_nfe         Table 1's count: mean of own loop steps + 1 (the batch-level count at batch size 1)
    batch512_nfe       the batch-level count of batches of 512 in the given order, from the batch-1 counts
    legal_rate         fraction of final boards fully filled with 1..9 and no repeated digit in a unit
    violations_final   mean violation count (sudoku.board.count_violations_batch) of the final board
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
    b1 = result.batch1_nfe
    m["batch512_nfe"] = None if b1 is None else batch_level_nfe(b1, AUTHORS_BATCH).float().mean().item()
    m["cells_per_step"] = result.cells_per_step.mean().item()
    m["n"] = int(pred.size(0))
    return m


def per_puzzle(questions: torch.Tensor, answers: torch.Tensor | None, result: DecodeResult) -> dict:
    """One decode's outcome per puzzle, compact: solved as a string of 0/1, the share of blank cells filled
    right (3 decimals) and the batch-1 NFE, in puzzle order."""
    out: dict = {"batch1_nfe": result.batch1_nfe.tolist()}
    if answers is not None:
        answers = answers.to(result.pred.device).long()
        right = result.pred == answers
        blank = questions.to(result.pred.device) == MASK
        out["solved"] = "".join("1" if x else "0" for x in right.all(1).tolist())
        share = (right & blank).sum(1) / blank.sum(1).clamp(min=1)
        out["blank_right"] = [round(x, 3) for x in share.tolist()]
    return out


def score_samples(questions: torch.Tensor, answers: torch.Tensor | None,
                  results: list[DecodeResult]) -> dict[str, float | None]:
    """The metrics of k decodes of the same puzzles: score() of one decode; for k > 1 every metric is its
    mean over the k samples, plus pass_at_k (fraction of puzzles solved by at least one sample), avg_at_k
    (= the mean exact match) and pass_at_k_nfe (the batch-1 count summed over the k samples: pass@k's cost)."""
    per_sample = [score(questions, answers, r) for r in results]
    if len(results) == 1:
        return per_sample[0]
    m = {k: (None if per_sample[0][k] is None else sum(s[k] for s in per_sample) / len(per_sample))
         for k in per_sample[0]}
    m["n"], m["k"] = per_sample[0]["n"], len(results)
    m["pass_at_k"] = m["avg_at_k"] = None
    if answers is not None:
        solved = torch.stack([(r.pred == answers.to(r.pred.device).long()).all(1) for r in results])  # (k, N)
        m["pass_at_k"] = solved.any(0).float().mean().item()
        m["avg_at_k"] = solved.float().mean().item()
    m["pass_at_k_nfe"] = len(results) * m["batch1_nfe"]
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
    p = configurator.ArgumentParser(description="Evaluate Sudoku checkpoints: τ sweep, Table 1, Pareto figure, "
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
    p.add_argument("--taus", type=_floats, default=None, help="the τ sweep, comma-separated (default "
                   f"{','.join(map(str, TAUS))}; with --frontier the authors' {','.join(map(str, AUTHORS_TAUS))})")
    p.add_argument("--tau", type=float, default=0.15, help="the matched τ of --table, --dump and --puzzle")
    p.add_argument("--max_steps", type=int, default=64, help="decoding steps before the final fill-in forward")
    p.add_argument("--batch_size", type=int, default=512, help="puzzles per forward; only bNFE depends on it "
                   "(Table 1's batch-1 count and the batch-512 count do not)")
    p.add_argument("--relay_carry", type=_bool, default=True, help="carry h between steps (relay models)")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps")
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="auto: bf16 autocast on CUDA (the authors' evaluation), fp32 elsewhere; or force one")
    p.add_argument("--out", default="", help="write all metrics and each checkpoint's run config as JSON")
    p.add_argument("--table", action="store_true", help="print Table-1-style rows at --tau")
    p.add_argument("--frontier", action="store_true", help="accuracy at matched NFE (--frontier_nfe) over the "
                   "τ sweep, interpolated at --budgets, never extrapolated (paper Sec. 4.1)")
    p.add_argument("--budgets", type=_floats, default=AUTHORS_BUDGETS, help="NFE budgets of --frontier")
    p.add_argument("--frontier_nfe", default="batch1_nfe,batch512_nfe", help="NFE bases of --frontier, comma-separated, "
                   f"one table each: {', '.join(NFE_AXES)} (default: Table 1's count and the validation logs' count)")
    p.add_argument("--temperature", type=float, default=1.0, help="softmax temperature of the confidences "
                   "the threshold rule reads (1 = the paper)")
    p.add_argument("--state_noise", type=float, default=0.0, help="s.d. of Gaussian noise added to the carried "
                   "relay state before each step (0 = the paper; relay checkpoints only)")
    p.add_argument("--samples_per_puzzle", type=int, default=1, help="k decodes per puzzle: pass@k and avg@k "
                   "(k > 1 needs --state_noise > 0, else the k decodes are identical)")
    p.add_argument("--seed", type=int, default=0, help="seed of the state noise (sample j uses seed + j)")
    p.add_argument("--plot", default="", help="draw exact match vs NFE over the τ sweep into this PNG")
    p.add_argument("--plot_nfe", default="batch1_nfe", choices=tuple(NFE_AXES), help="x axis of --plot "
                   "(default: Table 1's batch-1 count)")
    p.add_argument("--dump", default="", help="per-puzzle JSONL at --tau: question, answer, prediction, nfe, boards")
    p.add_argument("--per_puzzle", type=_bool, default=False, help="--out also records, at every τ, which puzzles "
                   "were solved, their blank cells filled right and their batch-1 NFE (to cut results by "
                   "difficulty later)")
    args = p.parse_args(argv)
    args.device = pick_device(args.device)  # resolved here: the --out file records the device that ran
    if not args.ckpt and not args.results:
        raise SystemExit("give --ckpt=RUN[,RUN...] to evaluate and/or --results=FILE[,FILE...] to merge earlier results")
    if (args.puzzle or args.dump) and not args.ckpt:
        raise SystemExit("--puzzle and --dump need --ckpt (merged --results hold no boards)")
    args.cohort = [c.strip() for c in args.cohort.split(",") if c.strip()]
    for c in args.cohort:
        if c not in ("all", "deduction_only"):
            raise SystemExit(f"--cohort: unknown cohort {c!r}; use all, deduction_only or all,deduction_only")
    if args.taus is None:
        args.taus = AUTHORS_TAUS if args.frontier else TAUS
    if not args.taus or not all(0 <= t < float("inf") for t in (*args.taus, args.tau)):  # NaN fails too
        raise SystemExit("--taus/--tau: give one or more finite thresholds >= 0, e.g. --taus=0.05,0.10,0.15")
    if args.tau not in args.taus:
        args.taus = tuple(sorted(args.taus + (args.tau,)))
    if args.n < 0 or args.batch_size < 1 or args.max_steps < 1:
        raise SystemExit("--n must be >= 0, --batch_size and --max_steps >= 1")
    check_sampler_args(args)
    return args


def check_sampler_args(args: argparse.Namespace) -> None:
    """One-line refusals for sampler knobs that cannot mean what they say."""
    if not 0 < args.temperature < float("inf"):
        raise SystemExit(f"--temperature must be a finite number > 0, got {args.temperature}")
    if not 0 <= args.state_noise < float("inf"):
        raise SystemExit(f"--state_noise must be a finite number >= 0, got {args.state_noise}")
    if args.samples_per_puzzle < 1:
        raise SystemExit(f"--samples_per_puzzle must be >= 1, got {args.samples_per_puzzle}")
    if args.per_puzzle and args.samples_per_puzzle > 1:
        raise SystemExit("--per_puzzle records one decode per puzzle: use it with --samples_per_puzzle=1")
    if args.samples_per_puzzle > 1 and args.state_noise == 0:
        raise SystemExit("--samples_per_puzzle > 1 needs --state_noise > 0: decoding is otherwise deterministic "
                         "and the samples would be identical")
    if args.frontier and not args.budgets:
        raise SystemExit("--budgets: give one or more NFE budgets, e.g. --budgets=15,20,25,30")
    if not all(0 < b < float("inf") for b in args.budgets):
        raise SystemExit(f"--budgets must be finite numbers > 0, got {','.join(f'{b:g}' for b in args.budgets)}")

    args.frontier_nfe = [k.strip() for k in args.frontier_nfe.split(",") if k.strip()]
    if not args.frontier_nfe or any(k not in NFE_AXES for k in args.frontier_nfe):
        raise SystemExit(f"--frontier_nfe: give one or more of {', '.join(NFE_AXES)}, comma-separated")


def load_checkpoints(spec: str, device: str, ema: bool) -> list[tuple[str, torch.nn.Module, dict]]:
    out = []
    for path in [s.strip() for s in spec.split(",") if s.strip()]:
        try:
            model, config = load_model(path, device=device, ema=ema)
        except (ValueError, RuntimeError, OSError, KeyError, TypeError) as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SystemExit(f"--ckpt: {msg}" if path in msg else f"--ckpt {path}: {msg}") from None  # the path once
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
        problem = folder_problem(folder)  # --out creates its folder: not under a file
        if problem:
            raise SystemExit(f"--{flag}={path}: its folder {problem}")
        if os.path.isdir(path):
            raise SystemExit(f"--{flag}={path} is a directory; give a file name")


SAMPLER_KEYS = ("temperature", "state_noise", "samples_per_puzzle", "seed")  # recorded per checkpoint entry


def decode_samples(model: torch.nn.Module, questions: torch.Tensor, tau: float, args: argparse.Namespace,
                   record: bool) -> list[DecodeResult]:
    """--samples_per_puzzle decodes of the questions at τ with the sampler knobs; sample j draws its state
    noise from a generator seeded with --seed + j (boards recorded for the first sample only)."""
    out = []
    for j in range(args.samples_per_puzzle):
        gen = (torch.Generator(device=device_of(model, questions.device)).manual_seed(args.seed + j)
               if args.state_noise > 0 else None)  # the noise's own stream; no noise draws nothing
        out.append(decode_puzzles(model, questions, tau=tau, max_steps=args.max_steps, batch_size=args.batch_size,
                                  relay_carry=args.relay_carry, record_boards=record and j == 0, progress=True,
                                  dtype=args.dtype, temperature=args.temperature, state_noise=args.state_noise,
                                  generator=gen))
    return out


def metrics_header(w: int, k: int) -> str:
    # b1NFE: Table 1's batch-1 count; b512: the batch-512 count; bNFE: the batch count at --batch_size;
    # vsnap: the authors' violating snapshots; vsum: violations summed over the boards (docs/sudoku_metrics.md)
    head = (f"{'checkpoint':<{w}} {'cohort':<14} {'τ':>5} {'exact%':>7} {'tok%':>7} {'b1NFE':>6} {'b512':>6} "
            f"{'bNFE':>6} {'NFE':>6} {'legal%':>7} {'viol':>6} {'vsnap':>6} {'vsum':>7} {'cells/f':>7}")
    return head + (f" {f'pass@{k}':>7} {f'avg@{k}':>7} {f'NFE@{k}':>7}" if k > 1 else "")


def metrics_line(name: str, w: int, cohort: str, tau: float, m: dict) -> str:
    """One row under metrics_header; a collapsed checkpoint (exact match and legal rate 0) says so."""
    def pct(v):
        return "n/a" if v is None else f"{100 * v:.2f}"
    line = (f"{name:<{w}} {cohort:<14} {tau:5.2f} {pct(m['exact_match']):>7} {pct(m['token_accuracy']):>7} "
            f"{m['batch1_nfe']:6.2f} {m['batch512_nfe']:6.2f} {m['batch_nfe']:6.2f} {m['mean_nfe']:6.2f} "
            f"{100 * m['legal_rate']:7.2f} {m['violations_final']:6.2f} {m['violating_snapshots']:6.2f} "
            f"{m['violations_rollout']:7.2f} {m['cells_per_step']:7.2f}")
    if "k" in m:
        line += f" {pct(m['pass_at_k']):>7} {pct(m['avg_at_k']):>7} {m['pass_at_k_nfe']:7.2f}"
    if is_collapsed(m):
        line += "  COLLAPSED (exact match 0, legal rate 0)"
    return line


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
    if args.state_noise > 0:
        for path, model, _ in ckpts:
            if not (args.relay_carry and getattr(model.config, "relay", False)):
                raise SystemExit(f"--state_noise: {path} carries no relay state (not a relay model, or "
                                 "--relay_carry=False); there is nothing to perturb")
    dump = open(args.dump, "w") if args.dump else None
    entries = list(earlier)
    names = [f"{label} (seed {config.get('seed', '?')})" if label else os.path.join(*os.path.normpath(path).split(os.sep)[-2:])
             for (path, _, config), label in zip(ckpts, labels)]
    w = max(len(x) for x in names + ["checkpoint"])
    if ckpts:
        print(metrics_header(w, args.samples_per_puzzle))
    for (path, model, config), label, name in zip(ckpts, labels, names):
        entry = {"path": path, "label": label, "config": config, "results": {},
                 "sampler": {k: getattr(args, k) for k in SAMPLER_KEYS}}
        for cohort, (q, a) in cohorts.items():
            entry["results"][cohort] = {}
            for tau in args.taus:
                record = dump is not None and tau == args.tau
                t0 = time.time()
                results = decode_samples(model, q, tau, args, record)
                m = score_samples(q, a, results) | {"seconds": round(time.time() - t0, 3)}
                if args.per_puzzle:
                    m["per_puzzle"] = per_puzzle(q, a, results[0])
                entry["results"][cohort][tau_key(tau)] = m
                print(metrics_line(name, w, cohort, tau, m), flush=True)
                if record:
                    write_boards(dump, path, cohort, tau, q, a, results[0])
        entries.append(entry)
    if dump is not None:
        dump.close()
        print(f"wrote per-puzzle boards at τ = {args.tau:g} to {args.dump}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        meta = {k: getattr(args, k) for k in ("data", "n", "cohort", "taus", "tau", "max_steps", "batch_size",
                                              "ema", "relay_carry", "device", "dtype") + SAMPLER_KEYS}
        with open(args.out, "w") as f:
            json.dump(meta | {"data_source": source, "checkpoints": entries}, f, indent=1)
        print(f"wrote {args.out}")
    if args.table:
        print("\n" + format_table(entries, args.tau, args.batch_size))
    if args.frontier:
        for nfe in args.frontier_nfe:
            print("\n" + format_frontier(entries, args.budgets, nfe))
    if args.plot:
        plot_pareto(entries, args.plot, nfe=args.plot_nfe)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
