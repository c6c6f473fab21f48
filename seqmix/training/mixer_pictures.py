"""Pictures of what the mixers learned: each layer's mixing weights over one sentence (``TokenMixer.mixing_weights``:
how much output step t takes from step s), one panel per head, as in Wu et al. 2019's figures. Attention maps,
LightConv/DynamicConv taps on their band and TaLK windows all come out as the same kind of (T, T) picture, so
mixers can be compared layer by layer."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from seqmix.files import atomic_write

_MARKERS = ("Ġ", "▁", "</w>", "@@")


def readable(piece: str) -> str:
    """A subword piece without its BPE markers (an empty piece shows as ·)."""
    for marker in _MARKERS:
        piece = piece.replace(marker, "")
    return piece or "·"


def draw_mixing(layers: list[tuple[str, Tensor]], labels: list[str] | None, title: str, path: Path,
                max_heads: int = 4) -> None:
    """One row per layer, one panel per head (the first ``max_heads``) of ``layers``' (H, T, T) weights, rows =
    output steps, columns = input steps labelled by ``labels``; written as a PNG at ``path`` (atomically)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    heads = min(max_heads, max(w.size(0) for _, w in layers))
    length = layers[0][1].size(-1)
    side = max(2.5, 0.18 * length)
    fig, axes = plt.subplots(len(layers), heads, figsize=(side * heads + 0.5, side * len(layers) + 0.6),
                             squeeze=False)
    for row, (name, weights) in enumerate(layers):
        w = weights.detach().float().cpu()
        for head in range(heads):
            ax = axes[row][head]
            if head >= w.size(0):
                ax.axis("off")
                continue
            signed = bool((w[head] < 0).any())
            limit = float(w[head].abs().max()) or 1.0
            ax.imshow(w[head].numpy(), cmap="RdBu_r" if signed else "viridis", aspect="equal",
                      vmin=-limit if signed else 0.0, vmax=limit, interpolation="nearest")
            ax.set_title(f"{name}, head {head + 1}/{w.size(0)}", fontsize=8)
            if labels is not None and len(labels) == length:
                ax.set_xticks(range(length), labels, rotation=90, fontsize=6)
                ax.set_yticks(range(length), labels, fontsize=6)
            else:
                ax.tick_params(labelsize=6)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=80))
    plt.close(fig)
