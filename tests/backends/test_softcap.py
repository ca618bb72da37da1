"""Logit softcapping (Gemma-2): the reference defines it, the torch backend agrees, the others refuse."""

import numpy as np
import pytest

import attnlab
from attnlab.reference.attention import attention as reference

rng = np.random.default_rng(0)
Q, K, V = (rng.standard_normal((2, 3, 7, 8)) * 4 for _ in range(3))


def _by_hand(q, k, v, c, scale, causal=False):
    s = q @ np.swapaxes(k, -1, -2) * scale
    s = c * np.tanh(s / c)
    if causal:
        s = np.where(np.tri(s.shape[-2], s.shape[-1], dtype=bool), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w @ v, w


def test_reference_is_tanh_of_scaled_scores():
    out, w = reference(Q, K, V, softcap=2.0, return_weights=True)
    want_out, want_w = _by_hand(Q, K, V, 2.0, 1 / np.sqrt(8))
    np.testing.assert_allclose(w, want_w, atol=1e-12)
    np.testing.assert_allclose(out, want_out, atol=1e-12)


def test_large_cap_changes_nothing_and_small_cap_flattens():
    _, plain = reference(Q, K, V, return_weights=True)
    _, loose = reference(Q, K, V, softcap=1e6, return_weights=True)
    np.testing.assert_allclose(loose, plain, atol=1e-9)
    _, tight = reference(Q, K, V, softcap=1e-3, return_weights=True)  # every score within ±0.001: nearly uniform
    np.testing.assert_allclose(tight, 1 / 7, atol=1e-3)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.needs("torch")
def test_backends_agree_with_the_reference(backend):
    import torch

    q, k, v = Q, K[:, :1], V[:, :1]  # grouped-query: one key/value head for three query heads
    want, want_w = _by_hand(q, np.repeat(k, 3, 1), np.repeat(v, 3, 1), 1.5, 0.3, causal=True)
    args = (q, k, v) if backend == "numpy" else tuple(torch.from_numpy(x) for x in (q, k, v))
    out, w = attnlab.attention(*args, softcap=1.5, scale=0.3, causal=True, return_weights=True, backend=backend)
    np.testing.assert_allclose(np.asarray(w), want_w, atol=1e-10)
    np.testing.assert_allclose(np.asarray(out), want, atol=1e-10)


@pytest.mark.parametrize("backend", ["sdpa"])
@pytest.mark.needs("torch")
def test_other_backends_refuse_it(backend):
    from attnlab.backends.dispatch import NoBackendError

    with pytest.raises(NoBackendError, match="softcapping"):
        attnlab.attention(Q.astype(np.float32), K.astype(np.float32), V.astype(np.float32), softcap=2.0, backend=backend)


def test_auto_picks_a_backend_that_softcaps():
    out = attnlab.attention(Q, K, V, softcap=2.0)
    np.testing.assert_allclose(out, _by_hand(Q, K, V, 2.0, 1 / np.sqrt(8))[0], atol=1e-10)


@pytest.mark.parametrize("bad, error", [(0.0, ValueError), (-1.0, ValueError), (float("inf"), ValueError), ("2", TypeError), (True, TypeError)])
def test_bad_softcap(bad, error):
    with pytest.raises(error, match="softcap"):
        attnlab.attention(Q, K, V, softcap=bad)
