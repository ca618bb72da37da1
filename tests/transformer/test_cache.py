"""KVCache: the layout the decode kernel reads, each kind equal to a full recompute with its mask, bytes, checks."""

from __future__ import annotations

import pytest

from attnlab.transformer import TransformerConfig

H, HKV, D = 4, 2, 8


def _config(**kw):
    return TransformerConfig(**{"vocab_size": 11, "d_model": 32, "num_layers": 2, "num_heads": H, "num_kv_heads": HKV,
                                "positions": "rotary", "norm": "rmsnorm", "ffn": "gated", "activation": "silu",
                                "max_positions": 64, **kw})


def _cache(kind="dense", batch=2, window=None, sink=None, capacity=None, dtype=None, **kw):
    import torch

    from attnlab.transformer.cache import KVCache

    return KVCache.for_model(_config(**kw), batch, kind=kind, window=window, sink=sink, capacity=capacity,
                             dtype=dtype or torch.float64)


def test_attention_has_the_per_sequence_rule_the_cache_reads_by():
    """The cache's reads pass lengths + causal alone: attnlab.attention must place query i of sequence b at
    lengths[b] − Tq + i (docs/design.md, causal alignment)."""
    import torch

    import attnlab

    q, k = torch.ones(1, 1, 2, 4, dtype=torch.float64), torch.ones(1, 1, 3, 4, dtype=torch.float64)
    _, w = attnlab.attention(q, k, k, lengths=torch.tensor([2]), causal=True, return_weights=True, backend="torch")
    assert float(w[0, 0, 0, 1]) == 0.0  # query 0 sits at position 0 (= lengths − Tq + 0), not at 1
    assert w[0, 0].tolist() == [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]


def _full_reference(kind, keys, values, q, qpos, window, sink):
    """Attention of queries at ``qpos`` over every position so far, with the kind's mask, by attnlab.attention."""
    import torch

    import attnlab

    T = keys.shape[2]
    kpos = torch.arange(T)[None, :]
    qp = qpos[:, None] if qpos.dim() == 1 else qpos[..., None]
    mask = kpos <= qp
    if kind in ("window", "band"):
        mask &= kpos > qp - window
    if kind == "sink":
        mask &= (kpos < sink) | (kpos > qp - window)
    return attnlab.attention(q, keys, values, mask=mask[:, None], backend="torch")


@pytest.mark.parametrize("ragged", [True, False])
@pytest.mark.parametrize("kind, window, sink, layer_window", [
    ("dense", None, None, None), ("dense", None, None, 5), ("window", 5, None, None), ("sink", 4, 3, None),
])
def test_each_kind_equals_a_full_recompute_with_its_mask(kind, window, sink, layer_window, ragged):
    """Prompts (ragged or not) prefilled in one chunk, a second chunk, then single tokens: every real query's
    output equals attention over all positions with the kind's mask (keys 0..S−1 and the last W), float64."""
    import torch

    import attnlab

    torch.manual_seed(0)
    B, lens, steps = 2, ([7, 3] if ragged else [6, 6]), 14
    extra = {"sliding_window": layer_window} if layer_window else {}
    cache = _cache(kind, B, window=window, sink=sink, capacity=4, **extra)  # capacity 4: the dense cache must grow
    total = max(lens) + 4 + steps
    keys = torch.randn(B, HKV, total, D, dtype=torch.float64)
    values = torch.randn(B, HKV, total, D, dtype=torch.float64)
    queries = torch.randn(B, H, total, D, dtype=torch.float64)
    ref_kind = "band" if layer_window else kind
    w = layer_window or window
    second = [2, 4] if ragged else [4, 4]
    chunks = [torch.tensor(lens), torch.tensor(second)] + [torch.ones(B, dtype=torch.long)] * steps
    for new in chunks:
        tq = int(new.max())
        step = cache.begin(new, tq)
        pos = step.positions.clamp(min=0)  # (B, Tq)
        take = lambda x: x.gather(2, pos[:, None, :, None].expand(B, x.shape[1], tq, D))  # noqa: E731
        read = cache.update(0, step, take(keys), take(values), torch.float64)
        out = attnlab.attention(take(queries), read.k, read.v, backend="torch", **read.kwargs())
        cache.commit(step)
        ref = _full_reference(ref_kind, keys, values, queries, torch.arange(total)[None].expand(B, total), w, sink)
        for b in range(B):
            cols = step.real[b].nonzero()[:, 0]
            got, want = out[b][:, cols], ref[b][:, step.positions[b, cols]]
            assert float((got - want).abs().max()) < 1e-12
    assert cache.lengths.tolist() == [lens[0] + second[0] + steps, lens[1] + second[1] + steps]


def test_dense_layout_zero_beyond_lengths_and_bytes():
    import torch

    cache = _cache("dense", batch=2, capacity=10)
    step = cache.begin(torch.tensor([3, 1]), 3)
    k = torch.randn(2, HKV, 3, D, dtype=torch.float64)
    cache.update(0, step, k, k.clone(), torch.float64)
    cache.update(1, step, k, k.clone(), torch.float64)
    cache.commit(step)
    layer = cache.layers[0]
    assert layer.k.shape == (2, HKV, 10, D) and layer.k.is_contiguous()
    assert torch.equal(layer.k[0, :, :3], k[0]) and torch.equal(layer.k[1, :, :1], k[1, :, 2:])  # own offsets
    assert float(layer.k[0, :, 3:].abs().max()) == 0.0 and float(layer.k[1, :, 1:].abs().max()) == 0.0
    assert layer.slot_positions[1].tolist()[:2] == [0, -1]
    assert cache.nbytes == sum(t.nbytes for lc in cache.layers for t in (lc.k, lc.v))
    assert cache.nbytes == 2 * 2 * HKV * D * 10 * 8 * 2  # 2 (k, v) · L · H_kv · D · T · bytes, for a batch of 2


def test_dense_cache_of_exactly_t_and_doubling():
    import torch

    cache = _cache("dense", batch=1, capacity=6, dtype=torch.float32)
    assert cache.nbytes == 2 * 2 * HKV * D * 6 * 4
    step = cache.begin(torch.tensor([7]), 7)  # one past the capacity: it doubles
    for layer in range(2):
        cache.update(layer, step, torch.randn(1, HKV, 7, D), torch.randn(1, HKV, 7, D), torch.float32)
    assert [lc.capacity for lc in cache.layers] == [12, 12]
    assert cache.nbytes == sum(t.nbytes for lc in cache.layers for t in (lc.k, lc.v))


def test_window_memory_stops_at_w_and_slots_map_back():
    import torch

    cache = _cache("window", batch=1, window=4)
    before = cache.nbytes
    for p in range(9):
        step = cache.begin(torch.tensor([1]), 1)
        k = torch.full((1, HKV, 1, D), float(p), dtype=torch.float64)
        for layer in range(2):
            cache.update(layer, step, k, k, torch.float64)
        cache.commit(step)
    ring = cache.layers[0]
    assert cache.nbytes == before and ring.capacity == 4
    assert ring.slot_positions[0].tolist() == [8, 5, 6, 7]  # slot = position mod W
    assert ring.k[0, 0, :, 0].tolist() == [8.0, 5.0, 6.0, 7.0]


def test_a_bfloat16_cache_under_float32_queries():
    import torch

    cache = _cache("dense", batch=1, capacity=8, dtype=torch.bfloat16)
    step = cache.begin(torch.tensor([2]), 2)
    k = torch.randn(1, HKV, 2, D)
    read = cache.update(0, step, k, k, torch.float32)
    # a float32 query reads a 16-bit cache as stored (a view, no copy): attention() takes the mix
    assert cache.layers[0].k.dtype == torch.bfloat16 and read.k.dtype == torch.bfloat16
    assert read.k.data_ptr() == cache.layers[0].k.data_ptr()
    assert torch.equal(read.k[0, :, :2].float(), k[0].to(torch.bfloat16).float())
    assert read.kwargs()["kv_checked"] and read.kwargs()["k_norm"] >= float(k.norm(dim=-1).max()) * (1 - 2 ** -7)
    assert cache.nbytes == 2 * 2 * HKV * D * 8 * 2
    # a float64 query reads it widened, exactly; a float16 one rounded, so that its call checks the keys again
    assert cache.update(1, step, k, k, torch.float64).kwargs()["kv_checked"]
    assert "kv_checked" not in cache.update(1, step, k, k, torch.float16).kwargs()


@pytest.mark.parametrize("k, error, match", [
    ("nan", ValueError, "k for layer 0 must be finite"),
    ("shape", ValueError, r"k for layer 0 must be \[B, H_kv, Tq, D\]"),
    ("list", TypeError, "k for layer 0 must be a torch tensor"),
    ("int", TypeError, "k for layer 0 must be floating"),
    ("overflow", ValueError, "finite in the cache's torch.float16"),
])
def test_entries_are_checked_once_when_appended(k, error, match):
    import torch

    cache = _cache("dense", batch=1, capacity=4, dtype=torch.float16 if k == "overflow" else torch.float64)
    step = cache.begin(torch.tensor([1]), 1)
    good = torch.zeros(1, HKV, 1, D)
    bad = {"nan": torch.full((1, HKV, 1, D), float("nan")), "shape": torch.zeros(1, H, 1, D), "list": [0.0],
           "int": torch.zeros(1, HKV, 1, D, dtype=torch.long), "overflow": torch.full((1, HKV, 1, D), 1e6)}[k]
    with pytest.raises(error, match=match):
        cache.update(0, step, bad, good)


def test_hybrid_layers_get_their_own_kinds():
    from attnlab.transformer.cache import layer_kinds

    gemma_like = _config(num_layers=4, sliding_window=6,
                         layer_types=("sliding_attention", "full_attention") * 2)
    assert layer_kinds(gemma_like, "window", None, None) == [("window", 6, None), ("dense", None, None)] * 2
    assert layer_kinds(gemma_like, "window", 4, None) == [("window", 4, None)] * 4
    assert layer_kinds(gemma_like, "sink", 8, 2) == [("window", 6, None), ("sink", 8, 2)] * 2
    assert layer_kinds(gemma_like, "dense", None, None) == [("dense", None, None)] * 4
    cache = _cache("window", batch=1, sliding_window=6, layer_types=("sliding_attention", "full_attention"))
    assert cache.kinds == ("window", "dense")


@pytest.mark.parametrize("kind, window, sink, match", [
    ("ring", None, None, "cache must be one of"),
    ("window", None, None, "has no sliding-window layers"),
    ("sink", None, 4, "needs window="),
    ("dense", 8, None, "dense cache keeps every position"),
    ("window", 0, None, "window must be an int >= 1"),
    ("window", 4, 2, "pass cache='sink'"),
])
def test_bad_kinds_name_the_argument(kind, window, sink, match):
    from attnlab.transformer.cache import layer_kinds

    with pytest.raises(ValueError, match=match):
        layer_kinds(_config(), kind, window, sink)


def test_a_cache_of_another_shape_is_refused():
    import torch

    cache = _cache("dense", batch=2, capacity=4, dtype=torch.float32)
    cache.check_fits(_config(), 2)
    with pytest.raises(ValueError, match="kv_cache holds 2 layers x 2 k/v heads"):
        cache.check_fits(_config(num_kv_heads=4), 2)
    with pytest.raises(ValueError, match="for a batch of 2"):
        cache.check_fits(_config(), 3)
