"""Backbones built from shared blocks; mixers are injected."""

from seqmix.models.adaptive import AdaptiveInput, AdaptiveSoftmax
from seqmix.models.decoder_only import DecoderOnly
from seqmix.models.encoder_decoder import EncoderDecoder, EncoderOut, count_parameters
from seqmix.models.stack import DecoderState, Stack

__all__ = ["EncoderDecoder", "EncoderOut", "DecoderState", "DecoderOnly", "AdaptiveInput", "AdaptiveSoftmax", "Stack",
           "count_parameters"]
