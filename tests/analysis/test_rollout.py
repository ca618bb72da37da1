"""Rollout and flow against independent computations: a loop over layers by hand, for two layers
the max flow in closed form (the paths through different middle nodes share no edge), and for
three the minimum cut found by trying every cut (max-flow = min-cut). Flow's capacities are
rounded to multiples of 2^-24 (rollout.FLOW_UNITS), hence tolerances of 1e-6."""

import itertools

import numpy as np
import pytest

import attnlab
from attnlab.analysis.rollout import MAX_FLOW_TOKENS, flow, mixed_layers, rollout


def _random(l, h, t, seed=0):
    w = np.random.default_rng(seed).random((l, h, t, t))
    return w / w.sum(-1, keepdims=True)


def test_rollout_is_the_product_of_mixed_layers(make_maps):
    maps = make_maps([["[CLS]", "the", "cat", "sat", ".", "[SEP]"]], num_layers=3, num_heads=4)
    got = rollout(maps, residual=0.3)[0]
    w = maps.weights[0].astype(np.float64)
    want = np.eye(6)
    for l in range(3):
        a = 0.3 * np.eye(6) + 0.7 * w[l].mean(0)
        a = a / a.sum(-1, keepdims=True)
        want = a @ want
        np.testing.assert_allclose(got[l], want, atol=1e-12)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-12)  # each row still a distribution


def test_word_level_rollout(make_maps):
    maps = make_maps([["[CLS]", "embeddings", "work", "[SEP]"]], num_layers=2, num_heads=2, pieces=[[1, 3, 1, 1]])
    words = maps.to_words()
    got = rollout(words)[0]
    assert got.shape == (2, 4, 4)
    np.testing.assert_allclose(got[1], mixed_layers(words.weights[0])[1] @ mixed_layers(words.weights[0])[0])


def test_residual_zero_is_pure_attention_and_one_is_refused():
    """One range, [0, 1), in the library, the CLI and the server: at 1 the maps would not count at all."""
    w = _random(2, 3, 5)
    np.testing.assert_allclose(mixed_layers(w, 0.0), w.mean(1))
    np.testing.assert_allclose(mixed_layers(w, 0.9)[0], (0.9 * np.eye(5) + 0.1 * w.mean(1)[0]), atol=1e-12)
    with pytest.raises(ValueError, match=r"residual must be a number in \[0, 1\), got 1.0"):
        mixed_layers(w, 1.0)


def test_flow_of_two_layers_in_closed_form(make_maps):
    maps = make_maps([["a", "b", "c", "d", "e"]], num_layers=2, num_heads=3, seed=4)
    got = flow(maps)[0]
    a = mixed_layers(maps.weights[0])
    raw = np.minimum(a[1][:, :, None], a[0][None, :, :]).sum(1)  # Σ_m min(Ã2[i, m], Ã1[m, j])
    np.testing.assert_allclose(got, raw / raw.sum(-1, keepdims=True), atol=1e-6)
    one = flow(maps, layer=0)[0]  # one layer: the flow is the edge itself
    np.testing.assert_allclose(one, a[0] / a[0].sum(-1, keepdims=True), atol=1e-6)


def _min_cut(a, source, sink):
    """The minimum cut between node (L, source) and node (0, sink) of the layered graph of ``a``
    [L, T, T] (edges (l + 1, i) → (l, j) of capacity a[l, i, j]), by trying every set of middle nodes."""
    n_layers, t = a.shape[0], a.shape[-1]
    middle = [(l, i) for l in range(1, n_layers) for i in range(t)]
    best = np.inf
    for chosen in itertools.product((False, True), repeat=len(middle)):
        side = {node for node, on in zip(middle, chosen) if on} | {(n_layers, source)}  # the source's side
        # inputs other than the sink are dead ends: on the source's side, the edges into them cost nothing
        cut = sum(a[l, i, j] for l in range(n_layers) for i in range(t) for j in range(t)
                  if (l + 1, i) in side and (l, j) not in side and (l > 0 or j == sink))
        best = min(best, cut)
    return best


def test_flow_of_three_layers_is_the_minimum_cut():
    w = _random(3, 2, 3, seed=7) ** 3
    w = w / w.sum(-1, keepdims=True)
    a = mixed_layers(w, 0.4)
    from attnlab.analysis.rollout import flow_one

    raw = np.array([[_min_cut(a, i, j) for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(flow_one(w, 0.4), raw / raw.sum(-1, keepdims=True), atol=1e-6)


def test_flow_refuses_long_inputs_and_bad_arguments():
    with pytest.raises(ValueError, match=f"more than {MAX_FLOW_TOKENS}"):
        from attnlab.analysis.rollout import flow_one

        flow_one(_random(1, 1, MAX_FLOW_TOKENS + 1))
    with pytest.raises(ValueError, match="residual must be"):
        mixed_layers(_random(1, 1, 3), residual=1.5)
    with pytest.raises(ValueError, match="layer must be"):
        from attnlab.analysis.rollout import flow_one

        flow_one(_random(2, 1, 3), layer=2)


def test_public_names():
    assert attnlab.rollout is rollout and attnlab.flow is flow
