"""The two kinds of benchmark figure: log-log lines (cost against size) and annotated bars, one panel per group."""

from __future__ import annotations

from pathlib import Path


def _panels(n: int, width: float, path: Path, title: str, draw) -> None:
    """``draw(ax, k)`` for each of ``n`` panels side by side, then a PNG at 120 dpi (the figure is closed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(width, 4.6), squeeze=False)
    for k, ax in enumerate(axes[0]):
        draw(ax, k)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def line_panels(panels: list[tuple[str, dict[str, list]]], xlabel: str, path: Path, title: str, xbase: int = 10) -> None:
    """A log-log panel per (ylabel, {series: [(x, y)]}); a series named "∝ ..." is a dotted guide line."""
    def draw(ax, k):
        for label, pts in panels[k][1].items():
            style = {"linestyle": ":", "color": "gray"} if label.startswith("∝") else {"marker": "o"}
            ax.plot(*(zip(*sorted(pts)) if pts else ([], [])), label=label, **style)
        ax.set(yscale="log", xlabel=xlabel, ylabel=panels[k][0])
        ax.set_xscale("log", base=xbase)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)

    _panels(len(panels), 6 * len(panels), path, title, draw)


def bar_panels(panels: dict[str, list[tuple[str, float, str, bool]]], ylabel: str, path: Path, title: str) -> None:
    """A panel per group of bars (label, value, note written on the bar, whether it is the baseline: gray)."""
    groups = list(panels.items())

    def draw(ax, k):
        bars = groups[k][1]
        drawn = ax.bar(range(len(bars)), [b[1] or 0 for b in bars], color=["tab:gray" if b[3] else "tab:blue" for b in bars])
        for bar, b in zip(drawn, bars):
            ax.annotate(b[2], (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7, rotation=15)
        ax.set(ylabel=ylabel, title=groups[k][0], ylim=(0, max([b[1] or 0 for b in bars] + [1e-9]) * 1.45))

    _panels(len(groups), 1.5 + sum(1.2 * len(bars) + 1 for _, bars in groups), path, title, draw)
