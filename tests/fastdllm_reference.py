"""A deliberately plain transcription of the authors' batched Fast-dLLM v2 decoding (the procedure behind
paper Table 2), used as a test oracle for fastdllm.generate.generate(decode="authors").

No KV cache (every forward recomputes the whole sequence with the block-causal mask), one loop per
block / sub-block / forward, Python lists for the bookkeeping. Written from docs/fastdllm.md, not from
fastdllm/generate.py. What it does, step by step:
  - prompts are right-padded with MASK to the longest one; decoding runs
    max_new_tokens // bs + longest_prompt // bs blocks for the whole batch, from block shortest // bs;
  - if the shortest prompt fills whole blocks (and at least one), the rows of that length take their
    first answer token from the last prompt logit (argmax, no threshold);
  - sub-block by sub-block, while any row has a MASK there: one forward of all rows still in the batch;
    logits shifted by one inside the block; commit conf > threshold plus the most confident MASK; a
    row finishes when it commits the stop token; NFE + 1 for every row that had a MASK in the
    sub-block and had not finished before this forward;
  - relay carry: the first forward of a block gets none; every later one gets shift(h_s) of the
    previous forward, for all rows (rows that waited included);
  - block end: finished rows get pad after their first stop token and leave the batch; the others get
    the clean block's last logit argmax as the next block's first token, unless their prompt covers
    that position, or their prompt ends exactly there while a longer prompt is still in the batch
    (that position then stays MASK and is decoded by the threshold rule like the others).
Returns each row's raw tail (everything after its prompt, as the authors' tokenizer.decode sees it),
its NFE and whether it finished.
"""
import torch

from fastdllm.model import block_causal_mask


def _shift(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t[:, :1], t[:, :-1]], dim=1)


@torch.no_grad()
def reference_decode(model, prompts: list[list[int]], max_new_tokens: int, threshold: float, stop_id: int,
                     pad_id: int, sub_block_size: int = 8, relay_carry: bool = False):
    bs, mask_id = model.config.bd_size, model.config.mask_token_id
    seq_len = [len(p) for p in prompts]
    min_len, max_len = min(seq_len), max(seq_len)
    n_blocks = max_new_tokens // bs + max_len // bs
    x = torch.full((len(prompts), max(n_blocks * bs, max_len) + 1), mask_id, dtype=torch.long)
    for r, p in enumerate(prompts):
        x[r, :len(p)] = torch.tensor(p)
    nfe = [0] * len(prompts)
    finished = [False] * len(prompts)
    tails = [None] * len(prompts)
    live = list(range(len(prompts)))  # rows still in the batch

    def forward(end, relay=None):
        pos = torch.arange(end)[None]  # block-causal mask over the whole recomputed sequence
        out = model(x[live, :end], relay_h=relay, attention_mask=block_causal_mask(end, end, bs), position_ids=pos)
        logits = out.logits.clone()
        logits[..., mask_id] = float("-inf")  # MASK is never a prediction
        return logits, out.hidden

    if min_len >= bs and min_len % bs == 0:
        logits, _ = forward(min_len)
        for i, r in enumerate(live):
            if seq_len[r] == min_len:
                x[r, min_len] = logits[i, -1].argmax()

    for b in range(min_len // bs, n_blocks):
        lo_b, hi_b = b * bs, (b + 1) * bs
        carry = None
        for s in range(0, bs, sub_block_size):
            lo, hi = lo_b + s, lo_b + s + sub_block_size
            while (x[live, lo:hi] == mask_id).any():
                masked = x[live, lo:hi] == mask_id
                counted = [r for i, r in enumerate(live) if masked[i].any() and not finished[r]]
                relay = None
                if relay_carry and carry is not None:
                    relay = torch.zeros(len(live), hi_b, carry.shape[-1], dtype=carry.dtype)
                    relay[:, lo_b:hi_b] = _shift(carry)
                logits, hidden = forward(hi_b, relay)
                probs = _shift(logits[:, lo_b:hi_b])[:, s:s + sub_block_size].softmax(-1)
                conf, tok = probs.max(-1)
                conf = torch.where(masked, conf, torch.tensor(float("-inf"), dtype=conf.dtype))
                for i, r in enumerate(live):
                    commit = [k for k in range(sub_block_size) if masked[i, k] and conf[i, k] > threshold]
                    best = int(conf[i].argmax())
                    if masked[i, best] and best not in commit:
                        commit.append(best)
                    for k in commit:
                        x[r, lo + k] = tok[i, k]
                        if tok[i, k] == stop_id:
                            finished[r] = True
                for r in counted:
                    nfe[r] += 1
                if relay_carry:
                    carry = hidden[:, lo_b:hi_b]
        for r in live:
            if finished[r]:
                tail = x[r, seq_len[r]:hi_b].tolist()
                first_stop = tail.index(stop_id)
                tails[r] = tail[:first_stop + 1] + [pad_id] * (len(tail) - first_stop - 1)
        if all(finished[r] for r in live):
            live = []
            break
        logits, _ = forward(hi_b)
        for i, r in enumerate(live):
            if not finished[r] and (seq_len[r] < hi_b or max_len <= hi_b):
                x[r, hi_b] = logits[i, -1].argmax()
        live = [r for r in live if not finished[r]]
    for r in live:  # the block limit was reached: everything decoded, plus the next block's first token
        tails[r] = x[r, seq_len[r]:n_blocks * bs + 1].tolist()
    return tails, nfe, finished


# -----------------------------------------------------------------------------
# training objectives, one plain function per optimizer step (docs/fastdllm.md, "Training objectives")


def _doubled(model, z, x0, relay, bd):
    """Logits and h_s of the x_t half of [z || x0]: the training mask, RoPE positions 0..L-1 in both halves."""
    from fastdllm.model import bd_training_mask
    L = z.shape[1]
    out = model(torch.cat([z, x0], 1), relay_h=relay, attention_mask=bd_training_mask(L, bd),
                position_ids=torch.arange(L).repeat(2)[None])
    return out.logits[:, :L], out.hidden[:, :L]


def _ce(logits, x0, where):
    """Sum over positions i in `where` of -log p(x0[i]) read from logits[i - 1] (the token shift)."""
    total = logits.new_zeros(())
    for b, i in where.nonzero().tolist():
        total = total - logits[b, max(i - 1, 0)].log_softmax(-1)[x0[b, i]]
    return total


def reference_sft_step(model, window, bd, mask_id, generator):
    """window: G micro-batches (x0, maskable). Per micro-batch: one t per block, p = (1 - 1e-3) t + 1e-3,
    mask m; copies [m, not m] on response tokens. Loss = sum CE over both copies / response tokens in the
    whole window; backward per micro-batch. Returns the summed loss."""
    n_window = sum(int(m.sum()) for _, m in window)
    total = 0.0
    for x0, maskable in window:
        B, L = x0.shape
        t = torch.rand(B, L // bd, generator=generator)
        u = torch.rand(B, L, generator=generator)
        m = torch.zeros(B, L, dtype=torch.bool)
        for b in range(B):
            for i in range(L):
                m[b, i] = bool(u[b, i] < (1 - 1e-3) * t[b, i // bd] + 1e-3) and bool(maskable[b, i])
        loss = 0.0
        for sup in (m, maskable & ~m):
            z = torch.where(sup, torch.full_like(x0, mask_id), x0)
            logits, _ = _doubled(model, z, x0, None, bd)
            loss = loss + _ce(logits, x0, sup)
        loss = loss / n_window
        loss.backward()
        total += float(loss.detach())
    return total


def _select(logits, x0, cand, tau, bd):
    """Positions to reveal: confidence (softmax max of the shifted logit) > tau, plus the most confident
    candidate of every bd-block that has one."""
    pick = torch.zeros_like(cand)
    for b in range(cand.shape[0]):
        conf = [float(logits[b, max(i - 1, 0)].softmax(-1).max()) for i in range(cand.shape[1])]
        for start in range(0, cand.shape[1], bd):
            idx = [i for i in range(start, start + bd) if cand[b, i]]
            for i in idx:
                pick[b, i] = conf[i] > tau
            if idx:
                pick[b, max(idx, key=lambda i: (conf[i], -i))] = True
    return pick


def reference_rollout_step(model, slots, G, variant, bd, mask_id, tau=0.85):
    """G micro-steps over the same buffer slots (no slot may finish: refill is then a no-op), each:
    forward 1 with relay shift(h) (h = 0 at a cold start, none for rollout), L1 = token mean over the
    masks; reveal the ground truth at the selected positions; forward 2 with relay shift(h_s1)
    (detached for relay_sg), L2; backward (L1 + L2) / G; reveal again, keep shift(h_s2) (model precision).
    slots: dict with x0, z, maskable, h (None at a cold start). Returns the summed loss."""
    x0, z, maskable, h = slots["x0"], slots["z"].clone(), slots["maskable"], slots["h"]
    shift = lambda t: torch.cat([t[:, :1], t[:, :-1]], 1)
    total = 0.0
    for _ in range(G):
        if variant != "rollout" and h is None:
            h = torch.zeros(*z.shape, model.config.hidden_size, dtype=torch.float32)
        relay = None if variant == "rollout" else h
        loss = 0.0
        for _k in range(2):
            cand = (z == mask_id) & maskable
            logits, hs = _doubled(model, z, x0, relay, bd)
            loss = loss + _ce(logits, x0, cand) / cand.sum()
            z = torch.where(_select(logits.detach(), x0, cand, tau, bd), x0, z)
            relay = None if variant == "rollout" else (shift(hs) if variant == "relay" else shift(hs).detach())
        (loss / G).backward()
        total += float(loss.detach() / G)
        h = relay.detach() if relay is not None else None  # the model's precision, as relay.rollout_loss stores it
    return total
