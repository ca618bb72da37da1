"""The long view's computations: any part of a long input's map, exact, from its queries, keys and row LSEs.

A :class:`~attnlab.maps.long.LongMaps` holds no weights. Each function here computes the weights it
needs a tile at a time: the tile's queries and keys go through ``attnlab.attention`` (the torch
backend, with the tile's visibility as a mask), which gives the tile's own softmax w̃ and its
log-sum-exp lsẽ; the row's weight is then w̃ · exp(lsẽ − lse), lse the row's log-sum-exp over all
its keys, kept at capture. That is exp(s − lse) with the scores' scale, softcap and masks applied by
the one implementation of attention, and never more than one tile of T × T at once:

    weights(lm, layer, head, rows, cols)   a tile at full resolution, [rows, cols]
    row(lm, layer, head, query)            the query's weights on every key, [T]
    top_keys(lm, layer, head, query, k)    its k largest, (key, weight), largest first
    column(lm, layer, head, key)           the weight every query puts on the key, [T]
    overview(lm, layer, head, cells)       the pooled map: each cell the mean and the max weight of a
                                           block of b × b pairs (b = ⌈T / cells⌉; a pair a row cannot
                                           see counts as a weight of 0 in the mean), and with top=k
                                           every row's k largest; by the compiled pooled pass
                                           (kernel.pool: the tiles' weights pooled in the cache and the
                                           rows' largest kept in the same sweep, no strip of rows × T)
                                           where the kernel is built, else from tiles as above

    sink_share(lm, layer, head)            learned sinks (gpt-oss): each query's mass on the sink, exp(sink −
                                           lse) [T] (its weights add up to 1 minus it); None without sinks

Visibility (which key j query i sees) is the capture's: ``causal`` (j ≤ i), the layer's ``window``
(left, right) reaches (i − left ≤ j ≤ i + right), a ``sink`` (keys below it are seen past the window),
and padding (keys at or past ``length`` are never seen).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab import masks
from attnlab.backends import kernel
from attnlab.maps.heads import Head
from attnlab.maps.long import LongMaps

DEFAULT_CELLS = 512  # the overview's side at most, in cells
STRIP_SCORES = 2**22  # the scores of one strip of the overview (rows × keys): bounds its memory to tens of MB
DEFAULT_TOP = 10


def check_long(maps: Any, what: str) -> LongMaps:
    """``maps`` if it is a :class:`LongMaps`; TypeError naming ``what`` otherwise."""
    if not isinstance(maps, LongMaps):
        raise TypeError(f"{what} takes a long input's maps (LongMaps, from attnlab.capture_long), got "
                        f"{type(maps).__name__}")
    return maps


def _head(lm: LongMaps, layer: int, head: int) -> Head:
    return Head.of((layer, head), lm.num_layers, lm.num_heads, "(layer, head)")


def _span(name: str, span: Any, t: int) -> tuple[int, int]:
    """(start, stop) of rows or columns inside 0..t, or a ValueError naming ``name`` and the map's size."""
    try:
        start, stop = (int(x) for x in span)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a (start, stop) pair of ints, got {span!r}") from None
    if not 0 <= start < stop <= t:
        raise ValueError(f"{name} must be (start, stop) with 0 <= start < stop <= {t} (the map is {t} × {t}), "
                         f"got ({start}, {stop})")
    return start, stop


def _index(name: str, i: Any, t: int) -> int:
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(i).__name__}")
    if not 0 <= i < t:
        raise ValueError(f"{name} must be 0..{t - 1} (the map has {t} tokens), got {i}")
    return int(i)


def description(lm: LongMaps, layer: int) -> masks.Mask | None:
    """Which keys each query of ``layer`` sees, as attnlab.masks says it: its window (and the sink's first keys
    beside it), causal, and the padding past the real tokens; None: every key."""
    facts, t = lm.layers[layer], lm.queries.shape[2]
    m = None if facts.window is None else masks.window(*facts.window)
    if lm.sink and m is not None:
        m = m | masks.sink_tokens(lm.sink)
    for term in ([masks.causal()] if facts.causal else []) + ([masks.key_lengths(lm.num_tokens)] if lm.num_tokens < t else []):
        m = term if m is None else m & term
    return m


def visible(lm: LongMaps, layer: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(len(rows), len(cols)) bool, True where query ``rows[r]`` may see key ``cols[c]`` in ``layer``: the
    description's rule at those positions of the whole (T, T) map."""
    m, t = description(lm, layer), lm.queries.shape[2]
    if m is None:
        return np.ones((len(rows), len(cols)), dtype=bool)
    frame = m.frame(t, t)
    zero = np.zeros((1, 1), dtype=np.int64)
    return np.broadcast_to(m.allows(frame, zero, zero, np.asarray(rows)[:, None], np.asarray(cols)[None, :]),
                           (len(rows), len(cols)))


def _key_range(lm: LongMaps, layer: int, i0: int, i1: int) -> tuple[int, int]:
    """The keys any of the rows i0..i1 − 1 may see (the description's intervals): the rest of a strip is zero
    without computing it."""
    m, t = description(lm, layer), lm.queries.shape[2]
    if m is None:
        return 0, t
    lo, hi = m.spans(m.frame(t, t))
    lo, hi = lo[0, 0, i0:i1], hi[0, 0, i0:i1]  # (rows, n)
    live = hi > lo
    if not live.any():
        return 0, 1
    j0, j1 = int(np.where(live, lo, t).min()), int(np.where(live, hi, 0).max())
    return j0, max(j1, j0 + 1)


def _seen(lm: LongMaps, layer: int, i0: int, i1: int, j0: int, j1: int) -> dict:
    """attention()'s keywords for the tile's visibility: its own causal band where they say the same (a
    causal strip ending at its last row's key: bottom-right alignment puts row r at key i0 + r, so the
    band and the window are the capture's), nothing where every key is seen, else :func:`visible` as a mask."""
    import torch

    facts = lm.layers[layer]
    if facts.causal and not lm.sink and j1 == i1:
        return {"causal": True, "window": facts.window}
    if not facts.causal and facts.window is None:
        return {}
    return {"mask": torch.from_numpy(np.array(visible(lm, layer, np.arange(i0, i1), np.arange(j0, j1))))}  # (R, C), writable


def _tile(lm: LongMaps, layer: int, head: int, i0: int, i1: int, j0: int, j1: int) -> np.ndarray:
    """The exact float32 weights of rows i0..i1 − 1 on keys j0..j1 − 1 (no checks: the callers')."""
    import torch

    from attnlab.backends.api import attention

    facts = lm.layers[layer]
    group = lm.num_heads // lm.num_kv_heads
    # float64 from the float32 q and k as captured: the products are then exact, and what is left of the
    # error is the stored LSE's float32 rounding, a relative 6e-7 of each weight
    q = torch.from_numpy(np.asarray(lm.queries[layer, head, i0:i1], dtype=np.float64))  # (R, D)
    k = torch.from_numpy(np.asarray(lm.keys[layer, head // group, j0:j1], dtype=np.float64))  # (C, D)
    v = torch.zeros(j1 - j0, 1, dtype=torch.float64)  # the values do not enter the weights
    _, w, lse = attention(q, k, v, **_seen(lm, layer, i0, i1, j0, j1), scale=facts.scale, softcap=facts.softcap,
                          return_weights=True, return_lse=True, backend="torch")
    row_lse = torch.from_numpy(np.asarray(lm.lse[layer, head, i0:i1], dtype=np.float64))
    # the tile's softmax times the tile's share of the whole row; a row that sees nothing here (lse −inf)
    # or at all stays zero
    share = torch.exp(torch.where(torch.isinf(lse), torch.full_like(lse, -math.inf), lse - row_lse))
    return (w * share[:, None]).float().numpy()


def weights(lm: LongMaps, layer: int, head: int, rows: Any, cols: Any) -> np.ndarray:
    """The exact weights of queries ``rows`` = (start, stop) on keys ``cols`` = (start, stop) of ``layer``
    and ``head`` (0-based): float32 [stop − start, stop − start], what the full map holds there."""
    lm = check_long(lm, "weights")
    _head(lm, layer, head)
    t = lm.num_tokens
    (i0, i1), (j0, j1) = _span("rows", rows, t), _span("cols", cols, t)
    return _tile(lm, layer, head, i0, i1, j0, j1)


def row(lm: LongMaps, layer: int, head: int, query: int) -> np.ndarray:
    """Query ``query``'s weights on every key, float32 [T]."""
    lm = check_long(lm, "row")
    _head(lm, layer, head)
    i = _index("query", query, lm.num_tokens)
    return _tile(lm, layer, head, i, i + 1, 0, lm.num_tokens)[0]


def top_keys(lm: LongMaps, layer: int, head: int, query: int, k: int = DEFAULT_TOP) -> list[tuple[int, float]]:
    """The ``k`` keys ``query`` weighs most: (key, weight), largest first (ties: the earlier key)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    keys, found = _top(row(lm, layer, head, query)[None], k)
    return [(int(j), float(w)) for j, w in zip(keys[0], found[0])]


def column(lm: LongMaps, layer: int, head: int, key: int) -> np.ndarray:
    """The weight every query puts on ``key`` (who attends to it), float32 [T]."""
    lm = check_long(lm, "column")
    _head(lm, layer, head)
    t = lm.num_tokens
    j = _index("key", key, t)
    return _tile(lm, layer, head, 0, t, j, j + 1)[:, 0]


def sink_share(lm: LongMaps, layer: int, head: int) -> np.ndarray | None:
    """Learned sinks: the share of each query's softmax mass that goes to the sink, exp(sink − lse), float32 [T]
    (its weights on the keys add up to 1 minus it); None where the maps have no learned sinks."""
    lm = check_long(lm, "sink_share")
    _head(lm, layer, head)
    if lm.sink_logits is None:
        return None
    lse = lm.lse[layer, head, :lm.num_tokens].astype(np.float64)
    return np.exp(float(lm.sink_logits[layer, head]) - lse).astype(np.float32)


@dataclass(frozen=True)
class Overview:
    """A head's pooled map: cell (r, c) covers queries r·block .. and keys c·block .. (the last cells
    may be narrower); ``mean`` [n, n] the mean weight over the cell's pairs, ``max`` [n, n] the largest.
    With ``top`` k > 0 also every row's k largest weights, largest first: ``top_keys`` [T, k] (int)
    and ``top_weights`` [T, k] (float32), from the same pass. With learned sinks, ``sink_share`` [n]:
    the mean over each row of cells' queries of the mass they put on the sink (:func:`sink_share`)."""

    block: int
    mean: np.ndarray
    max: np.ndarray
    tokens: int
    top_keys: np.ndarray | None = None
    top_weights: np.ndarray | None = None
    sink_share: np.ndarray | None = None

    @property
    def cells(self) -> int:
        return int(self.mean.shape[0])


def _pool(w: np.ndarray, block: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """[R, T] strip (R a multiple of ``block`` but at the end) → its [⌈R/block⌉, n] block sums and maxima."""
    r, t = w.shape
    rows, cols = -(-r // block), n
    full = np.zeros((rows * block, cols * block), dtype=np.float32)
    full[:r, :t] = w
    cells = full.reshape(rows, block, cols, block)  # (row block, row, column block, column)
    return cells.sum(axis=(1, 3), dtype=np.float64), cells.max(axis=(1, 3))


def _top(w: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k largest of [R, T]: keys [R, k] and weights [R, k], largest first (ties: the earlier key).

    A partition finds them in O(T) a row (a sort of every row took half an overview's time); rows
    whose k-th weight ties with a key left out (a row seeing fewer than k keys: its zeros) are sorted whole."""
    if k >= w.shape[1]:
        order = np.argsort(-w, axis=1, kind="stable")[:, :k]
    else:
        cand = np.argpartition(-w, k - 1, axis=1)[:, :k]  # (R, k): the k largest, in no order
        vals = np.take_along_axis(w, cand, axis=1)
        order = np.take_along_axis(cand, np.lexsort((cand, -vals), axis=1), axis=1)  # by weight, then key
        kth = vals.min(axis=1, keepdims=True)
        ties = (w == kth).sum(axis=1) != (vals == kth).sum(axis=1)  # equal weights outside the k
        if ties.any():
            order[ties] = np.argsort(-w[ties], axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(w, order, axis=1)


def _compiled_pool(lm: LongMaps, layer: int, head: int, block: int, top: int) -> tuple[np.ndarray | None, ...]:
    """The cells' weight sums [n, n] (float64) and maxima [n, n] (float32) by the compiled pooled pass
    (:func:`attnlab.backends.kernel.pool`), from the stored q, k and LSE of the real tokens; with ``top`` > 0
    also every row's largest, keys [T, top] and weights [T, top] (else None, None)."""
    t, facts = lm.num_tokens, lm.layers[layer]
    group = lm.num_heads // lm.num_kv_heads
    q = lm.queries[layer, head, None, None, :t]  # (1, 1, T, D)
    k = lm.keys[layer, head // group, None, :t]  # (1, T, D)
    lse = lm.lse[layer, head, None, None, :t]  # (1, 1, T)
    out = kernel.pool(q, k, lse, scale=facts.scale, block=block, mask=description(lm, layer), softcap=facts.softcap,
                      top=top)
    return tuple(x[0, 0] for x in out) + ((None, None) if top == 0 else ())


def overview(lm: LongMaps, layer: int, head: int, cells: int = DEFAULT_CELLS, top: int = 0) -> Overview:
    """The pooled map of ``layer`` and ``head`` (0-based), at most ``cells`` × ``cells`` (module
    docstring), and with ``top`` > 0 every row's ``top`` largest weights (:class:`Overview`)."""
    lm = check_long(lm, "overview")
    _head(lm, layer, head)
    for name, value, low in (("cells", cells, 1), ("top", top, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    t = lm.num_tokens
    block = -(-t // cells)
    n = -(-t // block)
    sizes = np.diff(np.minimum(np.arange(n + 1) * block, t)).astype(np.float64)  # (n,): each block's width
    share = sink_share(lm, layer, head)
    if share is not None:  # (n,): each row of cells' mean
        share = np.add.reduceat(share.astype(np.float64), np.arange(n) * block) / sizes
        share = share.astype(np.float32)
    k = min(top, t)
    if kernel.isa() is not None and k <= kernel.POOL_TOP_MAX:
        sums, maxes, keys, best = _compiled_pool(lm, layer, head, block, k)
        return Overview(block=block, mean=(sums / sizes[:, None] / sizes[None, :]).astype(np.float32), max=maxes,
                        tokens=t, top_keys=keys, top_weights=best, sink_share=share)
    sums, maxes = np.zeros((n, n)), np.zeros((n, n), dtype=np.float32)
    keys, best = np.zeros((t, k), dtype=np.int64), np.zeros((t, k), dtype=np.float32)
    strip = max(block, (STRIP_SCORES // max(t, 1)) // block * block)  # whole blocks of rows per strip
    for i0 in range(0, t, strip):
        i1 = min(t, i0 + strip)
        j0, j1 = _key_range(lm, layer, i0, i1)
        j0 = j0 // block * block  # whole blocks of keys, so the strip's cells line up with the map's
        w = np.zeros((i1 - i0, t), dtype=np.float32)
        w[:, j0:j1] = _tile(lm, layer, head, i0, i1, j0, j1)
        s, m = _pool(w, block, n)
        sums[i0 // block: i0 // block + s.shape[0]] = s
        maxes[i0 // block: i0 // block + s.shape[0]] = m
        if k:
            keys[i0:i1], best[i0:i1] = _top(w, k)
    return Overview(block=block, mean=(sums / sizes[:, None] / sizes[None, :]).astype(np.float32), max=maxes, tokens=t,
                    top_keys=keys if k else None, top_weights=best if k else None, sink_share=share)
