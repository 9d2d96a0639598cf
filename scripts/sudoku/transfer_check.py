"""Transfer check: does a Sudoku model solve puzzles from a generator it never saw as well as its own?

    python scripts/sudoku/transfer_check.py --ckpt=runs/budget_clean/mlm_s1,runs/budget_clean/relay_cold_s1 --n=1000

For each of the first --n puzzles of the test split, a twin is built with the same number of clues
and the same removal procedure (`sudoku.board.remove_clues`: random-order removal while the solution stays
unique) on a grid from an independently written sampler (scripts/sudoku/independent_grids.py). Each model
decodes both sets at --tau; exact match is reported per clue-count bucket. A model that learned
Sudoku scores the same on both (within noise); a model that learned its generator's habits does not.
"""
import json
import os
import sys

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
import sudoku.board  # noqa: E402
from scripts.sudoku.independent_grids import independent_grid  # noqa: E402

BUCKETS = ((17, 23), (24, 27), (28, 31), (32, 35), (36, 39), (40, 81))


def independent_twins(questions: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, 81) token boards -> (puzzles, solutions) as token ids, one twin per board with its clue count."""
    n_clues = (questions != sudoku.board.MASK).sum(1)
    puzzles, solutions = [], []
    for i, k in enumerate(tqdm(n_clues.tolist(), desc="independent puzzles", disable=None, leave=False)):
        rng = np.random.default_rng([seed, i])
        grid = independent_grid(rng)
        puzzles.append(sudoku.board.remove_clues(rng, grid, int(k)))
        solutions.append(grid)
    return sudoku.board.digits_to_tokens(np.stack(puzzles)), sudoku.board.digits_to_tokens(np.stack(solutions))


def bucket_name(lo: int, hi: int) -> str:
    return f"{lo}-{hi}" if hi < 81 else f"{lo}+"


def exact_by_bucket(questions: np.ndarray, answers: np.ndarray, pred: np.ndarray) -> dict[str, dict]:
    """{bucket: {"exact": fraction, "n": count}} by clue count, plus "all"."""
    n_clues = (questions != sudoku.board.MASK).sum(1)
    right = (pred == answers).all(1)
    out = {}
    for lo, hi in BUCKETS:
        keep = (n_clues >= lo) & (n_clues <= hi)
        if keep.any():
            out[bucket_name(lo, hi)] = {"exact": float(right[keep].mean()), "n": int(keep.sum())}
    out["all"] = {"exact": float(right.mean()), "n": int(right.size)}
    return out


def table(results: dict[str, dict[str, dict]]) -> str:
    """Markdown: one row per (run, puzzle set), exact match per clue bucket (n in brackets)."""
    names = [bucket_name(lo, hi) for lo, hi in BUCKETS] + ["all"]
    names = [b for b in names if any(b in sets for run in results.values() for sets in run.values())]
    lines = ["| run | puzzles | " + " | ".join(f"{b} clues" if b != "all" else "all" for b in names) + " |",
             "|---|---|" + "---|" * len(names)]
    for run, sets in results.items():
        for which, buckets in sets.items():
            cells = [f"{100 * buckets[b]['exact']:.1f}% ({buckets[b]['n']})" if b in buckets else "–" for b in names]
            lines.append(f"| {run} | {which} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--ckpt", required=True, help="checkpoint out_dir(s) or .pt file(s), comma-separated")
    p.add_argument("--labels", default="", help="a name per checkpoint, comma-separated (default: its path)")
    p.add_argument("--data_dir", default="data/sudoku")
    p.add_argument("--n", type=int, default=1000, help="first N test puzzles and as many twins")
    p.add_argument("--tau", type=float, default=0.15)
    p.add_argument("--seed", type=int, default=0, help="seed of the independent twins")
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--out", default="", help="write the numbers as JSON here")
    args = p.parse_args(argv)
    if args.n < 1 or args.batch_size < 1 or not args.tau >= 0:
        raise SystemExit("--n and --batch_size must be >= 1 and --tau >= 0")
    if args.seed < 0:
        raise SystemExit(f"--seed must be >= 0 (it seeds numpy's generator), got {args.seed}")
    ckpts = [c.strip() for c in args.ckpt.split(",") if c.strip()]
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else ckpts
    if len(labels) != len(ckpts):
        raise SystemExit(f"--labels: {len(labels)} names for {len(ckpts)} checkpoints")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise SystemExit(f"--out {args.out}: its directory does not exist")
    if args.out and os.path.isdir(args.out):
        raise SystemExit(f"--out {args.out} is a directory; give a file name")

    import sample
    import sudoku.decode
    from prepare_data import load_puzzles
    try:
        own = load_puzzles("test", data_dir=args.data_dir)
    except (ValueError, OSError) as e:
        raise SystemExit(f"--data_dir {args.data_dir}: {str(e).strip().splitlines()[0]}") from None
    if own.answer is None:
        raise SystemExit(f"--data_dir {args.data_dir}: the test split has no answers")
    sets = {"own test split": (np.asarray(own.question)[:args.n], np.asarray(own.answer)[:args.n])}
    sets["independent grids"] = independent_twins(sets["own test split"][0], args.seed)

    results = {}
    for label, (path, model, _) in zip(labels, sample.load_checkpoints(",".join(ckpts), "cpu", ema=True)):
        results[label] = {}
        for which, (q, a) in sets.items():
            res = sudoku.decode.decode_puzzles(model, torch.as_tensor(q), tau=args.tau, batch_size=args.batch_size, progress=True)
            results[label][which] = exact_by_bucket(q, a, res.pred.numpy())
        print(f"{label}: own {100 * results[label]['own test split']['all']['exact']:.1f}%, independent "
              f"{100 * results[label]['independent grids']['all']['exact']:.1f}%", flush=True)
    print(f"\nexact match at τ = {args.tau:g} by number of clues (puzzles in brackets)\n")
    print(table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"tau": args.tau, "n": args.n, "data_dir": os.path.abspath(args.data_dir), "results": results}, f,
                      indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
