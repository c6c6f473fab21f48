"""Self-attention as a token mixer (Vaswani et al. 2017), through torch SDPA."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seqmix.mixers.base import MixerState, TokenMixer, check_incremental_call, index_select_batch
from seqmix.mixers.multihead_attention import MultiheadAttention


@dataclass
class KeyValueCache(MixerState):
    """Projected keys/values of every step decoded so far: (B, H, t, head_dim)."""

    k: Tensor | None = None
    v: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        self.k = index_select_batch(self.k, index)
        self.v = index_select_batch(self.v, index)


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
        k, v = attn.project_kv(x, x)
        offset = 0
        if state is not None:
            offset = state.length
            k, v = state.append(k, v)
            key_padding_mask = None  # decoding prefixes carry no padding
        return attn.attend(q, k, v, key_padding_mask, causal_offset=offset if self.causal else None)
