"""Quantized KV caches in generate (cache_dtype="int8" | "int4" | "fp8", rotate=): codes only, bytes counted from
the tensors held, a prompt written at once or in pieces stores the same codes, every bad input refused first."""

from __future__ import annotations

import pytest

from attnlab.cli.app import main

torch = pytest.importorskip("torch")


def _model(d_model=128, heads=4, kv_heads=2):
    from attnlab.transformer import Transformer, TransformerConfig

    torch.manual_seed(0)
    c = TransformerConfig(vocab_size=40, d_model=d_model, num_layers=2, num_heads=heads, num_kv_heads=kv_heads,
                          positions="rotary", norm="rmsnorm", ffn="gated", activation="silu", max_positions=512)
    return Transformer(c)


PROMPTS = [list(range(1, 39)), list(range(3, 20))]


@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
def test_a_quantized_cache_holds_codes_only_and_counts_its_bytes(kind):
    m = _model()
    g = m.generate(PROMPTS, 6, cache_dtype=kind, rotate=kind == "int8")
    kv = g.kv_cache
    assert kv.cache_dtype == kind and kv.to_dict()["dtype"] == kind
    total = 0
    for layer in kv.layers:
        for store in (layer.k, layer.v):
            held = [t for t in vars(store).values() if isinstance(t, torch.Tensor)]
            floats = [t for t in held if t.dtype.is_floating_point and t.dtype != torch.float8_e4m3fn]
            # float tensors: scales and zeros (a number per token or group), and int4's fixed residual ring
            assert all(t.shape[-1] < store.dim or t is store.residual for t in floats if t.dim() == 4 and t is not store.zero
                       and t is not store.scale)
            assert store.nbytes == sum(t.nbytes for t in held)
            total += store.nbytes
    assert kv.nbytes == total
    assert layer.describe()["cache_dtype"] == kind


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_prompt_written_at_once_or_in_pieces_stores_the_same_codes(kind):
    """int8 scales each token, int4 quantizes whole groups once they leave the newest RESIDUAL: neither depends on
    how the tokens came (fp8's scale is the first write's, so it does). The first layer's entries (later layers'
    depend on what earlier steps read: a long prompt's own queries already read its older groups as codes). The
    pieces go into a cache of 40 slots that grows (int4's residual ring with it)."""
    from attnlab.transformer.cache import KVCache

    m = _model()
    ids = torch.arange(1, 200)[None] % 40
    whole = KVCache.for_model(m.config, 1, dtype=kind, capacity=256)
    parts = KVCache.for_model(m.config, 1, dtype=kind, capacity=40)
    with torch.no_grad():
        m(ids, kv_cache=whole)
        for chunk in (ids[:, :70], ids[:, 70:71], ids[:, 71:150], ids[:, 150:]):
            m(chunk, kv_cache=parts)
    for a, b in zip(whole.layers[:1], parts.layers[:1]):
        for sa, sb in ((a.k, b.k), (a.v, b.v)):
            n = sb.codes.shape[2]
            assert n >= 199 and torch.equal(sa.codes[:, :, :199], sb.codes[:, :, :199])
            torch.testing.assert_close(sa.read(199).reference(), sb.read(199).reference(), rtol=1e-6, atol=1e-6)


def test_maps_and_a_cache_passed_back_work_quantized():
    m = _model()
    g = m.generate(PROMPTS, 4, cache_dtype="int4", maps=True)
    rows = g.attention[0][-1]  # [L, H, P + t]
    torch.testing.assert_close(torch.from_numpy(rows.sum(-1)), torch.ones(rows.shape[:2]), rtol=0, atol=1e-5)
    more = m.generate([[int(g.ids[b, -1])] for b in range(2)], 3, cache_dtype="int4", kv_cache=g.kv_cache)
    assert more.ids.shape == (2, 3)


def test_hooked_scores_read_a_quantized_cache_as_the_torch_backend_does():
    m = _model()
    plain = m.generate(PROMPTS, 4, cache_dtype="int8", backend="torch")
    seen = []
    hooks = [("blocks.1.attn.hook_attn_scores", lambda s, name: seen.append(s.shape) or s)]
    hooked = m.generate(PROMPTS, 4, cache_dtype="int8", backend="torch", fwd_hooks=hooks)
    assert torch.equal(plain.ids, hooked.ids) and torch.equal(plain.logits, hooked.logits)
    assert seen[-1][-1] == 38 + 3  # the last step's scores span the longest prompt and the tokens fed since


@pytest.mark.parametrize("kw, model, error, text", [
    ({"cache_dtype": "int3"}, {}, ValueError, "cache_dtype must be one of float32, float64, float16, bfloat16, int8, int4, fp8"),
    ({"cache_dtype": "float16", "rotate": True}, {}, ValueError, "rotate=True rotates keys before they are quantized"),
    ({"rotate": True}, {}, ValueError, "cache_dtype=None does not quantize"),
    ({"cache_dtype": "int8", "rotate": "yes"}, {}, TypeError, "rotate must be True or False"),
    ({"cache_dtype": "int8", "rotate": True}, {"d_model": 96, "heads": 2, "kv_heads": 1}, ValueError,
     "head width that is a power of two; this model's is 48"),
    ({"cache_dtype": "int4"}, {"d_model": 64}, ValueError, "head width 16 is not divisible by 32"),
    ({"cache_dtype": "fp8", "cache": "sink", "window": 8}, {}, ValueError, "cache='sink' is not served quantized"),
    ({"cache_dtype": "int8", "backend": "sdpa"}, {}, ValueError, "backend 'sdpa' does not read a quantized cache"),
])
def test_bad_input_is_refused_before_any_work(kw, model, error, text, monkeypatch):
    from attnlab.transformer import cache

    m = _model(**model)
    monkeypatch.setattr(cache.KVCache, "for_model", lambda *a, **k: pytest.fail("a cache was built"))
    with pytest.raises(error, match=text.replace("(", "\\(").replace(")", "\\)")):
        m.generate(PROMPTS, 3, **kw)


@pytest.mark.parametrize("args, text", [
    (["x", "--cache-dtype", "int9"], "--cache-dtype must be one of float32, float64, float16, bfloat16, int8, int4, fp8"),
    (["x", "--rotate"], "--rotate goes with a quantized --cache-dtype (int8, int4, fp8), got no --cache-dtype"),
    (["x", "--rotate", "--cache-dtype", "bfloat16"], "got --cache-dtype bfloat16"),
])
def test_cli_flags_are_one_line_before_the_model_loads(args, text, capsys, no_decoder):
    assert main(["generate", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and text in err, err


def _store_after(kind, rows, monkeypatch, compiled, grouping="token"):
    """A ``kind`` Store after a prompt of 5 positions then one decoding step per row of ``rows`` (B, H, n, D)."""
    from attnlab.transformer import quantize
    from attnlab.transformer.layer_cache import Step

    if not compiled:
        monkeypatch.setattr(quantize, "_encode", None)
    B, H, n, D = rows.shape
    s = quantize.Store(kind, B, H, D, 5 + n, torch.float32, "cpu", grouping=grouping)
    s.write(Step(torch.zeros(B, dtype=torch.long), torch.full((B,), 5), 5), torch.randn(B, H, 5, D))
    for i in range(n):
        s.write(Step(torch.full((B,), 5 + i), torch.ones(B, dtype=torch.long), 1, True), rows[:, :, i:i + 1])
    monkeypatch.undo()
    return s


@pytest.mark.needs("encode")
def test_a_decoding_steps_int8_codes_are_torchs_bits_from_the_compiled_encoder(monkeypatch):
    torch.manual_seed(0)
    rows = torch.randn(3, 2, 6, 64) * torch.logspace(-30, 30, 6)[None, None, :, None]  # rows of every magnitude
    rows[0, 0, 1] = 0.0  # a row of zeros: codes 0, scale 0
    rows[1, 1, 2] = torch.arange(64, dtype=torch.float32) - 31.5  # halves: x / scale lands on ties (half to even)
    rows[1, 1, 2, 0] = 127.0
    rows[2, 0, 3] = torch.tensor([1.0, -1.0] * 32) * 3e38  # near float32's largest
    torch.manual_seed(1)
    fast = _store_after("int8", rows, monkeypatch, compiled=True)
    torch.manual_seed(1)
    slow = _store_after("int8", rows, monkeypatch, compiled=False)
    assert torch.equal(fast.codes, slow.codes) and torch.equal(fast.scale, slow.scale)
    assert (fast.codes[0, 0, 6] == 0).all() and fast.scale[0, 0, 6] == 0  # the zero row at its slot
    assert slow.norm <= fast.norm <= slow.norm * (1 + 1e-6)  # the longest row as read, rounded up


@pytest.mark.needs("encode")
def test_a_decoding_steps_fp8_codes_and_saturations_are_torchs_from_the_compiled_encoder(monkeypatch):
    torch.manual_seed(0)
    rows = torch.randn(2, 3, 5, 64) * torch.tensor([1e-4, 0.1, 1.0, 30.0, 1e3])[None, None, :, None]  # beyond 448·scale too
    rows[1, 2, 0] = 0.0
    torch.manual_seed(1)
    fast = _store_after("fp8", rows, monkeypatch, compiled=True)
    torch.manual_seed(1)
    slow = _store_after("fp8", rows, monkeypatch, compiled=False)
    assert torch.equal(fast.codes.view(torch.uint8), slow.codes.view(torch.uint8)) and torch.equal(fast.scale, slow.scale)
    assert fast.saturated == slow.saturated > 0  # the 1e3 rows: entries beyond the scale set by the prompt
    assert slow.norm <= fast.norm <= slow.norm * (1 + 1e-6)


@pytest.mark.needs("encode")
@pytest.mark.parametrize("grouping", ["channel", "token"])
def test_int4_decoding_steps_are_torchs_bits_from_the_compiled_encoder(grouping, monkeypatch):
    """A step's token into the ring, and the group of 32 that leaves the ring when one is due, by the compiled
    encoder: 250 steps cross several groups, and every tensor held ends as torch's path leaves it."""
    from attnlab.transformer import quantize

    torch.manual_seed(0)
    rows = torch.randn(2, 2, 250, 64) * 3
    rows[1, 0, 40:120, 5] = 0.7  # a channel constant over whole groups: scale 0 (codes 0, read as the zero point)
    groups = []
    real = quantize._encode.int4_group
    monkeypatch.setattr(quantize._encode, "int4_group", lambda *a: groups.append(a[8]) or real(*a))
    torch.manual_seed(1)
    fast = _store_after("int4", rows, monkeypatch, compiled=True, grouping=grouping)
    assert groups == [0, 32, 64]  # every group became codes in the compiled call
    torch.manual_seed(1)
    slow = _store_after("int4", rows, monkeypatch, compiled=False, grouping=grouping)
    assert int(fast.quantized.min()) >= 64  # groups became codes along the way
    for name in ("codes", "scale", "zero", "residual", "quantized"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    assert slow.norm <= fast.norm <= slow.norm * (1 + 1e-6)


@pytest.mark.needs("encode")
def test_the_compiled_encoder_rounds_every_float8_value_as_torch_casts_it():
    from attnlab.transformer import _encode

    torch.manual_seed(0)
    every = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mids = (every[1:] + every[:-1]) / 2  # ties: half to even
    x = torch.cat([every, mids, torch.nextafter(mids, torch.zeros(1)), torch.nextafter(mids, torch.full((1,), 500.0)),
                   torch.rand(1000) * 448, torch.rand(1000) * 2 ** -6])  # normals, and below 2^-6: steps of 2^-9
    x = torch.cat([x, -x])[: 4096 // 64 * 64].reshape(-1, 64)
    codes = torch.zeros(x.shape[0], 1, 64, dtype=torch.uint8)
    norm, over = _encode.fp8_rows(x.numpy(), codes.numpy(), torch.ones(x.shape[0]).numpy(), x.shape[0], 64, 1, 0)
    assert torch.equal(codes[:, 0], x.to(torch.float8_e4m3fn).view(torch.uint8)) and over == 0
    assert norm >= float(torch.linalg.vector_norm(x.to(torch.float8_e4m3fn).double(), dim=-1).max())


@pytest.mark.needs("encode")
def test_the_compiled_encoder_refuses_buffers_of_the_wrong_size_before_writing():
    from attnlab.transformer import _encode

    x, codes, scales = torch.zeros(2, 8), torch.zeros(2, 4, 8, dtype=torch.int8), torch.zeros(2, 4)
    with pytest.raises(ValueError, match="slot in 0..capacity - 1, got .* slot 4"):
        _encode.int8_rows(x.numpy(), codes.numpy(), scales.numpy(), 2, 8, 4, 4)
    with pytest.raises(ValueError, match="x must hold rows x dim = 24 float32 values, got 64 bytes"):
        _encode.int8_rows(x.numpy(), codes.numpy(), scales.numpy(), 3, 8, 4, 0)
    with pytest.raises(ValueError, match="scales must hold 8 float32 values, got 16 bytes"):
        _encode.int8_rows(x.numpy(), codes.numpy(), scales[:, :2].contiguous().numpy(), 2, 8, 4, 0)
    with pytest.raises(ValueError, match="ring must hold rows x capacity x dim = 64 float32 values, got 64 bytes"):
        _encode.f32_rows(x.numpy(), codes.numpy(), 2, 8, 4, 0)
    ring, packed, sz = torch.zeros(2, 40, 32), torch.zeros(2, 64, 16, dtype=torch.uint8), torch.zeros(2, 2, 32)
    with pytest.raises(ValueError, match="first a multiple of 32 with first \\+ 32 <= capacity, .* first 48"):
        _encode.int4_group(ring.numpy(), packed.numpy(), sz.numpy(), sz.numpy(), 2, 32, 40, 64, 48, True)
    with pytest.raises(ValueError, match="scale and zero must hold 128 float32 values each, got 512 and 256 bytes"):
        _encode.int4_group(ring.numpy(), packed.numpy(), sz.numpy(), sz[:, :1].contiguous().numpy(), 2, 32, 40, 64, 0, True)
    assert not packed.any()
    assert not codes.any()  # nothing written by a refused call
