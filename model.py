"""The Sudoku denoiser: the paper's "xtiny" pre-norm rotary Transformer, optionally with a relay.

    model = SudokuTransformer(ModelConfig(relay=True))
    logits, h = model(tokens)          # first step: h = 0
    logits, h = model(tokens, h)       # later steps carry the last block's output

Architecture (App. A.1 of the paper; details in docs/reference.md): token embedding (17 ids, no
positional embedding: RoPE in attention), 4 pre-norm blocks (LayerNorm eps 1e-5; fused bias-free
QKV; RoPE over all 64 head dims, base 10000, rotate-half; bidirectional attention; bias-free
output projection; ReLU FFN with biases), final LayerNorm, bias-free head over all 17 ids.
Dropout 0.1 on attention probabilities, attention output and FFN output.

Relay (paper Eq. 2): the input to block 0 is Emb(x) + LN_relay(h), where h is the
last block's output *before* the final LayerNorm of the previous step. 7,106,304 parameters
(untied); 7,105,536 without relay; tying the head to the embedding saves 6,528.
"""
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from relay import RelayLayerNorm


@dataclass
class ModelConfig:
    n_layer: int = 4
    n_head: int = 6
    n_embd: int = 384
    d_ff: int = 1536
    dropout: float = 0.1
    vocab_size: int = 17
    block_size: int = 81  # sequence length: the 81 cells, no special tokens
    tie_embeddings: bool = False
    relay: bool = False
    # Learned absolute positions: NOT in the paper (its model has RoPE only). With RoPE alone a model
    # must infer each cell's row and box from attention patterns, which small CPU runs learn slowly;
    # the CPU presets turn this on so that they learn in minutes. Adds block_size * n_embd parameters.
    pos_emb: bool = False


def rope_cache(head_dim: int, length: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (length, head_dim) for the rotate-half (NeoX) convention."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (head_dim/2,)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)  # (length, head_dim/2)
    angles = torch.cat([angles, angles], dim=-1)  # pair i uses dims i and i + head_dim/2
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.proj_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, L, C = x.shape
        qkv = self.qkv(x).view(B, L, 3, self.n_head, C // self.n_head)
        # RoPE on q and k at once, in the projection's own (contiguous) layout: the same values, per element, as
        # on each of them after the transpose, in a third of the time (elementwise work dominates at this width)
        qk = apply_rope(qkv[:, :, :2], cos[:, None, None], sin[:, None, None])
        q, k, v = qk[:, :, 0].transpose(1, 2), qk[:, :, 1].transpose(1, 2), qkv[:, :, 2].transpose(1, 2)  # (B, H, L, D)
        # bidirectional: every cell attends to every cell (no causal mask)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, L, C)
        return self.proj_drop(self.proj(y))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.n_embd, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)  # only after fc2, as in xlm-core

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(F.relu(self.fc1(x))))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = SelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.ffn = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.ffn(self.norm2(x))


class SudokuTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd, padding_idx=0)
        # positions on the token embedding's scale (N(0, 1), or N(0, 1/sqrt(d)) when tied): a much smaller
        # init leaves the cell index drowned by the token vector, and small CPU runs then learn far slower
        pos_std = cfg.n_embd ** -0.5 if cfg.tie_embeddings else 1.0
        self.pos_emb = nn.Parameter(pos_std * torch.randn(cfg.block_size, cfg.n_embd)) if cfg.pos_emb else None
        # gamma = 1 from scratch (paper App. A.1); init_from a plain parent sets zero_init instead
        self.relay_norm = RelayLayerNorm(cfg.n_embd, eps=1e-5) if cfg.relay else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.final_norm = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            # The default N(0, 1) embedding would make the tied head's initial logits huge, so the
            # authors re-initialise it to N(0, 1/sqrt(d)) (PAD row zero) before sharing it.
            with torch.no_grad():
                self.tok_emb.weight.normal_(0.0, cfg.n_embd ** -0.5)
                self.tok_emb.weight[0].zero_()
            self.head.weight = self.tok_emb.weight
        cos, sin = rope_cache(cfg.n_embd // cfg.n_head, cfg.block_size)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # shared (tied) tensors counted once

    def forward(self, tokens: torch.Tensor, h: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, L) ids, h (B, L, d) relay state or None -> logits (B, L, V), h_out (B, L, d).

        h_out is the last block's output before the final LayerNorm: the relay state for the next
        step. Plain models return it too, so callers can treat all models alike.
        """
        B, L = tokens.shape
        if L > self.config.block_size:
            raise ValueError(f"sequence length {L} exceeds block_size {self.config.block_size}")
        x = self.tok_emb(tokens)  # (B, L, d)
        if self.pos_emb is not None:
            x = x + self.pos_emb[:L]
        if self.relay_norm is not None:
            # h = 0 at the first step; LN_relay(0) = beta exactly, so add beta without normalising zeros
            x = x + (self.relay_norm(h) if h is not None else self.relay_norm.bias)
        elif h is not None:
            raise ValueError("this model was built with relay=False and cannot take a relay state h; pass h=None")
        cos, sin = self.rope_cos[:L], self.rope_sin[:L]
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.head(self.final_norm(x))
        return logits, x


def model_from_config(config: dict) -> SudokuTransformer:
    """A fresh model from a stored ModelConfig dict; keys this version does not know are ignored."""
    known = {f.name for f in fields(ModelConfig)}
    return SudokuTransformer(ModelConfig(**{k: v for k, v in config.items() if k in known}))


def model_from_checkpoint(ckpt: dict, device: str = "cpu", ema: bool = True) -> SudokuTransformer:
    """The model of a loaded train_sudoku.py checkpoint, in eval mode (EMA weights if ema and present)."""
    model = model_from_config(ckpt["model_config"])
    model.load_state_dict(ckpt["model"])
    if ema and ckpt.get("ema") is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(ckpt["ema"]["shadow"][name])
    return model.to(device).eval()
