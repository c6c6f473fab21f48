"""Decoder-only backbone for language modeling: the encoder-decoder's causal ``Stack`` without cross-attention.

The token embedding is an ``AdaptiveInput`` (one band = a plain embedding) and the output an ``AdaptiveSoftmax``
(no cutoffs = a full softmax), tied to the input when ``tie_weights``. The model returns features; the output
head turns them into log-probabilities or per-token NLL, so large vocabularies never materialize (B, T, V).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from torch import Tensor, nn

from seqmix.errors import SeqmixError
from seqmix.models.adaptive import AdaptiveInput, AdaptiveOptions, AdaptiveSoftmax
from seqmix.models.stack import DecoderState, Stack, layer_mixer_configs, stack_settings

log = logging.getLogger("seqmix")


class DecoderOnly(nn.Module):
    def __init__(self, vocab_size: int, padding_idx: int, embed_dim: int, decoder: dict, dropout: float = 0.1,
                 positions: str = "sinusoidal", max_positions: int = 1024, scale_embedding: bool = True,
                 tie_weights: bool = True, input_cutoffs: Sequence[int] = (), softmax_cutoffs: Sequence[int] = (),
                 adaptive_factor: float = 4.0, softmax_dropout: float = 0.0, name: str | None = None,
                 project_all_bands: bool = False, tie_projections: bool = True) -> None:
        super().__init__()
        self.name = name
        self.padding_idx = padding_idx
        settings = stack_settings(decoder, cross_attention=False)
        embed = AdaptiveInput(vocab_size, padding_idx, embed_dim, input_cutoffs, adaptive_factor, project_all_bands)
        self.decoder = Stack(embed, max_positions, positions=positions, dropout=dropout,
                             scale_embedding=scale_embedding, causal=True, **settings)
        self.output = AdaptiveSoftmax(embed_dim, vocab_size, softmax_cutoffs, adaptive_factor, softmax_dropout,
                                      bands=embed.bands if tie_weights else None,
                                      project_all_bands=project_all_bands, tie_projections=tie_projections)
        self.max_positions = max_positions

    @classmethod
    def from_preset(cls, vocab_size: int, padding_idx: int, preset: dict,
                    adaptive: AdaptiveOptions | None = None) -> DecoderOnly:
        """The language model of an encoder-decoder preset (``conf/model``, its ``decoder`` mixer configs already
        made factories): its decoder stack without cross-attention and its shared settings; the encoder's are
        ignored. Pre-norm is forced when a layer's mixer says its language models need it
        (``TokenMixer.language_model_pre_norm``)."""
        decoder = preset.get("decoder")
        if not decoder or not ({"mixer", "pattern"} & set(decoder)):
            raise SeqmixError(f"model={preset.get('name')} has no decoder.mixer; language modeling needs a preset "
                              "built on the encoder-decoder backbone (transformer, lightconv, dynamicconv, talk, ...)")
        classes = {getattr(m, "func", m) for m in layer_mixer_configs(decoder)}
        pre_norm = sorted(c.__name__ for c in classes if getattr(c, "language_model_pre_norm", False))
        if pre_norm and not decoder.get("normalize_before"):
            log.info("language model with %s: pre-norm forced (normalize_before=true)", ", ".join(pre_norm))
            decoder = {**decoder, "normalize_before": True}
        adaptive = adaptive or AdaptiveOptions()
        return cls(vocab_size, padding_idx, preset["embed_dim"], decoder, dropout=preset["dropout"],
                   positions=preset["positions"], max_positions=preset["max_target_positions"],
                   scale_embedding=preset["scale_embedding"], tie_weights=preset["share_decoder_input_output_embed"],
                   input_cutoffs=list(adaptive.cutoffs) if adaptive.input else [],
                   softmax_cutoffs=list(adaptive.cutoffs) if adaptive.softmax else [],
                   adaptive_factor=adaptive.factor, softmax_dropout=adaptive.softmax_dropout, name=preset.get("name"),
                   project_all_bands=adaptive.project_all_bands, tie_projections=adaptive.tie_projections)

    def forward(self, tokens: Tensor, state: DecoderState | None = None) -> Tensor:
        """Features (B, T, C); with ``state``, ``tokens`` holds only the new step(s)."""
        return self.decoder(tokens, state)

    def init_state(self) -> DecoderState:
        return self.decoder.init_state()

    def log_probs(self, features: Tensor) -> Tensor:
        return self.output.log_probs(features)

    def nll(self, features: Tensor, target: Tensor) -> Tensor:
        """-log p(target) per position, 0 at padding."""
        return self.output.nll(features, target, self.padding_idx)
