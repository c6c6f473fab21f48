"""Backbones built from shared blocks; mixers are injected."""

from seqmix.models.adaptive import AdaptiveInput, AdaptiveSoftmax
from seqmix.models.decoder_only import DecoderOnly
from seqmix.models.encoder_decoder import DecoderState, EncoderDecoder, EncoderOut, count_parameters

__all__ = ["EncoderDecoder", "EncoderOut", "DecoderState", "DecoderOnly", "AdaptiveInput", "AdaptiveSoftmax", "count_parameters"]
