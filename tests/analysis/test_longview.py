"""The long view computes exactly what the full map holds: every tile, row, column and pooled cell,
from queries, keys and row LSEs alone (float32, 1e-6), with causal, windows, sinks and padding."""

import numpy as np
import pytest

from attnlab.analysis import longview
from attnlab.maps.long import LongMaps, MapTooLarge, check_full, full_capture_bytes
from attnlab.maps.records import LayerFacts, Tokens

ATOL = 1e-6


def _side(t):
    return Tokens(tokens=[[f"t{i}" for i in range(t)]], word_of=[list(range(t))], words=[[f"t{i}" for i in range(t)]],
                  kinds=[["word"] * t])


def _synthetic(t=53, pad=0, h=4, hkv=2, d=8, facts=None, sink=0, seed=0):
    """Random float32 q, k (padded by ``pad`` positions), the LSE (kept in float32, as a capture keeps
    it) and the full map through attnlab.attention in float64 with the same visibility written out
    as a mask."""
    import torch

    from attnlab.backends.api import attention

    rng = np.random.default_rng(seed)
    facts = facts or (LayerFacts(scale=0.4, causal=True), LayerFacts(scale=0.3, causal=False, window=(5, 3)),
                      LayerFacts(scale=0.5, causal=True, window=(6, 0)), LayerFacts(scale=0.35, softcap=2.0))
    n = t + pad
    q = rng.normal(size=(len(facts), h, n, d)).astype(np.float32) * 2
    k = rng.normal(size=(len(facts), hkv, n, d)).astype(np.float32) * 2
    lm0 = LongMaps(sentence="x", side=_side(t), queries=q, keys=k, lse=np.zeros((len(facts), h, n), np.float32),
                   layers=facts, model_id="m", revision=None, sink=sink, length=t if pad else None)
    lses, fulls = [], []
    for layer, f in enumerate(facts):
        mask = longview.visible(lm0, layer, np.arange(n), np.arange(n))  # (n, n), keys past t hidden
        _, w, lse = attention(torch.from_numpy(q[layer]).double(), torch.from_numpy(k[layer]).double(),
                              torch.zeros(hkv, n, 1, dtype=torch.float64),
                              mask=torch.from_numpy(np.array(mask)), scale=f.scale, softcap=f.softcap, return_weights=True,
                              return_lse=True, backend="torch")
        lses.append(lse.float().numpy())
        fulls.append(w.float().numpy()[:, :t, :t])
    lm = LongMaps(sentence="x", side=_side(t), queries=q, keys=k, lse=np.stack(lses), layers=facts, model_id="m",
                  revision=None, sink=sink, length=t if pad else None)
    return lm, np.stack(fulls)  # [L, H, t, t]


def _check_all(lm, full):
    t = lm.num_tokens
    for layer in range(lm.num_layers):
        for head in range(lm.num_heads):
            f = full[layer, head]
            np.testing.assert_allclose(longview.weights(lm, layer, head, (0, t), (0, t)), f, rtol=0, atol=ATOL)
            np.testing.assert_allclose(longview.weights(lm, layer, head, (7, 30), (11, 40)), f[7:30, 11:40], rtol=0,
                                       atol=ATOL)
            for i in (0, 1, t // 2, t - 1):
                np.testing.assert_allclose(longview.row(lm, layer, head, i), f[i], rtol=0, atol=ATOL)
                np.testing.assert_allclose(longview.column(lm, layer, head, i), f[:, i], rtol=0, atol=ATOL)
                top = longview.top_keys(lm, layer, head, i, k=3)
                assert [j for j, _ in top] == list(np.argsort(-f[i], kind="stable")[:3])
            ov = longview.overview(lm, layer, head, cells=8)
            _check_pooled(ov, f)


def _check_pooled(ov, f):
    t, b = f.shape[0], ov.block
    assert ov.cells == -(-t // b) <= 8
    for r in range(ov.cells):
        for c in range(ov.cells):
            cell = f[r * b:(r + 1) * b, c * b:(c + 1) * b]
            assert abs(ov.mean[r, c] - cell.mean()) <= ATOL and abs(ov.max[r, c] - cell.max()) <= ATOL


@pytest.mark.needs("torch")
@pytest.mark.parametrize("pad, sink", [(0, 0), (9, 0), (0, 3), (6, 2)])
def test_every_tile_row_column_and_cell_equals_the_full_map(pad, sink):
    lm, full = _synthetic(pad=pad, sink=sink)
    _check_all(lm, full)


@pytest.mark.needs("torch")
def test_out_of_range_requests_name_the_map_size():
    lm, _ = _synthetic(t=20)
    with pytest.raises(ValueError, match=r"rows must be \(start, stop\) with 0 <= start < stop <= 20"):
        longview.weights(lm, 0, 0, (10, 25), (0, 4))
    with pytest.raises(ValueError, match=r"query must be 0..19 \(the map has 20 tokens\), got 20"):
        longview.row(lm, 0, 0, 20)
    with pytest.raises(ValueError, match="layer"):
        longview.column(lm, 4, 0, 0)
    with pytest.raises(TypeError, match="takes a long input's maps"):
        longview.overview(object(), 0, 0)


def test_the_full_map_is_refused_with_its_bytes_before_allocating():
    needed = full_capture_bytes(4, 4, 8192)
    assert needed > 8 * 2**30  # the 23.7 GB run of the issue: what the guard counts is of that order
    with pytest.raises(MapTooLarge, match=r"would hold about 11.8 GB of T × T attention weights, over the limit "
                                          r"of 2.1 GB; take the long view"):
        check_full("capturing 8192 tokens", 4, 4, 8192)
    assert check_full("short", 4, 4, 64) == full_capture_bytes(4, 4, 64)


@pytest.mark.needs("torch")
def test_every_rows_top_keys_from_the_overview_pass_are_a_stable_sorts():
    lm, full = _synthetic(t=41, sink=2)
    for layer in range(lm.num_layers):
        ov = longview.overview(lm, layer, 1, cells=5, top=6)
        f = full[layer, 1]
        want = np.argsort(-f, axis=1, kind="stable")[:, :6]
        assert np.array_equal(ov.top_keys, want)
        np.testing.assert_allclose(ov.top_weights, np.take_along_axis(f, want, 1), rtol=0, atol=ATOL)


@pytest.mark.needs("torch")
def test_analyses_of_the_full_map_refuse_long_maps_naming_why():
    from attnlab.analysis.roles import head_roles
    from attnlab.analysis.rollout import rollout

    lm, _ = _synthetic(t=12)
    for run in (lambda: head_roles(lm), lambda: rollout(lm), lambda: lm.to_words()):
        with pytest.raises(TypeError, match="a long input's maps hold no weights .* attnlab.analysis.longview"):
            run()


@pytest.mark.needs("torch")
@pytest.mark.parametrize("sink", [0, 2])
def test_an_overview_in_many_strips_equals_one_in_one(monkeypatch, sink):
    """Strips of a few rows: their key ranges start past 0 under a window, where the causal band is
    attention's own (bottom-right aligned), not a mask."""
    from attnlab.backends import kernel

    lm, full = _synthetic(t=53, sink=sink)
    monkeypatch.setattr(longview, "STRIP_SCORES", 53 * 7)  # 7 rows a strip
    monkeypatch.setattr(kernel, "isa", lambda: None)  # the tiles' path, as where no compiler built the kernel
    for layer in range(lm.num_layers):
        ov = longview.overview(lm, layer, 0, cells=8, top=4)
        _check_pooled(ov, full[layer, 0])
        assert np.array_equal(ov.top_keys, np.argsort(-full[layer, 0], axis=1, kind="stable")[:, :4])


@pytest.mark.needs("torch")
@pytest.mark.parametrize("pad, sink", [(0, 0), (9, 0), (0, 3), (6, 2)])
def test_the_compiled_overview_equals_the_tiles_one(monkeypatch, pad, sink):
    """kernel.pool (where the kernel is built) against the overview from attention's tiles (without it), with
    causal, a window, sink tokens, padding, softcap and grouped heads (4 over 2), cells of several sizes."""
    from attnlab.backends import kernel

    if kernel.isa() is None:
        pytest.skip("the compiled kernel was not built here")
    lm, full = _synthetic(t=131, pad=pad, sink=sink)
    for cells, top in ((8, 0), (45, 5)):
        compiled = [longview.overview(lm, layer, head, cells=cells, top=top) for layer in range(4) for head in range(4)]
        with monkeypatch.context() as m:
            m.setattr(kernel, "isa", lambda: None)  # as where no compiler built it
            tiles = [longview.overview(lm, layer, head, cells=cells, top=top) for layer in range(4) for head in range(4)]
        for i, (a, b) in enumerate(zip(compiled, tiles)):
            assert a.block == b.block and (a.top_keys is None) == (top == 0)
            np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=ATOL)
            np.testing.assert_allclose(a.max, b.max, rtol=0, atol=ATOL)
            if top:  # the same weights, at keys that hold them; the same keys but where two weights nearly tie
                np.testing.assert_allclose(a.top_weights, b.top_weights, rtol=0, atol=ATOL)
                np.testing.assert_allclose(np.take_along_axis(full[i // 4, i % 4], a.top_keys, 1), a.top_weights,
                                           rtol=0, atol=ATOL)
                assert (a.top_keys == b.top_keys).all(1).mean() > 0.95
        if cells == 8:
            _check_pooled(compiled[5], full[1, 1])
