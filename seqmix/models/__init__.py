"""Backbones built from shared blocks; mixers are injected."""

from seqmix.models.encoder_decoder import DecoderState, EncoderDecoder, EncoderOut

__all__ = ["EncoderDecoder", "EncoderOut", "DecoderState"]
