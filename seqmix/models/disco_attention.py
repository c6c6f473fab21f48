"""DisCo self-attention (Kasai et al. 2020): each query sees only its own observed set of target tokens.

Keys and values come from the decontextualized target embeddings (token + position, the same tensor for every
layer), never from the previous layer's output: otherwise information could flow around a cycle of observed
sets (n sees m, m sees n) and leak a token into its own prediction. Queries are the previous layer's output.
The per-query mask goes through the shared ``MultiheadAttention`` (SDPA with a boolean mask).
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqmix.layers.attention import MultiheadAttention
from seqmix.mixers.base import MixerState, TokenMixer


class DisCoAttention(TokenMixer):
    """``y = mixer(x, key_padding_mask, context=E_tok[y] + P[y], observed=(B, T, T) bool)``.

    ``observed[b, n, m]`` is True when query n may see target token m; each row needs one visible key (DisCo
    models always make eos visible). Non-incremental: every position is predicted in parallel.
    """

    def __init__(self, embed_dim: int, num_heads: int, causal: bool = False, layer_idx: int = 0,
                 attention_dropout: float = 0.0, bias: bool = True) -> None:
        if causal:
            raise ValueError("DisCoAttention is a parallel (non-causal) mixer; its contexts come from `observed`")
        super().__init__(embed_dim, causal, layer_idx)
        self.attn = MultiheadAttention(embed_dim, num_heads, dropout=attention_dropout, bias=bias)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, state: MixerState | None = None,
                context: Tensor | None = None, observed: Tensor | None = None) -> Tensor:
        if state is not None:
            raise ValueError("DisCoAttention has no incremental state: it predicts every position at once")
        if context is None or observed is None:
            raise ValueError("DisCoAttention needs context= (token + position embeddings) and observed= (B, T, T)")
        attn = self.attn
        if not self.training:
            single = single_visible_key(observed, key_padding_mask)
            if single is not None:  # softmax over one key is 1: the output is that key's value, no scores needed
                picked = context.gather(1, single.unsqueeze(-1).expand(-1, -1, context.size(-1)))
                return attn.out_proj(attn.v_proj(picked))
        q = attn.split_heads(attn.q_proj(x))
        k, v = attn.project_kv(context, context)
        return attn.attend(q, k, v, key_padding_mask, attn_mask=observed)


def single_visible_key(observed: Tensor, key_padding_mask: Tensor | None) -> Tensor | None:
    """(B, T) index of each query's only visible key when every query sees exactly one (the first pass of
    iterative decoding observes eos alone), else None."""
    visible = observed if key_padding_mask is None else observed & ~key_padding_mask.unsqueeze(1)
    if not bool(visible.sum(dim=-1).eq(1).all()):
        return None
    return visible.to(torch.uint8).argmax(dim=-1)
