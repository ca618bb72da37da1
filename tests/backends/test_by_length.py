"""Causal with lengths= is each sequence's own (docs/design.md, causal alignment): query i of sequence b
sits at position lengths[b] − Tq + i, and a window measures from there. Every backend that serves
lengths= with causal=True, against the reference and against a mask written out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab import masks
from attnlab.backends.agreement import reference_of, request_of
from attnlab.backends.api import attention
from attnlab.backends.dispatch import BACKENDS, refusals
from attnlab.reference import attention as reference

LENGTHS = np.array([9, 4, 0, 6])  # a ragged batch of caches in a buffer of Tk = 9 keys
TK = 9


def by_hand(tq: int, lengths: np.ndarray, window: int | None = None) -> np.ndarray:
    """(B, 1, Tq, Tk): key j is seen by query i of sequence b when j ≤ pos = lengths[b] − Tq + i,
    j < lengths[b] and (with a window of W − 1 keys back) j ≥ pos − (W − 1)."""
    out = np.zeros((len(lengths), 1, tq, TK), bool)
    for b, n in enumerate(lengths):
        for i in range(tq):
            pos = n - tq + i
            for j in range(TK):
                out[b, 0, i, j] = j <= pos and j < n and (window is None or j >= pos - window)
    return out


def _inputs(tq: int, library: str):
    rng = np.random.default_rng(tq)
    q = rng.standard_normal((4, 4, tq, 8))  # 4 query heads over 2 k/v heads (GQA)
    k, v = rng.standard_normal((4, 2, TK, 8)), rng.standard_normal((4, 2, TK, 8))
    if library == "torch":
        import torch

        return tuple(torch.from_numpy(x.astype(np.float32)) for x in (q, k, v)), LENGTHS
    return (q, k, v), LENGTHS


@pytest.mark.parametrize("tq", [1, 4])
@pytest.mark.parametrize("window", [None, 2])
def test_the_reference_places_each_sequence_at_its_own_end(tq, window):
    (q, k, v), n = _inputs(tq, "numpy")
    mask = by_hand(tq, n, window)
    want = reference.attention(q, np.repeat(k, 2, 1), np.repeat(v, 2, 1), mask=mask)
    got = reference_of(q, k, v, causal=True, lengths=n, window=None if window is None else (window, 0))
    np.testing.assert_allclose(got, want, atol=1e-14)
    plain = reference.attention(q, np.repeat(k, 2, 1), np.repeat(v, 2, 1), causal=True, lengths=n)
    if window is None:
        np.testing.assert_allclose(plain, want, atol=1e-14)
    assert not want[2].any()  # an empty cache: every row sees nothing, zeros


CASES = [pytest.param(lib, name, marks=pytest.mark.needs("torch") if lib == "torch" else ())
         for lib in ("numpy", "torch") for name in BACKENDS]


@pytest.mark.parametrize(("library", "backend"), CASES)
@pytest.mark.parametrize("tq", [1, 4])  # one new token, and four at once (speculative decoding)
@pytest.mark.parametrize("window", [None, 2])
def test_every_backend_aligns_causal_by_each_sequence_length(library, backend, tq, window):
    (q, k, v), n = _inputs(tq, library)
    kw = {"causal": True, "lengths": n, "window": None if window is None else (window, 0)}
    why = refusals(request_of(q, k, v, **kw))[backend]
    if why:
        assert library == "numpy" or backend == "numpy", why  # every torch backend serves it
        pytest.skip(f"{backend} refuses: {'; '.join(why)}")
    got = attention(q, k, v, backend=backend, **kw)
    got = got.numpy() if hasattr(got, "numpy") else got
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    want = reference.attention(q64, np.repeat(k64, 2, 1), np.repeat(v64, 2, 1), mask=by_hand(tq, n, window))
    np.testing.assert_allclose(got, want, atol=1e-5 if got.dtype == np.float32 else 1e-12)


def test_without_lengths_causal_stays_bottom_right_and_key_lengths_only_pad():
    """lengths= means one thing (masks.cache_lengths): with or without causal, a window measures from each
    sequence's length. Padding that leaves the queries where they are is masks.key_lengths."""
    (q, k, v), n = _inputs(4, "numpy")
    k2, v2 = np.repeat(k, 2, 1), np.repeat(v, 2, 1)
    np.testing.assert_allclose(attention(q, k, v, backend="numpy", causal=True),
                               reference.attention(q, k2, v2, mask=by_hand(4, np.full(4, TK))), atol=1e-14)
    padding = np.arange(TK) < n[:, None, None, None]  # (B, 1, 1, Tk)
    band = np.abs(np.arange(TK) - (np.arange(4)[:, None] + TK - 4)) <= 1  # (Tq, Tk): at Tk − Tq + i, not by length
    np.testing.assert_allclose(attention(q, k, v, backend="blockwise", mask=masks.key_lengths(n), window=1),
                               reference.attention(q, k2, v2, mask=padding & band), atol=1e-12)
    pos = (n - 4)[:, None, None, None] + np.arange(4)[:, None]  # (B, 1, Tq, 1): each sequence's own
    own = padding & (np.abs(np.arange(TK) - pos) <= 1)
    np.testing.assert_allclose(attention(q, k, v, backend="blockwise", lengths=n, window=1),
                               reference.attention(q, k2, v2, mask=own), atol=1e-12)
