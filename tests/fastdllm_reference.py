"""A deliberately plain transcription of the authors' batched Fast-dLLM v2 decoding (the procedure behind
paper Table 2), used as a test oracle for fastdllm_generate.generate(decode="authors").

No KV cache (every forward recomputes the whole sequence with the block-causal mask), one loop per
block / sub-block / forward, Python lists for the bookkeeping. Written from docs/fastdllm.md, not from
fastdllm_generate.py. What it does, step by step:
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

from fastdllm_model import block_causal_mask


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
