"""Quick start: the reference MLM and Relay Sudoku models on hard puzzles, their accuracy-NFE frontier
as one table and one figure.

    python quickstart.py                 # the stand-in study's pair; writes out/quickstart/
    python quickstart.py --models=hard   # the earlier pair trained on hard puzzles only (3,000 / 1,500 steps)
    python quickstart.py --models=easy   # the earlier pair trained on the easy generated mix

reference/standin_mlm.safetensors and reference/standin_relay.safetensors are the EMA weights of two
0.8M-parameter models trained from scratch on the CPU, seed 1 of the stand-in study (docs/results.md):
Sudoku-Extreme's composition built offline (26% easy generated puzzles, 74% hard ones from larsdoku),
the same compute for both (MLM: 24,000 steps; Relay, K = 2: 12,000 steps of two forwards each). Both
decode two sets neither has seen: the first puzzles of Top1465, a classic collection of hard puzzles
(read from the installed larsdoku package; prepare_data.py removes its symmetric copies from every
training split), and fresh puzzles from this repository's generator in its hard mode (minimal puzzles
that naked and hidden singles cannot finish). Decoding is confidence-threshold unmasking over a τ sweep
(relay.decode); the paper compares models at matched NFE (Sec. 4.1, Fig. 2), so the table reads each
model's accuracy at the same mean number of forward passes, interpolated along its sweep
(sudoku/frontier.py), with binomial standard errors.
"""
import json
import os
import time

import numpy as np
import torch
from tqdm import tqdm

import sudoku.frontier
import sudoku.board
import sudoku.hard
from common import folder_problem, load_model
from sudoku.puzzle_files import strings_to_digits
from sudoku.decode import decode_boards
import configurator

REFERENCES = {"standin": {"MLM": "reference/standin_mlm.safetensors", "Relay": "reference/standin_relay.safetensors"},
              # the earlier pairs: trained on hard puzzles only, and on the easy generated mix (17-45 clues;
              # docs/results.md)
              "hard": {"MLM": "reference/hard_mlm.safetensors", "Relay": "reference/hard_relay.safetensors"},
              "easy": {"MLM": "reference/mlm.safetensors", "Relay": "reference/relay.safetensors"}}
HARD_TAUS = (0.02, 0.05, 0.10, 0.15, 0.25)  # the paper's sweep reaches 0.05; hard puzzles reward lower thresholds
COLORS = {"MLM": "C0", "Relay": "C3"}


def top1465(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first n Top1465 puzzles and their solutions as (n, 81) token ids."""
    questions = strings_to_digits(sudoku.hard.top1465_questions()[:n])
    answers = np.stack([sudoku.board.solve(q) for q in questions])
    return sudoku.board.digits_to_tokens(questions), sudoku.board.digits_to_tokens(answers)


def fresh_hard(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n fresh hard puzzles from the generator (stream 1000: apart from prepare_data.py's streams)."""
    rows, index = [], 0
    with tqdm(total=n, desc="fresh hard puzzles", disable=None, leave=False) as bar:
        while len(rows) < n:
            found = sudoku.hard.hard_seed(seed, 1000, index)
            index += 1
            if found is not None:
                rows.append(found)
                bar.update()
    q, a, _ = zip(*rows)
    return sudoku.board.digits_to_tokens(strings_to_digits(q)), sudoku.board.digits_to_tokens(strings_to_digits(a))


def sweep(model: torch.nn.Module, questions: np.ndarray, answers: np.ndarray) -> list[dict]:
    """Exact match and mean NFE per puzzle (the puzzle's own forward passes) at each τ."""
    out = []
    for tau in HARD_TAUS:
        pred, nfe, _ = decode_boards(model, torch.as_tensor(questions), tau=tau)
        exact = (pred == torch.as_tensor(answers)).all(1).float().mean().item()
        out.append({"tau": tau, "exact": exact, "nfe": nfe.float().mean().item(), "n": len(questions)})
    return out


def curve(points: list[dict]) -> list[sudoku.frontier.Point]:
    return [sudoku.frontier.Point(p["nfe"], p["exact"], p["n"]) for p in points]


def report(results: dict[str, dict[str, list[dict]]]) -> str:
    """Markdown: exact match / NFE at each τ, then each set's accuracy at matched NFE."""
    lines = ["| puzzles | model | " + " | ".join(f"τ = {t:g}" for t in HARD_TAUS) + " |", "|---|---|" + "---|" * len(HARD_TAUS)]
    for name, by_model in results.items():
        for model, points in by_model.items():
            cells = [f"{100 * p['exact']:.1f}% / {p['nfe']:.1f}" for p in points]
            lines.append(f"| {name} | {model} | " + " | ".join(cells) + " |")
    for name, by_model in results.items():
        curves = {model: curve(points) for model, points in by_model.items()}
        budgets = sudoku.frontier.even_budgets(list(curves.values()), 4)
        lines += ["", f"{name}: exact match at matched mean NFE (± binomial s.e.)", "",
                  sudoku.frontier.compare(curves, budgets) if budgets else "the two curves share no NFE range"]
    return "\n".join(lines)


def save_figure(results: dict[str, dict[str, list[dict]]], path: str) -> None:
    panels = {f"{name} ({next(iter(by_model.values()))[0]['n']} puzzles)":
              {m: [curve(points)] for m, points in by_model.items()} for name, by_model in results.items()}
    taus = ", ".join(f"{t:g}" for t in HARD_TAUS)
    sudoku.frontier.plot_panels(panels, COLORS, f"exact match against mean NFE per puzzle, τ ∈ {{{taus}}}", path)


def main(argv: list[str] | None = None) -> None:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--models", choices=sorted(REFERENCES), default="standin", help="which reference pair")
    p.add_argument("--n", type=int, default=100, help="puzzles per set")
    p.add_argument("--seed", type=int, default=2026, help="seed of the fresh hard puzzles")
    p.add_argument("--out_dir", default="out/quickstart")
    args = p.parse_args(argv)
    if not 1 <= args.n <= 1465:
        raise SystemExit("--n must be in 1..1465 (Top1465 has 1,465 puzzles)")
    if args.seed < 0:
        raise SystemExit(f"--seed must be >= 0, got {args.seed}")
    problem = folder_problem(args.out_dir)
    if problem:
        raise SystemExit(f"--out_dir={args.out_dir} {problem}; choose another --out_dir")
    references = REFERENCES[args.models]
    missing = [path for path in references.values() if not os.path.exists(path)]
    if missing:
        raise SystemExit(f"{missing[0]} is missing: run from the repository root of a full clone")
    models = {}
    for label, path in references.items():  # each file's digest checked before anything is written
        try:
            models[label] = load_model(path)
        except ValueError as e:
            raise SystemExit(str(e).strip().splitlines()[0]) from None
    os.makedirs(args.out_dir, exist_ok=True)

    start = time.time()
    sets = {"Top1465": top1465(args.n), "fresh hard puzzles": fresh_hard(args.n, args.seed)}
    print(f"{args.n} puzzles per set in {time.time() - start:.0f} s", flush=True)
    results: dict[str, dict[str, list[dict]]] = {name: {} for name in sets}
    for label, (model, config) in models.items():
        for name, (q, a) in sets.items():
            results[name][label] = sweep(model, q, a)
            best = max(results[name][label], key=lambda r: r["exact"])
            print(f"{label} ({config.get('max_iters')} steps) on {name}: best {100 * best['exact']:.1f}% at "
                  f"τ = {best['tau']:g} ({best['nfe']:.1f} NFE)", flush=True)

    trained_on = {"standin": "the Sudoku-Extreme stand-in", "hard": "hard puzzles", "easy": "the easy mix"}[args.models]
    text = (f"reference models trained on {trained_on}: exact match / mean NFE per puzzle, {args.n} puzzles per set"
            f"\n\n{report(results)}")
    print("\n" + text)
    with open(os.path.join(args.out_dir, "results.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump({"models": args.models, "n": args.n, "seed": args.seed, "taus": HARD_TAUS, "results": results}, f, indent=1)
    figure = os.path.join(args.out_dir, "quickstart.png")
    save_figure(results, figure)
    print(f"\nwrote {figure} and results.md / results.json in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
