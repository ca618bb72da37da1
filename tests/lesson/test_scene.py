"""The scene and listing 2.8 reproduce the seeds' numbers."""

import json

import numpy as np
import pytest

from attnlab.cli.app import main
from attnlab.lesson.listing import W_KEY, W_QUERY, W_VALUE, X, run_listing
from attnlab.lesson.scene import compute_scene


def pcts(ws):
    return [round(100 * w) for w in ws]


def test_unscaled_scene_matches_the_seed():
    r = compute_scene(scaled=False)
    # river 60 %, sat 20 %, bank 10 %, the rest 2 %; blended (0.75, 0.05)
    assert pcts(r.weights) == [2, 20, 2, 2, 10, 2, 2, 60]
    assert np.round(r.output, 2).tolist() == [0.75, 0.05]
    assert r.scores[-1] == pytest.approx(1.8)


def test_scaled_scene_matches_the_seed():
    r = compute_scene(scaled=True)
    assert pcts(r.weights) == [4, 21, 4, 4, 13, 4, 4, 46]
    assert np.round(r.output, 2).tolist() == [0.63, 0.06]
    assert r.scale == pytest.approx(2**-0.5)


def test_scene_cli_prints_tables_and_json(capsys):
    assert main(["scene"]) == 0
    out = capsys.readouterr().out
    assert "60 %" in out and "46 %" in out and "(0.75, 0.05)" in out and "(0.63, 0.06)" in out
    assert main(["scene", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tokens"][4] == "bank" and round(data["scaled"]["weights"][-1], 2) == 0.46


def test_cli_usage_error_exits_2_without_traceback(capsys):
    assert main(["scene", "--no-such-flag"]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err


def test_listing_first_head_computed_independently():
    q, k, v = X @ W_QUERY, X @ W_KEY, X @ W_VALUE
    assert q.tolist() == [[1, 0, 2], [2, 2, 2], [2, 1, 3]]  # by hand from the printed matrices
    assert k.tolist() == [[0, 1, 1], [4, 4, 0], [2, 3, 1]]
    scores = q @ k.T  # k_d = 1, as printed
    assert scores.tolist() == [[2, 4, 4], [4, 16, 12], [4, 12, 10]]
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    weights = e / e.sum(axis=1, keepdims=True)
    r = run_listing()
    np.testing.assert_allclose(r.weights, weights, atol=1e-15)
    # row 0 is the listing's attention_input1 = Σ_j α_0j V_j
    np.testing.assert_allclose(r.head1[0], sum(weights[0, j] * v[j] for j in range(3)), atol=1e-12)
    np.testing.assert_allclose(r.head1[0], [1.9366, 6.6831, 1.5951], atol=1e-4)
    # head 1 of the eight-head layer is the same head
    np.testing.assert_allclose(r.multihead.weights[0], weights, atol=1e-15)
    np.testing.assert_allclose(r.multihead.heads[0], r.head1, atol=1e-12)


def test_listing_eight_heads_and_causal_variant():
    r = run_listing(seed=0)
    assert r.multihead.heads.shape == (8, 3, 3) and r.multihead.output.shape == (3, 4)
    assert np.allclose(np.triu(r.causal.weights, 1), 0)  # no head looks at the future
    np.testing.assert_allclose(r.causal.weights[:, 0, 0], 1.0)  # the first token only sees itself
    assert np.array_equal(run_listing(seed=0).multihead.output, r.multihead.output)
