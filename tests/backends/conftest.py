"""What the compiled kernel's tests share: ``isa``, a test run once per instruction set compiled in that this CPU
runs (AVX-512, AVX2, 128-bit vectors), the best one restored after it. Without a built kernel there are none (the
test modules skip, or on CI fail, before they need one)."""

from __future__ import annotations

import pytest

from attnlab.backends import kernel

ISAS = kernel._tiles.isas() if kernel._tiles is not None else []


@pytest.fixture(params=ISAS)
def isa(request):
    best = kernel._tiles.isa()
    assert kernel._tiles.isa(request.param) == request.param
    yield request.param
    kernel._tiles.isa(best)
