"""Fast-dLLM v2 block-diffusion decoding with a KV cache and the Relay carry (paper Sec. 5, Table 2).

    from fastdllm_model import load_fastdllm
    from fastdllm_generate import generate
    model, tok = load_fastdllm("brozonoyer/relay-fastdllm-v2-c40m60-relay-step200", device="cuda")
    ids = [tok(text, add_special_tokens=False)["input_ids"] for text in prompts]
    out = generate(model, ids, relay_carry=True, stop_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    out.tokens, out.nfe  # generated ids per prompt (stop token excluded), denoising forwards per prompt

    python fastdllm_generate.py --model=DIR --relay_carry=True --prompt="Write a function that ..."
    python fastdllm_generate.py --model=tiny --max_new_tokens=64      # random tiny model, CPU smoke test

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

Relay carry (paper Sec. 4; docs/fastdllm.md): inside a block, each denoising forward gets
h_t = shift(h_s of that row's previous forward), injected at MASK positions only (FastDLLM.embed); the
carry is reset at every block start and never enters the cache-update forward. The authors could only
carry with the block cache off; here the carry works with the prefix cache (exact: tested equal to full
recomputation) and with the sub-block cache.

Caches:
  - prefix_cache=True (default) is exact: completed blocks never change, and recomputing them gives the
    same keys and values. prefix_cache=False recomputes the whole sequence every forward (the reference).
  - sub_block_cache=True is Fast-dLLM's DualCache and is approximate by design: the first forward of a
    sub-block runs the whole block and keeps its keys/values; the next forwards of that sub-block run only
    the sub-block (plus the position before it, whose logit predicts the sub-block's first token) against
    the cached prefix and the cached rest of the block, which is stale. With sub_block_size == block_size
    it is exact. Off for the paper's numbers.
"""
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from fastdllm_model import FastDLLM, FastDLLMOutput, block_causal_mask, shift_hidden, shift_logits


# -----------------------------------------------------------------------------
# KV cache: one preallocated buffer per layer, written in place


class _BlockLayer(CacheLayerMixin):
    """Keys/values (B, H_kv, capacity, head_dim). Each forward writes its keys at the positions planned by
    the owning BlockKVCache and attends to everything before the planned end. Writing never moves the
    committed length: denoising forwards overwrite the active block in place, so no copy of the prefix
    is made per forward (transformers' DynamicCache would concatenate, i.e. copy the whole prefix)."""

    def __init__(self, owner: "BlockKVCache"):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, H, _, D = key_states.shape
        self.keys = key_states.new_zeros(B, H, self.owner.capacity, D)
        self.values = value_states.new_zeros(B, H, self.owner.capacity, D)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end, rows = self.owner.write_start, self.owner.kv_end, self.owner.rows
        n = key_states.shape[-2]
        if rows is None:
            self.keys[:, :, start:start + n] = key_states
            self.values[:, :, start:start + n] = value_states
            return self.keys[:, :, :end], self.values[:, :, :end]
        self.keys[rows, :, start:start + n] = key_states  # a forward over some rows of the batch (rare)
        self.values[rows, :, start:start + n] = value_states
        return self.keys[rows, :, :end], self.values[rows, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.kv_end, 0

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_length(self) -> int:
        return self.owner.capacity

    def select(self, rows: torch.Tensor) -> None:
        if self.is_initialized:
            self.keys, self.values = self.keys[rows], self.values[rows]


class BlockKVCache(Cache):
    """The prefix cache (plus the active block's keys for the sub-block cache). `plan` says where the next
    forward writes and how far it attends; `length` is the committed prefix."""

    def __init__(self, n_layers: int, capacity: int):
        self.capacity, self.length, self.write_start, self.kv_end, self.rows = capacity, 0, 0, 0, None
        super().__init__(layers=[_BlockLayer(self) for _ in range(n_layers)])

    def plan(self, write_start: int, kv_end: int, commit: bool, rows: torch.Tensor | None = None) -> None:
        self.write_start, self.kv_end, self.rows = write_start, kv_end, rows
        if commit:  # this forward's keys become part of the read-only prefix
            self.length = kv_end

    def select(self, rows: torch.Tensor) -> None:
        for layer in self.layers:
            layer.select(rows)


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
             trace: bool = False, progress: bool = False, decode: str = "authors") -> GenerateOutput:
    """Decode a batch of prompts (lists of token ids) with Fast-dLLM v2's block diffusion.

    model: a fastdllm_model.FastDLLM (or anything with its forward signature and config fields bd_size,
    mask_token_id). block_size defaults to the model's bd_size (32). stop_token_id: None = the model's
    eos_token_id (<|im_end|> for Fast-dLLM v2). trace=True records, per denoising forward, the rows that
    took part, the shifted logits of the active sub-block and the number of tokens committed per row.
    decode: "authors" (the batch procedure behind paper Table 2; a row's result depends on its batch) or
    "batch_invariant" (each row decodes as if alone); docs/fastdllm.md compares them."""
    cfg = model.config
    bs = block_size or cfg.bd_size
    stop_id = cfg.eos_token_id if stop_token_id is None else stop_token_id
    if isinstance(stop_id, (list, tuple)):
        stop_id = stop_id[0]
    _check_args(model, prompts, max_new_tokens, threshold, bs, sub_block_size, temperature, top_p,
                prefix_cache, sub_block_cache, relay_carry, cfg.mask_token_id, decode)
    _check_generator(model, generator)
    opt = _Settings(bs, sub_block_size, threshold, temperature, top_p, cfg.mask_token_id, stop_id,
                    sub_block_cache, relay_carry, generator, trace)
    decode_batch = _generate_authors if decode == "authors" else _generate_batch_invariant
    return decode_batch(model, prompts, max_new_tokens, prefix_cache, opt, progress)


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


@dataclass
class _Batch:
    """The decoding state the steps share. x and finished hold the rows still in the batch, in the order of
    `rows`; the per-prompt results (nfe, stop_at, tokens, stopped) are indexed by prompt."""
    x: torch.Tensor  # (b, total) prompt, committed tokens and MASK
    rows: torch.Tensor  # (b,) prompt index of each row still in the batch
    plen: torch.Tensor  # (B,) prompt lengths
    cache: BlockKVCache | None
    nfe: torch.Tensor  # (B,) Table 2's NFE
    stop_at: torch.Tensor  # (B,) batch_invariant: absolute position of the first stop token, -1 = none yet
    finished: torch.Tensor  # (b,) authors: the row has committed the stop token
    tokens: list  # (B,) the answer of each prompt, once its row is done
    stopped: list  # (B,) authors: the row finished on the stop token
    forwards: int = 0  # denoising forwards for the whole batch
    records: list = field(default_factory=list)  # trace


def _new_batch(model, prompts: list[list[int]], total: int, prefix_cache: bool) -> _Batch:
    """Prompts right-padded with MASK to `total` positions (a short prompt's padding is the start of its answer)."""
    device = next(model.parameters()).device
    B = len(prompts)
    x = torch.full((B, total), model.config.mask_token_id, dtype=torch.long, device=device)
    for r, p in enumerate(prompts):
        x[r, :len(p)] = torch.tensor(p, dtype=torch.long, device=device)
    return _Batch(x=x, rows=torch.arange(B, device=device),
                  plen=torch.tensor([len(p) for p in prompts], device=device),
                  cache=BlockKVCache(model.config.num_hidden_layers, total) if prefix_cache else None,
                  nfe=torch.zeros(B, dtype=torch.long, device=device),
                  stop_at=torch.full((B,), -1, dtype=torch.long, device=device),
                  finished=torch.zeros(B, dtype=torch.bool, device=device), tokens=[None] * B, stopped=[False] * B)


def _blocks(steps: range, progress: bool):
    if progress:
        from tqdm import tqdm
        return tqdm(steps, desc="blocks", leave=False)
    return steps


# -----------------------------------------------------------------------------
# decode="batch_invariant": each row decodes as if alone


def _generate_batch_invariant(model, prompts, max_new_tokens, prefix_cache, opt: _Settings, progress) -> GenerateOutput:
    bs = opt.bs
    last_pos = max(len(p) for p in prompts) + max_new_tokens - 1
    st = _new_batch(model, prompts, (last_pos // bs + 1) * bs, prefix_cache)
    last = st.plen + max_new_tokens - 1  # each row's last position to generate; its block is its last one
    b0 = int(st.plen.min()) // bs * bs
    next_logit = _prefill(model, st, b0, bs)
    for b_start in _blocks(range(b0, st.x.shape[1], bs), progress):
        if next_logit is not None:
            _first_token_invariant(st, b_start, next_logit, opt)
        _denoise_block_invariant(model, st, b_start, opt)
        if not _finish_rows_invariant(st, b_start + bs, last):
            break
        next_logit = _cache_block(model, st, b_start, bs).logits[:, -1]
    return GenerateOutput(tokens=st.tokens, nfe=st.nfe.tolist(), stopped=(st.stop_at >= 0).tolist(),
                          forwards=st.forwards, trace=st.records)


def _first_token_invariant(st: _Batch, b_start: int, next_logit: torch.Tensor, opt: _Settings) -> None:
    """The block's first token: autoregressive from the previous block's last logit (no threshold)."""
    first = st.x[:, b_start] == opt.mask_id
    next_logit = next_logit.clone()
    next_logit[:, opt.mask_id] = float("-inf")
    tok, _ = sample_tokens(next_logit, opt.temperature, opt.top_p, opt.generator)
    st.x[:, b_start] = torch.where(first, tok, st.x[:, b_start])
    st.stop_at = _mark_stop(st.stop_at, st.rows, first & (tok == opt.stop_id), b_start)


def _denoise_block_invariant(model, st: _Batch, b_start: int, opt: _Settings) -> None:
    """Decode the block sub-block by sub-block until no MASK is left. The relay carry is h_s of each row's
    own latest forward, by block position, reset per block: rows that waited (no MASK in the active
    sub-block) keep theirs, since their forward would not happen if they decoded alone."""
    hbuf = None  # (b, bs, d)
    has_carry = torch.zeros(st.x.shape[0], dtype=torch.bool, device=st.x.device)
    for s in range(0, opt.bs, opt.sub_block_size):
        lo, hi = b_start + s, b_start + s + opt.sub_block_size
        partial = False  # the sub-block cache runs the whole block once per sub-block, then only the sub-block
        while True:
            masked = st.x[:, lo:hi] == opt.mask_id  # (b, S)
            active = masked.any(1)
            if not active.any():
                break
            # positions this forward computes; logits at q-1 predict token q (the block start is never MASK,
            # so s = 0 needs no extra position)
            q0 = (lo - 1 if s > 0 else lo) if partial else b_start
            end = hi if partial else b_start + opt.bs
            out = _forward_invariant(model, st, opt, b_start, q0, end, hbuf, has_carry, active)
            partial = opt.sub_block_cache
            sub_logits = shift_logits(out.logits)[:, lo - q0:hi - q0]  # (b, S, V), a fresh tensor
            counted = active & (st.stop_at[st.rows] < 0)  # NFE: unfinished, with something left to decode
            commit, tok = _commit(st, sub_logits, masked, lo, hi, opt)
            st.nfe[st.rows] += counted.long()
            hit = commit & (tok == opt.stop_id)
            if hit.any():
                first_hit = torch.where(hit.any(1), lo + hit.float().argmax(1), torch.full_like(st.rows, -1))
                st.stop_at = _mark_stop_pos(st.stop_at, st.rows, first_hit)
            if opt.relay_carry:
                if hbuf is None:
                    hbuf = out.hidden.new_zeros(out.hidden.shape[0], opt.bs, out.hidden.shape[2])
                upd = hbuf.clone()
                upd[:, q0 - b_start:end - b_start] = out.hidden.to(hbuf.dtype)
                hbuf = torch.where(active[:, None, None], upd, hbuf)
                has_carry = has_carry | active
            _record(st, opt, b_start, s, sub_logits, commit, active)


def _forward_invariant(model, st: _Batch, opt: _Settings, b_start: int, q0: int, end: int,
                       hbuf: torch.Tensor | None, has_carry: torch.Tensor, active: torch.Tensor):
    """One denoising forward over [q0, end) (without the cache: [0, end)), each row with its own carry.
    A row that starts decoding in this block only now (its prompt ended in a later sub-block) must get no
    relay, as if decoded alone; a zero carry would not do (LN(0) = beta), so those rows run separately."""
    start, b_end = (q0 if st.cache is not None else 0), b_start + opt.bs
    relay_h = None
    if opt.relay_carry and (active & has_carry).any():
        relay_h = shift_hidden(hbuf)[:, q0 - b_start:end - b_start]  # aligned with positions q0..end-1
    if relay_h is None or not (active & ~has_carry).any():
        return _forward(model, st.cache, st.x, start, end, opt.bs, relay_h=relay_h, block_end=b_end, keep_from=q0)
    out = _Merged()
    for rows_sub, h in ((torch.nonzero(~has_carry).flatten(), None), (torch.nonzero(has_carry).flatten(), relay_h)):
        part = _forward(model, st.cache, st.x, start, end, opt.bs, relay_h=None if h is None else h[rows_sub],
                        block_end=b_end, rows=rows_sub, keep_from=q0)
        out.put(rows_sub, part, st.x.shape[0])
    return out


def _finish_rows_invariant(st: _Batch, b_end: int, last: torch.Tensor) -> bool:
    """Rows that chose the stop token, or whose last position is in this block, are done (tokens after the
    stop are dropped) and leave the batch. False when no row is left."""
    done = (st.stop_at[st.rows] >= 0) | (last[st.rows] < b_end)
    for i in torch.nonzero(done).flatten().tolist():
        r = int(st.rows[i])
        stop = int(st.stop_at[r])
        end = stop if stop >= 0 else int(last[r]) + 1
        st.tokens[r] = st.x[i, int(st.plen[r]):end].tolist()
    return _keep_rows(st, torch.nonzero(~done).flatten())


# -----------------------------------------------------------------------------
# decode="authors": the authors' batch procedure (paper Table 2)


def _generate_authors(model, prompts, max_new_tokens, prefix_cache, opt: _Settings, progress) -> GenerateOutput:
    """docs/fastdllm.md, "decode modes": one block count for the whole batch, the relay carry of every row
    replaced after every forward, a row finishes only when the threshold rule commits the stop token, and
    finished rows leave the batch at the end of their block."""
    bs = opt.bs
    min_len, max_len = min(len(p) for p in prompts), max(len(p) for p in prompts)
    n_blocks = max_new_tokens // bs + max_len // bs  # for the whole batch, from the longest prompt
    st = _new_batch(model, prompts, n_blocks * bs + 1, prefix_cache)  # + the next block's first token
    b0 = min_len // bs * bs
    next_logit = _prefill(model, st, b0, bs)
    if next_logit is not None and min_len == b0:  # prompts that fill whole blocks start with an autoregressive token
        st.x[:, b0] = torch.where(st.plen == b0, _greedy_next(next_logit, opt.mask_id), st.x[:, b0])
    for b in _blocks(range(min_len // bs, n_blocks), progress):
        b_start, b_end = b * bs, (b + 1) * bs
        _denoise_block_authors(model, st, b_start, opt)
        if not _finish_rows_authors(st, b_end, opt.stop_id):
            break
        next_logit = _cache_block(model, st, b_start, bs).logits[:, -1]
        # The next block's first token, for rows already answering. A row whose prompt ends exactly here
        # gets it only once no longer prompt is left in the batch; otherwise that position stays MASK and
        # is decoded by the threshold rule (as in the authors' code).
        write = (st.plen[st.rows] < b_end) | (max_len <= b_end)
        st.x[:, b_end] = torch.where(write, _greedy_next(next_logit, opt.mask_id), st.x[:, b_end])
    else:
        for i, r in enumerate(st.rows.tolist()):  # the block limit: every decoded token plus the next block's first
            st.tokens[r] = st.x[i, int(st.plen[r]):].tolist()
    return GenerateOutput(tokens=st.tokens, nfe=st.nfe.tolist(), stopped=st.stopped, forwards=st.forwards,
                          trace=st.records)


def _greedy_next(logit: torch.Tensor, mask_id: int) -> torch.Tensor:
    """A block's first token: argmax of the previous position's logit, MASK excluded, no threshold."""
    return logit.masked_fill(torch.arange(logit.shape[-1], device=logit.device) == mask_id, float("-inf")).argmax(-1)


def _denoise_block_authors(model, st: _Batch, b_start: int, opt: _Settings) -> None:
    """Decode the block sub-block by sub-block until no MASK is left. The relay carry is h_s of the latest
    forward for every row, rows that waited included; reset per block."""
    b_end = b_start + opt.bs
    carry = None  # (b, bs, d)
    block_keys = False  # sub-block cache: whether this block's keys/values are in the cache
    for s in range(0, opt.bs, opt.sub_block_size):
        lo, hi = b_start + s, b_start + s + opt.sub_block_size
        while True:
            masked = st.x[:, lo:hi] == opt.mask_id
            if not masked.any():
                break
            counted = masked.any(1) & ~st.finished  # NFE: rows with work left that have not finished
            if opt.sub_block_cache and block_keys and not (st.x[:, lo] == opt.mask_id).any():
                # only the sub-block, against the cached prefix and the cached (stale) rest of the block;
                # position lo is not MASK: its own logit is never read
                out = _forward(model, st.cache, st.x, lo, hi, opt.bs, block_end=b_end)
                sub_logits = shift_logits(out.logits)
            else:
                relay_h = shift_hidden(carry) if carry is not None else None
                out = _forward(model, st.cache, st.x, b_start, b_end, opt.bs, relay_h=relay_h)
                sub_logits = shift_logits(out.logits)[:, s:s + opt.sub_block_size]
                block_keys = True
            commit, tok = _commit(st, sub_logits, masked, lo, hi, opt)
            st.finished |= (commit & (tok == opt.stop_id)).any(1)
            st.nfe[st.rows] += counted.long()
            if opt.relay_carry:
                carry = out.hidden
            _record(st, opt, b_start, s, sub_logits, commit, masked.any(1))


def _finish_rows_authors(st: _Batch, b_end: int, stop_id: int) -> bool:
    """Rows that committed the stop token end at their first stop token and leave the batch. False when no
    row is left."""
    for i in torch.nonzero(st.finished).flatten().tolist():
        r = int(st.rows[i])
        tail = st.x[i, int(st.plen[r]):b_end].tolist()
        st.tokens[r], st.stopped[r] = tail[:tail.index(stop_id)], True
    return _keep_rows(st, torch.nonzero(~st.finished).flatten())


# -----------------------------------------------------------------------------
# steps both modes share


def _prefill(model, st: _Batch, b0: int, bs: int) -> torch.Tensor | None:
    """The complete prompt blocks [0, b0) every row shares go into the cache in one forward. Returns the
    logit of position b0-1 (it predicts block b0's first token); None when no block is shared."""
    if b0 == 0:
        return None
    return _forward(model, st.cache, st.x, 0, b0, bs, commit=True, keep_from=b0 - 1).logits[:, -1]


def _cache_block(model, st: _Batch, b_start: int, bs: int) -> FastDLLMOutput:
    """The clean block's keys and values join the prefix cache (no relay: the carry never enters this
    forward); the output's last logit predicts the next block's first token."""
    return _forward(model, st.cache, st.x, b_start, b_start + bs, bs, commit=True, keep_from=b_start + bs - 1)


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
        st.x, st.rows, st.finished = st.x[keep], st.rows[keep], st.finished[keep]
        if st.cache is not None:
            st.cache.select(keep)
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


def _check_args(model, prompts, max_new_tokens, threshold, bs, sub_block_size, temperature, top_p,
                prefix_cache, sub_block_cache, relay_carry, mask_id, decode) -> None:
    if decode not in DECODE_MODES:
        raise ValueError(f"decode must be one of {DECODE_MODES}, got '{decode}'")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    if any(mask_id in p for p in prompts):
        raise ValueError(f"a prompt contains the mask token id {mask_id}; remove it (it would be decoded over)")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if bs < 1 or sub_block_size < 1 or bs % sub_block_size:
        raise ValueError(f"block_size ({bs}) must be a positive multiple of sub_block_size ({sub_block_size})")
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1] (1.0 commits exactly one token per forward), got {threshold}")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature} and {top_p}")
    if sub_block_cache and not prefix_cache:
        raise ValueError("sub_block_cache=True needs prefix_cache=True (the block's keys live in the prefix cache)")
    context = getattr(model.config, "max_position_embeddings", None)
    longest = max(len(p) for p in prompts)
    if context is not None and longest + max_new_tokens > context:
        raise ValueError(f"a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} does not fit the model's "
                         f"context of {context} positions; shorten the prompt or lower max_new_tokens")
    if decode == "authors" and max_new_tokens < bs:
        raise ValueError(f"decode='authors' runs max_new_tokens // block_size blocks past the longest prompt's block: "
                         f"max_new_tokens ({max_new_tokens}) must be >= block_size ({bs})")
    if decode == "authors" and sub_block_cache and relay_carry:
        raise ValueError("decode='authors' has no sub-block cache with the relay carry (the authors' code ran the carry "
                         "without it); drop sub_block_cache or use decode='batch_invariant'")
    if relay_carry and getattr(model, "relay_layer_norm", None) is None:
        raise ValueError("relay_carry=True needs a model with a relay LayerNorm (a Relay checkpoint, use_relay=True)")


# -----------------------------------------------------------------------------
# command line: chat with a checkpoint (python fastdllm_generate.py --model=DIR --prompt="...")


@dataclass
class ChatConfig:
    model: str = "Efficient-Large-Model/Fast_dLLM_v2_1.5B"  # hub id, checkpoint dir, or "tiny" (random, CPU smoke test)
    prompt: str = "Write a Python function that returns the n-th Fibonacci number."
    relay_carry: bool = False  # Relay checkpoints: carry the relay state between denoising forwards
    decode: str = "authors"  # authors (paper Table 2) | batch_invariant (see docs/fastdllm.md)
    threshold: float = 0.85
    sub_block_size: int = 8
    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 0.95
    prefix_cache: bool = True
    sub_block_cache: bool = False
    seed: int = 0
    device: str = "auto"
    dtype: str = "bfloat16"  # bfloat16 | float32 (the tiny model runs in float32)


def main(argv: list[str] | None = None) -> str:
    """One prompt through the chat template, decoded; prints the answer and its NFE."""
    from configurator import ConfigError, load_config
    import fastdllm_model
    try:
        cfg = load_config(ChatConfig, argv)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    if cfg.dtype not in dtypes:
        raise SystemExit(f"--dtype must be one of {list(dtypes)}, got '{cfg.dtype}'")
    try:
        if cfg.model == "tiny":
            model, tok = fastdllm_model.make_tiny_fastdllm(use_relay=cfg.relay_carry, seed=cfg.seed), fastdllm_model.make_tiny_tokenizer()
        else:
            model, tok = fastdllm_model.load_fastdllm(cfg.model, dtype=dtypes[cfg.dtype], device=device)
        text = tok.apply_chat_template([{"role": "user", "content": cfg.prompt}], tokenize=False, add_generation_prompt=True)
        torch.manual_seed(cfg.seed)
        out = generate(model.to(device).eval(), [tok(text, add_special_tokens=False)["input_ids"]],
                       max_new_tokens=cfg.max_new_tokens, threshold=cfg.threshold, sub_block_size=cfg.sub_block_size,
                       temperature=cfg.temperature, top_p=cfg.top_p, stop_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                       prefix_cache=cfg.prefix_cache, sub_block_cache=cfg.sub_block_cache, relay_carry=cfg.relay_carry,
                       progress=True, decode=cfg.decode)
    except ValueError as e:
        raise SystemExit(str(e))
    answer = tok.decode(out.tokens[0], skip_special_tokens=True)
    print(answer)
    print(f"[{len(out.tokens[0])} tokens, NFE {out.nfe[0]}, {'stopped at <|im_end|>' if out.stopped[0] else 'hit max_new_tokens'}]")
    return answer


if __name__ == "__main__":
    main()
