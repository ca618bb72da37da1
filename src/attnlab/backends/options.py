"""One description of an attention call's options: :class:`Options`, built once from ``attention()``'s keywords.

Every part that needs a call's options takes this one record: :func:`attnlab.backends.request.prepare`
(which checks them against q, k and v), the dispatcher's calibration runs, the agreement table
and the benchmarks. The defaults live here and nowhere else; adding an option means a field here,
its check, and the backends (and the reference) that serve it.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from attnlab.reference import validate

# What each option does, as attention()'s help shows it (attnlab.backends.api composes it into the
# docstring, so that help(attention) lists every option from this one text).
HELP = """\
mask: which keys each query sees: a boolean array (True = may attend, broadcastable to (..., Tq, Tk)),
    a FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` callable, or attnlab.masks objects
    combined with & and | (masks.documents(ids) & masks.causal(), masks.prefix(n) | masks.causal(), …).
    ANDed with ``causal``, ``window`` and ``lengths``, which are shorthands for the same objects.
bias: float added to the scores (−inf blocks a pair), broadcastable to (..., Tq, Tk).
score_mod: a change of the scores, after scale, softcap and bias, before the masks: attnlab.masks.alibi(slopes)
    or a FlexAttention ``score_mod(score, b, h, q_idx, kv_idx) -> score`` callable (indices as for mask).
sink_logits: learned attention sinks (gpt-oss): one logit per query head, shape (H,) (broadcast against
    q's leading dims), that takes part in each row's softmax with no value: a row's weights add up to
    less than 1 (its sink share is the rest); differentiable.
causal: masks.causal(): query i sees keys up to its position pos(i) = Tk − Tq + i (bottom-right aligned when
    Tq ≠ Tk, decoding with a cache); with ``lengths``, each sequence's own (see lengths).
scale: default 1/√D.
window: sliding window, an int w (w keys each side) or (left, right): query i sees keys
    pos(i) − left .. pos(i) + right (pos(i) as for ``causal``: with ``causal`` and ``lengths``, each
    sequence's own); with ``causal`` the right side is cut at 0.
lengths: masks.cache_lengths(lengths), ints shaped like the first batch dims (e.g. (B,) for q (B, H, T, D)):
    sequence b holds lengths[b] keys (the rest is padding) and its queries are its newest tokens, so
    query i sits at lengths[b] − Tq + i for causal, window and every position-dependent term. Key padding
    that leaves the queries where they are is mask=masks.key_lengths(lengths).
return_weights: also return every weight (..., Tq, Tk) (materialising backends only).
weights_rows: query indices; also return the exact weights of just those rows (..., R, Tk),
    which blockwise recomputes from the LSE without the (Tq, Tk) matrix (outside autograd:
    a diagnostic, not differentiable there).
return_lse: also return each row's log-sum-exp of its scores (..., Tq) (−inf: nothing to attend).
block_size: tile size of blockwise and kernel, an int or (queries, keys). Default: 96 × 512 in
    the kernel (it rounds the keys up to whole vectors, 16 with AVX-512), about 2^20 scores for
    all heads together in the blockwise loop.
softcap: logit softcapping c > 0 (Gemma-2): scaled scores become c · tanh(s / c) before the
    bias, the score_mod and the masks (numpy, torch and blockwise backends).
kv_checked: k and v are known finite (a KV cache checks its entries once, when it appends them), so
    the call does not read them again to check; needs ``k_norm``. A plain call leaves it False:
    every entry of q, k and v is checked (NaN or Inf is an error).
k_norm: with ``kv_checked``, an upper bound of every key's length ‖k_j‖ (the cache keeps the largest of
    its entries'): the overflow check bounds the scores by |scale|·max‖q_i‖·k_norm without reading k."""


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _window(window: Any) -> tuple[int, int] | None:
    if window is None:
        return None
    pair = (window, window) if not isinstance(window, (tuple, list)) else tuple(window)
    if len(pair) != 2 or any(isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 0 for w in pair):
        raise ValueError(f"window must be an int >= 0 (keys each side) or a pair (left, right) of them, got {window!r}")
    return int(pair[0]), int(pair[1])


def _norm(k_norm: Any, kv_checked: bool) -> float | None:
    if k_norm is None:
        if kv_checked:
            raise ValueError("kv_checked=True needs k_norm= (the largest key length ‖k_j‖, which the overflow check uses)")
        return None
    if not kv_checked:
        raise ValueError("k_norm= is the bound of keys checked when written: pass it with kv_checked=True")
    if isinstance(k_norm, bool) or not isinstance(k_norm, (int, float, np.floating, np.integer)):
        raise TypeError(f"k_norm must be a float >= 0, got {type(k_norm).__name__}")
    if not (math.isfinite(float(k_norm)) and k_norm >= 0):
        raise ValueError(f"k_norm must be a finite float >= 0, got {k_norm}")
    return float(k_norm)


@dataclass(frozen=True, eq=False)  # it holds arrays (mask, bias, lengths): compared by identity
class Options:
    """The options of one attention call with their defaults, checked and normalised once.

    ``window`` is kept as a pair (left, right), ``softcap``, ``scale`` and ``k_norm`` as floats; the
    checks that need q, k and v (shapes, the array library) are :func:`attnlab.backends.request.prepare`'s.
    Build it from keywords with :meth:`of`, which names an unknown one. The options:
    """

    mask: Any = None
    bias: Any = None
    score_mod: Any = None
    sink_logits: Any = None
    causal: bool = False
    scale: float | None = None
    window: tuple[int, int] | None = None
    lengths: Any = None
    return_weights: bool = False
    weights_rows: Any = None
    return_lse: bool = False
    block_size: int | tuple[int, int] | None = None
    softcap: float | None = None
    kv_checked: bool = False
    k_norm: float | None = None

    def __post_init__(self) -> None:
        for name in ("causal", "return_weights", "return_lse", "kv_checked"):
            object.__setattr__(self, name, _flag(name, getattr(self, name)))
        if self.return_weights and self.weights_rows is not None:
            raise ValueError("pass return_weights=True (every row) or weights_rows= (chosen rows), not both")
        if self.scale is not None:
            object.__setattr__(self, "scale", validate.check_scale(self.scale, 1))
        object.__setattr__(self, "window", _window(self.window))
        object.__setattr__(self, "softcap", validate.check_softcap(self.softcap))
        object.__setattr__(self, "k_norm", _norm(self.k_norm, self.kv_checked))

    @classmethod
    def of(cls, options: dict[str, Any], *, caller: str = "attention()") -> Options:
        """Options from keywords; an unknown one is a TypeError that lists them all."""
        unknown = sorted(options.keys() - _NAME_SET)
        if unknown:
            raise TypeError(f"{caller} got an unknown keyword {unknown[0]!r}; its options are {', '.join(NAMES)}")
        return cls(**options)

    @property
    def wants_weights(self) -> bool:
        """Weights come back: every row's (return_weights) or chosen rows' (weights_rows)."""
        return self.return_weights or self.weights_rows is not None


NAMES: tuple[str, ...] = tuple(f.name for f in fields(Options))
_NAME_SET = frozenset(NAMES)


def defaults() -> str:
    """The options with their defaults, as a call would spell them: "mask=None, …"."""
    return ", ".join(f"{f.name}={f.default!r}" for f in fields(Options))


if Options.__doc__:  # None under python -OO
    Options.__doc__ = Options.__doc__.rstrip() + "\n\n" + textwrap.indent(HELP, "    ") + "\n"
