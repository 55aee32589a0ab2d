"""Figures the diagnostics log as artifacts."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def cross_score_heatmap(L: np.ndarray, column: np.ndarray, title: str):
    """Per-token cross-scores, rows grouped by their own prompt (matched cells outlined)."""
    order = np.argsort(column, kind="stable")
    fig, ax = plt.subplots(figsize=(1.2 + 0.35 * L.shape[1], 1.2 + 0.06 * L.shape[0]))
    image = ax.imshow(L[order], aspect="auto", cmap="viridis", interpolation="nearest")
    ax.scatter(
        column[order],
        np.arange(len(order)),
        marker="s",
        s=6,
        facecolors="none",
        edgecolors="red",
        linewidths=0.6,
        label="own prompt",
    )
    ax.set_xlabel("prompt x_j")
    ax.set_ylabel("reasoning z_i (grouped by own prompt)")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="mean log p(z_i | x_j) per token")
    ax.legend(loc="upper right", fontsize=7)
    return fig
