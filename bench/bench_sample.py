"""Sampler throughput: relay carry on/off x early exit on/off, in one run, printed as a table.

    python bench/bench_sample.py                                    # random xtiny relay model, 512 generated puzzles
    python bench/bench_sample.py --ckpt=out/relay --data=test --n=2048 --device=cuda
    python bench/bench_sample.py --size=tiny --n=64 --batch_size=32 --repeats=1   # seconds, a smoke run

Targets: carrying h costs at most 5% per forward; early exit (finished puzzles leave the
batch) is at least 2x faster than running every batch until its slowest puzzle is done.
With random weights every puzzle fills one cell per step, so the early-exit ratio then only
reflects the spread of blank counts; measure it on a trained checkpoint (--ckpt).
"""
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import configurator  # noqa: E402
import sudoku.decode  # noqa: E402
from common import pick_device  # noqa: E402
from common import load_model  # noqa: E402
from model import ModelConfig, SudokuTransformer  # noqa: E402
from sudoku.board import MASK, digits_to_tokens, random_grid  # noqa: E402


class Counting(torch.nn.Module):
    """Counts the rows the sampler runs forward passes on (= puzzle-forwards)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config, self.rows = model, model.config, 0

    def forward(self, tokens, h=None):
        self.rows += tokens.size(0)
        return self.model(tokens, h)


def generated_puzzles(n: int, seed: int = 0) -> torch.Tensor:
    """Random solved grids with 17..60 cells kept (no uniqueness check: only timing matters)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        digits = random_grid(rng)
        digits[rng.permutation(81)[: 81 - rng.integers(17, 61)]] = 0
        out.append(digits_to_tokens(digits))
    return torch.tensor(np.array(out))


def main() -> None:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--ckpt", default="", help="a relay checkpoint (default: random weights of --size)")
    p.add_argument("--data", default="", help="puzzles as for sample.py --data (default: generated)")
    p.add_argument("--data_dir", default="data/sudoku")
    p.add_argument("--size", default="xtiny", choices=("xtiny", "tiny"), help="random model: paper xtiny or d=32")
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--tau", type=float, default=0.15)
    p.add_argument("--repeats", type=int, default=2, help="timed runs per setting; the median is reported")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu) | cpu | cuda | mps")
    args = p.parse_args()
    args.device = pick_device(args.device)
    if args.n < 1 or args.batch_size < 1 or args.repeats < 1:
        raise SystemExit("--n, --batch_size and --repeats must be >= 1")

    if args.ckpt:
        try:
            model, _ = load_model(args.ckpt, device=args.device)
        except ValueError as e:
            raise SystemExit(f"--ckpt {args.ckpt}: {e}") from None
        if not model.config.relay:
            raise SystemExit(f"--ckpt {args.ckpt} is not a relay model: the carry rows need one")
    else:
        torch.manual_seed(0)
        cfg = ModelConfig(relay=True) if args.size == "xtiny" else ModelConfig(n_layer=2, n_head=2, n_embd=32,
                                                                                 d_ff=64, relay=True)
        model = SudokuTransformer(cfg).to(args.device).eval()
    if args.data:
        from prepare_data import load_puzzles
        try:
            questions = torch.as_tensor(np.asarray(load_puzzles(args.data, data_dir=args.data_dir).question))[:args.n]
        except (ValueError, OSError) as e:
            raise SystemExit(f"--data {args.data}: {e}") from None
    else:
        questions = generated_puzzles(args.n)
    questions = questions.long()

    counting = Counting(model)
    sudoku.decode.decode_puzzles(counting, questions[: min(64, args.n)], tau=args.tau, batch_size=args.batch_size)  # warm up
    settings = [("carry, early exit", True, True), ("no carry, early exit", False, True),
                ("carry, run to slowest", True, False), ("no carry, run to slowest", False, False)]
    rows = {}
    for name, carry, early in settings:
        times = []
        for _ in range(args.repeats):
            counting.rows = 0
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            res = sudoku.decode.decode_puzzles(counting, questions, tau=args.tau, batch_size=args.batch_size,
                                       relay_carry=carry, early_exit=early)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        dt = statistics.median(times)
        rows[name] = dict(s=dt, pps=len(questions) / dt, fwd=counting.rows, ms_fwd=1e3 * dt / counting.rows,
                          nfe=res.nfe.float().mean().item(), bnfe=res.batch_nfe.float().mean().item())

    base = rows["carry, early exit"]
    print(f"\ndevice {args.device}, threads {torch.get_num_threads()}, model "
          f"{args.ckpt or args.size + ' (random weights)'}, {len(questions)} puzzles "
          f"({(questions == MASK).sum(1).float().mean():.1f} blanks on average), batch {args.batch_size}, "
          f"τ {args.tau:g}, median of {args.repeats}")
    print(f"| setting | puzzles/s | x vs carry+early exit | puzzle-forwards | ms per puzzle-forward | mean NFE | batch NFE |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['pps']:.1f} | {r['pps'] / base['pps']:.2f} | {r['fwd']} | {r['ms_fwd']:.3f} | "
              f"{r['nfe']:.2f} | {r['bnfe']:.2f} |")
    carry_cost = rows["carry, early exit"]["ms_fwd"] / rows["no carry, early exit"]["ms_fwd"] - 1
    speedup = rows["carry, early exit"]["pps"] / rows["carry, run to slowest"]["pps"]
    print(f"relay carry costs {100 * carry_cost:+.1f}% per puzzle-forward (target <= +5%); "
          f"early exit is {speedup:.2f}x faster than running each batch to its slowest puzzle (target >= 2x)")
    if not args.ckpt:
        print("(random weights fill one cell per step: the early-exit ratio shows only the spread of blank "
              "counts; pass --ckpt for a real measurement)")


if __name__ == "__main__":
    main()
