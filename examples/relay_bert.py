"""Relay on a backbone we did not write: a randomly initialised Hugging Face BertForMaskedLM
(built from a config, nothing downloaded) learns 5x5 Latin-square completion with MLM and with
Relay, then both decode with confidence-threshold unmasking. Needs torch and transformers.

    OMP_NUM_THREADS=1 python examples/relay_bert.py                         # defaults (see --help)
    OMP_NUM_THREADS=1 python examples/relay_bert.py --steps=50 --n_test=32 --seeds=0   # seconds

The glue is RelayBert (about 15 lines): R(h) is added to the output of BERT's embedding module
(word + position embeddings after its LayerNorm: the input of layer 0), h is BERT's last hidden
state (the tensor its MLM head reads), and R starts at zero (zero_init=True). Adding R(h) to the raw
word embeddings instead (std 0.02, before the embedding LayerNorm) let R drown the token identity
as soon as gamma grew, and Relay did not learn in 1,800 steps.
"""
import argparse
import os
import sys
import time
from functools import partial

import torch
import torch.nn as nn
from transformers import BertConfig, BertForMaskedLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # relay.py at the repo root
from relay import (RelayLayerNorm, RolloutBuffer, confidence_unmask, decode, draw_taus, mlm_loss,  # noqa: E402
                   rollout_loss)

N = 5  # 5x5 squares, 25 cells
SYMBOLS = list(range(2, 2 + N))  # token ids of the symbols 0..4
MASK = 7  # [MASK] id; 0 and 1 stay unused (think [PAD], [CLS])


class RelayBert(nn.Module):
    """A step_fn (tokens, h) -> (logits, h_out) around BertForMaskedLM; relay=False is plain MLM."""

    def __init__(self, cfg: BertConfig, relay: bool):
        super().__init__()
        self.bert = BertForMaskedLM(cfg)
        self.relay_norm = RelayLayerNorm(cfg.hidden_size, zero_init=True) if relay else None

    def forward(self, tokens: torch.Tensor, h: torch.Tensor | None = None):
        x = self.bert.bert.embeddings(input_ids=tokens)  # word + position embeddings, LayerNorm: unit scale
        if self.relay_norm is not None:  # the residual stream before layer 0 (paper Eq. 2: Emb(x) + R(h))
            x = x + self.relay_norm(torch.zeros_like(x) if h is None else h)  # h=None is h_0 = 0: R(0) = beta
        h_out = self.bert.bert.encoder(x).last_hidden_state
        return self.bert.cls(h_out), h_out


def allow_only(step_fn, allowed: list[int], mask_id: int):
    """decode's step_fn that writes only the `allowed` ids: the other logits are set to -inf before
    decode's confidence and argmax (here: only symbols, never [MASK] or the unused ids; relay.decode
    itself takes the argmax over the whole vocabulary, as the paper's Sudoku evaluation). Allowing
    mask_id is an error: the decoder could commit [MASK] forever."""
    if mask_id in allowed:
        raise ValueError(f"allowed contains mask_id={mask_id}; the decoder could commit [MASK] forever")

    def step(tokens: torch.Tensor, h: torch.Tensor | None = None):
        logits, h_out = step_fn(tokens, h)
        V = logits.shape[-1]
        if not all(0 <= i < V for i in allowed):
            raise ValueError(f"allowed ids must lie in 0..{V - 1}, got {list(allowed)}")
        banned = torch.ones(V, dtype=torch.bool, device=logits.device)
        banned[list(allowed)] = False
        return logits.masked_fill(banned, float("-inf")), h_out
    return step


def latin_squares(n: int, g: torch.Generator) -> torch.Tensor:
    """n random 5x5 Latin squares as (n, 25) token ids: the cyclic square with rows, columns and
    symbols permuted at random."""
    base = (torch.arange(N)[:, None] + torch.arange(N)[None, :]) % N
    perm = lambda: torch.argsort(torch.rand(n, N, generator=g), dim=1)  # noqa: E731
    rows, cols, syms = perm(), perm(), perm()
    sq = base[rows[:, :, None], cols[:, None, :]]  # (n, 5, 5)
    return (torch.gather(syms, 1, sq.view(n, -1)) + SYMBOLS[0]).view(n, N * N)


def n_solutions(cells: list[int], limit: int = 2) -> int:
    """Completions of a partial square (-1 = blank), counted up to `limit`."""
    best = None
    for i, v in enumerate(cells):
        if v < 0:
            r, c = divmod(i, N)
            used = {cells[r * N + k] for k in range(N)} | {cells[k * N + c] for k in range(N)}
            options = [s for s in SYMBOLS if s not in used]
            if best is None or len(options) < len(best[1]):
                best = (i, options)
    if best is None:
        return 1
    count = 0
    for s in best[1]:
        cells[best[0]] = s
        count += n_solutions(cells, limit - count)
        cells[best[0]] = -1
        if count >= limit:
            break
    return count


def unique_puzzles(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(questions, answers): blanks removed in random order while the solution stays unique, so
    each puzzle has one answer and exact match is well defined. Few clues: order matters."""
    answers, questions = latin_squares(n, g), []
    for sol in answers.tolist():
        cells = list(sol)
        for i in torch.randperm(N * N, generator=g).tolist():
            v, cells[i] = cells[i], -1
            if n_solutions(cells) != 1:
                cells[i] = v
        questions.append([MASK if v < 0 else v for v in cells])
    return torch.tensor(questions), answers


def train(relay: bool, args, seed: int) -> tuple[RelayBert, float, float]:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    cfg = BertConfig(vocab_size=8, hidden_size=args.d, num_hidden_layers=args.layers, num_attention_heads=4,
                     intermediate_size=4 * args.d, max_position_embeddings=N * N, type_vocab_size=1, pad_token_id=0)
    model = RelayBert(cfg, relay)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    buffer = RolloutBuffer(args.batch_size, mask_id=MASK)
    used, t0 = 0, time.time()
    for step in range(args.steps):
        x0 = latin_squares(args.batch_size, g)
        n_blank = torch.randint(6, 19, (args.batch_size, 1), generator=g)  # cells to fill per square
        maskable = torch.rand(args.batch_size, N * N, generator=g).argsort(1).argsort(1) < n_blank
        if relay:  # K = 2 forwards and one backward through both per step (Algorithm 1)
            used += int(buffer.refill(x0, maskable))
            taus = draw_taus(2, 0.15, 0.1, g)  # training thresholds max(0, 0.15 + 0.1 eps), one per step
            out = rollout_loss(model, **buffer.inputs(), K=2, variant="relay",
                               policy=[partial(confidence_unmask, tau=t) for t in taus])
            buffer.update(out)
            loss = out.loss
        else:
            loss = mlm_loss(model, x0, maskable=maskable, mask_id=MASK, generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.log and step % args.log == 0:
            print(f"  {'relay' if relay else 'mlm'} seed {seed} step {step}: loss {loss.item():.3f}", flush=True)
    return model.eval(), time.time() - t0, used / (args.steps * args.batch_size)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=800, help="optimizer steps per model (equal for MLM and Relay)")
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--d", type=int, default=64, help="BERT hidden size (4 heads, FFN 4d)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--n_test", type=int, default=500, help="test puzzles (unique solutions)")
    p.add_argument("--taus", default="0.05,0.15,0.25", help="decoding thresholds, comma-separated")
    p.add_argument("--seeds", default="0", help="training seeds, comma-separated (the test set has its own seed)")
    p.add_argument("--log", type=int, default=0, help="print the loss every N steps (0: never)")
    args = p.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        taus = [float(t) for t in args.taus.split(",")]
    except ValueError:
        raise SystemExit("--seeds and --taus take comma-separated numbers, e.g. --seeds=0,1 --taus=0.15") from None
    if min(args.steps, args.batch_size, args.d, args.layers, args.n_test) < 1 or args.d % 4:
        raise SystemExit("--steps, --batch_size, --layers, --n_test must be >= 1 and --d a positive multiple of 4")
    questions, answers = unique_puzzles(args.n_test, torch.Generator().manual_seed(12345))
    print(f"{args.n_test} test puzzles, {(questions == MASK).sum(1).float().mean():.1f} of 25 cells blank on average")
    print(f"{'method':<6} {'seed':>4} {'train s':>8} {'rows used':>9} {'tau':>5} {'exact %':>8} {'NFE':>6} {'batch NFE':>9}")
    for seed in seeds:
        for relay in (False, True):
            model, seconds, used = train(relay, args, seed)
            for tau in taus:
                out = decode(allow_only(model, SYMBOLS, MASK), questions, mask_id=MASK, tau=tau, carry=relay)
                exact = (out.tokens == answers).all(1).float().mean().item()
                print(f"{'Relay' if relay else 'MLM':<6} {seed:>4} {seconds:8.0f} {used if relay else 1.0:9.2f} "
                      f"{tau:5.2f} {100 * exact:8.1f} {out.nfe.float().mean():6.2f} {out.batch_nfe:9d}", flush=True)


if __name__ == "__main__":
    main()
