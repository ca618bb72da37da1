"""Which keys a query sees and how its scores change, said once (``import attnlab as al; al.masks``).

Visibility is one composable value (:class:`Mask`): :func:`causal`, :func:`window`, :func:`documents`,
:func:`prefix`, :func:`key_lengths`, :func:`cache_lengths` and :func:`sink_tokens`, combined with ``&``
(both) and ``|`` (either); any FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` and boolean arrays
combine with them too. Score changes (:func:`alibi`, any ``score_mod``) are the other half.
``attnlab.attention(q, k, v, mask=..., score_mod=..., sink_logits=...)`` takes them, and every
backend, the kernel's tiles and its decode pass read the same description.

Positions: query i sits at pos(i) = Tk − Tq + i (bottom-right, as decoding with a cache), or, where
the description holds ``cache_lengths(n)``, at n[b] − Tq + i (each sequence's own). Stored as each
row's key intervals (at most two per row: see :mod:`attnlab.masks.intervals`).

NumPy only: torch tensors given as ids or lengths are read once as NumPy arrays.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

from attnlab.masks.frame import Frame
from attnlab.masks.intervals import MAX_SPANS, NotStructured
from attnlab.masks.scores import Alibi, ScoreMod, as_score_mod
from attnlab.masks.visibility import (
    CacheLengths, Causal, Documents, KeyLengths, Mask, MaskMod, Prefix, SinkTokens, Window, as_mask,
)


def causal() -> Mask:
    """Query i sees keys up to its own position pos(i)."""
    return Causal()


def window(left: int | None, right: int | None = 0) -> Mask:
    """Query i sees keys pos(i) − left .. pos(i) + right (None: unbounded on that side). ``window(w)`` is
    the causal sliding window that sees itself and the w keys before it; transformers' ``sliding_window = W``
    is ``window(W − 1)``."""
    return Window(left, right)


def sliding_window(w: int) -> Mask:
    """transformers' ``sliding_window = W``: a token sees itself and the W − 1 keys before it, ``window(W − 1, 0)``
    (their mask keeps key j for query i when i − W < j ≤ i). The one place that count is converted."""
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        raise ValueError(f"sliding_window must be an int >= 1 (keys a token sees, itself included), got {w!r}")
    return Window(w - 1, 0)


def documents(ids: Any) -> Mask:
    """Packed documents: ids (Tk,) or (B, Tk), each key's document, non-decreasing along a row; a query
    sees the keys of the document at its position only. ``documents(ids) & causal()`` is packed causal
    training (FlashAttention's varlen, xFormers' BlockDiagonalCausalMask)."""
    return Documents(ids)


def prefix(lengths: Any) -> Mask:
    """Every query of sequence b sees the first lengths[b] keys: ``prefix(n) | causal()`` is a prefix-LM
    (bidirectional over the prefix, causal after it)."""
    return Prefix(lengths)


def key_lengths(lengths: Any) -> Mask:
    """Key padding: sequence b has lengths[b] real keys (lengths shaped like a prefix of the batch dims);
    the positions of queries do not move."""
    return KeyLengths(lengths)


def cache_lengths(lengths: Any) -> Mask:
    """A ragged batch of caches: sequence b holds lengths[b] keys and its Tq queries are its newest tokens,
    so every position-dependent term places query i at lengths[b] − Tq + i. ``attention(..., lengths=n)``
    builds this."""
    return CacheLengths(lengths)


def sink_tokens(n: int) -> Mask:
    """The first n keys, seen by every query (StreamingLLM): ``window(w) | sink_tokens(4)``."""
    return SinkTokens(n)


def mask_mod(fn: Callable[..., Any]) -> Mask:
    """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` as a Mask (to combine with the others)."""
    if not callable(fn):
        raise TypeError(f"mask_mod must be callable (b, h, q_idx, kv_idx) -> bool, got {type(fn).__name__}")
    return MaskMod(fn)


def all_of(terms: Any) -> Any:
    """``terms[0] & terms[1] & …`` (masks, or boolean arrays); None when there are none."""
    terms = [t for t in terms if t is not None]
    return functools.reduce(operator.and_, terms) if terms else None


def from_keywords(mask: Any = None, causal: bool = False, window: Any = None, lengths: Any = None) -> Mask | None:
    """attention()'s shorthands as the one description: ``mask`` (an array, a callable or a Mask) & ``causal()``
    & ``window(left, right)`` (an int w: both sides) & ``cache_lengths(lengths)``; None: every key."""
    if window is not None and not isinstance(window, (tuple, list)):
        window = (window, window)
    return all_of([None if mask is None else as_mask(mask), Causal() if causal else None,
                   None if window is None else Window(*window), None if lengths is None else CacheLengths(lengths)])


def alibi(slopes: Any) -> ScoreMod:
    """ALiBi: score − slopes[h] · |pos(i) − j| (one slope per query head)."""
    return Alibi(slopes)


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's standard slopes for ``heads`` heads (Press et al.; BLOOM's rule for counts that are not powers of 2)."""
    import math

    def powers(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if heads < 1:
        raise ValueError(f"heads must be >= 1, got {heads}")
    closest = 2 ** math.floor(math.log2(heads))
    out = powers(closest)
    if closest < heads:
        out += powers(2 * closest)[0::2][: heads - closest]
    return out


__all__ = [
    "Frame", "MAX_SPANS", "Mask", "NotStructured", "ScoreMod", "alibi", "alibi_slopes", "as_mask", "as_score_mod",
    "all_of", "cache_lengths", "causal", "documents", "from_keywords", "key_lengths", "mask_mod", "prefix", "sink_tokens", "sliding_window", "window",
]
