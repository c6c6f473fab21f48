"""Token mixers: one module per mixer, one protocol (``seqmix.mixers.base``)."""

from seqmix.mixers.base import MixerState, TokenMixer
from seqmix.mixers.dynamicconv import DynamicConv
from seqmix.mixers.lightconv import LightConv
from seqmix.mixers.self_attention import KeyValueCache, SelfAttention
from seqmix.mixers.talk import TaLK

__all__ = ["MixerState", "TokenMixer", "SelfAttention", "KeyValueCache", "LightConv",
           "DynamicConv", "TaLK"]
