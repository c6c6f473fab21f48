"""The stack of shared blocks behind every backbone (encoder, decoder, language model) and its layer layout.

A stack's token mixers come from its config: ``mixer`` (one mixer for every layer) or a hybrid ``pattern``
with a ``legend``, e.g. ``pattern: DDA`` and ``legend: {D: <dynamicconv>, A: <self_attention>}``: one legend
key per layer (a string of one-letter keys, or a list of keys). Each legend entry is a partially built mixer
from the ``conf/mixer`` group, called here with ``embed_dim``, ``causal`` (from the side, never the file),
``layer_idx`` (the layer's index in the stack, so per-layer lists such as kernel sizes keep working) and the
stack's ``heads`` when the mixer takes ``num_heads`` and its config does not set it.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import Tensor, nn

from seqmix.errors import SeqmixError
from seqmix.layers.dropout import Dropout
from seqmix.layers.embeddings import PositionalEmbedding
from seqmix.layers.padding import padding_or_none
from seqmix.mixers.base import MixerState, TokenMixer
from seqmix.models.blocks import Block, BlockState

_BLOCK_SETTINGS = {"layers", "ffn_dim", "normalize_before", "activation", "activation_dropout", "final_norm"}
_MIXER_SETTINGS = {"mixer", "pattern", "legend", "heads"}
_CROSS_SETTINGS = {"attention_dropout", "cross_attention_heads"}


@dataclass
class DecoderState(MixerState):
    """Per-block caches plus the number of target steps already decoded (for positions)."""

    blocks: list[BlockState] = field(default_factory=list)
    step: int = 0

    def reorder(self, index: Tensor) -> None:
        for block in self.blocks:
            block.reorder(index)


def stack_settings(settings: dict, cross_attention: bool) -> dict:
    """A side's config checked against what a stack takes; cross-attention settings only where it attends."""
    settings = dict(settings)
    known = _BLOCK_SETTINGS | _MIXER_SETTINGS | _CROSS_SETTINGS
    unknown = set(settings) - known
    if unknown:
        raise SeqmixError(f"unknown encoder/decoder settings {sorted(unknown)}; known: {sorted(known)}")
    layers = settings.get("layers")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise SeqmixError(f"model.<encoder|decoder>.layers={layers!r}: a stack of shared blocks needs a whole number of "
                          "layers >= 1 (a list of [width, kernel] per layer is ConvS2S's format)")
    if cross_attention:
        settings.setdefault("cross_attention_heads", settings.get("heads") or 8)
    else:
        for key in _CROSS_SETTINGS:
            settings.pop(key, None)
    return settings


def layer_keys(layers: int, pattern: str | Sequence[str] | None, legend: dict | None) -> list[str] | None:
    """The legend key of every layer, or None for a single-mixer stack; a pattern that does not fit is an error."""
    if pattern is None:
        return None
    keys = list(pattern)
    if len(keys) != layers:
        raise SeqmixError(f"mixer pattern {pattern!r} has {len(keys)} entries for {layers} layers: give one per layer")
    missing = sorted(set(keys) - set(legend or {}))
    if missing:
        raise SeqmixError(f"mixer pattern {pattern!r} uses {missing}, which the legend does not define "
                          f"(legend keys: {sorted(legend or {})})")
    return keys


def layer_mixer_configs(settings: dict) -> list:
    """The mixer (config or factory) of every layer of a stack's settings, in layer order."""
    keys = layer_keys(settings["layers"], settings.get("pattern"), settings.get("legend"))
    if keys is None:
        if settings.get("mixer") is None:
            raise SeqmixError("a stack needs a mixer (model.<side>.mixer) or a pattern with a legend")
        return [settings["mixer"]] * settings["layers"]
    return [settings["legend"][k] for k in keys]


def build_mixer(factory: Callable[..., TokenMixer], embed_dim: int, causal: bool, layer_idx: int,
                heads: int | None) -> TokenMixer:
    """Call a mixer factory with what the stack decides; the mixer config's own ``num_heads`` wins over ``heads``."""
    kwargs = {"embed_dim": embed_dim, "causal": causal, "layer_idx": layer_idx}
    preset = getattr(factory, "keywords", {}) or {}
    try:
        if heads is not None and "num_heads" not in preset and "num_heads" in inspect.signature(factory).parameters:
            kwargs["num_heads"] = heads
        return factory(**kwargs)
    except (TypeError, ValueError) as err:  # an option of another mixer left in the config, e.g. after mixer=...
        func = getattr(factory, "func", factory)
        foreign = sorted(set(preset) - set(inspect.signature(func).parameters)) or err
        raise SeqmixError(f"mixer {getattr(func, '__name__', func)} does not take {foreign}: remove it from "
                          "model.<side>.mixer (each mixer's options: conf/mixer/<name>.yaml)") from err


class Stack(nn.Module):
    """Embeddings → dropout → N blocks → final norm (pre-norm, unless ``final_norm=False``). Shared by encoder, decoder
    and LM."""

    def __init__(self, embed_tokens: nn.Embedding, max_positions: int, positions: str, dropout: float,
                 scale_embedding: bool, layers: int, ffn_dim: int, causal: bool, mixer: Callable | None = None,
                 pattern: str | Sequence[str] | None = None, legend: dict | None = None, heads: int | None = None,
                 normalize_before: bool = False, activation: str = "relu", activation_dropout: float = 0.0,
                 attention_dropout: float = 0.0, cross_attention_heads: int | None = None,
                 final_norm: bool = True) -> None:
        super().__init__()
        embed_dim = embed_tokens.embedding_dim
        self.padding_idx = embed_tokens.padding_idx
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(embed_dim) if scale_embedding else 1.0
        self.embed_positions = PositionalEmbedding(max_positions, embed_dim, self.padding_idx, positions)
        self.dropout = Dropout(dropout)
        self.causal = causal
        self.pattern = None if pattern is None else list(pattern)
        factories = layer_mixer_configs({"layers": layers, "mixer": mixer, "pattern": pattern, "legend": legend})
        self.layers = nn.ModuleList(
            Block(embed_dim, build_mixer(factory, embed_dim, causal, i, heads), ffn_dim, dropout=dropout,
                  activation=activation, activation_dropout=activation_dropout,
                  normalize_before=normalize_before, cross_attention_heads=cross_attention_heads,
                  attention_dropout=attention_dropout)
            for i, factory in enumerate(factories)
        )
        # a pre-norm stack ends in a LayerNorm unless final_norm=false (fairseq's no_decoder_final_norm, the layout of
        # its wiki103/gbw language models and of every lightconv_lm); a post-norm stack's last block already normalized
        self.layer_norm = nn.LayerNorm(embed_dim) if normalize_before and final_norm else None

    def embed(self, tokens: Tensor, offset: int = 0) -> Tensor:
        x = self.embed_scale * self.embed_tokens(tokens)
        x = x + self.embed_positions(tokens, offset).to(x.dtype)
        return self.dropout(x)

    def finish(self, x: Tensor) -> Tensor:
        return x if self.layer_norm is None else self.layer_norm(x)

    def init_state(self) -> DecoderState:
        return DecoderState(blocks=[layer.init_state() for layer in self.layers])

    def forward(self, tokens: Tensor, state: DecoderState | None = None, encoder_out: Tensor | None = None,
                encoder_padding_mask: Tensor | None = None) -> Tensor:
        """Pass of a decoder stack (B, T, C), shared by EncoderDecoder, DecoderOnly and CMLM. With ``state``,
        ``tokens`` holds only the new step(s) and positions continue from ``state.step``.

        A causal stack takes no padding mask: decoder inputs are right-padded (every collate pads on the right),
        and a causal mixer's output at a real position reads only earlier positions, all real, so masking would
        change only the outputs at pads, which no loss reads (fairseq's decoders likewise). Without a mask,
        attention keeps ``is_causal`` (flash kernels on GPUs) and nothing reads the mask back to the host.
        A non-causal stack (CMLM's decoder) reads later positions too, pads included: it always gets the mask."""
        offset = 0 if state is None else state.step
        x = self.embed(tokens, offset)
        mask = None if self.causal else padding_or_none(tokens.eq(self.padding_idx))
        for i, layer in enumerate(self.layers):
            x = layer(x, key_padding_mask=mask, encoder_out=encoder_out,
                      encoder_padding_mask=encoder_padding_mask, state=None if state is None else state.blocks[i])
        if state is not None:
            state.step += tokens.size(1)
        return self.finish(x)
