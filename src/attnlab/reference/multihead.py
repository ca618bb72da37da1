"""Multi-head attention (Vaswani et al. 2017, §3.2.2), forward read top to bottom.

    head_h = Attention(X_q W^Q_h, X_kv W^K_h, X_kv W^V_h)
    MultiHead = Concat(head_1, …, head_H) W^O

Weights are stored the way ``x @ W`` reads: W^Q (d_model, H·d_head), W^K (d_kv, H·d_head),
W^V (d_kv, H·d_v), W^O (H·d_v, d_model), with optional biases. A real model's layer loads into
it through :meth:`MultiHeadAttention.from_weights` (transpose torch ``Linear.weight`` first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.reference.attention import attention


@dataclass(frozen=True)
class MultiHeadResult:
    """What one forward pass computes; internals come out here, never as attributes."""

    output: np.ndarray  # (..., Tq, d_model)
    weights: np.ndarray  # (..., H, Tq, Tk), post-softmax, one map per head
    heads: np.ndarray  # (..., H, Tq, d_v), each head's output before W^O


def _matrix(name: str, w: Any, rows: int | None, cols: int | None) -> np.ndarray:
    w = np.asarray(w)
    if not np.issubdtype(w.dtype, np.number) or np.issubdtype(w.dtype, np.complexfloating):
        raise TypeError(f"{name} must be a real numeric matrix, got dtype {w.dtype}")
    if w.ndim != 2 or (rows is not None and w.shape[0] != rows) or (cols is not None and w.shape[1] != cols):
        want = f"({rows if rows is not None else '?'}, {cols if cols is not None else '?'})"
        raise ValueError(f"{name} must have shape {want}, got {w.shape}")
    return w.astype(np.float64)


def _vector(name: str, b: Any, n: int) -> np.ndarray:
    if b is None:
        return np.zeros(n)
    b = np.asarray(b, dtype=np.float64)
    if b.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {b.shape}")
    return b


class MultiHeadAttention:
    """H heads of scaled dot-product attention with learned projections.

    ``MultiHeadAttention(d_model, num_heads)`` draws seeded weights (uniform ±1/√fan_in, as
    ``torch.nn.Linear``); ``d_kv`` (the key/value input size, for cross-attention), ``d_head`` and
    ``d_v`` default to d_model and d_model / num_heads.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        d_kv: int | None = None,
        d_head: int | None = None,
        d_v: int | None = None,
        seed: int = 0,
        bias: bool = True,
    ) -> None:
        for name, value in (("d_model", d_model), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if d_head is None and d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}; pass d_head=")
        d_kv = d_model if d_kv is None else d_kv
        d_head = d_model // num_heads if d_head is None else d_head
        d_v = d_head if d_v is None else d_v
        rng = np.random.default_rng(seed)

        def init(fan_in: int, fan_out: int) -> np.ndarray:
            bound = 1.0 / np.sqrt(fan_in)
            return rng.uniform(-bound, bound, size=(fan_in, fan_out))

        self._set(
            w_q=init(d_model, num_heads * d_head),
            w_k=init(d_kv, num_heads * d_head),
            w_v=init(d_kv, num_heads * d_v),
            w_o=init(num_heads * d_v, d_model),
            num_heads=num_heads,
            biases=[np.zeros(n) if bias else None for n in (num_heads * d_head, num_heads * d_head, num_heads * d_v, d_model)],
        )

    @classmethod
    def from_weights(
        cls,
        w_q: Any,
        w_k: Any,
        w_v: Any,
        w_o: Any,
        num_heads: int,
        *,
        b_q: Any = None,
        b_k: Any = None,
        b_v: Any = None,
        b_o: Any = None,
    ) -> MultiHeadAttention:
        """Build from given matrices in ``x @ W`` layout (see the module docstring)."""
        self = cls.__new__(cls)
        self._set(w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o, num_heads=num_heads, biases=[b_q, b_k, b_v, b_o])
        return self

    def _set(self, *, w_q, w_k, w_v, w_o, num_heads, biases) -> None:
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads must be an int >= 1, got {num_heads!r}")
        w_q = _matrix("w_q", w_q, None, None)
        d_model, qk = w_q.shape
        if qk % num_heads:
            raise ValueError(f"w_q has {qk} columns, not divisible by num_heads={num_heads}")
        w_k = _matrix("w_k", w_k, None, qk)
        w_v = _matrix("w_v", w_v, w_k.shape[0], None)
        if w_v.shape[1] % num_heads:
            raise ValueError(f"w_v has {w_v.shape[1]} columns, not divisible by num_heads={num_heads}")
        w_o = _matrix("w_o", w_o, w_v.shape[1], None)
        self.num_heads = num_heads
        self.d_model, self.d_kv, self.d_out = d_model, w_k.shape[0], w_o.shape[1]
        self.d_head, self.d_v = qk // num_heads, w_v.shape[1] // num_heads
        self.w_q, self.w_k, self.w_v, self.w_o = w_q, w_k, w_v, w_o
        self.b_q, self.b_k, self.b_v, self.b_o = (
            _vector(name, b, n)
            for name, b, n in zip(("b_q", "b_k", "b_v", "b_o"), biases, (qk, qk, w_v.shape[1], self.d_out))
        )

    def _split(self, x: np.ndarray, d: int) -> np.ndarray:
        # (..., T, H·d) → (..., H, T, d)
        x = x.reshape(*x.shape[:-1], self.num_heads, d)  # (..., T, H, d)
        return np.swapaxes(x, -2, -3)  # (..., H, T, d)

    def __call__(
        self,
        x: Any,
        context: Any = None,
        *,
        mask: Any = None,
        causal: bool = False,
        scale: float | None = None,
    ) -> MultiHeadResult:
        """Self-attention over x (..., Tq, d_model), or cross-attention to context (..., Tk, d_kv).

        ``mask`` broadcasts to (..., H, Tq, Tk) (True = may attend); ``scale`` defaults to 1/√d_head.
        """
        x = np.asarray(x)
        context = x if context is None else np.asarray(context)
        for name, arr, d in (("x", x, self.d_model), ("context", context, self.d_kv)):
            if arr.ndim < 2 or arr.shape[-1] != d:
                raise ValueError(f"{name} must have shape (..., T, {d}), got {arr.shape}")
        # 1. project: Q = X W^Q, K = C W^K, V = C W^V
        q = x @ self.w_q + self.b_q  # (..., Tq, H·d_head)
        k = context @ self.w_k + self.b_k  # (..., Tk, H·d_head)
        v = context @ self.w_v + self.b_v  # (..., Tk, H·d_v)
        # 2. split heads
        q, k = self._split(q, self.d_head), self._split(k, self.d_head)  # (..., H, T, d_head)
        v = self._split(v, self.d_v)  # (..., H, Tk, d_v)
        # 3. attend, every head at once
        heads, weights = attention(q, k, v, mask=mask, causal=causal, scale=scale, return_weights=True)
        # 4. merge heads: (..., H, Tq, d_v) → (..., Tq, H·d_v)
        merged = np.swapaxes(heads, -2, -3)  # (..., Tq, H, d_v)
        merged = merged.reshape(*merged.shape[:-2], self.num_heads * self.d_v)  # (..., Tq, H·d_v)
        # 5. output projection
        output = merged @ self.w_o + self.b_o  # (..., Tq, d_out)
        return MultiHeadResult(output=output, weights=weights, heads=heads)
