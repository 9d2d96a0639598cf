"""How far apart the two Fast-dLLM v2 decode modes are, on the tiny random model (CPU, float64).

    python bench/fastdllm_decode_modes.py               # the table in docs/fastdllm.md

The tiny model has a wide init and a non-zero relay LayerNorm so that its predictions are peaked and the
carry matters; byte 242 stands in for <|im_end|>. For each setting it decodes N prompts of mixed lengths
in batches (the authors' order: by length in characters, shortest first) and reports, per mode, the mean
NFE, the share of rows that stopped, and how many rows give the same answer as one-by-one decoding.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fastdllm.generate import generate  # noqa: E402
from fastdllm.model import make_tiny_fastdllm  # noqa: E402

STOP, N, BATCH, MAX_NEW, TAU = 242, 32, 8, 96, 0.5


def tiny_model():
    model = make_tiny_fastdllm(use_relay=True, seed=0, initializer_range=0.5).double().eval()
    torch.manual_seed(1)
    torch.nn.init.normal_(model.relay_layer_norm.weight, std=0.5)
    torch.nn.init.normal_(model.relay_layer_norm.bias, std=0.1)
    return model


def run(model, prompts, decode, relay_carry, batch):
    tokens, nfe, stopped = [], [], []
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    by_row = {}
    for s in range(0, len(order), batch):
        rows = order[s:s + batch]
        out = generate(model, [prompts[i] for i in rows], max_new_tokens=MAX_NEW, threshold=TAU, stop_token_id=STOP,
                       relay_carry=relay_carry, decode=decode)
        for j, i in enumerate(rows):
            by_row[i] = (out.tokens[j], out.nfe[j], out.stopped[j])
    for i in range(len(prompts)):
        t, n, st = by_row[i]
        tokens.append(t), nfe.append(n), stopped.append(st)
    return tokens, nfe, stopped


def main() -> None:
    model = tiny_model()
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, 140, (N,), generator=g).tolist()
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths]
    print(f"{N} prompts of {min(lengths)}-{max(lengths)} tokens, batch {BATCH}, max_new_tokens {MAX_NEW}, tau {TAU}")
    print("| relay carry | mode | mean NFE (batched) | mean NFE (one by one) | stopped | rows equal to one-by-one |")
    print("|---|---|---|---|---|---|")
    for carry in (False, True):
        for decode in ("authors", "batch_invariant"):
            tb, nb, sb = run(model, prompts, decode, carry, BATCH)
            t1, n1, _ = run(model, prompts, decode, carry, 1)
            same = sum(a == b and x == y for a, b, x, y in zip(tb, t1, nb, n1))
            print(f"| {'on' if carry else 'off'} | {decode} | {sum(nb) / N:.2f} | {sum(n1) / N:.2f} | "
                  f"{sum(sb)}/{N} | {same}/{N} |")
    for carry in (False, True):  # the modes against each other, batched
        ta, na, _ = run(model, prompts, "authors", carry, BATCH)
        tb, nb, _ = run(model, prompts, "batch_invariant", carry, BATCH)
        same = sum(a == b for a, b in zip(ta, tb))
        print(f"carry {'on' if carry else 'off'}: authors vs batch_invariant, batched: same answer {same}/{N}, "
              f"mean |NFE difference| {sum(abs(x - y) for x, y in zip(na, nb)) / N:.2f}")


if __name__ == "__main__":
    main()
