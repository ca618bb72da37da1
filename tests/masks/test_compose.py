"""Random compositions of attnlab.masks, on every backend, against the reference on the dense mask.

The backends read a description as key intervals (its spans) or tile by tile from its rule; the dense mask
here comes from the rule alone (:meth:`Mask.dense`), so the two encodings check each other.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab import masks
from attnlab.backends.api import attention
from attnlab.backends.dispatch import BACKENDS
from attnlab.backends.request import prepare
from attnlab.backends.options import Options
from attnlab.reference import attention as reference

B, H, HKV, D = 2, 4, 2, 8


def _leaf(draw, tk: int) -> masks.Mask:
    kind = draw(st.sampled_from(["causal", "window", "documents", "prefix", "key_lengths", "sink_tokens"]))
    small = st.integers(0, tk + 2)
    if kind == "causal":
        return masks.causal()
    if kind == "window":
        return masks.window(draw(st.one_of(st.none(), small)), draw(st.one_of(st.none(), small)))
    if kind == "documents":
        cuts = sorted(draw(st.lists(st.integers(1, max(tk - 1, 1)), max_size=4)))
        return masks.documents(np.searchsorted(cuts, np.arange(tk), side="right"))
    if kind == "sink_tokens":
        return masks.sink_tokens(draw(small))
    n = np.array(draw(st.lists(st.integers(0, tk), min_size=B, max_size=B)))
    return masks.prefix(n) if kind == "prefix" else masks.key_lengths(n)


@st.composite
def descriptions(draw) -> tuple:
    tq, tk = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    m = _leaf(draw, tk)
    for _ in range(draw(st.integers(0, 3))):
        other = _leaf(draw, tk)
        m = m & other if draw(st.booleans()) else m | other
    extra = {}
    if draw(st.booleans()):
        extra["score_mod"] = masks.alibi(np.array(masks.alibi_slopes(H)))
    if draw(st.booleans()):
        extra["sink_logits"] = np.array(draw(st.lists(st.floats(-3, 3), min_size=H, max_size=H)))
    return tq, tk, m, extra


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(descriptions(), st.integers(0, 2**16))
@pytest.mark.needs("torch")
def test_every_backend_agrees_with_the_dense_reference(case, seed):
    import torch

    tq, tk, m, extra = case
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((B, H, tq, D)), rng.standard_normal((B, HKV, tk, D)), rng.standard_normal((B, HKV, tk, D))
    dense = m.dense(tq, tk, (B, H))  # by the rule alone
    g = H // HKV
    want = reference.attention(q, np.repeat(k, g, 1), np.repeat(v, g, 1), mask=dense, **extra)
    for name, backend in BACKENDS.items():
        x = [a.astype(np.float32) for a in (q, k, v)] if name == "kernel" else [q, k, v]
        if name != "numpy":
            x = [torch.from_numpy(a) for a in x]
        kw = {n: torch.from_numpy(a) if isinstance(a, np.ndarray) and name != "numpy" else a for n, a in extra.items()}
        if backend.refusals(prepare(*x, Options(mask=m, **kw)).request):
            continue
        got = attention(*x, mask=m, backend=name, **kw)
        got = got.double().numpy() if hasattr(got, "numpy") else got
        np.testing.assert_allclose(got, want, atol=2e-5 if name == "kernel" else 1e-10, err_msg=f"{name}: {m!r}")
