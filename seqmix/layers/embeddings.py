"""Token embeddings and positions (fairseq conventions, so weights and numerics line up)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from seqmix.errors import SeqmixError


def token_embedding(num_embeddings: int, embed_dim: int, padding_idx: int) -> nn.Embedding:
    """N(0, d^-1/2) init with a zero pad row, as fairseq's transformer."""
    emb = nn.Embedding(num_embeddings, embed_dim, padding_idx=padding_idx)
    nn.init.normal_(emb.weight, mean=0.0, std=embed_dim**-0.5)
    with torch.no_grad():
        emb.weight[padding_idx].zero_()
    return emb


def make_positions(tokens: Tensor, padding_idx: int, offset: int = 0) -> Tensor:
    """Positions start at padding_idx + 1; pads get padding_idx (fairseq). ``offset``: steps already decoded."""
    mask = tokens.ne(padding_idx).long()
    return (torch.cumsum(mask, dim=1) + offset) * mask + padding_idx


def sinusoidal_table(num_embeddings: int, embed_dim: int, padding_idx: int) -> Tensor:
    """fairseq's table: first half sin, second half cos (not interleaved), frequency step log(1e4)/(half-1)."""
    half = embed_dim // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float) * -step)
    angles = torch.arange(num_embeddings, dtype=torch.float).unsqueeze(1) * freqs.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if embed_dim % 2 == 1:
        table = torch.cat([table, torch.zeros(num_embeddings, 1)], dim=1)
    table[padding_idx] = 0
    return table


class PositionalEmbedding(nn.Module):
    """Sinusoidal (fixed) or learned absolute positions for up to ``max_positions`` tokens."""

    def __init__(self, max_positions: int, embed_dim: int, padding_idx: int, kind: str = "sinusoidal") -> None:
        super().__init__()
        if kind not in ("sinusoidal", "learned"):
            raise SeqmixError(f"positions must be 'sinusoidal' or 'learned', got {kind!r}")
        self.kind = kind
        self.max_positions = max_positions
        self.padding_idx = padding_idx
        num = max_positions + padding_idx + 1
        if kind == "learned":
            self.weights = nn.Embedding(num, embed_dim, padding_idx=padding_idx)
            nn.init.normal_(self.weights.weight, mean=0.0, std=embed_dim**-0.5)
            with torch.no_grad():
                self.weights.weight[padding_idx].zero_()
        else:
            # a plain tensor, not a buffer: nothing for DDP to broadcast before every forward (those per-step
            # collectives hang when ranks run different numbers of evaluation batches)
            self.table = sinusoidal_table(num, embed_dim, padding_idx)

    def forward(self, tokens: Tensor, offset: int = 0) -> Tensor:
        positions = make_positions(tokens, self.padding_idx, offset)
        # positions never exceed offset + length: only a longer tensor needs its largest position read back
        # (a host sync on GPUs)
        if offset + tokens.size(-1) > self.max_positions and positions.numel() \
                and int(positions.max()) > self.max_positions + self.padding_idx:
            raise SeqmixError(
                f"sequence of {int(positions.max()) - self.padding_idx} tokens exceeds max positions "
                f"{self.max_positions}; raise model max_*_positions or shorten the input"
            )
        if self.kind == "learned":
            return self.weights(positions)
        if self.table.device != positions.device:
            self.table = self.table.to(positions.device)
        return self.table[positions]
