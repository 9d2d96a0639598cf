"""Fast-dLLM v2 block-diffusion decoding with a KV cache and the Relay carry (paper Sec. 4.2, Table 2).

    from fastdllm.model import load_fastdllm
    from fastdllm.generate import generate
    model, tok = load_fastdllm("brozonoyer/relay-fastdllm-v2-c40m60-relay-step200", device="cuda")
    ids = [tok(text, add_special_tokens=False)["input_ids"] for text in prompts]
    out = generate(model, ids, relay_carry=True, stop_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    out.tokens, out.nfe  # generated ids per prompt (stop token excluded), denoising forwards per prompt

The command line (one prompt, chat template) is fastdllm/chat.py; the KV cache is fastdllm/cache.py.

The algorithm (docs/fastdllm.md, "Decoding: the two modes"; this describes decode='batch_invariant', the authors'
batch variant, the default, differs as listed there):
  - The sequence is cut into blocks of `block_size` (32) absolute positions. Prompts are right-padded
    with MASK, so a short prompt's padding is simply the start of its answer.
  - Prefill: the complete prompt blocks shared by all rows go into the KV cache in one forward
    (block-causal: bidirectional inside a block, causal across blocks).
  - Each block is decoded sub-block by sub-block (8 positions, in order). One denoising forward runs the
    whole block against the cached prefix; logits are shifted by one (logit i-1 predicts token i); every
    MASK of the sub-block with confidence > threshold is committed, plus the most confident one, so every
    forward makes progress.
  - When the block has no MASK left, a cache-update forward appends the clean block's keys and values to
    the cache; its last logit gives the next block's first token (autoregressively, no threshold).
  - A row is finished once it commits the stop token (<|im_end|>); it still completes its block (tokens
    after the stop are dropped) and then leaves the batch with its cache rows. A row also ends when the
    block holding its max_new_tokens-th token is complete.
  - NFE (Table 2): per row, the denoising forwards in which the row was unfinished and had a MASK in the
    active sub-block. Prefill and cache-update forwards are not counted.
Both modes run the one loop below (generate -> _decode); _Settings.batch_invariant picks the few steps
where they differ: the block count, the block's first token, the sub-block cache's span, whose carry a
forward replaces, and where an answer ends.

Relay carry (the relay state of paper Sec. 3, run inside Fast-dLLM's blocks as in Sec. 4.2; docs/fastdllm.md):
inside a block, each denoising forward gets h_t = shift(h_s of that row's previous forward), injected at
MASK positions only (FastDLLM.embed); the carry is reset at every block start and never enters the
cache-update forward. The authors could only carry with the block cache off; here the carry works with
the prefix cache (exact: tested equal to full recomputation) and with the sub-block cache.

Caches:
  - prefix_cache=True (default) is exact: completed blocks never change, and recomputing them gives the
    same keys and values. prefix_cache=False recomputes the whole sequence every forward (the reference).
  - cuda_graph=True (CUDA, prefix cache only) runs every block forward at fixed shapes as a replayed CUDA
    graph (fastdllm/graphs.py): the same keys and values, so the prefix cache's outputs up to rounding.
  - sub_block_cache=True is Fast-dLLM's DualCache and is approximate by design: the first forward of a
    sub-block runs the whole block and keeps its keys/values; the next forwards of that sub-block run only
    the sub-block (plus the position before it, whose logit predicts the sub-block's first token) against
    the cached prefix and the cached rest of the block, which is stale. With sub_block_size == block_size
    it is exact. Off for the paper's numbers.
"""
from dataclasses import dataclass, field

import torch

from fastdllm.cache import BlockKVCache
from fastdllm.graphs import BlockGraphs
from fastdllm.model import FastDLLM, FastDLLMOutput, block_causal_mask, shift_hidden, shift_logits


# -----------------------------------------------------------------------------
# token choice and the unmasking rule


def sample_tokens(logits: torch.Tensor, temperature: float = 0.0, top_p: float = 1.0,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., V) logits -> (token, confidence), each (...). temperature 0: argmax and its softmax
    probability, top-p unused (as the authors' sample_with_top_p). Otherwise nucleus sampling per row
    and the probability of the drawn token under the truncated distribution."""
    if temperature == 0:
        conf, tok = logits.float().softmax(-1).max(-1)
        return tok, conf
    probs = (logits.float() / temperature).softmax(-1)
    sorted_p, order = probs.sort(-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p > top_p  # keep the smallest prefix whose mass reaches top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    sorted_p = sorted_p / sorted_p.sum(-1, keepdim=True)
    flat = sorted_p.reshape(-1, sorted_p.shape[-1])
    pick = torch.multinomial(flat, 1, generator=generator).view(sorted_p.shape[:-1])
    tok = order.gather(-1, pick[..., None])[..., 0]
    conf = sorted_p.gather(-1, pick[..., None])[..., 0]
    return tok, conf


def unmask_rule(conf: torch.Tensor, masked: torch.Tensor, threshold: float) -> torch.Tensor:
    """(B, S) confidences and MASK flags of one sub-block -> (B, S) positions to commit:
    conf > threshold, plus the most confident MASK of each row that has one (docs/fastdllm.md).
    Own function rather than relay.block_confidence_unmask because the confidence here comes from the
    sampler (the drawn token's probability when sampling), not from a fresh softmax max."""
    conf = conf.masked_fill(~masked, -1.0)
    best = torch.zeros_like(masked)
    best.scatter_(1, conf.argmax(1, keepdim=True), True)
    return ((conf > threshold) | best) & masked


# -----------------------------------------------------------------------------


@dataclass
class GenerateOutput:
    # generated ids per prompt, up to (excluding) the first stop token; batch_invariant: at most max_new_tokens;
    # authors: a row that never commits the stop token keeps all its decoded tokens + the next block's first
    tokens: list[list[int]]
    nfe: list[int]  # denoising forwards per prompt (Table 2's NFE)
    blocks: list[int]  # blocks in which the prompt had a forward counted in nfe (nfe / blocks: passes per block)
    stopped: list[bool]  # whether the row finished on the stop token (authors: committed by the threshold rule)
    forwards: int = 0  # denoising forwards run for the whole batch (a forward over several rows counts once)
    trace: list[dict] = field(default_factory=list)  # per denoising forward, when asked for (tests, debugging)

    @property
    def mean_nfe(self) -> float:
        return sum(self.nfe) / max(len(self.nfe), 1)


DECODE_MODES = ("authors", "batch_invariant")


@torch.no_grad()
def generate(model, prompts: list[list[int]], max_new_tokens: int = 2048, threshold: float = 0.85,
             block_size: int | None = None, sub_block_size: int = 8, temperature: float = 0.0, top_p: float = 0.95,
             stop_token_id: int | None = None, prefix_cache: bool = True, sub_block_cache: bool = False,
             relay_carry: bool = False, generator: torch.Generator | None = None,
             trace: bool = False, progress: bool = False, decode: str = "authors",
             cuda_graph: bool = False) -> GenerateOutput:
    """Decode a batch of prompts (lists of token ids) with Fast-dLLM v2's block diffusion.

    model: a fastdllm.model.FastDLLM (or anything with its forward signature and config fields bd_size,
    mask_token_id). block_size defaults to the model's bd_size (32). stop_token_id: None = the model's
    eos_token_id (<|im_end|> for Fast-dLLM v2). trace=True records, per denoising forward, the rows that
    took part, the shifted logits of the active sub-block and the number of tokens committed per row.
    decode: "authors" (the batch procedure behind paper Table 2; a row's result depends on its batch) or
    "batch_invariant" (each row decodes as if alone); docs/fastdllm.md compares them. cuda_graph: replay the
    cached block forward as CUDA graphs (needs a CUDA model and the prefix cache, not the sub-block cache)."""
    cfg = model.config
    bs = block_size or cfg.bd_size
    stop_id = cfg.eos_token_id if stop_token_id is None else stop_token_id
    if isinstance(stop_id, (list, tuple)):
        stop_id = stop_id[0]
    _check_args(model, prompts, max_new_tokens, threshold, bs, sub_block_size, temperature, top_p,
                prefix_cache, sub_block_cache, relay_carry, cfg.mask_token_id, decode, cuda_graph)
    _check_generator(model, generator)
    _check_cuda_graph_device(model, cuda_graph)
    opt = _Settings(bs, sub_block_size, threshold, temperature, top_p, cfg.mask_token_id, stop_id,
                    sub_block_cache, relay_carry, generator, trace, batch_invariant=decode == "batch_invariant",
                    cuda_graph=cuda_graph)
    return _decode(model, prompts, max_new_tokens, prefix_cache, opt, progress)


@dataclass(frozen=True)
class _Settings:
    """generate()'s decoding options, resolved."""
    bs: int  # block size
    sub_block_size: int
    threshold: float
    temperature: float
    top_p: float
    mask_id: int
    stop_id: int
    sub_block_cache: bool
    relay_carry: bool
    generator: torch.Generator | None
    trace: bool
    batch_invariant: bool  # decode="batch_invariant": each row decodes as if alone; False: the authors' batch procedure
    cuda_graph: bool = False  # the block forwards through fastdllm/graphs.py


@dataclass
class _Batch:
    """The decoding state the steps share. x holds the rows still in the batch, in the order of `rows`; the
    per-prompt results (nfe, stop_at, tokens) are indexed by prompt."""
    x: torch.Tensor  # (b, total) prompt, committed tokens and MASK
    rows: torch.Tensor  # (b,) prompt index of each row still in the batch
    plen: torch.Tensor  # (B,) prompt lengths
    last: torch.Tensor  # (B,) batch_invariant: the last position a prompt may generate (its max_new_tokens-th)
    b0: int  # the first block decoded: the complete prompt blocks before it are shared by every row
    fwd: "_PlainForwards | BlockGraphs"  # the model's forwards and their cache, chosen once (cuda_graph or not)
    nfe: torch.Tensor  # (B,) Table 2's NFE
    blocks: torch.Tensor  # (B,) blocks with at least one of the prompt's NFE
    stop_at: torch.Tensor  # (B,) absolute position of the first stop token committed, -1 = none yet
    tokens: list  # (B,) the answer of each prompt, once its row is done
    forwards: int = 0  # denoising forwards for the whole batch
    records: list = field(default_factory=list)  # trace


def _new_batch(model, prompts: list[list[int]], max_new_tokens: int, prefix_cache: bool, opt: _Settings) -> _Batch:
    """Prompts right-padded with MASK (a short prompt's padding is the start of its answer) to the last block
    decoded. batch_invariant: each prompt's own max_new_tokens. The authors: one block count for the whole
    batch, from the longest prompt, plus one position for the next block's first token."""
    bs, max_len = opt.bs, max(len(p) for p in prompts)
    if opt.batch_invariant:
        total = ((max_len + max_new_tokens - 1) // bs + 1) * bs
    else:
        total = (max_new_tokens // bs + max_len // bs) * bs + 1
    device = next(model.parameters()).device
    B = len(prompts)
    x = torch.full((B, total), model.config.mask_token_id, dtype=torch.long, device=device)
    for r, p in enumerate(prompts):
        x[r, :len(p)] = torch.tensor(p, dtype=torch.long, device=device)
    plen = torch.tensor([len(p) for p in prompts], device=device)
    if opt.cuda_graph:  # the static-shape forwards with their own cache (fastdllm/graphs.py)
        fwd = BlockGraphs(model, B, total, bs, capture=device.type == "cuda")
    else:
        fwd = _PlainForwards(model, BlockKVCache(model.config.num_hidden_layers, total) if prefix_cache else None, bs)
    return _Batch(x=x, rows=torch.arange(B, device=device), plen=plen, last=plen + max_new_tokens - 1,
                  b0=min(len(p) for p in prompts) // bs * bs, fwd=fwd,
                  nfe=torch.zeros(B, dtype=torch.long, device=device),
                  blocks=torch.zeros(B, dtype=torch.long, device=device),
                  stop_at=torch.full((B,), -1, dtype=torch.long, device=device), tokens=[None] * B)


def _blocks(steps: range, progress: bool):
    if progress:
        from tqdm import tqdm
        return tqdm(steps, desc="blocks", leave=False)
    return steps


# -----------------------------------------------------------------------------
# the decoding loop


def _decode(model, prompts, max_new_tokens, prefix_cache, opt: _Settings, progress) -> GenerateOutput:
    """Block by block: the first token, the denoising forwards, the rows that are done leave, the clean
    block joins the cache (docs/fastdllm.md, "Decoding: the two modes", for what the authors' procedure does)."""
    bs = opt.bs
    st = _new_batch(model, prompts, max_new_tokens, prefix_cache, opt)
    # the complete prompt blocks every row shares go into the cache in one forward; its last logit predicts
    # block b0's first token (no block shared: none)
    next_logit = st.fwd.prefill(st.x, st.b0) if st.b0 > 0 else None
    for b_start in _blocks(range(st.b0, st.x.shape[1] // bs * bs, bs), progress):  # the authors' extra position is no block
        if next_logit is not None:
            _first_token(st, b_start, next_logit, opt)
        _denoise_block(st, b_start, opt)
        if not _finish_rows(st, b_start + bs, opt):
            break
        next_logit = st.fwd.cache_block(st.x, b_start).logits[:, -1]
    else:  # only the authors' block count runs out with rows left (batch_invariant's last block ends every row)
        _first_token(st, st.x.shape[1] - 1, next_logit, opt)
        for i, r in enumerate(st.rows.tolist()):  # the block limit: every decoded token plus the next block's first
            st.tokens[r] = st.x[i, int(st.plen[r]):].tolist()
    return GenerateOutput(tokens=st.tokens, nfe=st.nfe.tolist(), blocks=st.blocks.tolist(), stopped=(st.stop_at >= 0).tolist(),
                          forwards=st.forwards, trace=st.records)


def _first_token(st: _Batch, b_start: int, next_logit: torch.Tensor, opt: _Settings) -> None:
    """The block's first token: autoregressive from the previous block's last logit (no threshold)."""
    if not opt.batch_invariant:
        # the authors: greedy, and a row whose prompt ends exactly here gets it only in the first block or
        # once no longer prompt is left in the batch; otherwise that position stays MASK and is decoded by
        # the threshold rule (as in the authors' code). A stop token chosen here does not finish the row.
        plen = st.plen[st.rows]
        write = (plen < b_start) | (int(st.plen.max()) <= b_start) | ((plen == b_start) & (b_start == st.b0))
        st.x[:, b_start] = torch.where(write, _greedy_next(next_logit, opt.mask_id), st.x[:, b_start])
        return
    first = st.x[:, b_start] == opt.mask_id
    next_logit = next_logit.clone()
    next_logit[:, opt.mask_id] = float("-inf")
    tok, _ = sample_tokens(next_logit, opt.temperature, opt.top_p, opt.generator)
    st.x[:, b_start] = torch.where(first, tok, st.x[:, b_start])
    st.stop_at = _mark_stop(st.stop_at, st.rows, first & (tok == opt.stop_id), b_start)


def _greedy_next(logit: torch.Tensor, mask_id: int) -> torch.Tensor:
    """A block's first token: argmax of the previous position's logit, MASK excluded, no threshold."""
    return logit.masked_fill(torch.arange(logit.shape[-1], device=logit.device) == mask_id, float("-inf")).argmax(-1)


def _denoise_block(st: _Batch, b_start: int, opt: _Settings) -> None:
    """Decode the block sub-block by sub-block until no MASK is left. The relay carry is h_s of the latest
    forward, by block position, reset per block. batch_invariant: each row keeps that of its own latest
    forward (rows that waited, with no MASK in the active sub-block, keep theirs, since their forward
    would not happen if they decoded alone); the authors replace every row's carry after every forward."""
    b_end = b_start + opt.bs
    hbuf = None  # (b, bs, d)
    has_carry = torch.zeros(st.x.shape[0], dtype=torch.bool, device=st.x.device)
    block_keys = False  # sub-block cache: whether this block's keys/values are in the cache
    counted_here = torch.zeros(st.x.shape[0], dtype=torch.bool, device=st.x.device)  # rows with NFE in this block
    for s in range(0, opt.bs, opt.sub_block_size):
        lo, hi = b_start + s, b_start + s + opt.sub_block_size
        sub_forwards = 0
        while True:
            masked = st.x[:, lo:hi] == opt.mask_id  # (b, S)
            active = masked.any(1)
            if not active.any():
                break
            # positions this forward computes (logits at q-1 predict token q): the whole block, or with the
            # sub-block cache only the sub-block; batch_invariant then computes position lo-1 too (the block
            # start is never MASK, so s = 0 needs no extra position), the authors' lo must hold a token
            partial = opt.sub_block_cache and _sub_block_only(st, opt, lo, block_keys, sub_forwards)
            q0, end = ((lo - 1 if s > 0 and opt.batch_invariant else lo), hi) if partial else (b_start, b_end)
            out = st.fwd.denoise(st.x, b_start, q0, end, hbuf, has_carry, active)
            block_keys, sub_forwards = block_keys or not partial, sub_forwards + 1
            sub_logits = shift_logits(out.logits)[:, lo - q0:hi - q0]  # (b, S, V), a fresh tensor
            counted = active & (st.stop_at[st.rows] < 0)  # NFE: unfinished, with something left to decode
            commit, tok = _commit(st, sub_logits, masked, lo, hi, opt)
            st.nfe[st.rows] += counted.long()
            counted_here |= counted
            hit = commit & (tok == opt.stop_id)
            if hit.any():
                first_hit = torch.where(hit.any(1), lo + hit.float().argmax(1), torch.full_like(st.rows, -1))
                st.stop_at = _mark_stop_pos(st.stop_at, st.rows, first_hit)
            if opt.relay_carry:
                if hbuf is None:
                    hbuf = out.hidden.new_zeros(out.hidden.shape[0], opt.bs, out.hidden.shape[2])
                upd = hbuf.clone()
                upd[:, q0 - b_start:end - b_start] = out.hidden.to(hbuf.dtype)
                replaced = active if opt.batch_invariant else torch.ones_like(active)
                hbuf = torch.where(replaced[:, None, None], upd, hbuf)
                has_carry = has_carry | replaced
            _record(st, opt, b_start, s, sub_logits, commit, active)
    st.blocks[st.rows] += counted_here.long()


def _sub_block_only(st: _Batch, opt: _Settings, lo: int, block_keys: bool, sub_forwards: int) -> bool:
    """Sub-block cache: whether this forward runs only the sub-block against the cached (stale) rest of the
    block. batch_invariant: every forward of a sub-block but its first. The authors: every forward once the
    block's keys are cached and position lo holds a token in every row."""
    if opt.batch_invariant:
        return sub_forwards > 0
    return block_keys and not (st.x[:, lo] == opt.mask_id).any()


def _finish_rows(st: _Batch, b_end: int, opt: _Settings) -> bool:
    """Rows that committed the stop token (batch_invariant: or whose last position is in this block) are done
    and leave the batch. False when no row is left."""
    done = st.stop_at[st.rows] >= 0
    if opt.batch_invariant:
        done |= st.last[st.rows] < b_end
    for i in torch.nonzero(done).flatten().tolist():
        r = int(st.rows[i])
        start = int(st.plen[r])
        answer = st.x[i, start:b_end].tolist()
        if opt.batch_invariant:  # up to the first stop token, or through the row's last position
            stop = int(st.stop_at[r])
            st.tokens[r] = answer[:(stop if stop >= 0 else int(st.last[r]) + 1) - start]
        else:  # the authors: up to the first stop token of the answer, committed by the threshold rule or not
            st.tokens[r] = answer[:answer.index(opt.stop_id)]
    return _keep_rows(st, torch.nonzero(~done).flatten())


# -----------------------------------------------------------------------------
# the forwards and their bookkeeping


class _PlainForwards:
    """The model's forwards during decoding, without CUDA graphs: against the prefix cache (fastdllm/cache.py),
    or recomputing the sequence up to the active block (cache None). fastdllm/graphs.py's BlockGraphs makes
    the same four calls at fixed shapes; _new_batch picks one of the two for the whole generate() call."""

    def __init__(self, model, cache: BlockKVCache | None, bs: int):
        self.model, self.cache, self.bs = model, cache, bs

    def prefill(self, x: torch.Tensor, b0: int) -> torch.Tensor:
        """The complete prompt blocks [0, b0) every row shares into the cache in one forward; returns the
        logit of position b0-1 (it predicts block b0's first token)."""
        return _forward(self.model, self.cache, x, 0, b0, self.bs, commit=True, keep_from=b0 - 1).logits[:, -1]

    def denoise(self, x: torch.Tensor, b_start: int, q0: int, end: int, hbuf: torch.Tensor | None,
                has_carry: torch.Tensor, active: torch.Tensor) -> FastDLLMOutput:
        """One denoising forward over [q0, end) (without the cache: [0, end)), each row with its own carry
        (hbuf (b, bs, d), None before the block's first forward or without relay_carry). A row that starts
        decoding in this block only now (its prompt ended in a later sub-block) must get no relay, as if
        decoded alone; a zero carry would not do (LN(0) = beta), so those rows run separately."""
        start, b_end = (q0 if self.cache is not None else 0), b_start + self.bs
        relay_h = None
        if hbuf is not None and (active & has_carry).any():
            relay_h = shift_hidden(hbuf)[:, q0 - b_start:end - b_start]  # aligned with positions q0..end-1
        if relay_h is None or not (active & ~has_carry).any():
            return _forward(self.model, self.cache, x, start, end, self.bs, relay_h=relay_h, block_end=b_end,
                            keep_from=q0)
        out = _Merged()
        for rows_sub, h in ((torch.nonzero(~has_carry).flatten(), None), (torch.nonzero(has_carry).flatten(), relay_h)):
            part = _forward(self.model, self.cache, x, start, end, self.bs, relay_h=None if h is None else h[rows_sub],
                            block_end=b_end, rows=rows_sub, keep_from=q0)
            out.put(rows_sub, part, x.shape[0])
        return out

    def cache_block(self, x: torch.Tensor, b_start: int) -> FastDLLMOutput:
        """The clean block's keys and values join the prefix cache (no relay: the carry never enters this
        forward); the output's last logit predicts the next block's first token."""
        return _forward(self.model, self.cache, x, b_start, b_start + self.bs, self.bs, commit=True,
                        keep_from=b_start + self.bs - 1)

    def keep_rows(self, keep: torch.Tensor) -> None:
        """Finished rows leave: the cache keeps the rows `keep`, in that order."""
        if self.cache is not None:
            self.cache.select(keep)


def _commit(st: _Batch, sub_logits: torch.Tensor, masked: torch.Tensor, lo: int, hi: int, opt: _Settings):
    """Sample the sub-block [lo, hi) from its (b, S, V) shifted logits and commit what unmask_rule picks.
    Returns the committed positions and the sampled tokens, each (b, S)."""
    st.forwards += 1
    sub_logits[..., opt.mask_id] = float("-inf")  # committing MASK would stall decoding (untrained models do it)
    tok, conf = sample_tokens(sub_logits, opt.temperature, opt.top_p, opt.generator)
    commit = unmask_rule(conf, masked, opt.threshold)
    st.x[:, lo:hi] = torch.where(commit, tok, st.x[:, lo:hi])
    return commit, tok


def _record(st: _Batch, opt: _Settings, b_start: int, s: int, sub_logits, commit, active) -> None:
    if opt.trace:
        st.records.append(dict(rows=st.rows.tolist(), block=b_start, sub_block=s, logits=sub_logits.float().cpu(),
                               committed=commit.sum(1).tolist(), active=active.tolist()))


def _keep_rows(st: _Batch, keep: torch.Tensor) -> bool:
    """Keep only the rows `keep` (finished rows leave the batch with their cache rows); False if none."""
    if keep.numel() == 0:
        return False
    if keep.numel() < st.rows.numel():
        st.x, st.rows = st.x[keep], st.rows[keep]
        st.fwd.keep_rows(keep)
    return True


def _forward(model, cache: BlockKVCache | None, x: torch.Tensor, start: int, end: int, bs: int,
             relay_h: torch.Tensor | None = None, commit: bool = False, block_end: int | None = None,
             rows: torch.Tensor | None = None, keep_from: int | None = None) -> FastDLLMOutput:
    """One forward over absolute positions [start, end) of x (B, total) (or of its rows `rows`); logits and
    hidden of positions [keep_from, end) only (default: all computed ones). With the cache: write keys at
    [start, end), attend up to block_end (the active block's end), commit the prefix if asked. Without it:
    recompute [0, end) block-causally; relay_h then covers [end - len, end) and is padded with zeros in
    front (the recomputed prefix holds no MASK, so those zeros are never injected)."""
    ids = x if rows is None else x[rows]
    n_last = end - (start if keep_from is None else keep_from)
    if cache is None:
        if relay_h is not None and relay_h.shape[1] < end:
            relay_h = torch.cat([relay_h.new_zeros(relay_h.shape[0], end - relay_h.shape[1], relay_h.shape[2]), relay_h], 1)
        ids, mask, pos = ids[:, :end], block_causal_mask(end, end, bs, x.device), torch.arange(end, device=x.device)[None]
    else:
        kv_end = end if block_end is None else block_end
        cache.plan(start, kv_end, commit, rows)
        if end - start > bs:  # prefill: several blocks, block-causal among themselves
            mask = block_causal_mask(end - start, kv_end, bs, x.device)
        else:  # one block (or part of it) sees the whole prefix and the whole block
            mask = torch.ones(1, 1, end - start, kv_end, dtype=torch.bool, device=x.device)
        ids, pos = ids[:, start:end], torch.arange(start, end, device=x.device)[None]
    # FastDLLM.forward's n_last skips the lm_head over a 151936-word vocabulary at prefix positions that
    # decoding never reads (~17% of an uncached forward at the 1.5B shape); test stand-ins return every position
    kw = {"n_last": n_last} if isinstance(model, FastDLLM) else {}
    out = model(ids, relay_h=relay_h, attention_mask=mask, position_ids=pos, past_key_values=cache, **kw)
    return FastDLLMOutput(logits=out.logits[:, -n_last:], hidden=out.hidden[:, -n_last:])


class _Merged:
    """Logits and hidden of a batch assembled from forwards over subsets of its rows."""

    def put(self, rows: torch.Tensor, part, batch: int) -> None:
        if not hasattr(self, "logits"):
            self.logits = part.logits.new_zeros(batch, *part.logits.shape[1:])
            self.hidden = part.hidden.new_zeros(batch, *part.hidden.shape[1:])
        self.logits[rows], self.hidden[rows] = part.logits, part.hidden


def _mark_stop(stop_at: torch.Tensor, rows: torch.Tensor, hit: torch.Tensor, pos: int) -> torch.Tensor:
    first = torch.where(hit, torch.full_like(rows, pos), torch.full_like(rows, -1))
    return _mark_stop_pos(stop_at, rows, first)


def _mark_stop_pos(stop_at: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Record a row's first stop position (pos -1 = none this step); an earlier stop stays."""
    cur = stop_at[rows]
    new = torch.where((pos >= 0) & ((cur < 0) | (pos < cur)), pos, cur)
    stop_at = stop_at.clone()
    stop_at[rows] = new
    return stop_at


def _check_generator(model, generator: torch.Generator | None) -> None:
    """Sampling draws on the model's device, so a generator elsewhere fails deep inside torch.multinomial."""
    device = next(model.parameters()).device
    if generator is not None and generator.device.type != device.type:
        raise ValueError(f"the generator is on {generator.device} but the model on {device}; "
                         f"make it with torch.Generator(device='{device}')")


GRAPH_DEVICES = ("cuda",)  # where cuda_graph=True runs; the CPU tests add "cpu" (the same forward, not captured)


def _check_cuda_graph_device(model, cuda_graph: bool) -> None:
    device = next(model.parameters()).device
    if cuda_graph and device.type not in GRAPH_DEVICES:
        raise ValueError(f"cuda_graph=True needs the model on a CUDA device, it is on {device}")


def check_settings(max_new_tokens: int, threshold: float, block_size: int, sub_block_size: int, temperature: float,
                   top_p: float, prefix_cache: bool, sub_block_cache: bool, relay_carry: bool, decode: str,
                   cuda_graph: bool = False) -> None:
    """The decoding settings alone (no model, no prompts): ValueError with one line. eval_code.py runs this
    before it loads a model; generate() runs it again with the checks that need the model and prompts."""
    bs = block_size
    if decode not in DECODE_MODES:
        raise ValueError(f"decode must be one of {DECODE_MODES}, got '{decode}'")
    if not max_new_tokens >= 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not (bs >= 1 and sub_block_size >= 1) or bs % sub_block_size:
        raise ValueError(f"block_size ({bs}) must be a positive multiple of sub_block_size ({sub_block_size})")
    if not 0 < threshold <= 1:  # written so that NaN fails
        raise ValueError(f"threshold must be in (0, 1] (1.0 commits exactly one token per forward), got {threshold}")
    if not (0 <= temperature < float("inf") and 0 < top_p <= 1):
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature} and {top_p}")
    if cuda_graph and (not prefix_cache or sub_block_cache):
        raise ValueError("cuda_graph=True needs prefix_cache=True and sub_block_cache=False (the graphed forward is "
                         "one whole block against the prefix cache)")
    if sub_block_cache and not prefix_cache:
        raise ValueError("sub_block_cache=True needs prefix_cache=True (the block's keys live in the prefix cache)")
    if decode == "authors" and max_new_tokens < bs:
        raise ValueError(f"decode='authors' runs max_new_tokens // block_size blocks past the longest prompt's block: "
                         f"max_new_tokens ({max_new_tokens}) must be >= block_size ({bs})")
    if decode == "authors" and sub_block_cache and relay_carry:
        raise ValueError("decode='authors' has no sub-block cache with the relay carry (the authors' code ran the carry "
                         "without it); drop sub_block_cache or use decode='batch_invariant'")


def _check_args(model, prompts, max_new_tokens, threshold, bs, sub_block_size, temperature, top_p,
                prefix_cache, sub_block_cache, relay_carry, mask_id, decode, cuda_graph) -> None:
    check_settings(max_new_tokens, threshold, bs, sub_block_size, temperature, top_p, prefix_cache, sub_block_cache,
                   relay_carry, decode, cuda_graph)
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    if any(mask_id in p for p in prompts):
        raise ValueError(f"a prompt contains the mask token id {mask_id}; remove it (it would be decoded over)")
    context = getattr(model.config, "max_position_embeddings", None)
    longest = max(len(p) for p in prompts)
    if context is not None and longest + max_new_tokens > context:
        raise ValueError(f"a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} does not fit the model's "
                         f"context of {context} positions; shorten the prompt or lower max_new_tokens")
    if relay_carry and getattr(model, "relay_layer_norm", None) is None:
        raise ValueError("relay_carry=True needs a model with a relay LayerNorm (a Relay checkpoint, use_relay=True)")
