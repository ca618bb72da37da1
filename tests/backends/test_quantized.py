"""A quantized cache's keys and values in attnlab.attention (QuantizedKV): the output equals the float64
reference on the dequantized keys and values within float32 rounding (GQA, windows, ragged lengths, rotation),
the stored format reads as docs/generation.md says, and the backends that would not read codes refuse by name.
Served by blockwise (a key block at a time), torch (a tile of keys at a time), numpy (the float64 reference) and the
compiled kernel's decode pass (every kind, dequantized in registers)."""

from __future__ import annotations

import numpy as np
import pytest

import attnlab
from attnlab import masks

torch = pytest.importorskip("torch")

B, HKV, G, D = 2, 2, 3, 64


def _filled(kind, lengths, rotate=False, seed=0, tq_prefill=None):
    """Keys and values Stores of ``kind`` with ``lengths`` (B,) positions written (a ragged prefill, then decode
    steps), and the float entries written."""
    from attnlab.transformer.layer_cache import Step
    from attnlab.transformer.quantize import Store

    g = torch.Generator().manual_seed(seed)
    cap = max(lengths)
    k, v = torch.randn(B, HKV, cap, D, generator=g) * 2, torch.randn(B, HKV, cap, D, generator=g)
    ks = Store(kind, B, HKV, D, cap, torch.float32, "cpu", grouping="channel", rotate=rotate)
    vs = Store(kind, B, HKV, D, cap, torch.float32, "cpu", grouping="token")
    first = torch.tensor([n - 3 for n in lengths])  # the prompts; then three single-token steps
    tq = int(first.max())
    kk, vv = torch.zeros(B, HKV, tq, D), torch.zeros(B, HKV, tq, D)
    for b, n in enumerate(first.tolist()):  # right-aligned in the step's columns (padding first)
        kk[b, :, tq - n:], vv[b, :, tq - n:] = k[b, :, :n], v[b, :, :n]
    step = Step(torch.zeros(B, dtype=torch.long), first, tq)
    ks.write(step, kk)
    vs.write(step, vv)
    start = first.clone()
    for _ in range(3):
        step = Step(start.clone(), torch.ones(B, dtype=torch.long), 1, True)
        b = torch.arange(B)
        ks.write(step, k[b, :, start][:, :, None])
        vs.write(step, v[b, :, start][:, :, None])
        start += 1
    return ks, vs, k, v


@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("window", [None, 37])
def test_output_equals_the_float64_reference_on_the_dequantized_cache(kind, rotate, window):
    lengths = [203, 170]
    ks, vs, _, _ = _filled(kind, lengths, rotate)
    qk, qv = ks.read(max(lengths)), vs.read(max(lengths))
    q = torch.randn(B, HKV * G, 2, D, generator=torch.Generator().manual_seed(1))
    kw = {"lengths": torch.tensor(lengths), "causal": True, "mask": None if window is None else masks.sliding_window(window)}
    out = attnlab.attention(q, qk, qv, **kw)  # auto: blockwise, a key block at a time
    k64, v64 = qk.reference(), qv.reference()  # float64, original basis
    want = attnlab.attention(q.double().numpy(), np.repeat(k64, G, 1), np.repeat(v64, G, 1),
                             lengths=np.array(lengths), causal=True, mask=kw["mask"], backend="numpy")
    err = np.abs(out.double().numpy() - want).max()
    assert err < 2e-5 * max(1.0, np.abs(want).max()), err
    # the torch backend reads it a tile of keys at a time (scores materialised, as it always does)
    by_torch = attnlab.attention(q, qk, qv, backend="torch", **kw)
    assert np.abs(by_torch.double().numpy() - want).max() < 2e-5 * max(1.0, np.abs(want).max())
    # the compiled decode pass reads the codes in place, dequantized in registers (int4: its residual too)
    by_kernel = attnlab.attention(q, qk, qv, backend="kernel", **kw)
    assert np.abs(by_kernel.double().numpy() - want).max() < 2e-5 * max(1.0, np.abs(want).max())
    # the numpy backend takes the QuantizedKV itself: the same float64 reference
    got = attnlab.attention(q.double().numpy(), qk, qv, lengths=np.array(lengths), causal=True, mask=kw["mask"],
                            backend="numpy")
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # the chosen rows' weights, recomputed a key block at a time, equal the reference's
    _, w = attnlab.attention(q, qk, qv, weights_rows=[1], backend="blockwise", **kw)
    _, w64 = attnlab.attention(q.double().numpy(), k64, v64, return_weights=True, backend="numpy",
                               lengths=np.array(lengths), causal=True, mask=kw["mask"])
    np.testing.assert_allclose(w[:, :, 0].double().numpy(), w64[:, :, 1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind, tol", [("int8", 0.01), ("int4", 0.2), ("fp8", 0.07)])
def test_dequantized_entries_are_close_to_what_was_written_and_rotation_is_undone(kind, tol):
    lengths = [203, 170]
    for rotate in (False, True):
        ks, _, k, _ = _filled(kind, lengths, rotate)
        got = ks.read(max(lengths)).reference()
        for b, n in enumerate(lengths):
            rel = np.abs(got[b, :, :n] - k[b, :, :n].numpy()).max() / np.abs(k[b, :, :n].numpy()).max()
            assert rel < tol, (rotate, b, rel)


def test_the_stored_format_reads_as_documented():
    """int8 x̂ = code·scale; int4 channel 2j in the low nibble, x̂ = code·scale + zero; fp8 x̂ = code·scale."""
    from attnlab.reference.quantized import QuantizedKV

    codes8 = torch.tensor([[[[3, -127]]]], dtype=torch.int8)
    x = QuantizedKV("int8", codes8, torch.tensor([[[0.5]]]), 1, 2, 64.0).dequantize(0, 1)
    assert x.flatten().tolist() == [1.5, -63.5]
    packed = torch.zeros(1, 1, 1, 16, dtype=torch.uint8)
    packed[..., 0] = 0x52  # channel 0: code 2 (low nibble), channel 1: code 5 (high nibble)
    scale, zero = torch.full((1, 1, 1, 1), 0.25), torch.full((1, 1, 1, 1), -1.0)  # values: one group of 32 channels
    q4 = QuantizedKV("int4", packed, scale, 1, 32, 9.0, zero, torch.zeros(1, 1, 160, 32), torch.tensor([1]))
    assert q4.dequantize(0, 1).flatten()[:3].tolist() == [-0.5, 0.25, -1.0]
    codes = torch.tensor([[[[448.0, -2.0]]]]).to(torch.float8_e4m3fn)
    f8 = QuantizedKV("fp8", codes, torch.tensor([[0.5]]), 1, 2, 300.0).dequantize(0, 1)
    assert f8.flatten().tolist() == [224.0, -1.0]


def test_int4_keeps_the_newest_positions_exact_and_groups_whole():
    from attnlab.reference.quantized import GROUP, RESIDUAL

    lengths = [203, 170]
    ks, vs, k, v = _filled("int4", lengths)
    for b, n in enumerate(lengths):
        q = int(ks.quantized[b])
        assert q % GROUP == 0 and RESIDUAL <= n - q < RESIDUAL + GROUP
        got_k, got_v = ks.read(n).reference()[b], vs.read(n).reference()[b]
        np.testing.assert_array_equal(got_k[:, q:n], k[b, :, q:n].numpy())
        np.testing.assert_array_equal(got_v[:, q:n], v[b, :, q:n].numpy())


@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
def test_each_store_bounds_every_row_it_holds_as_read(kind, rotate):
    """Store.norm (what overflow checks use instead of a pass over the cache) is at least the length of every row as
    it is read, after every write: decoding steps that put one position in every sequence (int4: to the ring, and
    every 32 a group into codes) and ragged ones; and no looser than the rows as they were read. The longest row is
    the first, and as int4 values it is longer as codes than as written (0.95 rounds to 1 in a group from -1 to 1):
    the bound must follow it into codes."""
    from attnlab.transformer.layer_cache import Step
    from attnlab.transformer.quantize import Store

    g, n = torch.Generator().manual_seed(5), 200  # int4: the first group turns into codes at 160
    x = torch.randn(B, HKV, n, D, generator=g)
    x[:, :, 0] = torch.tensor([-1.0, 1.0] + [0.95] * 30).repeat(D // 32) * 10  # the longest, longer as int4 codes
    for even in (True, False):
        for grouping in ("channel", "token"):
            s = Store(kind, B, HKV, D, n, torch.float32, "cpu", grouping=grouping, rotate=rotate and grouping == "channel")
            first = torch.tensor([40, 40] if even else [40, 27])  # the prompts (ragged: right-aligned, padding first)
            prompt = torch.zeros(B, HKV, 40, D)
            for b, m in enumerate(first.tolist()):
                prompt[b, :, 40 - m:] = x[b, :, :m]
            s.write(Step(torch.zeros(B, dtype=torch.long), first, 40), prompt)
            start, seen = first.clone(), 0.0  # seen: the longest row as read so far, at any step
            while int(start.max()) < n:
                s.write(Step(start.clone(), torch.ones(B, dtype=torch.long), 1, True), x[torch.arange(B), :, start][:, :, None])
                start += 1
                rows = s.read(int(start.max())).dequantize(0, int(start.max()))
                held = torch.arange(rows.shape[2])[None, None, :] < start[:, None, None]
                longest = float(torch.where(held, torch.linalg.vector_norm(rows, dim=-1), 0.0).max())
                assert s.norm >= longest
                seen = max(seen, longest)
            assert s.norm == pytest.approx(seen, rel=1e-6)


def test_fp8_codes_times_their_scale_are_the_dequantized_bits():
    """A fp8 Store bounds its new rows by codes · scale (two operations on a step's few rows); QuantizedKV.dequantize
    reads them through float16 bits (fast on a whole cache): both round code · scale once, so every code gives the
    same bits at scales over 80 octaves."""
    from attnlab.reference.quantized import QuantizedKV

    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    codes = codes[~torch.isnan(codes.to(torch.float32))].reshape(1, 1, -1, 2)  # every code but NaN
    for e in range(-40, 40):
        for m in (1.0, 1.37, 1.999):
            scale = torch.full((1, 1), m * 2.0 ** e)
            direct = codes.to(torch.float32) * scale[:, :, None, None]
            read = QuantizedKV("fp8", codes, scale, codes.shape[2], 2, 0.0).dequantize(0, codes.shape[2])
            assert torch.equal(direct.view(torch.int32), read.view(torch.int32))


def test_fp8_sets_its_scale_at_the_first_write_and_counts_saturations():
    from attnlab.transformer.layer_cache import Step
    from attnlab.transformer.quantize import Store

    s = Store("fp8", 1, 1, 4, 4, torch.float32, "cpu")
    s.write(Step(torch.tensor([0]), torch.tensor([1]), 1), torch.tensor([[[[1.0, -2.0, 0.5, 0.0]]]]))
    assert float(s.scale) == pytest.approx(2.0 / 448)
    s.write(Step(torch.tensor([1]), torch.tensor([1]), 1, True), torch.tensor([[[[3.0, 1.0, -5.0, 0.0]]]]))
    assert s.saturated == 2
    assert s.read(2).dequantize(0, 2)[0, 0, 1].tolist() == [2.0, 1.0, -2.0, 0.0]


@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
def test_nbytes_counts_every_tensor_held(kind):
    ks, vs, _, _ = _filled(kind, [203, 170])
    for s in (ks, vs):
        held = [t for t in vars(s).values() if isinstance(t, torch.Tensor)]
        assert s.nbytes == sum(t.nbytes for t in held) == s.read(5).nbytes
        codes_and_scales = s.codes.nbytes + s.scale.nbytes + (0 if s.zero is None else s.zero.nbytes)
        assert codes_and_scales < 0.3 * 203 * B * HKV * D * 4  # under 0.3x a float32 copy of the positions held


def test_the_backends_that_do_not_read_codes_refuse_by_the_declared_feature():
    ks, vs, _, _ = _filled("int8", [40, 40])
    qk, qv = ks.read(40), vs.read(40)
    q = torch.randn(B, HKV * G, 1, D)
    with pytest.raises(attnlab.backends.dispatch.NoBackendError, match="quantized cache's keys and values"):
        attnlab.attention(q, qk, qv, backend="sdpa")
    auto = attnlab.backends.dispatch.choose(attnlab.backends.request.prepare(q, qk, qv).request).name
    assert auto in ("blockwise", "torch", "kernel")
    with pytest.raises(attnlab.backends.dispatch.NoBackendError, match="in its decode pass only"):
        attnlab.attention(torch.randn(B, HKV * G, 40, D), qk, qv, backend="kernel", causal=True)


@pytest.mark.parametrize("kind", ["int8", "fp8", "int4"])
def test_the_kernel_reads_a_prefix_of_a_longer_quantized_cache_in_place(kind):
    """A step reads the first Tk of the cache's C slots: codes and int8's per-key scales are strided views
    ([:, :, :Tk] of (B, H, C)), read where they lie; int4's groups and residual ring as the cache holds them."""
    ks, vs, _, _ = _filled(kind, [203, 170])
    qk, qv = ks.read(150), vs.read(150)
    assert qk.codes.shape[2] > 150
    q = torch.randn(B, HKV * G, 1, D, generator=torch.Generator().manual_seed(2))
    kw = {"lengths": torch.tensor([150, 140]), "causal": True}
    got = attnlab.attention(q, qk, qv, backend="kernel", **kw)
    want = attnlab.attention(q.double().numpy(), np.repeat(qk.reference(), G, 1), np.repeat(qv.reference(), G, 1),
                             lengths=np.array([150, 140]), causal=True, backend="numpy")
    assert np.abs(got.double().numpy() - want).max() < 2e-5 * max(1.0, np.abs(want).max())


def test_k_and_v_must_both_be_quantized_and_match_q():
    ks, vs, k, _ = _filled("int8", [40, 40])
    q = torch.randn(B, HKV * G, 1, D)
    with pytest.raises(TypeError, match="k and v must both be QuantizedKV"):
        attnlab.attention(q, ks.read(40), k[:, :, :40])
    with pytest.raises(ValueError, match="q must be \\(B, H, Tq, D\\) with the B=2 sequences"):
        attnlab.attention(q[:1], ks.read(40), vs.read(40))


def test_fp8_codes_read_as_torch_casts_them_every_one():
    from attnlab.reference.quantized import QuantizedKV

    every = torch.arange(256, dtype=torch.uint8)
    codes = every[(every & 0x7F) != 0x7F].view(torch.float8_e4m3fn).reshape(1, 1, -1, 1)  # all but the NaNs
    x = QuantizedKV("fp8", codes, torch.tensor([[0.75]]), codes.shape[2], 1, 400.0).dequantize(0, codes.shape[2])
    assert torch.equal(x.flatten(), codes.to(torch.float32).flatten() * 0.75)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_the_kernel_reads_codes_under_alibi_softcap_and_sinks(kind):
    """The decode pass's visibility and score changes are the same over codes: ALiBi, softcapping and learned
    sinks against the float64 reference on the QuantizedKV (the numpy backend), with a window and ragged lengths."""
    ks, vs, _, _ = _filled(kind, [203, 170])
    qk, qv = ks.read(203), vs.read(203)
    g = torch.Generator().manual_seed(3)
    q, sinks = torch.randn(B, HKV * G, 2, D, generator=g), torch.randn(HKV * G, generator=g)
    kw = {"causal": True, "mask": masks.sliding_window(90), "score_mod": masks.alibi(masks.alibi_slopes(HKV * G)),
          "softcap": 4.0}
    got = attnlab.attention(q, qk, qv, backend="kernel", lengths=torch.tensor([203, 170]), sink_logits=sinks, **kw)
    want = attnlab.attention(q.double().numpy(), qk, qv, backend="numpy", lengths=np.array([203, 170]),
                             sink_logits=sinks.double().numpy(), **kw)
    assert np.abs(got.double().numpy() - want).max() < 2e-5 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
def test_a_cache_read_describes_codes_as_a_checked_call_does(kind):
    """prepare_read (a decoding step's read, no second look at what the cache holds) describes a quantized read
    as prepare does: the same request (shapes, kind, score bound from the stored norm), so the same backend."""
    from attnlab.backends.options import Options
    from attnlab.backends.request import prepare, prepare_read

    ks, vs, _, _ = _filled(kind, [40, 29])
    q = torch.randn(B, HKV * G, 1, D, generator=torch.Generator().manual_seed(3))
    o = Options.of({"causal": True, "mask": None, "lengths": torch.tensor([40, 29])})
    lean, full = prepare_read(q, ks.read(40), vs.read(40), o), prepare(q, ks.read(40), vs.read(40), o)
    assert lean.request == full.request and lean.request.quantized == kind
    assert lean.k.kind == kind and lean.v.kind == kind  # the codes themselves go to the backend, not stand-ins
