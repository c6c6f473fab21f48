"""Self-attention as a token mixer (Vaswani et al. 2017), through torch SDPA."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seqmix.layers.attention import MultiheadAttention
from seqmix.mixers.base import MixerState, TokenMixer, check_incremental_call


@dataclass
class KeyValueCache(MixerState):
    """Projected keys/values of every step decoded so far, time-major in one buffer (capacity, 2, B, C) that
    grows by doubling: a step writes its keys/values in place instead of concatenating the whole cache, and a
    beam reorder gathers the filled part into a spare buffer in one copy (time-major rows are long and
    contiguous: faster to gather on CPU than (B, H, t, d))."""

    buffer: Tensor | None = None
    length: int = 0
    spare: Tensor | None = None

    def append(self, k: Tensor, v: Tensor, num_heads: int) -> tuple[Tensor, Tensor]:
        """k, v: (B, n, C) new steps. Returns every step's keys and values as (B, H, t, C / H) views."""
        bsz, n, channels = k.shape
        end = self.length + n
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):  # autograd: no in-place writes
            new = torch.stack([k, v]).permute(2, 0, 1, 3)
            self.buffer = new if self.buffer is None else torch.cat([self.buffer[: self.length], new])
            self.spare = None
        elif self.buffer is None or end > self.buffer.size(0):
            grown = k.new_empty(max(16, 2 * end), 2, bsz, channels)
            if self.buffer is not None:
                grown[: self.length].copy_(self.buffer[: self.length])
            self.buffer, self.spare = grown, None
        if not self.buffer.requires_grad:
            self.buffer[self.length: end, 0] = k.transpose(0, 1)
            self.buffer[self.length: end, 1] = v.transpose(0, 1)
        self.length = end
        kv = self.buffer[:end].view(end, 2, bsz, num_heads, channels // num_heads).permute(1, 2, 3, 0, 4)
        return kv[0], kv[1]

    def reorder(self, index: Tensor) -> None:
        if self.buffer is None:
            return
        index = index.to(self.buffer.device)
        cap, _, bsz, channels = self.buffer.shape
        if self.buffer.requires_grad:
            self.buffer = self.buffer[: self.length].index_select(2, index)
            return
        if self.spare is None or self.spare.size(2) != index.numel():
            self.spare = self.buffer.new_empty(cap, 2, index.numel(), channels)
        torch.index_select(self.buffer[: self.length], 2, index, out=self.spare[: self.length])
        self.buffer, self.spare = self.spare, self.buffer if bsz == index.numel() else None


class SelfAttention(TokenMixer):
    """Scaled dot-product self-attention; with ``causal`` each step sees only itself and the past.

    Incremental calls may carry one step or a chunk of several steps: the chunk is causal within
    itself and sees the whole cache.
    """

    state_class = KeyValueCache

    def __init__(self, embed_dim: int, num_heads: int, causal: bool = False, layer_idx: int = 0,
                 attention_dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__(embed_dim, causal, layer_idx)
        self.attn = MultiheadAttention(embed_dim, num_heads, dropout=attention_dropout, bias=bias)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None,
                state: KeyValueCache | None = None) -> Tensor:
        check_incremental_call(self, x, state)
        attn = self.attn
        q = attn.split_heads(attn.q_proj(x))
        if state is None:
            k, v = attn.project_kv(x, x)
            return attn.attend(q, k, v, key_padding_mask, causal_offset=0 if self.causal else None)
        offset = state.length
        k, v = state.append(attn.k_proj(x), attn.v_proj(x), attn.num_heads)
        return attn.attend(q, k, v, None, causal_offset=offset)  # decoding prefixes carry no padding

    def mixing_weights(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """The attention probabilities softmax(QKᵀ/√d) per head (without dropout)."""
        attn = self.attn
        q, k = attn.split_heads(attn.q_proj(x)), attn.split_heads(attn.k_proj(x))
        scores = (q @ k.transpose(-1, -2)).float() / attn.head_dim ** 0.5
        t = x.size(1)
        if self.causal:
            scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        return torch.softmax(scores, dim=-1)
