"""How scores change before the softmax: :class:`ScoreMod` and its kinds (ALiBi, any callable).

A score change is applied after the scale, softcap and ``bias`` and before the masks, at (b, h, i, j) as
for masks (:mod:`attnlab.masks.frame`): ``score_mod(score, b, h, q_idx, kv_idx) -> score``, FlexAttention's
signature. :class:`Alibi` is structured (the compiled kernel adds it inside its tiles); a callable is
served by the reference, torch and blockwise, which calls it a tile at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from attnlab.masks.frame import Frame, as_numpy


class ScoreMod:
    """A change of the scores, applied elementwise at broadcasting index arrays."""

    structured = False

    def __call__(self, frame: Frame, s: Any, b: Any, h: Any, i: Any, j: Any) -> Any:
        raise NotImplementedError

    def check(self, frame: Frame) -> None:
        """Raise where the change does not fit the call."""


class Alibi(ScoreMod):
    """ALiBi (Press et al. 2022; BLOOM, MPT): score − slope_h · |pos(i) − j|, one slope per query head,
    bottom-right aligned as FlashAttention's ``alibi_slopes``."""

    structured = True

    def __init__(self, slopes: Any):
        arr = as_numpy(slopes)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.floating) and not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"alibi slopes must be a 1-D array of floats, one per query head, got {arr.dtype} of shape {arr.shape}")
        if not np.isfinite(arr).all():
            raise ValueError("alibi slopes must be finite")
        self.slopes = arr.astype(np.float64)

    def check(self, frame: Frame) -> None:
        heads = frame.batch[-1] if frame.batch else 1
        if self.slopes.shape[0] not in (1, heads):
            raise ValueError(f"alibi slopes must have one slope per query head ({heads}), got {self.slopes.shape[0]}")

    def per_head(self, frame: Frame) -> np.ndarray:
        """The slopes in the frame's (B|1, H|1) space."""
        heads = frame.batch[-1] if frame.batch else 1
        s = np.broadcast_to(self.slopes, (heads,))
        return s.reshape(1, heads)

    def __call__(self, frame: Frame, s: Any, b: Any, h: Any, i: Any, j: Any) -> Any:
        slope = self.per_head(frame)[0, h % self.per_head(frame).shape[1]]
        end = frame.tk if frame.ends is None else frame.ends[b % frame.ends.shape[0], h % frame.ends.shape[1]]
        dist = np.abs(end - frame.tq + i - j)
        if type(s).__module__.startswith("torch"):
            import torch

            return s - torch.from_numpy(np.ascontiguousarray(slope * dist)).to(s.device, s.dtype)
        return s - slope * dist

    def __repr__(self) -> str:
        return f"alibi({self.slopes.tolist()})"


class Callable_(ScoreMod):
    """A FlexAttention ``score_mod(score, b, h, q_idx, kv_idx) -> score``."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, frame: Frame, s: Any, b: Any, h: Any, i: Any, j: Any) -> Any:
        if type(s).__module__.startswith("torch"):
            import torch

            b, h, i, j = (torch.from_numpy(np.ascontiguousarray(x)).to(s.device) for x in (b, h, i, j))
        out = self.fn(s, b, h, i, j)
        if not hasattr(out, "shape") or tuple(out.shape) != tuple(s.shape):
            raise ValueError(f"score_mod must return scores of the shape it was given {tuple(s.shape)}, "
                             f"got {getattr(out, 'shape', type(out).__name__)}")
        bad = bool(out.isnan().any()) if type(out).__module__.startswith("torch") else bool(np.isnan(out).any())
        if bad:  # a hidden pair is −inf by the masks, which come after: NaN is the function's own
            raise ValueError(f"score_mod returned NaN for finite scores ({self!r}); it must map scores to scores")
        return out

    def __repr__(self) -> str:
        return f"score_mod({getattr(self.fn, '__name__', type(self.fn).__name__)})"


def as_score_mod(x: Any) -> ScoreMod | None:
    """A ScoreMod from a ScoreMod, a ``score_mod`` callable, or None."""
    if x is None or isinstance(x, ScoreMod):
        return x
    if callable(x):
        return Callable_(x)
    raise TypeError(f"score_mod must be a callable (score, b, h, q_idx, kv_idx) -> score or attnlab.masks.alibi(...), "
                    f"got {type(x).__name__}")
