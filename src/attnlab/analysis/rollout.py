"""Attention rollout and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Both treat the residual connection as attention to oneself: each layer's head-averaged map becomes

    Ã_l = residual · I + (1 − residual) · mean_h A_l,  rows renormalised to sum to 1

**Rollout** multiplies them: rollout_l = Ã_l · rollout_{l−1} (rollout_1 = Ã_1), so entry l, row i,
column j is how much of input token j reaches position i after layers 1..l.

**Flow** reads the layers as a graph: a node per (layer, position), from (l, i) to (l − 1, j) an
edge of capacity Ã_l[i, j]; the flow from output i to input j is the maximum flow between
(L, i) and (0, j), and each row is normalised to sum to 1 as in the authors' code. It needs T²
maximum-flow problems over an (L + 1)·T-node graph, solved by SciPy's compiled Dinic algorithm
(``scipy.sparse.csgraph.maximum_flow``), which takes integer capacities: Ã is rounded to multiples
of 2⁻²⁴ (:data:`FLOW_UNITS`), so a flow is exact to T · 3·10⁻⁸. It is limited to
:data:`MAX_FLOW_TOKENS` positions, since its time grows faster than T⁴.

Both take token-level :class:`~attnlab.maps.records.AttentionMaps` or word-level
:class:`~attnlab.maps.words.WordMaps` (``maps.to_words()``): word-level rollout rolls the word maps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.maps.records import Maps
from attnlab.maps.heads import check_layer

DEFAULT_RESIDUAL = 0.5  # Abnar & Zuidema's choice: the residual carries as much as attention
MAX_FLOW_TOKENS = 64  # T² max-flow problems on an (L + 1)·T-node graph: seconds at 64, minutes beyond
FLOW_UNITS = 1 << 24  # capacities in units of 2^-24: a node's T edges of at most 1 stay within int32


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


def rollout(maps: Maps, residual: float = DEFAULT_RESIDUAL) -> list[np.ndarray]:
    """Attention rollout of every sentence of ``maps``: a list of [L, T, T] (T tokens or words)."""
    return [rollout_one(w, residual) for w in maps.weights]


def flow_one(weights: np.ndarray, residual: float = DEFAULT_RESIDUAL, layer: int | None = None) -> np.ndarray:
    """Attention flow of one sentence through layers 1..``layer`` + 1 (0-based; default the last):
    [L, H, T, T] → [T, T], row i the share of output position i's flow that comes from input j."""
    try:
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import maximum_flow
    except ImportError as e:
        raise ImportError("attention flow needs scipy, which is not installed (pip install 'attnlab[models]')") from e

    mixed = mixed_layers(weights, residual)
    num_layers, t = mixed.shape[0], mixed.shape[-1]
    if t > MAX_FLOW_TOKENS:
        raise ValueError(f"attention flow solves T² max-flow problems; {t} positions is more than "
                         f"{MAX_FLOW_TOKENS} (use rollout, or word-level maps, for longer inputs)")
    top = num_layers - 1 if layer is None else check_layer(layer, num_layers)
    # node l·T + i is position i below layer l + 1; layer l + 1's attention: from (l + 1, i) to (l, j)
    units = np.rint(mixed[: top + 1] * FLOW_UNITS).astype(np.int32)
    l, i, j = np.nonzero(units)
    graph = csr_matrix((units[l, i, j], ((l + 1) * t + i, l * t + j)), shape=((top + 2) * t,) * 2)
    out = np.array([[maximum_flow(graph, (top + 1) * t + a, b).flow_value for b in range(t)] for a in range(t)],
                   dtype=np.float64) / FLOW_UNITS
    total = out.sum(axis=-1, keepdims=True)
    return np.divide(out, total, out=np.zeros_like(out), where=total > 0)


def flow(maps: Maps, residual: float = DEFAULT_RESIDUAL, layer: int | None = None) -> list[np.ndarray]:
    """Attention flow of every sentence of ``maps`` at ``layer`` (0-based, default the last): a list of [T, T]."""
    return [flow_one(w, residual, layer) for w in maps.weights]
