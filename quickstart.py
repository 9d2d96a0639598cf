"""Quick start: the reference Relay and MLM Sudoku models on fresh puzzles, as one table and one figure.

    python quickstart.py                 # 6 minutes on the 2-core CPU (shared); writes out/quickstart/

reference/mlm.safetensors and reference/relay.safetensors are the EMA weights of two 0.8M-parameter
models trained on the CPU with the same compute (MLM: 5,000 steps; Relay, K = 2: 2,500 steps, each
step two forwards), made by the commands in docs/results.md. This script generates puzzles neither
model has seen, in two sets with the same clue counts: one from this repository's generator
(`sudoku.generate_puzzle`, like the training data) and one on grids from an independently written
sampler (scripts/independent_grids.py), so a model that learned its generator's habits instead of
Sudoku shows up as a gap between the two. Both models decode both sets over the paper's τ sweep
(confidence-threshold unmasking, relay.decode); the table reports exact match and NFE, the figure
exact match against NFE and exact match per clue count.
"""
import argparse
import json
import os
import time

import numpy as np
import torch
from tqdm import tqdm

import sudoku
from model import load_model
from prepare_data import generate_one, parse_args as data_args
from sample import TAUS  # the paper's inference sweep
from scripts.transfer_check import BUCKETS, bucket_name, exact_by_bucket, independent_twins
from sudoku_decode import decode_boards

REFERENCES = {"MLM": "reference/mlm.safetensors", "Relay": "reference/relay.safetensors"}
HEADLINE_TAU = 0.15  # the paper's default threshold
_DATA = data_args([])
MIN_CLUES, MAX_CLUES = _DATA.min_clues, _DATA.max_clues  # as the default training data


def fresh_puzzles(n: int, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{set name: (questions, answers)} as (n, 81) token ids; seeded apart from the training data's streams."""
    questions, answers = [], []
    for i in tqdm(range(n), desc="fresh puzzles", disable=None, leave=False):
        # stream 1000: apart from the training data's splits (streams 0-2)
        puzzle, solution, _ = generate_one(seed, 1000, i, MIN_CLUES, MAX_CLUES)
        questions.append(puzzle)
        answers.append(solution)
    own = (sudoku.digits_to_tokens(np.stack(questions)), sudoku.digits_to_tokens(np.stack(answers)))
    return {"this generator": own, "independent grids": independent_twins(own[0], seed)}


def evaluate(model: torch.nn.Module, sets: dict, taus: tuple[float, ...]) -> dict:
    """{set: {tau: {"exact", "nfe", "buckets"}}} for one model."""
    out = {}
    for name, (q, a) in sets.items():
        out[name] = {}
        for tau in taus:
            pred, nfe, _ = decode_boards(model, torch.as_tensor(q), tau=tau)
            buckets = exact_by_bucket(q, a, pred.numpy())
            out[name][f"{tau:g}"] = {"exact": buckets["all"]["exact"], "nfe": float(nfe.float().mean()),
                                     "buckets": buckets}
    return out


def table(results: dict, taus: tuple[float, ...]) -> str:
    """Markdown: one row per (model, puzzle set); exact match / mean NFE at each τ."""
    lines = ["| model | puzzles | " + " | ".join(f"τ = {t:g}" for t in taus) + " |",
             "|---|---|" + "---|" * len(taus)]
    for model, sets in results.items():
        for name, by_tau in sets.items():
            cells = [f"{100 * by_tau[f'{t:g}']['exact']:.1f}% / {by_tau[f'{t:g}']['nfe']:.1f}" for t in taus]
            lines.append(f"| {model} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict, taus: tuple[float, ...], path: str) -> None:
    """Left: exact match against mean NFE over τ. Right: exact match per clue count at the headline τ."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"MLM": "tab:blue", "Relay": "tab:red"}
    styles = {"this generator": "-", "independent grids": "--"}
    for model, sets in results.items():
        for name, by_tau in sets.items():
            points = [by_tau[f"{t:g}"] for t in taus]
            left.plot([p["nfe"] for p in points], [100 * p["exact"] for p in points], styles[name], marker="o",
                      color=colors.get(model), label=f"{model}, {name}")
    left.set(xlabel="mean NFE per puzzle (forward passes)", ylabel="exact match (%)",
             title=f"τ sweep {', '.join(f'{t:g}' for t in taus)}")
    left.legend(fontsize=8)
    names = [bucket_name(lo, hi) for lo, hi in BUCKETS]
    first = next(iter(next(iter(results.values())).values()))[f"{HEADLINE_TAU:g}"]["buckets"]
    names = [b for b in names if b in first]
    width = 0.8 / (len(results) * 2)
    x = np.arange(len(names))
    k = 0
    for model, sets in results.items():
        for name, by_tau in sets.items():
            buckets = by_tau[f"{HEADLINE_TAU:g}"]["buckets"]
            right.bar(x + (k - len(results)) * width + width / 2, [100 * buckets[b]["exact"] for b in names], width,
                      color=colors.get(model), alpha=1.0 if name == "this generator" else 0.45,
                      label=f"{model}, {name}")
            k += 1
    right.set_xticks(x, [f"{b}" for b in names])
    right.set(xlabel="clues", ylabel="exact match (%)", title=f"by number of clues, τ = {HEADLINE_TAU:g}")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--n", type=int, default=1000, help="fresh puzzles per set")
    p.add_argument("--seed", type=int, default=2026, help="seed of the fresh puzzles")
    p.add_argument("--out_dir", default="out/quickstart")
    args = p.parse_args(argv)
    if args.n < 1:
        raise SystemExit("--n must be >= 1")
    missing = [path for path in REFERENCES.values() if not os.path.exists(path)]
    if missing:
        raise SystemExit(f"{missing[0]} is missing: run from the repository root of a full clone")
    os.makedirs(args.out_dir, exist_ok=True)

    start = time.time()
    sets = fresh_puzzles(args.n, args.seed)
    print(f"{args.n} fresh puzzles per set in {time.time() - start:.0f} s", flush=True)
    results = {}
    for label, path in REFERENCES.items():
        model, config = load_model(path)
        results[label] = evaluate(model, sets, TAUS)
        r = results[label]
        print(f"{label} ({config.get('max_iters')} steps): exact match at τ = {HEADLINE_TAU:g}: "
              f"{100 * r['this generator'][f'{HEADLINE_TAU:g}']['exact']:.1f}% on this generator's puzzles, "
              f"{100 * r['independent grids'][f'{HEADLINE_TAU:g}']['exact']:.1f}% on independent grids", flush=True)

    text = (f"exact match / mean NFE on {args.n} fresh puzzles per set (seed {args.seed}), "
            f"{MIN_CLUES}-{MAX_CLUES} clues\n\n{table(results, TAUS)}")
    print("\n" + text)
    with open(os.path.join(args.out_dir, "results.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump({"n": args.n, "seed": args.seed, "taus": TAUS, "results": results}, f, indent=1)
    figure = os.path.join(args.out_dir, "quickstart.png")
    plot(results, TAUS, figure)
    print(f"\nwrote {figure} and results.md / results.json in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
