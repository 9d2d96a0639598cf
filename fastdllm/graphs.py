"""generate(..., cuda_graph=True): the block forward of cached decoding at fixed shapes, captured as CUDA graphs.

With the prefix cache, every forward of decoding but the prefill is the same shape: one block of `block_size`
positions against the cache. At the 1.5B shape such a forward is a few milliseconds of GPU work split over
hundreds of small kernels, so launching them from Python leaves the GPU waiting on the host (with the
cache a forward computes about 5x fewer tokens than without it but took half the time). A CUDA graph
launches them all at once. What a graph needs, and how the forward here provides it:

- fixed addresses: the block's ids, positions, attention mask and relay input are static tensors the host
  refills before each replay; the keys and values live in one preallocated buffer per layer, written at
  the block's positions by index (index_copy_ with the static position tensor, no Python int in the graph);
- fixed shapes: the attention spans the buffer up to the next multiple of SPAN_STEP past the active
  block (one graph per span), and the mask hides what is not yet written (keys past the block's end);
  the same keys as the growing cache, so the same outputs up to rounding (attention over a longer,
  masked span may sum in another order: bf16 can flip a near-tie). Spanning the whole buffer from the
  first block would double the attention of a long generation on average;
- a fixed batch: rows that finish leave the batch by moving the remaining rows' keys to the front of the
  buffer; the forward then runs the smallest power-of-two row count that holds them (one graph each, all
  sharing one memory pool), so a nearly finished batch does not pay for the full one;
- one forward for rows with and without a relay carry: `relay_rows` gates the relay per row inside
  FastDLLM.embed (a zero carry would not do: LN(0) = beta), where the plain path runs two forwards.

The denoising forwards and the cache-update forwards are the same graph (the cache-update forward is a
block forward with no row carrying). The prefill, one forward of variable length, runs without a graph.
`BlockGraphs(..., capture=False)` runs the same static-shape forward eagerly: that is how the CPU tests
check it against the plain path (tests/test_fastdllm_graphs.py).
"""
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from fastdllm.model import FastDLLM, FastDLLMOutput, block_causal_mask, shift_hidden

SPAN_STEP = 512  # the attention's span grows in steps of this many positions (a graph per span)


class _StaticLayer(CacheLayerMixin):
    """Keys/values (batch, H_kv, capacity, head_dim) at fixed addresses; a forward over b rows writes rows
    [0, b) at the owner's write positions and attends to the owner's span."""

    def __init__(self, owner: "StaticBlockCache", shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.owner = owner
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass  # allocated in __init__: a graph must never allocate the cache

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        rows = key_states.shape[0]
        keys, values = self.keys[:rows], self.values[:rows]
        keys.index_copy_(2, self.owner.write_pos, key_states)
        values.index_copy_(2, self.owner.write_pos, value_states)
        return keys[:, :, :self.owner.span], values[:, :, :self.owner.span]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.span, 0

    def get_seq_length(self) -> int:
        return 0  # never read: every forward here brings its own 4-D mask

    def get_max_length(self) -> int:
        return self.owner.capacity


class StaticBlockCache(Cache):
    """The prefix cache of fastdllm/cache.py at fixed addresses: `write_pos` (a device tensor) says where the
    next forward's keys go."""

    def __init__(self, config, batch: int, capacity: int, dtype: torch.dtype, device: torch.device):
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (batch, config.num_key_value_heads, capacity, head_dim)
        self.capacity, self.span = capacity, capacity  # span: the keys the next forward attends to
        self.write_pos = torch.zeros(0, dtype=torch.long, device=device)
        super().__init__(layers=[_StaticLayer(self, shape, dtype, device) for _ in range(config.num_hidden_layers)])

    def keep_rows(self, keep: torch.Tensor) -> None:
        """The rows `keep` move to the front of every buffer, in that order (the others are dropped)."""
        n = keep.numel()
        for layer in self.layers:
            layer.keys[:n] = layer.keys[keep]  # the gather copies first, so overlapping rows are safe
            layer.values[:n] = layer.values[keep]


class BlockGraphs:
    """The static-shape block forward of one generate() call (see the module docstring): the four calls
    decoding makes (prefill, denoise, cache_block, keep_rows), as fastdllm/generate.py's plain ones.

    batch: the rows at the start; capacity: the decoded sequence's length (the cache's size)."""

    def __init__(self, model: FastDLLM, batch: int, capacity: int, block_size: int, capture: bool):
        p = next(model.parameters())
        cfg, device = model.config, p.device
        self.model, self.bs, self.capacity, self.capture = model, block_size, capacity, capture
        self.cache = StaticBlockCache(cfg, batch, capacity, p.dtype, device)
        self.ids = torch.full((batch, block_size), cfg.mask_token_id, dtype=torch.long, device=device)
        self.offsets = torch.arange(block_size, device=device)
        self.pos = torch.zeros(1, block_size, dtype=torch.long, device=device)  # the block's absolute positions
        self.kv_index = torch.arange(capacity, device=device)
        self.kv_mask = torch.zeros(1, 1, block_size, capacity, dtype=torch.bool, device=device)
        self.relay = model.relay_layer_norm is not None
        self.relay_h = torch.zeros(batch, block_size, cfg.hidden_size, dtype=p.dtype, device=device) if self.relay else None
        self.relay_rows = torch.zeros(batch, dtype=torch.bool, device=device)
        self.batch = batch
        self.graphs: dict[tuple[int, int], tuple] = {}  # (row count, span) -> (graph, its static output)
        self.pool = None

    def prefill(self, x: torch.Tensor, end: int) -> torch.Tensor:
        """Positions [0, end) of x (block-causal among themselves) into the cache, without a graph; returns
        the logit of position end-1 (it predicts the next block's first token)."""
        self.cache.span = self.capacity
        mask = torch.zeros(1, 1, end, self.capacity, dtype=torch.bool, device=x.device)
        mask[..., :end] = block_causal_mask(end, end, self.bs, x.device)
        self.cache.write_pos = self.kv_index[:end]
        out = self.model(x[:, :end], attention_mask=mask, position_ids=self.kv_index[None, :end],
                         past_key_values=self.cache, n_last=1)
        return out.logits[:, -1]

    def block(self, x: torch.Tensor, b_start: int, relay_h: torch.Tensor | None = None,
              relay_rows: torch.Tensor | None = None) -> FastDLLMOutput:
        """One forward of the block [b_start, b_start + block_size) of x (b, total) against the cache; rows
        in relay_rows (b,) get relay_h (b, block_size, d). The outputs stay valid until the next call."""
        b = x.shape[0]
        self.ids[:b] = x[:, b_start:b_start + self.bs]
        self.pos[0] = self.offsets + b_start
        self.kv_mask.copy_((self.kv_index < b_start + self.bs).expand_as(self.kv_mask))
        self.relay_rows.zero_()
        if relay_h is not None:
            self.relay_h[:b] = relay_h
            self.relay_rows[:b] = relay_rows
        span = min(self.capacity, -(-(b_start + self.bs) // SPAN_STEP) * SPAN_STEP)
        out = self._run(self._row_count(b), span)
        return FastDLLMOutput(logits=out.logits[:b], hidden=out.hidden[:b])

    def denoise(self, x: torch.Tensor, b_start: int, q0: int, end: int, hbuf: torch.Tensor | None,
                has_carry: torch.Tensor, active: torch.Tensor) -> FastDLLMOutput:
        """A denoising forward of the whole block (q0, end are its bounds: no sub-block cache here), one
        forward for every row: the carry hbuf (b, bs, d) goes to the rows in has_carry, gated per row."""
        carry = hbuf is not None and bool(has_carry.any())
        return self.block(x, b_start, shift_hidden(hbuf) if carry else None, has_carry)

    def cache_block(self, x: torch.Tensor, b_start: int) -> FastDLLMOutput:
        """The clean block's keys and values into the cache (no carry); the last logit predicts the next block's
        first token."""
        return self.block(x, b_start)

    def keep_rows(self, keep: torch.Tensor) -> None:
        """Finished rows leave: the rows `keep` move to the front (their cache rows with them)."""
        self.cache.keep_rows(keep)

    def _row_count(self, b: int) -> int:
        """The rows a forward computes: the smallest power of two >= b, at most the starting batch."""
        return min(self.batch, 1 << (b - 1).bit_length())

    def _forward(self, n: int, span: int) -> FastDLLMOutput:
        self.cache.write_pos, self.cache.span = self.pos[0], span
        relay = dict(relay_h=self.relay_h[:n], relay_rows=self.relay_rows[:n]) if self.relay else {}
        return self.model(self.ids[:n], attention_mask=self.kv_mask[..., :span], position_ids=self.pos,
                          past_key_values=self.cache, n_last=self.bs, **relay)

    def _run(self, n: int, span: int) -> FastDLLMOutput:
        if not self.capture:
            return self._forward(n, span)
        if (n, span) not in self.graphs:
            # the first call runs eagerly on a side stream (kernel selection, workspaces), then the capture
            # records the same forward, which the replay below runs
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._forward(n, span)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self._forward(n, span)
            self.pool = graph.pool()
            self.graphs[n, span] = (graph, out)
        graph, out = self.graphs[n, span]
        graph.replay()
        return out
