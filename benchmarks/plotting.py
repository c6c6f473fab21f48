"""What every benchmark plot shares: log-log panels styled alike, and saving a figure as a PNG."""

from __future__ import annotations

from pathlib import Path


def style_log_axes(ax, xlabel: str, ylabel: str, xbase: int = 10) -> None:
    """Log scales on both axes (x in ``xbase``), labels, a light grid on every decade, a small legend."""
    ax.set_xscale("log", base=xbase)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def save_figure(fig, path: Path, title: str | None = None) -> None:
    """Title (if any), tight layout, PNG at 120 dpi, figure closed (benchmarks draw many in one process)."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
