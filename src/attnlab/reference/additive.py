"""Additive attention (Bahdanau, Cho & Bengio 2014): the score is a small network.

    e_ij = vᵀ tanh(W s_i + U h_j)       s_i: decoder state (query), h_j: encoder state (key)
    α_ij = softmax_j(e_ij)
    c_i  = Σ_j α_ij h_j

The weights are the same softmax and the context the same weighted sum as in dot-product
attention; only the score differs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.reference import validate
from attnlab.reference.attention import softmax


class AdditiveAttention:
    """Seeded W (d_query → d_hidden), U (d_key → d_hidden) and v (d_hidden,), or given ones."""

    def __init__(self, d_query: int, d_key: int, d_hidden: int, *, seed: int = 0) -> None:
        for name, value in (("d_query", d_query), ("d_key", d_key), ("d_hidden", d_hidden)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        rng = np.random.default_rng(seed)
        self.w = rng.normal(0, 1 / np.sqrt(d_query), size=(d_query, d_hidden))
        self.u = rng.normal(0, 1 / np.sqrt(d_key), size=(d_key, d_hidden))
        self.v = rng.normal(0, 1 / np.sqrt(d_hidden), size=(d_hidden,))

    @classmethod
    def from_weights(cls, w: Any, u: Any, v: Any) -> AdditiveAttention:
        """W (d_query, d_hidden), U (d_key, d_hidden), v (d_hidden,), in ``x @ W`` layout."""
        w, u, v = (np.asarray(a, dtype=np.float64) for a in (w, u, v))
        if w.ndim != 2 or u.ndim != 2 or v.ndim != 1 or not w.shape[1] == u.shape[1] == v.shape[0]:
            raise ValueError(
                f"w (d_query, d_hidden), u (d_key, d_hidden) and v (d_hidden,) must agree on d_hidden, "
                f"got shapes {w.shape}, {u.shape}, {v.shape}"
            )
        self = cls.__new__(cls)
        self.w, self.u, self.v = w, u, v
        return self

    def scores(self, s: Any, h: Any) -> np.ndarray:
        """e (..., Tq, Tk) for queries s (..., Tq, d_query) and keys h (..., Tk, d_key)."""
        s, h = np.asarray(s, np.float64), np.asarray(h, np.float64)
        for name, arr, d in (("s", s, self.w.shape[0]), ("h", h, self.u.shape[0])):
            if arr.ndim < 2 or arr.shape[-1] != d:
                raise ValueError(f"{name} must have shape (..., T, {d}), got {arr.shape}")
            validate.check_finite(name, arr)
        ws = (s @ self.w)[..., :, None, :]  # (..., Tq, 1, d_hidden)
        uh = (h @ self.u)[..., None, :, :]  # (..., 1, Tk, d_hidden)
        return np.tanh(ws + uh) @ self.v  # (..., Tq, Tk)

    def __call__(self, s: Any, h: Any, *, mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Context (..., Tq, d_key) and weights (..., Tq, Tk); mask True = may attend."""
        e = self.scores(s, h)
        if mask is not None:
            mask = np.asarray(mask)
            if mask.dtype != bool:
                raise TypeError(f"mask must have dtype bool (True = may attend), got {mask.dtype}")
            try:
                e = np.where(np.broadcast_to(mask, e.shape), e, -np.inf)
            except ValueError:
                raise ValueError(f"mask of shape {mask.shape} does not broadcast to the scores' shape {e.shape}") from None
        alpha = softmax(e, axis=-1)  # (..., Tq, Tk)
        return alpha @ np.asarray(h, np.float64), alpha  # (..., Tq, d_key)
