"""Attention masks, one convention: boolean, ``True`` = may attend (PyTorch SDPA, JAX).

Every mask broadcasts to the scores' shape (..., Tq, Tk) and masks combine with :func:`combine`
(logical and). When Tq ≠ Tk, positions are aligned bottom-right: query i sits at key position
Tk − Tq + i, as when decoding with a cache (the last query is the newest token). Given each
sequence's length (``lengths``, a ragged batch of caches), each sequence's own: query i of sequence
b sits at lengths[b] − Tq + i, and the mask is (*lengths.shape, Tq, Tk).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


def _length(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def _offsets(tq: int, tk: int | None, rows: Any = None, cols: Any = None, lengths: Any = None) -> np.ndarray:
    """j − pos(i) for queries i in ``rows`` and keys j in ``cols`` (default: all), pos(i) = Tk − Tq + i,
    or with ``lengths`` (ints, any shape S) pos(i) = lengths − Tq + i, each sequence's own.

    (len(rows), len(cols)), or (*S, len(rows), len(cols)); a blockwise kernel asks for one tile at a time.
    """
    tq = _length("tq", tq)
    tk = tq if tk is None else _length("tk", tk)
    rows = np.arange(tq) if rows is None else np.asarray(rows)
    cols = np.arange(tk) if cols is None else np.asarray(cols)
    if lengths is None:
        return cols[None, :] - (rows[:, None] + (tk - tq))
    ends = np.asarray(lengths)
    if ends.dtype == bool or not np.issubdtype(ends.dtype, np.integer):
        raise TypeError(f"lengths must be integers (each sequence's length), got dtype {ends.dtype}")
    return cols[None, :] - (rows[:, None] + (ends[..., None, None].astype(np.int64) - tq))  # (*S, rows, cols)


def causal_mask(tq: int, tk: int | None = None, *, lengths: Any = None) -> np.ndarray:
    """(Tq, Tk): query i may attend to keys up to its own position Tk − Tq + i; with ``lengths``
    (*S, Tq, Tk), up to lengths − Tq + i."""
    return _offsets(tq, tk, lengths=lengths) <= 0


def window_mask(tq: int, tk: int | None = None, *, left: int, right: int = 0, lengths: Any = None) -> np.ndarray:
    """(Tq, Tk) sliding window: query i sees keys from pos(i) − left to pos(i) + right (pos(i) as
    :func:`causal_mask` places it, by ``lengths`` where given: then (*S, Tq, Tk)).

    ``right=0`` is the causal sliding window of Longformer/Mistral; ``right=left`` a symmetric one.
    """
    for name, value in (("left", left), ("right", right)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    off = _offsets(tq, tk, lengths=lengths)
    return (off >= -left) & (off <= right)


def band_mask(
    tq: int,
    tk: int | None = None,
    *,
    left: int | None = None,
    right: int | None = None,
    rows: Any = None,
    cols: Any = None,
    lengths: Any = None,
) -> np.ndarray:
    """(len(rows), len(cols)): query i sees keys pos(i) − left .. pos(i) + right; ``None`` = unbounded.

    The causal mask is ``right=0``, the sliding window ``left=w``; ``rows``/``cols`` (index ranges or
    arrays, default all) cut out one tile of the (Tq, Tk) mask without building the rest. With
    ``lengths`` (ints, shape S) pos(i) = lengths − Tq + i and the mask is (*S, len(rows), len(cols)).
    """
    off = _offsets(tq, tk, rows, cols, lengths)
    keep = np.ones(off.shape, dtype=bool)
    if left is not None:
        keep &= off >= -left
    if right is not None:
        keep &= off <= right
    return keep


def by_batch(lengths: Any, batch_dims: int) -> np.ndarray:
    """``lengths`` shaped like the first of ``batch_dims`` leading dims (a prefix of them), reshaped to
    broadcast against them: (*lengths.shape, 1, …) with ``batch_dims`` dims in all."""
    n = np.asarray(lengths)
    return n.reshape(n.shape + (1,) * (batch_dims - n.ndim))


def padding_mask(lengths: Iterable[int], t: int, *, heads: bool = False) -> np.ndarray:
    """Key padding for a batch: sequence b has ``lengths[b]`` real keys followed by padding.

    Returns (B, 1, T), broadcasting to scores (B, Tq, T); with ``heads=True``, (B, 1, 1, T)
    for scores (B, H, Tq, T).
    """
    t = _length("t", t)
    lengths = np.asarray(list(lengths))
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
        raise TypeError(f"lengths must be a 1-D sequence of ints, got {lengths.dtype} of shape {lengths.shape}")
    if ((lengths < 0) | (lengths > t)).any():
        raise ValueError(f"lengths must lie in 0..t={t}, got {lengths.tolist()}")
    keep = np.arange(t)[None, :] < lengths[:, None]  # (B, T)
    return keep[:, None, None, :] if heads else keep[:, None, :]


def hide_mask(tk: int, positions: Iterable[int], tq: int | None = None) -> np.ndarray:
    """(Tq, Tk) or (1, Tk): no query may attend to the hidden key ``positions``.

    Hiding tokens this way is how a model can be asked to predict what it cannot see.
    """
    tk = _length("tk", tk)
    hidden = np.asarray(list(positions), dtype=np.int64)
    if ((hidden < -tk) | (hidden >= tk)).any():
        raise ValueError(f"positions must lie in 0..tk-1={tk - 1}, got {hidden.tolist()}")
    keep = np.ones(tk, dtype=bool)
    keep[hidden] = False
    rows = 1 if tq is None else _length("tq", tq)
    return np.broadcast_to(keep, (rows, tk)).copy()


def combine(*masks: Any) -> np.ndarray | None:
    """Logical and of masks with broadcasting; ``None`` entries mean "no restriction"."""
    present = [np.asarray(m) for m in masks if m is not None]
    for m in present:
        if m.dtype != bool:
            raise TypeError(f"masks must have dtype bool (True = may attend), got {m.dtype}")
    if not present:
        return None
    out = present[0]
    for m in present[1:]:
        out = out & m
    return out
