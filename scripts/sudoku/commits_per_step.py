"""Where a decoding's forward passes go: the cells each of the first forwards commits, per model and τ.

    python scripts/sudoku/commits_per_step.py --ckpt=reference/standin_mlm.safetensors,reference/standin_relay.safetensors \
        --data=data/sudoku-standin/test.parquet --n=1000 --clues=31-45

For each checkpoint and τ: the puzzles' mean NFE (each puzzle decoded alone: its loop steps + 1), their
exact match, and the mean number of cells committed by forward 1, 2, ..., --steps, over all selected
puzzles (a puzzle already finished counts 0, so a row sums to the mean number of blank cells when
--steps covers the slowest puzzle). Relay's first forward has no carried state (h_0 = 0, paper Eq. 2);
the later ones do. With answers and several checkpoints it then prints their exact match at matched NFE
(Sec. 4.1): five budgets spread over the NFE range every τ sweep covers, interpolated along each sweep.
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
from sample import load_checkpoints  # noqa: E402
import sudoku.frontier  # noqa: E402
from sudoku.board import MASK  # noqa: E402
from sudoku.decode import decode_puzzles  # noqa: E402
from sudoku.puzzle_files import load_puzzles  # noqa: E402


def commits_per_forward(commits: list[torch.Tensor], steps: int) -> list[float]:
    """Per-puzzle (nfe, 81) commit masks -> mean cells committed by forward 1..steps over all puzzles."""
    counts = np.zeros((len(commits), steps))
    for i, c in enumerate(commits):
        made = c.sum(1)[:steps].cpu().numpy()
        counts[i, :len(made)] = made
    return counts.mean(0).tolist()


def matched_nfe_table(rows: list[dict], n: int) -> str:
    """Each checkpoint's τ sweep as a frontier curve, compared at five budgets all of them cover."""
    paths = list(dict.fromkeys(r["ckpt"] for r in rows))
    short = {p: os.path.basename(p) for p in paths}
    if len(set(short.values())) < len(paths):  # two files of one name in different runs
        short = {p: p for p in paths}
    curves: dict[str, list[sudoku.frontier.Point]] = {}
    for r in rows:
        curves.setdefault(short[r["ckpt"]], []).append(sudoku.frontier.Point(nfe=r["nfe"], acc=r["exact"], n=n))
    budgets = sudoku.frontier.even_budgets(list(curves.values()), 5)
    if not budgets:
        return "no NFE range that every τ sweep covers: widen --taus"
    return sudoku.frontier.compare(curves, budgets)


def clue_range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        raise SystemExit(f"--clues must look like 31-45, got {text!r}") from None
    if not 0 <= lo <= hi <= 81:
        raise SystemExit(f"--clues must be a range within 0-81, got {text!r}")
    return lo, hi


def main(argv: list[str] | None = None) -> list[dict]:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--ckpt", required=True, help="checkpoints (.safetensors or run directories), comma-separated")
    p.add_argument("--data", default="test", help="a split (train, val, test) or a puzzle file")
    p.add_argument("--data_dir", default="data/sudoku-standin", help="where the splits are")
    p.add_argument("--n", type=int, default=0, help="the first n puzzles of --data (0: all), before --clues")
    p.add_argument("--clues", default="0-81", help="keep puzzles with this many clues, e.g. 31-45")
    p.add_argument("--taus", default="0.02,0.15,0.25")
    p.add_argument("--steps", type=int, default=4, help="forwards to show")
    args = p.parse_args(argv)
    lo, hi = clue_range(args.clues)
    try:
        taus = [float(t) for t in args.taus.split(",")]
    except ValueError:
        raise SystemExit(f"--taus must be comma-separated numbers, got {args.taus!r}") from None
    if not all(0 <= t < float("inf") for t in taus):  # NaN fails too; decode_puzzles would raise a traceback
        raise SystemExit(f"--taus must be finite thresholds >= 0, got {args.taus!r}")
    if args.n < 0 or args.steps < 1:
        raise SystemExit("--n must be >= 0 and --steps >= 1")
    puzzles = load_puzzles(args.data, args.data_dir)
    n = args.n or len(puzzles)
    questions = torch.as_tensor(puzzles.question[:n], dtype=torch.long)
    clues = (questions != MASK).sum(1)
    keep = (clues >= lo) & (clues <= hi)
    if not keep.any():
        raise SystemExit(f"no puzzle among the first {n} of {args.data} has {args.clues} clues")
    questions = questions[keep]
    answers = None if puzzles.answer is None else torch.as_tensor(puzzles.answer[:n], dtype=torch.long)[keep]
    print(f"{len(questions)} puzzles with {args.clues} clues (mean {int((questions == MASK).sum()) / len(questions):.1f} "
          f"blank cells), cells committed by forward 1..{args.steps}:")
    rows = []
    for path, model, _ in load_checkpoints(args.ckpt, "cpu", ema=True):
        for tau in taus:
            res = decode_puzzles(model, questions, tau=tau, record_boards=True)
            exact = float("nan") if answers is None else (res.pred == answers).all(1).float().mean().item()
            rows.append(dict(ckpt=path, tau=tau, nfe=res.batch1_nfe.float().mean().item(), exact=exact,
                             commits=commits_per_forward(res.commits, args.steps)))
            r = rows[-1]
            print(f"{os.path.basename(path):<28} τ {tau:<5g} NFE {r['nfe']:5.2f}  exact {100 * exact:5.1f}%  "
                  + " ".join(f"{c:5.1f}" for c in r["commits"]))
    if answers is not None and len({r["ckpt"] for r in rows}) > 1:
        print(f"\nexact match at matched NFE per puzzle (± binomial s.e., {len(questions)} puzzles):")
        print(matched_nfe_table(rows, len(questions)))
    return rows


if __name__ == "__main__":
    main()
