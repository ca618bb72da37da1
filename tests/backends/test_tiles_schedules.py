"""The compiled backward's schedules (``_tiles_backward.h``): heads, split and key groups.

heads and split sum every gradient in the same order (the same bits); key groups add a head's dQ per
group of key blocks, then the groups in order (other roundings, the same gradients). Which one runs
depends on the shapes (groups) and the threads (heads or split); each gives the same bits for any
thread count.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.backends import kernel, online
from attnlab.backends.tiling import Tiling

if kernel.isa() is None:
    pytest.skip("the compiled kernel was not built here", allow_module_level=True)

SCALE = 0.125


def _inputs(tq, tk, d, dv, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 1, tq, d)).astype(np.float32)
    k = rng.standard_normal((1, tk, d)).astype(np.float32)
    v = rng.standard_normal((1, tk, dv)).astype(np.float32)
    tiling = Tiling(tq, tk)
    out, lse = kernel.forward(q, k, v, tiling, scale=SCALE)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    return (q, k, v, out, lse, dout, None), tiling


def test_split_schedule_gives_the_heads_schedules_bits():
    """Two key groups of 33,000 query rows x 64 would take 4.2 M floats of dQ buffers, past the groups'
    limit (KGROUP_FLOATS, 4 M): one group, so threads=1 runs the heads schedule and threads=2 the split one."""
    args, tiling = _inputs(33_000, 300, 64, 8, 0)
    one = kernel.backward(*args, tiling, scale=SCALE, threads=1)
    two = kernel.backward(*args, tiling, scale=SCALE, threads=2)
    for x, y in zip(one, two):
        np.testing.assert_array_equal(x, y)


def test_key_groups_give_the_loops_gradients_and_the_same_bits_for_any_thread_count():
    """One head, 16 key blocks of 256: 8 groups of 2 blocks, their dQ added in group order."""
    args, tiling = _inputs(300, 4000, 32, 24, 1)
    one = kernel.backward(*args, tiling, scale=SCALE, threads=1)
    loop = online.backward(*args, tiling, scale=SCALE)
    for x, y in zip(one, loop):
        np.testing.assert_allclose(x, y, atol=5e-6)
    for threads in (2, 3):
        for x, y in zip(one, kernel.backward(*args, tiling, scale=SCALE, threads=threads)):
            np.testing.assert_array_equal(x, y)
