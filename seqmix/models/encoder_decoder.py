"""Encoder-decoder backbone: two `Stack`s of shared blocks; the mixers are injected as factories.

Hydra builds it from ``conf/model/*.yaml`` (backbone sizes) and the ``conf/mixer`` group (each side's mixer or
hybrid pattern); ``seqmix.models.stack`` turns a side's settings into layers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmix.errors import SeqmixError
from seqmix.layers.embeddings import token_embedding
from seqmix.layers.padding import padding_or_none
from seqmix.mixers.base import index_select_batch
from seqmix.models.stack import DecoderState, Stack, stack_settings

DECODER_STARTS = ("bos", "eos")
DEFAULT_DECODER_START = "eos"  # conf/model states the same; the constructors' default when built by hand


def check_joint_vocabulary(src_vocab_size: int, tgt_vocab_size: int) -> None:
    """share_all_embeddings ties one table to both sides: their vocabularies must be one."""
    if src_vocab_size != tgt_vocab_size:
        raise SeqmixError(f"share_all_embeddings needs one joint vocabulary, but the source has {src_vocab_size} "
                          f"symbols and the target {tgt_vocab_size} (seqmix's own data: task.tokenizer.joint=true)")


def check_decoder_start(decoder_start: str) -> str:
    """The first decoder input while training and decoding: ``eos`` (as fairseq trains its models, so every model
    exports to fairseq) or ``bos`` (what seqmix checkpoints written before the setting existed were trained with)."""
    if decoder_start not in DECODER_STARTS:
        raise SeqmixError(f"model.decoder_start must be one of {list(DECODER_STARTS)}, got {decoder_start!r}")
    return decoder_start


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
    # decoder rows served by each source row (consecutive rows b*group .. b*group+group-1): beam search's k
    # hypotheses of a sentence share its source instead of k copies of it (see EncoderDecoder.for_beams)
    group: int = 1

    def index_select(self, index: Tensor) -> EncoderOut:
        """Keep the source rows ``index`` (each still serving ``group`` decoder rows)."""
        return EncoderOut(
            self.out.index_select(0, index),
            self.padding_mask.index_select(0, index),
            index_select_batch(self.embedded, index),
            None if self.cross_kv is None else [(k.index_select(0, index), v.index_select(0, index))
                                                for k, v in self.cross_kv],
            self.group,
        )

    def ungrouped(self) -> EncoderOut:
        """One source row per decoder row (the copies a grouped output avoids)."""
        if self.group == 1:
            return self
        rows = torch.arange(self.out.size(0), device=self.out.device).repeat_interleave(self.group)
        return replace(self.index_select(rows), group=1)


class EncoderDecoder(nn.Module):
    """Transformer-shaped encoder-decoder whose self-attention is any token mixer."""

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, padding_idx: int, embed_dim: int,
                 encoder: dict, decoder: dict, dropout: float = 0.1, positions: str = "sinusoidal",
                 max_source_positions: int = 1024, max_target_positions: int = 1024,
                 share_all_embeddings: bool = False, share_decoder_input_output_embed: bool = True,
                 scale_embedding: bool = True, name: str | None = None, decoder_start: str = DEFAULT_DECODER_START) -> None:
        super().__init__()
        self.name = name
        self.decoder_start = check_decoder_start(decoder_start)
        self.padding_idx = padding_idx
        enc_settings, dec_settings = stack_settings(encoder, False), stack_settings(decoder, True)
        enc_embed = token_embedding(src_vocab_size, embed_dim, padding_idx)
        if share_all_embeddings:
            check_joint_vocabulary(src_vocab_size, tgt_vocab_size)
            dec_embed = enc_embed
        else:
            dec_embed = token_embedding(tgt_vocab_size, embed_dim, padding_idx)
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
        mask = padding_or_none(padding_mask)
        for layer in enc.layers:
            x = layer(x, key_padding_mask=mask)
        return EncoderOut(enc.finish(x), padding_mask, embedded)

    # --- decoder -------------------------------------------------------------------------------
    def for_beams(self, encoder_out: EncoderOut, beam_size: int) -> EncoderOut:
        """``encoder_out`` serving ``beam_size`` consecutive decoder rows per source without copying it: the
        cross-attention keys/values are then projected once per sentence, and beam reorders never move them."""
        return replace(encoder_out, group=encoder_out.group * beam_size)

    def init_decoder_state(self, encoder_out: EncoderOut) -> DecoderState:
        state = self.decoder.init_state()
        for block in state.blocks:
            block.group = encoder_out.group
        return state

    def decode(self, prev_output_tokens: Tensor, encoder_out: EncoderOut, state: DecoderState | None = None) -> Tensor:
        """Logits (B, T, V). With ``state``, ``prev_output_tokens`` holds only the new step(s)."""
        return self.output_layer(self.decode_features(prev_output_tokens, encoder_out, state))

    def decode_features(self, prev_output_tokens: Tensor, encoder_out: EncoderOut,
                        state: DecoderState | None = None) -> Tensor:
        """Decoder output (B, T, C) before the output projection, also for losses that fuse the projection
        (``seqmix.tasks.fused_loss``)."""
        if state is None:  # a full pass attends per decoder row; a stepping state knows the grouping
            encoder_out = encoder_out.ungrouped()
        enc_mask = padding_or_none(encoder_out.padding_mask)
        return self.decoder(prev_output_tokens, state, encoder_out.out, enc_mask)

    def output_weight(self) -> Tensor:
        """The (V, C) output projection: the tied target embedding or ``output_projection`` (no bias)."""
        if self.output_projection is None:
            return self.decoder.embed_tokens.weight
        return self.output_projection.weight

    def output_layer(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled():
            return F.linear(x, self.output_weight())
        return torch.matmul(x, self._output_weight_t())  # the same products (summed in another order at most)

    def _output_weight_t(self) -> Tensor:
        """The output projection as a contiguous (C, V) copy, for decoding: a decoder step's few rows times it are
        faster on CPU than ``F.linear`` on the (V, C) weight. Rebuilt whenever the weight is another
        tensor, another storage or was written in place (optimizer steps and ``load_state_dict`` bump its version
        counter), so it is never stale."""
        w = self.output_weight()
        src, version, cached = getattr(self, "_weight_t_cache", (None, None, None))
        if src is not w or version != (w.data_ptr(), w._version):
            cached = w.detach().t().contiguous()
            self._weight_t_cache = (w, (w.data_ptr(), w._version), cached)
        return cached

    def forward(self, src_tokens: Tensor, prev_output_tokens: Tensor) -> Tensor:
        return self.decode(prev_output_tokens, self.encode(src_tokens))
