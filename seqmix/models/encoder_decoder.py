"""Encoder-decoder backbone built from shared blocks; the mixer is injected as a factory.

Hydra builds it from ``conf/model/*.yaml``: ``encoder.mixer`` / ``decoder.mixer`` are partially
instantiated mixer classes, called here with ``embed_dim``, ``causal`` and ``layer_idx``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.nn.functional as F
from torch import Tensor, nn

from seqmix.mixers.base import MixerState, index_select_batch
from seqmix.models.blocks import Block, BlockState
from seqmix.models.embeddings import PositionalEmbedding, token_embedding


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied embeddings count once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@dataclass
class EncoderOut:
    out: Tensor  # (B, S, C)
    padding_mask: Tensor  # (B, S) True at pads
    embedded: Tensor | None = None  # token+position embeddings (B, S, C), for models that attend to them
    # per decoder layer, cross-attention keys/values (B, H, S, d) projected once for decoders that run many passes
    cross_kv: list[tuple[Tensor, Tensor]] | None = None

    def index_select(self, index: Tensor) -> EncoderOut:
        return EncoderOut(
            self.out.index_select(0, index),
            self.padding_mask.index_select(0, index),
            index_select_batch(self.embedded, index),
            None if self.cross_kv is None else [(k.index_select(0, index), v.index_select(0, index))
                                                for k, v in self.cross_kv],
        )


@dataclass
class DecoderState(MixerState):
    """Per-block caches plus the number of target steps already decoded (for positions)."""

    blocks: list[BlockState] = field(default_factory=list)
    step: int = 0

    def reorder(self, index: Tensor) -> None:
        for block in self.blocks:
            block.reorder(index)


def _stack_settings(settings: dict) -> dict:
    known = {"layers", "ffn_dim", "mixer", "normalize_before", "activation", "activation_dropout",
             "attention_dropout", "cross_attention_heads"}
    unknown = set(settings) - known
    if unknown:
        raise ValueError(f"unknown encoder/decoder settings {sorted(unknown)}; known: {sorted(known)}")
    return settings


class Stack(nn.Module):
    """Embeddings → dropout → N blocks → final norm (pre-norm only). Shared by encoder, decoder and LM."""

    def __init__(self, embed_tokens: nn.Embedding, max_positions: int, positions: str, dropout: float,
                 scale_embedding: bool, layers: int, ffn_dim: int, mixer: Callable, causal: bool,
                 normalize_before: bool = False, activation: str = "relu", activation_dropout: float = 0.0,
                 attention_dropout: float = 0.0, cross_attention_heads: int | None = None) -> None:
        super().__init__()
        embed_dim = embed_tokens.embedding_dim
        self.padding_idx = embed_tokens.padding_idx
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(embed_dim) if scale_embedding else 1.0
        self.embed_positions = PositionalEmbedding(max_positions, embed_dim, self.padding_idx, positions)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            Block(embed_dim, mixer(embed_dim=embed_dim, causal=causal, layer_idx=i), ffn_dim, dropout=dropout,
                  activation=activation, activation_dropout=activation_dropout,
                  normalize_before=normalize_before, cross_attention_heads=cross_attention_heads,
                  attention_dropout=attention_dropout)
            for i in range(layers)
        )
        self.layer_norm = nn.LayerNorm(embed_dim) if normalize_before else None

    def embed(self, tokens: Tensor, offset: int = 0) -> Tensor:
        x = self.embed_scale * self.embed_tokens(tokens)
        x = x + self.embed_positions(tokens, offset).to(x.dtype)
        return self.dropout(x)

    def finish(self, x: Tensor) -> Tensor:
        return x if self.layer_norm is None else self.layer_norm(x)

    def forward(self, tokens: Tensor, state: DecoderState | None = None, encoder_out: Tensor | None = None,
                encoder_padding_mask: Tensor | None = None) -> Tensor:
        """Causal pass of a decoder stack (B, T, C), shared by EncoderDecoder and DecoderOnly. With ``state``,
        ``tokens`` holds only the new step(s) and positions continue from ``state.step``."""
        offset = 0 if state is None else state.step
        x = self.embed(tokens, offset)
        padding_mask = tokens.eq(self.padding_idx) if state is None else None
        if padding_mask is not None and not padding_mask.any():
            padding_mask = None
        for i, layer in enumerate(self.layers):
            x = layer(x, key_padding_mask=padding_mask, encoder_out=encoder_out,
                      encoder_padding_mask=encoder_padding_mask, state=None if state is None else state.blocks[i])
        if state is not None:
            state.step += tokens.size(1)
        return self.finish(x)


class EncoderDecoder(nn.Module):
    """Transformer-shaped encoder-decoder whose self-attention is any token mixer."""

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, padding_idx: int, embed_dim: int,
                 encoder: dict, decoder: dict, dropout: float = 0.1, positions: str = "sinusoidal",
                 max_source_positions: int = 1024, max_target_positions: int = 1024,
                 share_all_embeddings: bool = False, share_decoder_input_output_embed: bool = True,
                 scale_embedding: bool = True, name: str | None = None) -> None:
        super().__init__()
        self.name = name
        self.padding_idx = padding_idx
        enc_settings, dec_settings = _stack_settings(dict(encoder)), _stack_settings(dict(decoder))
        enc_embed = token_embedding(src_vocab_size, embed_dim, padding_idx)
        if share_all_embeddings:
            if src_vocab_size != tgt_vocab_size:
                raise ValueError("share_all_embeddings needs one joint vocabulary (task.tokenizer.joint=true)")
            dec_embed = enc_embed
        else:
            dec_embed = token_embedding(tgt_vocab_size, embed_dim, padding_idx)
        dec_settings.setdefault("cross_attention_heads", 8)
        enc_settings.pop("cross_attention_heads", None)
        common = dict(positions=positions, dropout=dropout, scale_embedding=scale_embedding)
        self.encoder = Stack(enc_embed, max_source_positions, causal=False, **common, **enc_settings)
        self.decoder = Stack(dec_embed, max_target_positions, causal=True, **common, **dec_settings)
        if share_decoder_input_output_embed:
            self.output_projection = None
        else:
            self.output_projection = nn.Linear(embed_dim, tgt_vocab_size, bias=False)
            nn.init.normal_(self.output_projection.weight, mean=0.0, std=embed_dim**-0.5)
        self.max_source_positions = max_source_positions
        self.max_target_positions = max_target_positions

    # --- encoder -------------------------------------------------------------------------------
    def encode(self, src_tokens: Tensor) -> EncoderOut:
        enc = self.encoder
        padding_mask = src_tokens.eq(self.padding_idx)
        x = enc.embed(src_tokens)
        embedded = x
        x = x.masked_fill(padding_mask.unsqueeze(-1), 0.0)
        mask = padding_mask if padding_mask.any() else None
        for layer in enc.layers:
            x = layer(x, key_padding_mask=mask)
        return EncoderOut(enc.finish(x), padding_mask, embedded)

    # --- decoder -------------------------------------------------------------------------------
    def init_decoder_state(self, encoder_out: EncoderOut) -> DecoderState:
        return DecoderState(blocks=[layer.init_state() for layer in self.decoder.layers])

    def decode(self, prev_output_tokens: Tensor, encoder_out: EncoderOut, state: DecoderState | None = None) -> Tensor:
        """Logits (B, T, V). With ``state``, ``prev_output_tokens`` holds only the new step(s)."""
        enc_mask = encoder_out.padding_mask if encoder_out.padding_mask.any() else None
        return self.output_layer(self.decoder(prev_output_tokens, state, encoder_out.out, enc_mask))

    def output_layer(self, x: Tensor) -> Tensor:
        if self.output_projection is None:
            return F.linear(x, self.decoder.embed_tokens.weight)
        return self.output_projection(x)

    def forward(self, src_tokens: Tensor, prev_output_tokens: Tensor) -> Tensor:
        return self.decode(prev_output_tokens, self.encode(src_tokens))
