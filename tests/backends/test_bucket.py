"""auto decides once per length bucket, and a cache's read skips only what the cache checked."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.needs("torch")


def test_auto_explains_once_per_length_bucket(monkeypatch):
    """Tk 33..64 is one bucket (explained at its top, 64), 65 the next: a decoding step whose Tk grows by
    one asks auto again only when Tk passes a power of two."""
    import torch

    from attnlab import attention
    from attnlab.backends import dispatch

    explained = []
    real = dispatch.explain
    monkeypatch.setattr(dispatch, "explain", lambda r: explained.append(r.problem.tk) or real(r))
    monkeypatch.setattr(dispatch, "_CHOICES", {})
    q = torch.randn(1, 4, 1, 16)
    for tk in range(33, 66):
        k = torch.randn(1, 2, tk, 16)
        attention(q, k, k, causal=True)
    assert explained == [64, 128]
    assert dispatch.bucket(1) == 1 and dispatch.bucket(64) == 64 and dispatch.bucket(65) == 128


def test_a_cache_read_is_the_plain_calls_request_without_the_checks():
    import torch

    from attnlab.backends.options import Options
    from attnlab.backends.request import max_norm, prepare, prepare_read

    q, k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    o = Options(causal=True, scale=0.3, kv_checked=True, k_norm=max_norm(k), lengths=torch.tensor([9, 5]))
    plain, read = prepare(q, k, v, o), prepare_read(q, k, v, o)
    assert read.request == plain.request and math.isclose(read.request.score_bound, plain.request.score_bound)
    bad = q.clone()
    bad[1, 2, 0, 3] = float("inf")
    with pytest.raises(ValueError, match="q contains NaN or Inf"):
        prepare_read(bad, k, v, o)
    with pytest.raises(ValueError, match="lengths must lie in 0..Tk=9"):
        prepare_read(q, k, v, Options(causal=True, kv_checked=True, k_norm=1.0, lengths=torch.tensor([10, 5])))
