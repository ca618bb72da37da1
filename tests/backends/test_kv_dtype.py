"""A float32 query over a float16 or bfloat16 cache (docs/design.md, the dtype rule): allowed, the result
is q's dtype, computed on the values as stored; backends that do not serve it say so by a declared reason."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.backends import base
from attnlab.backends.agreement import reference_of, request_of, to_float64
from attnlab.backends.api import attention
from attnlab.backends.dispatch import BACKENDS, refusals

pytestmark = pytest.mark.needs("torch")
try:
    import torch
except ImportError:  # the needs mark skips every test here (on CI: fails them)
    torch = None


def _inputs(kv_dtype):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 3, 16, generator=gen)
    k, v = (torch.randn(2, 2, 40, 16, generator=gen).to(kv_dtype) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
def test_a_sixteen_bit_cache_under_a_float32_query(kv_dtype):
    q, k, v = _inputs(getattr(torch, kv_dtype))
    kw = {"causal": True, "lengths": np.array([40, 17])}
    want = reference_of(*(to_float64(x) for x in (q, k, v)), **kw)  # float64 on the 16-bit values as stored
    reasons = refusals(request_of(q, k, v, **kw))
    served = [n for n, why in reasons.items() if not why]
    assert {"torch", "blockwise"} <= set(served)
    for name in served:
        out = attention(q, k, v, backend=name, **kw)
        assert out.dtype == torch.float32, name
        np.testing.assert_allclose(out.numpy(), want, atol=1e-5, err_msg=name)
    for name, why in reasons.items():
        if name not in served and name != "numpy":
            assert base.refusal(BACKENDS[name].supports, "kv_dtype") in why, name
    assert attention(q, k, v, **kw).dtype == torch.float32  # auto finds one


def test_other_mixes_are_refused_naming_the_dtypes():
    q, k, v = _inputs(torch.bfloat16)
    with pytest.raises(TypeError, match="q bfloat16 and k, v float32"):
        attention(q.bfloat16(), k.float(), v.float())
    with pytest.raises(TypeError, match="k and v must share one dtype, got k bfloat16 and v float16"):
        attention(q, k, v.half())
    with pytest.raises(TypeError, match="q float64 and k, v float16"):
        attention(q.double(), k.half(), v.half())
