"""ConvS2S (Gehring et al. 2017): an encoder and a decoder of gated convolutions, multi-step attention.

Every scaling in here keeps the variance of activations roughly constant through a deep stack of
un-normalized layers (paper §3.4, appendix A): residual sums are multiplied by √0.5, the attention's
conditional input by m·√(1/m), and weights start at the variances derived for GLU layers behind dropout.
fairseq's ``fconv`` fixes what the paper leaves open (order of dropout/masking, where the gradient scaling
sits, the output projections); this module follows it there, with positions counted as in
``seqmix.layers.embeddings`` (right padding, pads at position ``padding_idx``).

Layer specs are lists of ``(width, kernel)`` or ``(width, kernel, residual lookback)``: lookback r adds the
output of the block r steps back (1 = this block's input, 0 = no residual), projected when widths differ.

The decoder implements the same interface as :class:`~seqmix.models.EncoderDecoder` (``encode``,
``init_decoder_state``, ``decode`` with a state, ``state.reorder``), so beam search and the tasks use it as is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from seqmix.errors import SeqmixError
from seqmix.layers.dropout import dropout
from seqmix.layers.embeddings import PositionalEmbedding
from seqmix.layers.padding import padding_or_none
from seqmix.mixers.base import WindowState, zero_padding
from seqmix.models.encoder_decoder import (
    DEFAULT_DECODER_START,
    EncoderOut,
    check_decoder_start,
    check_joint_vocabulary,
)
from seqmix.models.glu_conv import SQRT_HALF, GLUConv
from seqmix.models.stack import DecoderState

EMBED_STD = 0.1  # §3.5: every embedding (tokens and positions) starts at N(0, 0.1)


@dataclass(frozen=True)
class LayerSpec:
    width: int
    kernel: int
    lookback: int = 1


def parse_layers(layers: Sequence, where: str) -> list[LayerSpec]:
    """``[[512, 3], [1024, 3, 2], ...]`` → specs, with one message naming the bad entry."""
    if not layers:
        raise SeqmixError(f"{where}.layers is empty; give a list of [width, kernel] or [width, kernel, lookback]")
    specs = []
    for i, entry in enumerate(layers):
        values = list(entry) if isinstance(entry, Sequence) and not isinstance(entry, str) else None
        if values is None or len(values) not in (2, 3) or not all(isinstance(v, int) for v in values):
            raise SeqmixError(f"{where}.layers[{i}] = {entry!r}: expected [width, kernel] or "
                             "[width, kernel, residual lookback] (integers)")
        spec = LayerSpec(*values)
        if spec.width < 1 or spec.kernel < 1:
            raise SeqmixError(f"{where}.layers[{i}] = {entry!r}: width and kernel must be >= 1")
        if not 0 <= spec.lookback <= i + 1:
            raise SeqmixError(f"{where}.layers[{i}] = {entry!r}: residual lookback must be in 0..{i + 1} "
                             "(1 = the block's input, 0 = no residual)")
        specs.append(spec)
    return specs


# --- weight-normalized layers with the paper's initialization -------------------------------------------
def linear(n_in: int, n_out: int, dropout: float = 0.0) -> nn.Linear:
    """N(0, √((1−p)/n_in)), zero bias, weight norm: keeps the variance of an input that went through
    dropout with probability p (§3.5, A.3); p = 0 for layers without dropout in front."""
    layer = nn.Linear(n_in, n_out)
    nn.init.normal_(layer.weight, mean=0.0, std=math.sqrt((1.0 - dropout) / n_in))
    nn.init.zeros_(layer.bias)
    return weight_norm(layer, dim=0)


def normal_embedding_(embedding: nn.Embedding, std: float = EMBED_STD) -> nn.Embedding:
    """Re-initialize to N(0, std) with the pad row at zero."""
    nn.init.normal_(embedding.weight, mean=0.0, std=std)
    with torch.no_grad():
        embedding.weight[embedding.padding_idx].zero_()
    return embedding


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.scale, None


def scale_gradient(x: Tensor, scale: float) -> Tensor:
    """Identity forward; multiplies the gradient by ``scale`` on the way back."""
    return x if scale == 1.0 else _ScaleGradient.apply(x, scale)


# --- building blocks -------------------------------------------------------------------------------------
@dataclass
class AttentionMemory:
    """What every decoder attention reads from the source: keys z, values (z+e)·√0.5, pads, and the
    conditional-input scale m·√(1/m) with m the number of non-pad source tokens."""

    keys: Tensor  # (B, S, E)
    values: Tensor  # (B, S, E)
    padding_mask: Tensor | None  # (B, S), None when nothing is padded
    scale: Tensor  # (B, 1, 1)

    @classmethod
    def from_encoder_out(cls, encoder_out: EncoderOut) -> AttentionMemory:
        z, e, mask = encoder_out.out, encoder_out.embedded, encoder_out.padding_mask
        m = (~mask).sum(dim=1).to(z.dtype).clamp(min=1).view(-1, 1, 1)
        return cls(z, (z + e) * SQRT_HALF, padding_or_none(mask), m * torch.rsqrt(m))


class MultiStepAttention(nn.Module):
    """One decoder layer's attention (§3.3): d = (W·h + b + g)·√0.5, a = softmax(d·zᵀ) over non-pad source
    tokens, c = m·√(1/m)·Σ a·(z+e)·√0.5, output (W·c + b + h)·√0.5. Scores and softmax run in fp32 at least."""

    def __init__(self, conv_dim: int, embed_dim: int) -> None:
        super().__init__()
        self.in_projection = linear(conv_dim, embed_dim)
        self.out_projection = linear(embed_dim, conv_dim)

    def forward(self, h: Tensor, target_embedding: Tensor, memory: AttentionMemory) -> Tensor:
        d = (self.in_projection(h) + target_embedding) * SQRT_HALF
        scores = torch.bmm(d, memory.keys.transpose(1, 2))
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))  # fp32 at least (fp16/bf16 runs)
        if memory.padding_mask is not None:
            scores = scores.masked_fill(memory.padding_mask.unsqueeze(1), float("-inf"))
        attn = torch.softmax(scores, dim=-1).to(memory.values.dtype)
        c = torch.bmm(attn, memory.values) * memory.scale
        return (self.out_projection(c) + h) * SQRT_HALF


class GLUBlock(nn.Module):
    """[project residual] → GLU conv mixer (zero pads, dropout, conv, GLU) → [attention] → (x + residual)·√0.5.

    Without attention the residual goes into the mixer, which adds it right after the GLU: the decoder step
    then runs conv, GLU and residual as one kernel on CUDA (with attention in between, only conv + GLU fuse).
    """

    def __init__(self, n_in: int, spec: LayerSpec, residual_dim: int | None, causal: bool, dropout: float,
                 attention_embed_dim: int | None = None, kernel_backend: str = "auto") -> None:
        super().__init__()
        self.lookback = spec.lookback
        self.projection = (linear(residual_dim, spec.width)
                           if residual_dim is not None and residual_dim != spec.width else None)
        self.conv = GLUConv(n_in, spec.kernel, causal, out_dim=spec.width, input_dropout=dropout,
                            kernel_backend=kernel_backend)
        self.attention = MultiStepAttention(spec.width, attention_embed_dim) if attention_embed_dim else None

    def forward(self, outputs: list[Tensor], key_padding_mask: Tensor | None = None,
                state: WindowState | None = None, memory: AttentionMemory | None = None,
                target_embedding: Tensor | None = None) -> Tensor:
        """``outputs``: the stack's input followed by every earlier block's output (for the lookback)."""
        residual = outputs[-self.lookback] if self.lookback else None
        if residual is not None and self.projection is not None:
            residual = self.projection(residual)
        if self.attention is None:
            return self.conv(outputs[-1], key_padding_mask=key_padding_mask, state=state, residual=residual)
        x = self.conv(outputs[-1], key_padding_mask=key_padding_mask, state=state)
        x = self.attention(x, target_embedding, memory)
        return x if residual is None else (x + residual) * SQRT_HALF


class ConvStack(nn.Module):
    """Token + learned position embeddings (no √d scale) → dropout → linear to the first width → GLU blocks
    → linear to ``out_dim``. The encoder and the decoder are two of these."""

    def __init__(self, embed_tokens: nn.Embedding, max_positions: int, layers: list[LayerSpec], dropout: float,
                 causal: bool, out_dim: int, attention: list[bool] | None = None, kernel_backend: str = "auto") -> None:
        super().__init__()
        embed_dim = embed_tokens.embedding_dim
        self.padding_idx = embed_tokens.padding_idx
        self.embed_tokens = embed_tokens
        self.embed_positions = PositionalEmbedding(max_positions, embed_dim, self.padding_idx, "learned")
        normal_embedding_(self.embed_positions.weights)
        self.dropout = dropout
        self.fc1 = linear(embed_dim, layers[0].width, dropout)
        widths = [layers[0].width]  # widths[i]: width of the i-th entry of the blocks' ``outputs`` list
        self.blocks = nn.ModuleList()
        for i, spec in enumerate(layers):
            residual_dim = widths[-spec.lookback] if spec.lookback else None
            attend = attention is not None and attention[i]
            self.blocks.append(GLUBlock(widths[-1], spec, residual_dim, causal, dropout,
                                        embed_dim if attend else None, kernel_backend))
            widths.append(spec.width)
        self.fc2 = linear(widths[-1], out_dim)

    def embed(self, tokens: Tensor, offset: int = 0) -> Tensor:
        x = self.embed_tokens(tokens) + self.embed_positions(tokens, offset).to(self.embed_tokens.weight.dtype)
        return dropout(x, p=self.dropout, training=self.training)

    def run_blocks(self, x: Tensor, states: list[WindowState] | None = None, **kwargs) -> Tensor:
        outputs = [x]
        for i, block in enumerate(self.blocks):
            outputs.append(block(outputs, state=None if states is None else states[i], **kwargs))
        return self.fc2(outputs[-1])


class ConvS2S(nn.Module):
    """The ConvS2S encoder-decoder (Gehring et al. 2017), same interface as ``EncoderDecoder``.

    ``encoder``: ``{embed_dim, layers}``; ``decoder``: ``{embed_dim, layers, out_embed_dim, attention}``
    with ``attention`` one bool for every layer or a list with one per layer. ``kernel_backend``
    (auto | triton | torch): the decoder's incremental step on CUDA tensors runs the fused Triton kernel
    (``triton_kernels.convs2s``); CPU and full-sequence passes always use PyTorch.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, padding_idx: int, encoder: dict, decoder: dict,
                 dropout: float = 0.1, max_source_positions: int = 1024, max_target_positions: int = 1024,
                 share_all_embeddings: bool = False, share_decoder_input_output_embed: bool = False,
                 name: str | None = None, kernel_backend: str = "auto", decoder_start: str = DEFAULT_DECODER_START) -> None:
        super().__init__()
        self.name = name
        self.decoder_start = check_decoder_start(decoder_start)
        self.padding_idx = padding_idx
        self.max_source_positions = max_source_positions
        self.max_target_positions = max_target_positions
        enc = _settings(encoder, "model.encoder", {"embed_dim", "layers"})
        dec = _settings(decoder, "model.decoder", {"embed_dim", "layers", "out_embed_dim", "attention"})
        enc_layers, dec_layers = parse_layers(enc["layers"], "model.encoder"), parse_layers(dec["layers"], "model.decoder")
        attention = _attention_flags(dec.get("attention", True), len(dec_layers))
        if enc["embed_dim"] != dec["embed_dim"]:
            raise SeqmixError(f"the decoder's embeddings meet the encoder's in the attention: model.encoder.embed_dim "
                             f"({enc['embed_dim']}) must equal model.decoder.embed_dim ({dec['embed_dim']})")

        enc_embed = normal_embedding_(nn.Embedding(src_vocab_size, enc["embed_dim"], padding_idx=padding_idx))
        if share_all_embeddings:
            check_joint_vocabulary(src_vocab_size, tgt_vocab_size)
            dec_embed = enc_embed
        else:
            dec_embed = normal_embedding_(nn.Embedding(tgt_vocab_size, dec["embed_dim"], padding_idx=padding_idx))
        out_embed_dim = dec.get("out_embed_dim", dec["embed_dim"])

        self.encoder = ConvStack(enc_embed, max_source_positions, enc_layers, dropout, causal=False,
                                 out_dim=enc["embed_dim"])
        self.decoder = ConvStack(dec_embed, max_target_positions, dec_layers, dropout, causal=True,
                                 out_dim=out_embed_dim, attention=attention, kernel_backend=kernel_backend)
        # §3.4: the encoder gets a gradient from every attention layer; scaled down in backward only
        self.encoder_grad_scale = 1.0 / (2.0 * sum(attention))
        if share_decoder_input_output_embed:
            if out_embed_dim != dec["embed_dim"]:
                raise SeqmixError(f"share_decoder_input_output_embed needs model.decoder.out_embed_dim "
                                 f"({out_embed_dim}) == model.decoder.embed_dim ({dec['embed_dim']})")
            self.output_projection = None
            self.output_bias = nn.Parameter(torch.zeros(tgt_vocab_size))
        else:
            self.output_projection = linear(out_embed_dim, tgt_vocab_size, dropout)

    # --- encoder -------------------------------------------------------------------------------
    def encode(self, src_tokens: Tensor) -> EncoderOut:
        """Keys z (gradient-scaled, pads zero) in ``out``; the dropped-out input embeddings e in ``embedded``."""
        enc = self.encoder
        padding_mask = src_tokens.eq(self.padding_idx)
        e = enc.embed(src_tokens)
        mask = padding_or_none(padding_mask)
        z = zero_padding(enc.run_blocks(enc.fc1(e), key_padding_mask=mask), mask)
        return EncoderOut(scale_gradient(z, self.encoder_grad_scale), padding_mask, e)

    # --- decoder -------------------------------------------------------------------------------
    def init_decoder_state(self, encoder_out: EncoderOut) -> DecoderState:
        """One convolution window (and folded weight) per decoder block, plus the step count for positions."""
        return DecoderState(blocks=[block.conv.init_state() for block in self.decoder.blocks])

    def decode(self, prev_output_tokens: Tensor, encoder_out: EncoderOut, state: DecoderState | None = None
               ) -> Tensor:
        """Logits (B, T, V). With ``state``, ``prev_output_tokens`` holds only the new step(s)."""
        dec = self.decoder
        g = dec.embed(prev_output_tokens, 0 if state is None else state.step)
        x = dec.run_blocks(dec.fc1(g), None if state is None else state.blocks,
                           memory=AttentionMemory.from_encoder_out(encoder_out), target_embedding=g)
        if state is not None:
            state.step += prev_output_tokens.size(1)
        x = dropout(x, p=dec.dropout, training=self.training)
        if self.output_projection is None:
            return F.linear(x, dec.embed_tokens.weight, self.output_bias)
        return self.output_projection(x)

    def forward(self, src_tokens: Tensor, prev_output_tokens: Tensor) -> Tensor:
        return self.decode(prev_output_tokens, self.encode(src_tokens))


def _settings(settings: dict, where: str, known: set[str]) -> dict:
    settings = dict(settings)
    unknown = set(settings) - known
    if unknown:
        raise SeqmixError(f"unknown {where} settings {sorted(unknown)}; known: {sorted(known)}")
    for key in ("embed_dim", "layers"):
        if key not in settings:
            raise SeqmixError(f"{where}.{key} is required")
    return settings


def _attention_flags(attention: bool | Sequence[bool], num_layers: int) -> list[bool]:
    flags = [bool(attention)] * num_layers if isinstance(attention, bool) else [bool(a) for a in attention]
    if len(flags) != num_layers:
        raise SeqmixError(f"model.decoder.attention has {len(flags)} entries for {num_layers} decoder layers; "
                         "give one bool, or one per layer")
    if not any(flags):
        raise SeqmixError("model.decoder.attention: at least one decoder layer must attend to the source")
    return flags
