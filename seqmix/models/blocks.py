"""The block shared by every mixer: mixer + FFN (+ cross-attention), residuals, norms, dropout."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from seqmix.errors import SeqmixError
from seqmix.layers.attention import MultiheadAttention
from seqmix.layers.dropout import Dropout
from seqmix.mixers.base import MixerState, TokenMixer, index_select_batch

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}


def activation_fn(name: str) -> Callable[[Tensor], Tensor]:
    if name not in ACTIVATIONS:
        raise SeqmixError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class FeedForward(nn.Module):
    """fc1 → activation → activation dropout → fc2 (fairseq names)."""

    def __init__(self, embed_dim: int, ffn_dim: int, activation: str = "relu", activation_dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.activation = activation_fn(activation)
        self.activation_dropout = Dropout(activation_dropout)
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.zeros_(fc.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.activation_dropout(self.activation(self.fc1(x))))


class Residual(nn.Module):
    """x + dropout(f(norm(x))) for pre-norm, norm(x + dropout(f(x))) for post-norm."""

    def __init__(self, embed_dim: int, dropout: float, normalize_before: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(embed_dim)
        self.dropout = Dropout(dropout)
        self.normalize_before = normalize_before

    def forward(self, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        if self.normalize_before:
            return x + self.dropout(fn(self.norm(x)))
        return self.norm(x + self.dropout(fn(x)))


@dataclass
class BlockState(MixerState):
    """One decoder block's cache: its mixer's state and the cross-attention keys/values of the source, one
    row per source that serves ``group`` consecutive decoder rows (beam search's hypotheses of a sentence)."""

    mixer: MixerState
    cross_k: Tensor | None = None
    cross_v: Tensor | None = None
    group: int = 1

    def reorder(self, index: Tensor) -> None:
        """Keep decoder rows ``index``. Grouped: a reorder that keeps the row count must keep every row in its
        sentence's group (beam search's do), so the sources stay; one that drops rows keeps whole groups."""
        self.mixer.reorder(index)
        if self.cross_k is None or (self.group > 1 and index.numel() == self.cross_k.size(0) * self.group):
            return
        sources = index if self.group == 1 else index.view(-1, self.group)[:, 0].div(self.group, rounding_mode="floor")
        self.cross_k = index_select_batch(self.cross_k, sources)
        self.cross_v = index_select_batch(self.cross_v, sources)


class Block(nn.Module):
    """mixer sublayer [→ cross-attention sublayer] → FFN sublayer. The mixer is the only varying part."""

    def __init__(self, embed_dim: int, mixer: TokenMixer, ffn_dim: int, dropout: float = 0.1,
                 activation: str = "relu", activation_dropout: float = 0.0, normalize_before: bool = False,
                 cross_attention_heads: int | None = None, attention_dropout: float = 0.0) -> None:
        super().__init__()
        self.mixer = mixer
        self.mixer_residual = Residual(embed_dim, dropout, normalize_before)
        self.cross_attn = None
        if cross_attention_heads:
            self.cross_attn = MultiheadAttention(embed_dim, cross_attention_heads, dropout=attention_dropout)
            self.cross_residual = Residual(embed_dim, dropout, normalize_before)
        self.ffn = FeedForward(embed_dim, ffn_dim, activation, activation_dropout)
        self.ffn_residual = Residual(embed_dim, dropout, normalize_before)

    def init_state(self) -> BlockState:
        return BlockState(mixer=self.mixer.init_state())

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, encoder_out: Tensor | None = None,
                encoder_padding_mask: Tensor | None = None, state: BlockState | None = None, **mixer_inputs) -> Tensor:
        """``mixer_inputs``: extra keyword inputs for mixers that need more than ``x`` (DisCo's keys and contexts)."""
        x = self.mixer_residual(
            x, lambda h: self.mixer(h, key_padding_mask=key_padding_mask, state=None if state is None else state.mixer,
                                    **mixer_inputs)
        )
        if self.cross_attn is not None:
            x = self.cross_residual(x, lambda h: self._cross_attend(h, encoder_out, encoder_padding_mask, state))
        return self.ffn_residual(x, self.ffn)

    def _cross_attend(self, h: Tensor, encoder_out: Tensor, encoder_padding_mask: Tensor | None,
                      state: BlockState | None) -> Tensor:
        attn = self.cross_attn
        if state is not None and state.cross_k is not None:
            k, v = state.cross_k, state.cross_v
        else:
            k, v = attn.project_kv(encoder_out, encoder_out)
            if state is not None:  # the source never changes while decoding: project it once
                state.cross_k, state.cross_v = k, v
        rows, t, channels = h.shape
        group = 1 if state is None else state.group
        # the group's queries side by side: one (group * T) x S attention per source instead of group copies
        q = attn.split_heads(attn.q_proj(h).view(rows // group, group * t, channels))
        return attn.attend(q, k, v, encoder_padding_mask).view(rows, t, channels)
