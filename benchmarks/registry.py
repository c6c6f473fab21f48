"""Which token mixers the benchmark measures: one :class:`MixerEntry` per row.

A new mixer adds ONE line to ``ENTRIES`` (a name, a ``factory(embed_dim, causal)`` and a note). Factories
import their mixer lazily so that a broken or optional mixer cannot stop the other rows from loading.
The first entry is the baseline every ratio is computed against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from seqmix.mixers.base import TokenMixer

MixerFactory = Callable[[int, bool], TokenMixer]


@dataclass(frozen=True)
class MixerEntry:
    """One benchmark row: ``factory(embed_dim, causal)`` must return a fresh mixer (parameters initialized)."""

    name: str
    factory: MixerFactory
    causal: bool = False
    note: str = ""

    def build(self, embed_dim: int) -> TokenMixer:
        return self.factory(embed_dim, self.causal)


def self_attention(heads: int = 8) -> MixerFactory:
    def make(embed_dim: int, causal: bool) -> TokenMixer:
        from seqmix.mixers.self_attention import SelfAttention

        return SelfAttention(embed_dim, num_heads=heads, causal=causal)

    return make


def conv_mixer(class_name: str, heads: int = 8, kernel_size: int = 31) -> MixerFactory:
    """LightConv / DynamicConv / TaLK with the fast PyTorch path on CPU (Triton on CUDA)."""

    def make(embed_dim: int, causal: bool) -> TokenMixer:
        import seqmix.mixers

        return getattr(seqmix.mixers, class_name)(embed_dim, num_heads=heads, kernel_size=kernel_size, causal=causal)

    return make


ENTRIES: list[MixerEntry] = [
    MixerEntry("self_attention", self_attention(8), note="torch SDPA, 8 heads (baseline)"),
    MixerEntry("self_attention_causal", self_attention(8), causal=True, note="torch SDPA, 8 heads, is_causal"),
    MixerEntry("lightconv", conv_mixer("LightConv"), note="H=8, K=31, GLU; chunked band GEMM on CPU"),
    MixerEntry("dynamicconv", conv_mixer("DynamicConv"), note="H=8, K=31, GLU; chunked band GEMM on CPU"),
    MixerEntry("talk", conv_mixer("TaLK"), note="H=8, max offsets 31 left+right, GLU; prefix sums + gather on CPU"),
]

BASELINE = ENTRIES[0].name


def get(name: str) -> MixerEntry:
    for entry in ENTRIES:
        if entry.name == name:
            return entry
    raise KeyError(f"no benchmark entry {name!r}; known: {', '.join(e.name for e in ENTRIES)}")


def select(names: list[str] | None) -> list[MixerEntry]:
    """Entries in registry order, restricted to ``names`` (all when None); the baseline is always kept."""
    if not names:
        return list(ENTRIES)
    for n in names:
        get(n)  # unknown names fail loudly
    wanted = set(names) | {BASELINE}
    return [e for e in ENTRIES if e.name in wanted]
