"""The KV cache of Fast-dLLM v2 block decoding (fastdllm/generate.py): one preallocated buffer per layer,
written in place.

Completed blocks never change, so their keys and values are computed once and kept (the prefix). The
active block is rewritten by every denoising forward at the same positions: writing in place means no
copy of the prefix per forward (transformers' DynamicCache would concatenate, i.e. copy it every time).
"""
import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class _BlockLayer(CacheLayerMixin):
    """Keys/values (B, H_kv, capacity, head_dim). Each forward writes its keys at the positions planned by
    the owning BlockKVCache and attends to everything before the planned end. Writing never moves the
    committed length: denoising forwards overwrite the active block in place."""

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
