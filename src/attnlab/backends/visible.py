"""A call's visibility and score changes as one record (:class:`Visible`), built once by :func:`build`.

``attention()``'s ``mask`` (a boolean array, a ``mask_mod`` callable or :mod:`attnlab.masks` objects),
``causal``, ``window`` and ``lengths`` (shorthands for ``masks.causal()``, ``masks.window(left, right)``
and ``masks.cache_lengths(lengths)``) are ANDed into one description, which is split by how it is served:

- ``mask``: the structured part, stored as key intervals per row (``spans``): what the kernel reads,
  and what tells every blockwise pass which tiles no query sees;
- ``dense``: boolean arrays given as such, kept as given (a tensor stays on its device);
- ``rule``: anything else (callables, unions beyond two intervals), evaluated tile by tile.

Score changes: ``score_mod`` (:func:`attnlab.masks.alibi` or a callable) and ``sink_logits``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab import masks
from attnlab.masks.frame import Frame, as_numpy
from attnlab.masks.intervals import NotStructured, contains
from attnlab.masks.visibility import Both, Causal, Dense, Mask
from attnlab.reference import validate


@dataclass(frozen=True, eq=False)
class Visible:
    """What a call's queries see, and how its scores change, in the frame of its (B, H, Tq, Tk)."""

    frame: Frame
    mask: Mask | None = None  # structured: rows of key intervals; None: hides nothing
    spans: tuple | None = None  # mask's (lo, hi), each (B|1, H|1, Tq, n) int64
    dense: Any = None  # a boolean array or tensor broadcastable to (..., Tq, Tk)
    rule: Mask | None = None  # evaluated elementwise, tile by tile
    score_mod: masks.ScoreMod | None = None
    sinks: Any = None  # sink_logits as given (broadcast against q's leading dims)
    softcap: float | None = None  # logit softcapping c (before the bias and score_mod)
    causal: bool = False  # the structured part holds causal()
    lengths: bool = False  # ... cache_lengths (each sequence's own length)
    structure: bool = False  # ... anything else (a window, documents, a prefix, sink tokens, key lengths)

    def keep(self, rows: Any = None, cols: Any = None) -> np.ndarray | None:
        """(B|1, H|1, R, C) bool for query ``rows`` and key ``cols`` (default all): the structured part
        and the rule (dense arrays are the backends' own to apply). None: nothing hidden there."""
        f, out = self.frame, None
        cols = np.arange(f.tk) if cols is None else np.asarray(cols)
        if self.spans is not None:
            lo, hi = self.spans if rows is None else (s[..., np.asarray(rows), :] for s in self.spans)
            out = contains(lo, hi, cols)
        if self.rule is not None:
            r = np.asarray(self.rule.allows(f, *f.grid(rows, cols)))
            out = r if out is None else out & r
        return out

    def block_range(self, i0: int, i1: int) -> tuple[int, int]:
        """The keys [lo, hi) some query of rows i0..i1 − 1 may see (every key without a structured part)."""
        if self.spans is None:
            return 0, self.frame.tk
        lo, hi = (s[..., i0:i1, :] for s in self.spans)
        live = hi > lo
        if not live.any():
            return 0, 0
        return int(np.where(live, lo, self.frame.tk).min()), int(np.where(live, hi, 0).max())

    def tile_state(self, i0: int, i1: int, k0: int, k1: int) -> str:
        """"empty" (no query of rows i0.. sees a key of k0..k1 − 1), "full" (every one sees every key) or
        "edge", by the structured part alone."""
        if self.spans is None:
            return "full"
        lo, hi = (s[..., i0:i1, :] for s in self.spans)
        meets = (lo < k1) & (hi > k0) & (hi > lo)
        if not meets.any():
            return "empty"
        return "full" if ((lo <= k0) & (hi >= k1)).any(-1).all() else "edge"


def _terms(m: Mask | None) -> list[Mask]:
    """The top-level factors of an AND (``a & b & c``); none for None."""
    if m is None:
        return []
    return _terms(m.a) + _terms(m.b) if type(m) is Both else [m]


def build(p: validate.Problem, mask: Any, causal: bool, window: tuple | None, lengths: Any,
          score_mod: Any, sinks: Any, softcap: float | None = None) -> Visible:
    """One call's :class:`Visible` from attention()'s keywords (checked against its shapes)."""
    if mask is None and lengths is None and _band_sees_all(causal, window, p.tq, p.tk):  # a decoding step's call
        return _plain(p, score_mod, sinks, softcap)
    n = None if lengths is None else validate.check_lengths(lengths, p)
    terms = _terms(masks.from_keywords(None if mask is None else masks.as_mask(mask, "mask"), causal, window, n))
    dense = [t.array for t in terms if isinstance(t, Dense)]
    for d in dense:
        validate.check_mask(d, p)
    structured = [t for t in terms if t.structured]
    rule = [t for t in terms if not t.structured and not isinstance(t, Dense)]
    whole = masks.all_of(terms)
    ends = None if whole is None else whole.ends()
    frame = Frame.of(p.tq, p.tk, p.batch, ends)
    for t in terms:
        t.check(frame)
    _check_sinks(sinks, p)
    smod = masks.as_score_mod(score_mod)
    if smod is not None:
        smod.check(frame)
    part, spans = masks.all_of(structured), None
    if part is not None:
        try:
            spans = part.spans(frame)
        except NotStructured:
            rule, part = rule + structured, None
    if part is not None and _sees_all(spans, p.tk):
        part = spans = None  # one query after every key (a decoding step): the call without it
    kinds = {type(t) for t in _flat(part)} if part is not None else set()
    return Visible(frame, part, spans, masks.all_of(dense), masks.all_of(rule), smod, sinks, softcap, causal=Causal in kinds,
                   lengths=masks.visibility.CacheLengths in kinds, structure=bool(kinds - {Causal, masks.visibility.CacheLengths}))


def _flat(m: Mask) -> list[Mask]:
    """Every leaf of a description."""
    return [leaf for p in m.parts() for leaf in _flat(p)] if m.parts() else [m]


def _band_sees_all(causal: bool, window: tuple | None, tq: int, tk: int) -> bool:
    """Whether causal and a window (left, right) let every query see every key, said without building rows:
    the first query (at Tk − Tq) must reach the last key, the last (at Tk − 1) the first."""
    left, right = (None, None) if window is None else window
    right = 0 if causal and right is None else min(right, 0) if causal else right
    return (left is None or left >= tk - 1) and (right is None or right >= tq - 1)


def _plain(p: validate.Problem, score_mod: Any, sinks: Any, softcap: float | None) -> Visible:
    """The Visible of a call that hides no key: only its score changes."""
    frame = Frame(p.tq, p.tk, tuple(p.batch))
    _check_sinks(sinks, p)
    smod = masks.as_score_mod(score_mod)
    if smod is not None:
        smod.check(frame)
    return Visible(frame, score_mod=smod, sinks=sinks, softcap=softcap)


def _sees_all(spans: tuple, tk: int) -> bool:
    lo, hi = spans
    return bool(((lo[..., 0] <= 0) & (hi[..., 0] >= tk)).all())


def _check_sinks(sinks: Any, p: validate.Problem) -> None:
    """Learned sink logits: floats, one per query head, broadcast against q's leading dims, finite."""
    if sinks is None:
        return
    if not hasattr(sinks, "shape") or validate.dtype_name(sinks) not in validate.FLOAT_DTYPES:
        raise TypeError(f"sink_logits must be a float array or tensor, one logit per query head, got "
                        f"{getattr(sinks, 'dtype', type(sinks).__name__)}")
    shape = tuple(sinks.shape)
    try:
        ok = np.broadcast_shapes(shape, tuple(p.batch)) == tuple(p.batch)
    except ValueError:
        ok = False
    if not ok or not shape:
        heads = p.batch[-1] if p.batch else 1
        raise ValueError(f"sink_logits must have one logit per query head, shape ({heads},) (or broadcast against "
                         f"q's leading dims {tuple(p.batch)}), got {shape}")
    if not np.isfinite(as_numpy(sinks).astype(np.float64)).all():
        raise ValueError("sink_logits must be finite (NaN or Inf found)")


def describe(mask: Mask | None, tq: int, tk: int, batch: tuple = ()) -> Visible:
    """A :class:`Visible` of a structured ``mask`` alone (None: every key) over (*batch, Tq, Tk): a ring attention
    block's, or a direct call of the kernel's passes."""
    if mask is None:
        return Visible(Frame(tq, tk, tuple(batch)))
    frame = mask.frame(tq, tk, tuple(batch))
    spans = mask.spans(frame)
    if _sees_all(spans, tk):
        return Visible(frame)
    kinds = {type(t) for t in _flat(mask)}
    return Visible(frame, mask, spans, causal=Causal in kinds)
