"""Multi-head attention on ``scaled_dot_product_attention``; shared by self-attention and cross-attention.

Parameter names (q_proj, k_proj, v_proj, out_proj) follow fairseq so its checkpoints map 1:1.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from seqmix.errors import SeqmixError

# SDPA's backends on CUDA, cuDNN's left out: it builds an execution plan for every new (batch, length) shape, hundreds
# of milliseconds each, and token-budget batching gives nearly every update a new shape. On the H100 the
# Transformer recipe's updates took 7x as long as the conv recipes' with it allowed (benchmarks/README.md, GPU check).
CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 kdim: int | None = None, vdim: int | None = None) -> None:
        super().__init__()
        if embed_dim % num_heads != 0:
            raise SeqmixError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(kdim or embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(vdim or embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # fairseq's init: scaled xavier for the packed-equivalent q/k/v, plain xavier for the output.
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        return self.split_heads(self.k_proj(key)), self.split_heads(self.v_proj(value))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None,
               causal_offset: int | None = None, attn_mask: Tensor | None = None) -> Tensor:
        """q: (B, H, T, d) projected queries; k, v: (B, H, S, d). Returns (B, T, C) after out_proj.

        ``causal_offset``: query i sits at key position ``causal_offset + i`` and sees keys up to it.
        ``attn_mask``: bool (B, T, S), True where query t may see key s (per-query contexts, e.g. DisCo); every
        row needs at least one visible key.
        """
        t, s = q.size(2), k.size(2)
        mask = None
        is_causal = False
        if causal_offset is not None and not (t == 1 and causal_offset == s - 1):  # a last single query sees all
            if key_padding_mask is None and causal_offset == 0 and t == s:
                is_causal = True
            else:
                qpos = torch.arange(t, device=q.device).unsqueeze(1) + causal_offset
                mask = torch.arange(s, device=q.device).unsqueeze(0) <= qpos  # (T, S) True = attend
        if key_padding_mask is not None:
            keep = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, S)
            mask = keep if mask is None else (mask & keep)
        if attn_mask is not None:
            per_query = attn_mask.unsqueeze(1)  # (B, 1, T, S): the same context for every head
            mask = per_query if mask is None else (mask & per_query)
        with sdpa_kernel(CUDA_SDPA_BACKENDS) if q.is_cuda else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal
            )
        b = out.size(0)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, self.embed_dim))

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Tensor | None = None) -> Tensor:
        q = self.split_heads(self.q_proj(query))
        k, v = self.project_kv(key, value)
        return self.attend(q, k, v, key_padding_mask)
