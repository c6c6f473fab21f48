"""Non-autoregressive translation backbones: the DisCo transformer (Kasai et al. 2020) and the conditional masked
LM (CMLM, Ghazvininejad et al. 2019), on the shared ``Stack``, ``Block`` and attention.

Both share the encoder with a LENGTH token (its own embedding, no position) prepended to the source; its output
predicts the target length (eos included) against a length embedding table. One embedding table serves source,
target and output (joint vocabulary). Everything is initialised N(0, 0.02) with zero biases, as in the paper.

A decoder pass is ``predict(tokens, encoder_out, observed)``: ``tokens`` (B, T) hold a candidate (real tokens,
eos, pads); ``observed`` is either per query (B, T, T) or shared by every query (B, T). eos is always visible.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmix.errors import SeqmixError
from seqmix.layers.padding import padding_or_none
from seqmix.models.blocks import BlockState
from seqmix.models.encoder_decoder import EncoderOut
from seqmix.models.nat_masks import cmlm_masked, disco_observed, real_positions
from seqmix.models.stack import Stack, stack_settings


def init_nat_params(module: nn.Module) -> None:
    """N(0, 0.02) for every linear and embedding weight, zero biases and pad rows (BERT-style, paper §4)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()


class NATModel(nn.Module):
    """Encoder + length prediction + a parallel decoder (subclasses); see the module docstring."""

    per_query_contexts = False  # True when queries may observe different tokens in one pass (DisCo)
    extra_symbols = 0  # vocabulary rows beyond the tokenizer's (CMLM's mask symbol)

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, padding_idx: int, embed_dim: int, encoder: dict,
                 decoder: dict, dropout: float = 0.1, positions: str = "learned",
                 max_source_positions: int = 256, max_target_positions: int = 256, scale_embedding: bool = False,
                 eos_idx: int = 2, bos_idx: int = 0, unk_idx: int = 3, name: str | None = None) -> None:
        super().__init__()
        if src_vocab_size != tgt_vocab_size:
            raise SeqmixError("non-autoregressive models share one embedding table: use a joint vocabulary")
        self.name = name
        self.padding_idx, self.eos, self.bos, self.unk = padding_idx, eos_idx, bos_idx, unk_idx
        self.vocab_size = tgt_vocab_size + self.extra_symbols
        self.embed_tokens = nn.Embedding(self.vocab_size, embed_dim, padding_idx=padding_idx)
        enc_settings, dec_settings = stack_settings(encoder, False), stack_settings(decoder, True)
        common = dict(positions=positions, dropout=dropout, scale_embedding=scale_embedding)
        self.encoder = Stack(self.embed_tokens, max_source_positions, causal=False, **common, **enc_settings)
        self.decoder = Stack(self.embed_tokens, max_target_positions, causal=False, **common, **dec_settings)
        self.length_token = nn.Parameter(torch.empty(embed_dim))
        self.length_embed = nn.Embedding(max_target_positions + 1, embed_dim)  # class = length incl. eos
        self.max_source_positions = max_source_positions
        self.max_target_positions = max_target_positions
        init_nat_params(self)
        nn.init.normal_(self.length_token, mean=0.0, std=0.02)

    # --- encoder and length ----------------------------------------------------------------------------------
    def encode(self, src_tokens: Tensor) -> tuple[EncoderOut, Tensor]:
        """(encoder output over the source tokens, length logits (B, max_target_positions + 1))."""
        enc = self.encoder
        padding_mask = src_tokens.eq(self.padding_idx)
        x = enc.embed(src_tokens).masked_fill(padding_mask.unsqueeze(-1), 0.0)
        length = enc.dropout(self.length_token.to(x.dtype)).expand(x.size(0), 1, -1)
        x = torch.cat([length, x], dim=1)
        mask = torch.cat([padding_mask.new_zeros(x.size(0), 1), padding_mask], dim=1)
        for layer in enc.layers:
            x = layer(x, key_padding_mask=padding_or_none(mask))
        x = enc.finish(x)
        length_logits = F.linear(x[:, 0], self.length_embed.weight)
        no_tokens = torch.zeros_like(length_logits[0], dtype=torch.bool)
        no_tokens[0] = True  # a target always holds at least its eos
        length_logits = length_logits.masked_fill(no_tokens, float("-inf"))
        return EncoderOut(x[:, 1:], padding_mask), length_logits

    def length_targets(self, target: Tensor) -> Tensor:
        return target.ne(self.padding_idx).sum(dim=1).clamp(max=self.max_target_positions)

    # --- decoder ---------------------------------------------------------------------------------------------
    def banned_tokens(self) -> list[int]:
        """Symbols a decoder must never output inside a translation."""
        return [self.bos, self.padding_idx, self.eos, *range(self.vocab_size - self.extra_symbols, self.vocab_size)]

    def training_context(self, target: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(observed, scored positions (B, T)) for one training batch."""
        raise NotImplementedError

    def predict(self, tokens: Tensor, encoder_out: EncoderOut, observed: Tensor) -> Tensor:
        """Logits (B, T, V) of every position given its observed tokens."""
        raise NotImplementedError

    def forward(self, src_tokens: Tensor, tokens: Tensor, observed: Tensor) -> tuple[Tensor, Tensor]:
        encoder_out, length_logits = self.encode(src_tokens)
        return self.predict(tokens, encoder_out, observed), length_logits

    def output_layer(self, x: Tensor) -> Tensor:
        return F.linear(x, self.embed_tokens.weight)

    def _encoder_mask(self, encoder_out: EncoderOut) -> Tensor | None:
        return padding_or_none(encoder_out.padding_mask)


class DisCoTransformer(NATModel):
    """DisCo decoder: keys/values of every layer's self-attention are ``E_tok[y] + P[y]`` (one tensor, each layer
    projecting it itself); the first layer's queries are ``P[y]`` alone, later ones the previous layer's output;
    query n attends only to its observed set. Cross-attention and FFN are the shared block's."""

    per_query_contexts = True

    def training_context(self, target: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        return (disco_observed(target, self.padding_idx, self.eos, generator),
                real_positions(target, self.padding_idx, self.eos))

    def with_cross_cache(self, encoder_out: EncoderOut) -> EncoderOut:
        """``encoder_out`` with every decoder layer's cross-attention keys/values, projected once: iterative
        decoding then skips that projection in each pass (it rides along ``index_select``)."""
        kv = [layer.cross_attn.project_kv(encoder_out.out, encoder_out.out) for layer in self.decoder.layers]
        return dataclasses.replace(encoder_out, cross_kv=kv)

    def per_query_observed(self, tokens: Tensor, observed: Tensor) -> Tensor:
        """(B, T, T) contexts: a shared (B, T) set is seen by every query except at its own position; eos always."""
        if observed.dim() == 2:
            eye = torch.eye(tokens.size(1), dtype=torch.bool, device=tokens.device)
            observed = observed.unsqueeze(1) & ~eye
        return observed | tokens.eq(self.eos).unsqueeze(1)

    def predict(self, tokens: Tensor, encoder_out: EncoderOut, observed: Tensor, queries: Tensor | None = None
                ) -> Tensor:
        """``queries`` (B, Q): predict only these positions (logits (B, Q, V)). Exact, because a DisCo query never
        reads another query's hidden state: its keys/values are the embeddings of its observed tokens.

        Grouped: ``tokens`` (S, g, T) are g candidate rows of each of the S sources of ``encoder_out``, with
        ``observed`` (S, g, T, T) or (S, g, T), and ``queries`` (S, Q) index the g * T slots of a source. The
        rows' contexts become one sequence of g * T keys, each query masked to its own row's observed set, so a
        source's queries share one pass (no padding to the busiest row) and one cross-attention over the source
        (no copy of it per candidate)."""
        dec = self.decoder
        grouped = tokens.dim() == 3
        rows = tokens.flatten(0, 1) if grouped else tokens
        padding_mask = rows.eq(self.padding_idx)
        positions = dec.embed_positions(rows)
        context = dec.dropout(dec.embed_scale * dec.embed_tokens(rows) + positions)
        observed = self.per_query_observed(rows, observed.flatten(0, 1) if grouped else observed)
        if grouped:
            s, g, t = tokens.shape
            positions, context = positions.reshape(s, g * t, -1), context.reshape(s, g * t, -1)
            padding_mask = padding_mask.reshape(s, g * t)
            observed = block_diagonal(observed.view(s, g, t, t))
        if queries is not None:
            positions = positions.gather(1, queries.unsqueeze(-1).expand(-1, -1, positions.size(-1)))
            observed = observed.gather(1, queries.unsqueeze(-1).expand(-1, -1, observed.size(-1)))
        x = dec.dropout(positions)
        kpm = padding_or_none(padding_mask)
        enc_mask = self._encoder_mask(encoder_out)
        cached = encoder_out.cross_kv or [(None, None)] * len(dec.layers)
        for layer, (cross_k, cross_v) in zip(dec.layers, cached):
            state = None if cross_k is None else BlockState(mixer=None, cross_k=cross_k, cross_v=cross_v)
            x = layer(x, key_padding_mask=kpm, encoder_out=encoder_out.out, encoder_padding_mask=enc_mask,
                      state=state, context=context, observed=observed)
        return self.output_layer(dec.finish(x))


def block_diagonal(observed: Tensor) -> Tensor:
    """(S, g, T, T) per-row observed sets -> (S, g*T, g*T): slot (i, n) sees slot (j, m) iff i == j and n sees m."""
    s, g, t, _ = observed.shape
    same_row = torch.eye(g, dtype=torch.bool, device=observed.device).view(1, g, 1, g, 1)
    return (observed.unsqueeze(3) & same_row).reshape(s, g * t, g * t)


class CMLMTransformer(NATModel):
    """CMLM decoder: a standard (unmasked self-attention) decoder over the target with unobserved real tokens
    replaced by a mask symbol (an extra vocabulary row). Contexts are shared by every query."""

    extra_symbols = 1

    @property
    def mask_idx(self) -> int:
        return self.vocab_size - 1

    def training_context(self, target: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        masked = cmlm_masked(target, self.padding_idx, self.eos, generator)
        return ~masked, masked

    def predict(self, tokens: Tensor, encoder_out: EncoderOut, observed: Tensor) -> Tensor:
        if observed.dim() != 2:
            raise ValueError("a CMLM conditions every position on the same observed tokens: pass observed (B, T); "
                             "per-query contexts (easy-first decoding) need model=disco")
        hidden = ~observed & real_positions(tokens, self.padding_idx, self.eos)
        inputs = tokens.masked_fill(hidden, self.mask_idx)
        enc_mask = self._encoder_mask(encoder_out)
        return self.output_layer(self.decoder(inputs, encoder_out=encoder_out.out, encoder_padding_mask=enc_mask))

