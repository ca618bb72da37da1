"""Evicting caches (h2o, snapkv, knorm, random): every step equals the float64 reference attention over the
positions its k/v head kept, at their original positions; the prompt's queries see the whole prompt; each head
keeps its own positions, sinks and recent ones included, never more than the budget; bad input refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.transformer import TransformerConfig

pytestmark = [pytest.mark.needs("torch"), pytest.mark.usefixtures("one_thread")]
H, HKV, D, L = 4, 2, 8, 2
PROMPT, STEPS, BUDGET = 16, 9, 12


def _model(**kw):
    import torch

    from attnlab.transformer import Transformer

    torch.manual_seed(0)
    c = TransformerConfig(**{"vocab_size": 29, "d_model": H * D, "num_layers": L, "num_heads": H, "num_kv_heads": HKV,
                             "positions": "rotary", "norm": "rmsnorm", "ffn": "gated", "activation": "silu",
                             "max_positions": 64, **kw})
    return Transformer(c, backend="torch", dtype="float64").eval()


def _names():
    return [f"blocks.{layer}.attn.{n}" for layer in range(L) for n in ("hook_rot_q", "hook_rot_k", "hook_v", "hook_z")]


def _reference(q, k, v):
    from attnlab.reference.attention import attention

    return attention(q, k, v, scale=1 / np.sqrt(D))


@pytest.mark.parametrize("policy", ["h2o", "snapkv", "knorm", "random"])
def test_each_step_is_the_reference_over_the_positions_its_head_kept(policy):
    import torch

    from attnlab.transformer.cache import KVCache

    m = _model()
    ids = torch.randint(1, 29, (1, PROMPT + STEPS), generator=torch.Generator().manual_seed(1))
    kv = KVCache.for_model(m.config, 1, kind=policy, budget=BUDGET, dtype=torch.float64)
    keys = {layer: [] for layer in range(L)}  # each position's rotated key and value, kept as fed
    vals = {layer: [] for layer in range(L)}
    heads_differ = False
    for t in range(STEPS + 1):
        chunk = ids[:, :PROMPT] if t == 0 else ids[:, PROMPT + t - 1:PROMPT + t]
        _, got = m.run_with_cache(chunk, kv_cache=kv, names=_names())
        for layer in range(L):
            at = f"blocks.{layer}.attn."
            keys[layer].append(got[at + "hook_rot_k"][0].numpy())  # (H_kv, Tq, D)
            vals[layer].append(got[at + "hook_v"][0].numpy())
            k_all, v_all = np.concatenate(keys[layer], 1), np.concatenate(vals[layer], 1)  # (H_kv, T, D)
            q, z = got[at + "hook_rot_q"][0].numpy(), got[at + "hook_z"][0].numpy()  # (H, Tq, D)
            lc = kv.layers[layer]
            kept = lc.slot_positions[0].numpy()  # (H_kv, budget)
            assert (kept >= 0).sum(-1).tolist() == [BUDGET] * HKV
            if t == 0:  # the prompt's queries see the whole prompt, causal
                from attnlab.reference.attention import attention

                want = attention(q, np.repeat(k_all, H // HKV, 0), np.repeat(v_all, H // HKV, 0), causal=True,
                                 scale=1 / np.sqrt(D))
                np.testing.assert_allclose(z, want, rtol=0, atol=1e-12)
                continue
            heads_differ |= set(kept[0]) != set(kept[1])
            for h in range(H):
                pos = np.sort(kept[h // (H // HKV)])
                assert set(range(lc.sink)) <= set(pos) and PROMPT + t - 1 in pos  # sinks and the newest token
                want = _reference(q[h], k_all[h // (H // HKV), pos], v_all[h // (H // HKV), pos])
                np.testing.assert_allclose(z[h], want, rtol=0, atol=1e-12)
    assert heads_differ or policy in ("h2o", "snapkv")  # each k/v head chose its own (h2o: test below)


def test_h2o_keeps_the_keys_the_prompt_attended_to_most():
    """After the prompt, h2o holds the sinks, the recent half and the keys with most accumulated attention,
    whose sums the float64 reference gives independently."""
    import torch

    from attnlab.reference.attention import attention
    from attnlab.transformer.cache import KVCache

    m = _model()
    ids = torch.randint(1, 29, (1, PROMPT), generator=torch.Generator().manual_seed(2))
    kv = KVCache.for_model(m.config, 1, kind="h2o", budget=BUDGET, dtype=torch.float64)
    _, got = m.run_with_cache(ids, kv_cache=kv, names=_names())
    q, k = got["blocks.0.attn.hook_rot_q"][0].numpy(), got["blocks.0.attn.hook_rot_k"][0].numpy()
    _, w = attention(q, np.repeat(k, H // HKV, 0), np.repeat(k, H // HKV, 0), causal=True, scale=1 / np.sqrt(D),
                     return_weights=True)  # (H, T, T)
    score = w.sum(1).reshape(HKV, H // HKV, PROMPT).sum(1)  # (H_kv, T): received by each key, per k/v head
    lc = kv.layers[0]
    for g in range(HKV):
        fixed = set(range(lc.sink)) | set(range(PROMPT - lc.window, PROMPT))
        rest = [p for p in np.argsort(-score[g], kind="stable") if p not in fixed][:BUDGET - len(fixed)]
        assert set(lc.slot_positions[0, g].tolist()) == fixed | {int(p) for p in rest}
        np.testing.assert_allclose(np.sort(lc.rank[0, g].numpy()), np.sort(score[g][sorted(fixed | set(rest))]),
                                   atol=1e-12)


@pytest.mark.parametrize("dtype, lengths, cached", [
    ("float32", None, "float32"), ("float32", [5, 0, 11], "float32"), ("float64", [11, 3, 7], "float64"),
    ("float32", [9, 11, 1], "bfloat16"),
])
def test_a_decoding_steps_row_is_the_general_paths(dtype, lengths, cached):
    """h2o's rank at each decoding step: the one row's weights computed directly (softmax of scale q kᵀ over
    each sequence's keys) equal the general path's (``weights_rows=`` from the pass's LSE) to float rounding,
    with GQA, ragged lengths, a sequence with no keys and a 16-bit cache; a mask sends it the general way."""
    import torch

    from attnlab import masks
    from attnlab.transformer.attend import Pass, attend, received
    from attnlab.transformer.hooks import Hooks

    gen = torch.Generator().manual_seed(4)
    q = torch.randn(3, H, 1, D, generator=gen, dtype=getattr(torch, dtype))
    k, v = (torch.randn(3, HKV, 11, D, generator=gen).to(getattr(torch, cached)) for _ in "kv")
    p = Pass(_model().config, "auto", True, None, Hooks())
    kw = {"causal": True, "lengths": None if lengths is None else torch.tensor(lengths)}
    fast = received(q, k, v, p, kw, range(1))
    _, general = attend(q, k, v, p, dict(kw, lengths=torch.tensor(lengths or [11] * 3)), last=True)
    assert fast.shape == (3, H, 11) and fast.dtype == q.dtype
    tol = 1e-12 if dtype == "float64" else 2e-6
    np.testing.assert_allclose(fast.numpy(), general.numpy(), atol=tol, rtol=tol)
    if lengths is not None and 0 in lengths:
        assert not fast[lengths.index(0)].any()  # no keys: no weight
    window = dict(kw, mask=masks.sliding_window(4))
    _, windowed = attend(q, k, v, p, dict(window, lengths=torch.tensor(lengths or [11] * 3)), last=True)
    np.testing.assert_array_equal(received(q, k, v, p, window, range(1)).numpy(), windowed.numpy())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_maps_and_h2o_share_a_steps_row(dtype, monkeypatch):
    """generate(maps=True) with h2o: the row the map keeps is the row h2o ranks by, computed once a layer and
    step (not twice), and the generation (ids, logits, ranks) is bit for bit the one without maps."""
    import torch

    from attnlab.transformer import attend
    from attnlab.transformer.evict_cache import EvictingCache

    m = _model()
    m = m.to(getattr(torch, dtype))
    ids = torch.randint(1, 29, (1, PROMPT), generator=torch.Generator().manual_seed(5))
    plain = m.generate(ids, STEPS, cache="h2o", cache_budget=BUDGET)
    rows = []
    monkeypatch.setattr(attend, "_decode_row", lambda *a, real=attend._decode_row: rows.append(1) or real(*a))
    mapped = m.generate(ids, STEPS, cache="h2o", cache_budget=BUDGET, maps=True)
    assert len(rows) == L * (STEPS - 1)  # one row a layer for each step after the prompt's
    assert torch.equal(plain.ids, mapped.ids) and torch.equal(plain.logits, mapped.logits)
    for a, b in zip(plain.kv_cache.layers, mapped.kv_cache.layers):
        assert isinstance(a, EvictingCache) and torch.equal(a.rank, b.rank) and torch.equal(a.slot_positions, b.slot_positions)
    rows.clear()  # the model's forward: a step that captures layer 0's newest row
    m.run_with_cache(mapped.ids[:, -1:], kv_cache=mapped.kv_cache, names=["blocks.0.attn.hook_last_pattern"])
    assert len(rows) == L


@pytest.mark.parametrize("kind, rotate", [("int8", False), ("fp8", False), ("int4", False), ("int4", True)])
def test_a_decoding_steps_row_over_a_quantized_cache_is_the_reference_on_its_keys(kind, rotate):
    """generate(maps=True) on a quantized cache: the step's row (the kernel's decode pass writes its scores as it
    reads the codes) is the softmax of the scores over the keys as stored, dequantized in float64 (q turned where
    they were stored rotated); int4's newest positions come from its float residual; a ragged batch."""
    import torch

    from attnlab.reference.quantized import hadamard
    from attnlab.transformer.attend import Pass, received
    from attnlab.transformer.hooks import Hooks
    from attnlab.transformer.layer_cache import Step
    from attnlab.transformer.quantize import Store

    n, dim, lengths = 200, 32, [200, 150]  # int4: the first 32·k positions as codes, the newest in the residual
    gen = torch.Generator().manual_seed(6)
    k, v = (Store(kind, 2, HKV, dim, n, torch.float32, "cpu", grouping=grouping, rotate=rotate and grouping == "channel")
            for grouping in ("channel", "token"))  # the model's cache: keys per channel, values per token
    for store in (k, v):
        store.write(Step(torch.zeros(2, dtype=torch.long), torch.tensor([n, n]), n), torch.randn(2, HKV, n, dim, generator=gen))
    k, v = k.read(n), v.read(n)
    q = torch.randn(2, H, 1, dim, generator=gen)
    p = Pass(_model(d_model=H * dim).config, "auto", True, None, Hooks())
    got = received(q, k, v, p, {"causal": True, "lengths": torch.tensor(lengths)}, range(1))
    keys = k.dequantize(0, n).double().repeat_interleave(H // HKV, 1)  # (2, H, n, dim) as stored
    qq = q.double() @ torch.from_numpy(hadamard(dim)) if rotate else q.double()
    s = (qq @ keys.transpose(-1, -2))[:, :, 0] / np.sqrt(dim)  # (2, H, n)
    s[1, :, lengths[1]:] = -torch.inf
    assert got.shape == (2, H, n) and not got[1, :, lengths[1]:].any()
    np.testing.assert_allclose(got.numpy(), torch.softmax(s, -1).numpy(), atol=2e-6, rtol=2e-6)


def test_knorm_keeps_the_smallest_keys_and_random_is_seeded():
    import torch

    m = _model()
    ids = torch.randint(1, 29, (1, PROMPT), generator=torch.Generator().manual_seed(3))
    gen = m.generate(ids, 3, cache="knorm", cache_budget=BUDGET)
    lc = gen.kv_cache.layers[0]
    assert lc.describe() == {"kind": "knorm", "capacity": BUDGET, "budget": BUDGET, "sink": 4, "recent": 1}
    assert gen.kv_cache.nbytes == L * 2 * HKV * BUDGET * D * 8  # budget slots of k and v, float64
    _, got = m.run_with_cache(torch.cat([ids, gen.ids[:, :2]], 1), names=["blocks.0.attn.hook_rot_k"])
    norms = got["blocks.0.attn.hook_rot_k"][0].norm(dim=-1)  # (H_kv, T)
    for g in range(HKV):
        held = set(lc.slot_positions[0, g].tolist())
        free = [p for p in range(4, PROMPT + 1) if p not in held]  # the newest, PROMPT + 1, is always held
        assert max(norms[g, sorted(held - {0, 1, 2, 3, PROMPT + 1})]) <= min(norms[g, free]) + 1e-12
    a = m.generate(ids, 4, cache="random", cache_budget=BUDGET).kv_cache.layers[1].slot_positions
    b = m.generate(ids, 4, cache="random", cache_budget=BUDGET).kv_cache.layers[1].slot_positions
    assert torch.equal(a, b)


@pytest.mark.parametrize("policy", ["h2o", "knorm", "random"])
def test_a_full_layers_decoding_step_writes_what_the_counting_path_writes(policy):
    """Once every sequence holds its budget a decoding step skips counting the held keys (``full``); it writes
    the same slots, keys, positions and ranks as the path that counts them, through prompts below and above the
    budget, steps where a stopped sequence writes nothing, and h2o's ranks from each step's weights."""
    import torch

    from attnlab.transformer.evict_cache import EvictingCache
    from attnlab.transformer.layer_cache import Step

    g = torch.Generator().manual_seed(4)
    B, budget = 2, 7
    fast, counting = (EvictingCache(B, HKV, D, budget, 2, 3, policy, torch.float64, "cpu", seed=5) for _ in "ab")
    start, fulls = torch.tensor([0, 0]), []
    for new in ([5, 9], [1, 1], [1, 1], [0, 1], [1, 1], [1, 1], [1, 0], [1, 1], [1, 1], [4, 1], [1, 1], [1, 1]):
        new = torch.tensor(new)
        tq = int(new.max())
        k, v = torch.randn(B, HKV, tq, D, generator=g, dtype=torch.float64), torch.randn(B, HKV, tq, D, generator=g, dtype=torch.float64)
        step = Step(start.clone(), new, tq, decode=bool((new == 1).all()))
        w = torch.rand(B, H, budget + tq, generator=g, dtype=torch.float64)
        counting.full = False  # the path that counts every step
        reads = [c.update(step, k, v, torch.float64) for c in (fast, counting)]
        for c, r in zip((fast, counting), reads):
            if r.observe is not None:
                r.observe(lambda rows, tk=r.k.shape[2]: w[:, :, :tk])
        fulls.append(fast.full)
        for name in ("k", "v", "slot_positions", "rank"):
            assert torch.equal(getattr(fast, name), getattr(counting, name)), (name, new.tolist())
        assert fast.full == bool((fast.held == budget).all())
        start = start + new
    assert fulls.count(True) >= 6  # the steady state was taken


def test_a_ragged_batch_evicts_each_sequence_on_its_own():
    """Prompts of unequal length in one batch give each sequence the logits it gets alone."""
    import torch

    m = _model()
    prompts = [[3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 2], [4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 1]]
    both = m.generate(prompts, 5, cache="h2o", cache_budget=BUDGET)
    for b, p in enumerate(prompts):
        alone = m.generate([p], 5, cache="h2o", cache_budget=BUDGET)
        torch.testing.assert_close(both.logits[b], alone.logits[0], rtol=0, atol=1e-10)


def test_a_sliding_layer_keeps_its_window_and_the_others_evict():
    """A hybrid model: its sliding layers keep their own ring (exact), its global layers the evicting cache."""
    import torch

    m = _model(sliding_window=6, layer_types=("sliding_attention", "full_attention"))
    g = m.generate([list(range(3, 3 + PROMPT))], 5, cache="h2o", cache_budget=BUDGET)
    assert g.kv_cache.kinds == ("window", "h2o") and g.kv_cache.layers[0].capacity == 6
    assert (g.kv_cache.layers[1].slot_positions >= 0).sum(-1).tolist() == [[BUDGET] * HKV]
    assert torch.isfinite(g.logits).all()


@pytest.mark.parametrize("policy", ["h2o", "snapkv"])
def test_continuing_from_the_cache_is_one_call(policy):
    """generate(kv_cache=g.kv_cache) from the last chosen token gives the logits of one longer call."""
    import torch

    m = _model()
    prompt = list(range(3, 3 + PROMPT))
    one = m.generate([prompt], 7, cache=policy, cache_budget=BUDGET)
    first = m.generate([prompt], 4, cache=policy, cache_budget=BUDGET)
    rest = m.generate(first.ids[:, -1:], 3, cache=policy, cache_budget=BUDGET, kv_cache=first.kv_cache)
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], 1), one.logits, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="kv_cache keeps 12 tokens per layer and k/v head; cache_budget=16"):
        m.generate(rest.ids[:, -1:], 2, cache=policy, cache_budget=16, kv_cache=rest.kv_cache)


@pytest.mark.parametrize("kw, match", [
    ({"cache": "lru", "cache_budget": 8}, "cache must be one of dense, window, sink, h2o, snapkv, knorm, random"),
    ({"cache": "h2o"}, "cache_budget: cache='h2o' needs cache_budget="),
    ({"cache": "h2o", "cache_budget": 4}, "cache_budget=4 is below the 4 sink tokens"),
    ({"cache": "knorm", "cache_budget": 65}, "cache_budget=65 is above the model's context of 64"),
    ({"cache": "snapkv", "cache_budget": 8, "window": 6}, "window=6 newest positions \\+ 4 sinks pass cache_budget=8"),
    ({"cache": "dense", "cache_budget": 8}, "cache_budget=8 sizes an evicting cache"),
    ({"cache": "random", "cache_budget": 8, "sink": -2}, "sink must be an int >= 0 or None for cache='random', got -2"),
    ({"cache": "h2o", "cache_budget": 8, "window": 0}, "window must be an int >= 1 or None for cache='h2o', got 0"),
    ({"cache": "knorm", "cache_budget": 8, "window": 2.5}, "window must be an int >= 1 or None for cache='knorm'"),
])
def test_bad_input_is_refused_by_name_before_any_work(kw, match):
    m = _model()
    with pytest.raises(ValueError, match=match):
        m.generate([1, 2, 3], 2, **kw)
