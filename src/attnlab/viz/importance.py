"""Head importance as two heat maps side by side: each head's effect when ablated alone, and Michel
et al.'s gradient score ([L, H], layers and heads 1-based on the axes). Built without pyplot."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure


def importance_figure(ablation: np.ndarray, gradient: np.ndarray, title: str, metric: str) -> Figure:
    """``ablation`` and ``gradient`` [L, H]; ``metric`` names the ablation's effect ("cosine" or "loss")."""
    layers, heads = np.shape(ablation)
    fig = Figure(figsize=(2.2 + 0.75 * heads, 1.6 + 0.42 * layers), layout="constrained")
    effect = "1 − cosine, head alone" if metric == "cosine" else "loss change (nats), head alone"
    grad = "‖∂e/∂ξ‖ (Michel et al. 2019)" if metric == "cosine" else "|∂L/∂ξ| (Michel et al. 2019)"
    for ax, scores, label in zip(fig.subplots(1, 2), (np.asarray(ablation), np.asarray(gradient)), (effect, grad)):
        im = ax.imshow(scores, cmap="viridis", aspect="auto")
        ax.set_xticks(range(heads), [str(h + 1) for h in range(heads)], fontsize=7)
        ax.set_yticks(range(layers), [str(l + 1) for l in range(layers)], fontsize=7)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(label, fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(title, fontsize=10)
    return fig
