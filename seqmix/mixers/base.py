"""The token-mixer protocol every mixer implements (see ARCHITECTURE.md).

    y = mixer(x, key_padding_mask=None, state=None)     # x, y: (batch, time, channels)

A mixer owns its projections and its incremental-decoding cache; the block around it (norms, residuals,
dropout, FFN, cross-attention) is shared code in ``seqmix.models.blocks``.
"""

from __future__ import annotations

from abc import ABC, ABCMeta, abstractmethod
from dataclasses import dataclass

from torch import Tensor, nn


class MixerState(ABC):
    """Incremental-decoding cache of one mixer layer; beam search reorders it along the batch axis."""

    @abstractmethod
    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` (in that order)."""


@dataclass
class WindowState(MixerState):
    """The last K−1 inputs of a convolution over time (zeros before the sequence starts): the decoder's cache of the
    group's convolution mixers and of ConvS2S's GLU convolutions."""

    window: Tensor | None = None

    def reorder(self, index: Tensor) -> None:
        self.window = index_select_batch(self.window, index)


class TokenMixer(nn.Module, metaclass=ABCMeta):
    """Base class: mixes information along time; causal mixers see only the past.

    Constructor arguments shared by every mixer: ``embed_dim``, ``causal``, ``layer_idx`` (lets a mixer
    pick a per-layer setting such as a kernel size from a list), and ``num_heads`` for mixers with heads (the
    stack passes its ``heads`` unless the mixer's config sets it). A mixer is registered by a ``conf/mixer``
    file; nothing else lists mixers.
    """

    state_class: type[MixerState] | None = None  # the cache step-by-step decoding fills; None: no such decoding
    # True when language models built from this mixer need pre-norm blocks (they diverge post-norm)
    language_model_pre_norm: bool = False

    def __init__(self, embed_dim: int, causal: bool = False, layer_idx: int = 0) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.causal = causal
        self.layer_idx = layer_idx

    def init_state(self) -> MixerState:
        """An empty ``state_class`` cache for step-by-step decoding, which only a causal mixer can do."""
        if self.state_class is None:
            raise NotImplementedError(f"{type(self).__name__} does not support incremental decoding")
        if not self.causal:
            raise NotImplementedError("incremental decoding needs a causal mixer")
        return self.state_class()

    @abstractmethod
    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, state: MixerState | None = None) -> Tensor:
        """(B, T, C) → (B, T, C); with ``state``, ``x`` holds only the new step(s) of a causal mixer."""

    def mixing_weights(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor | None:
        """What the mixer does to ``x`` (the input ``forward`` takes) as weights: (B, H, T, T), how much output
        step t takes from step s per head, as in Wu et al. 2019's figures; pictured on the run's dashboard
        (``seqmix.training.dashboard``). None: the mixer's mixing is not a weighted sum over steps."""
        return None


def check_incremental_call(mixer: TokenMixer, x: Tensor, state: MixerState | None) -> None:
    """Incremental calls only make sense for causal mixers; say so instead of returning garbage."""
    if state is not None and not mixer.causal:
        raise ValueError(f"{type(mixer).__name__}: incremental state is only valid for causal (decoder) mixers")
    if x.dim() != 3:
        raise ValueError(f"mixers take (batch, time, channels) input, got shape {tuple(x.shape)}")


def zero_padding(x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """Set padded positions to zero so that pad content cannot leak into neighbours."""
    if key_padding_mask is None:
        return x
    return x.masked_fill(key_padding_mask.unsqueeze(-1), 0.0)


def index_select_batch(t: Tensor | None, index: Tensor) -> Tensor | None:
    return None if t is None else t.index_select(0, index.to(t.device))


