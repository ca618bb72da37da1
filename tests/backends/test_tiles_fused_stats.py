"""The forward with head_stats' statistics in one pass (kernel.fused, _tiles.forward_stats): its out and LSE the
kernel forward's bit for bit, its sums and column sums those of the statistics pass after that forward and of
float64 weights from dense scores, for causal, windows, sink tokens, learned sinks, softcap, grouped heads and
odd blocks, on every instruction set; the same bits for any thread count; its refusals name the argument."""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest

from attnlab import masks
from attnlab.backends import kernel
from attnlab.backends.kernel import fused
from attnlab.backends.tiling import Tiling
from attnlab.backends.visible import describe

if kernel.isa() is None:
    pytest.skip("the compiled kernel was not built here", allow_module_level=True)

CASES = {
    "causal-gqa": dict(b=2, g=3, t=300, d=32, dv=32, mask=masks.causal()),
    "full-odd": dict(b=1, g=3, t=97, d=59, dv=40, mask=None),
    "window": dict(b=1, g=2, t=257, d=16, dv=24, mask=masks.window(37, 5)),
    "sink-tokens-and-window": dict(b=1, g=2, t=300, d=16, dv=16,
                                   mask=(masks.window(20, 0) | masks.sink_tokens(3)) & masks.causal()),
    "learned-sinks": dict(b=1, g=2, t=300, d=16, dv=16, mask=masks.causal(), sinks=[0.5, 3.0]),
    "softcap-window": dict(b=1, g=1, t=200, d=64, dv=64, mask=masks.window(20, 0), softcap=2.0),
    "one-token": dict(b=1, g=2, t=1, d=8, dv=8, mask=masks.causal()),
}


def _case(case):
    rng = np.random.default_rng(zlib.crc32(repr(sorted(case.items(), key=str)).encode()))
    b, g, t, d, dv = (case[x] for x in ("b", "g", "t", "d", "dv"))
    q = (rng.standard_normal((b, g, t, d)) * 2).astype(np.float32)
    k = rng.standard_normal((b, t, d)).astype(np.float32)
    v = rng.standard_normal((b, t, dv)).astype(np.float32)
    sinks = None if "sinks" not in case else np.broadcast_to(np.float32(case["sinks"]), (b, g)).copy()
    visible = describe(case["mask"], t, t, (b, g))
    if case.get("softcap"):
        visible = dataclasses.replace(visible, softcap=case["softcap"])
    return q, k, v, sinks, visible


def _dense(q, k, lse, scale, seen, softcap, sinks):
    """(sums (B, G, 7), received (B, G, T)) by definition in float64 from dense weights exp(s − LSE)."""
    b, g, t, _ = q.shape
    s = np.einsum("bgid,bjd->bgij", q.astype(np.float64), k.astype(np.float64)) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    x = np.where(seen, s - lse.astype(np.float64)[..., None], 0.0)
    w = np.where(seen, np.exp(x), 0.0)
    ent = -(w * x).sum(-1)  # (B, G, T)
    n = seen.sum(-1) + np.zeros((b, g, t), int)
    if sinks is not None:  # the sink: one more outcome
        share = np.exp(sinks.astype(np.float64)[..., None] - lse)
        ent, n = ent - share * np.log(share), n + 1
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    rows = {"prev": np.diagonal(w, -1, -2, -1).sum(-1), "self": np.diagonal(w, 0, -2, -1).sum(-1),
            "next": np.diagonal(w, 1, -2, -1).sum(-1), "first": w[..., 0].sum(-1),
            "distance": (w * np.abs(i - j)).sum((-1, -2)), "entropy": ent.sum(-1),
            "entropy_norm": np.where(n > 1, ent / np.log(np.maximum(n, 2)), 0.0).sum(-1)}
    return np.stack([rows[name] for name in kernel.STATS], -1), w.sum(-2)


@pytest.mark.parametrize("block", [None, (16, 23), (1000, 5)], ids=["default", "16x23", "1000x5"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_one_pass_equals_the_forward_and_the_statistics_pass(case, block, isa):
    q, k, v, sinks, visible = _case(case)
    t, d = q.shape[2:]
    scale, cap = d**-0.5, case.get("softcap")
    tiling = Tiling(t, t, visible)
    out, lse = kernel.forward(q, k, v, tiling, scale=scale, block_size=block, sinks=sinks)
    got_out, got_lse, sums, received = fused.forward_stats(q, k, v, tiling, scale=scale, sinks=sinks, block_size=block)
    np.testing.assert_array_equal(got_out, out)  # the forward's part is the forward, bit for bit
    np.testing.assert_array_equal(got_lse, lse)
    two = kernel.stats(q, k, got_lse, scale=scale, mask=case["mask"], softcap=cap, sinks=sinks, block_size=block)
    seen = np.ones((t, t), bool) if case["mask"] is None else case["mask"].dense(t)[0, 0]
    want = _dense(q, k, got_lse, scale, seen, cap, sinks)
    for got, pass_, dense in zip((sums, received), two, want):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, pass_, rtol=2e-6, atol=1e-6)
        np.testing.assert_allclose(got, dense, rtol=2e-6, atol=1e-6)


def test_one_pass_is_the_same_bits_for_any_thread_count(isa):
    q, k, v, _, visible = _case(CASES["causal-gqa"])
    tiling = Tiling(q.shape[2], q.shape[2], visible)
    one = fused.forward_stats(q, k, v, tiling, scale=0.2, threads=1)
    three = fused.forward_stats(q, k, v, tiling, scale=0.2, threads=3)
    for a, b in zip(one, three):
        np.testing.assert_array_equal(a, b)  # a head is always one thread's, its blocks in order


def test_bad_arguments_are_refused_naming_them():
    f = np.float32
    args = dict(q=np.zeros((1, 2, 4, 8), f), k=np.zeros((1, 4, 8), f), v=np.zeros((1, 4, 8), f),
                out=np.empty((1, 2, 4, 8), f), lse=np.empty((1, 2, 4), f), sums=np.empty((1, 2, 7)),
                received=np.empty((1, 2, 4)), scale=1.0, block_q=4, block_k=4, threads=1)
    for change, text in [({"k": np.zeros((1, 5, 8), f)}, "k: expected shape (B=1, T=4, D=8), got (1, 5, 8)"),
                         ({"received": np.empty((1, 2, 4), f)}, "received: expected float64 items"),
                         ({"sums": np.empty((1, 2, 6))}, "sums: expected shape (B=1, G=2, S=7), got (1, 2, 6)"),
                         ({"block_q": 0}, "block_q: expected a block size >= 1, got 0")]:
        with pytest.raises(ValueError) as e:
            kernel._tiles.forward_stats(**{**args, **change})
        assert text in str(e.value)
    with pytest.raises(ValueError, match=r"k: expected shape \(B=1, T=4, D\) \(self-attention"):
        fused.forward_stats(args["q"], np.zeros((1, 5, 8), f), np.zeros((1, 5, 8), f), Tiling(4, 5, None), scale=1.0)


def test_kept_bytes_grow_with_the_keys_and_the_threads():
    assert fused.kept_bytes(8192, threads=2) == 2 * 96 * (8192 + 16) * 4
    assert fused.kept_bytes(100, block_q=16, threads=1) == 24 * (112 + 16) * 4
