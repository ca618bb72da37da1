"""Attention rollout and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Both treat the residual connection as attention to oneself: each layer's head-averaged map becomes

    Ã_l = residual · I + (1 − residual) · mean_h A_l,  rows renormalised to sum to 1

**Rollout** multiplies them: rollout_l = Ã_l · rollout_{l−1} (rollout_1 = Ã_1), so entry l, row i,
column j is how much of input token j reaches position i after layers 1..l.

**Flow** reads the layers as a graph: a node per (layer, position), from (l, i) to (l − 1, j) an
edge of capacity Ã_l[i, j]; the flow from output i to input j is the maximum flow between
(L, i) and (0, j), computed by networkx, and each row is normalised to sum to 1 as in the
authors' code. It needs T² maximum-flow problems over an L·T-node graph, so it is limited to
:data:`MAX_FLOW_TOKENS` positions.

Both take token-level :class:`~attnlab.models.maps.AttentionMaps` or word-level
:class:`~attnlab.models.words.WordMaps` (``maps.to_words()``): word-level rollout rolls the word maps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DEFAULT_RESIDUAL = 0.5  # Abnar & Zuidema's choice: the residual carries as much as attention
MAX_FLOW_TOKENS = 64  # T² max-flow problems on an (L + 1)·T-node graph: seconds at 64, minutes beyond


def _check_residual(residual: Any) -> float:
    if isinstance(residual, bool) or not isinstance(residual, (int, float)) or not 0 <= residual <= 1:
        raise ValueError(f"residual must be a number in [0, 1], got {residual!r}")
    return float(residual)


def mixed_layers(weights: np.ndarray, residual: float = DEFAULT_RESIDUAL) -> np.ndarray:
    """[L, H, T, T] weights → [L, T, T] Ã_l: head mean mixed with the identity, rows renormalised."""
    residual = _check_residual(residual)
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must be [L, H, T, T], got shape {w.shape}")
    mixed = residual * np.eye(w.shape[-1]) + (1 - residual) * w.mean(axis=1)  # (L, T, T)
    total = mixed.sum(axis=-1, keepdims=True)
    return np.divide(mixed, total, out=np.zeros_like(mixed), where=total > 0)


def rollout_one(weights: np.ndarray, residual: float = DEFAULT_RESIDUAL) -> np.ndarray:
    """Rollout of one sentence: [L, H, T, T] → [L, T, T], entry l through layers 1..l + 1 (0-based)."""
    mixed = mixed_layers(weights, residual)
    out = np.empty_like(mixed)
    out[0] = mixed[0]
    for layer in range(1, len(mixed)):
        out[layer] = mixed[layer] @ out[layer - 1]
    return out


def rollout(maps: Any, residual: float = DEFAULT_RESIDUAL) -> list[np.ndarray]:
    """Attention rollout of every sentence of ``maps``: a list of [L, T, T] (T tokens or words)."""
    return [rollout_one(w, residual) for w in maps.weights]


def flow_one(weights: np.ndarray, residual: float = DEFAULT_RESIDUAL, layer: int | None = None) -> np.ndarray:
    """Attention flow of one sentence through layers 1..``layer`` + 1 (0-based; default the last):
    [L, H, T, T] → [T, T], row i the share of output position i's flow that comes from input j."""
    import networkx as nx

    mixed = mixed_layers(weights, residual)
    n_layers, t = mixed.shape[0], mixed.shape[-1]
    if t > MAX_FLOW_TOKENS:
        raise ValueError(f"attention flow solves T² max-flow problems; {t} positions is more than "
                         f"{MAX_FLOW_TOKENS} (use rollout, or word-level maps, for longer inputs)")
    top = n_layers - 1 if layer is None else layer
    if not isinstance(top, int) or not 0 <= top < n_layers:
        raise ValueError(f"layer must be a 0-based layer index in 0..{n_layers - 1} or None, got {layer!r}")
    graph = nx.DiGraph()
    for l in range(top + 1):  # layer l + 1's attention: from node (l + 1, i) to node (l, j)
        for i in range(t):
            for j in range(t):
                if mixed[l, i, j] > 0:
                    graph.add_edge((l + 1, i), (l, j), capacity=float(mixed[l, i, j]))
    out = np.zeros((t, t))
    for i in range(t):
        for j in range(t):
            if graph.has_node((top + 1, i)) and graph.has_node((0, j)):
                out[i, j] = nx.maximum_flow_value(graph, (top + 1, i), (0, j))
    total = out.sum(axis=-1, keepdims=True)
    return np.divide(out, total, out=np.zeros_like(out), where=total > 0)


def flow(maps: Any, residual: float = DEFAULT_RESIDUAL, layer: int | None = None) -> list[np.ndarray]:
    """Attention flow of every sentence of ``maps`` at ``layer`` (0-based, default the last): a list of [T, T]."""
    return [flow_one(w, residual, layer) for w in maps.weights]
