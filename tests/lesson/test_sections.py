"""The lesson's NumPy sections against every number the seed states (no model needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnlab.lesson import cost as cost_mod
from attnlab.bench import Measurement
from attnlab.lesson.cost import CostConfig, growth_exponent, largest_context
from attnlab.lesson.fmt import pct, vec
from attnlab.lesson.formula import SEED_SCENE, formula_section, qkv_section
from attnlab.lesson.heads import heads_section
from attnlab.lesson.nextsteps import next_section
from attnlab.lesson.scaling import SEED_SCALING, scaling_section

MINILM = {"model_id": "all-MiniLM-L6-v2", "num_layers": 6, "num_heads": 12, "hidden_size": 384}


@pytest.fixture(scope="module")
def scaling():
    return scaling_section(seed=0)


def test_scene_weights_and_vectors_as_the_seed_states():
    s = formula_section()
    for variant in ("unscaled", "scaled"):
        shown = [round(100 * w) for w in s.data["distinct_weights"][variant]]
        assert shown == SEED_SCENE[variant]["weights_pct"] == ([60, 20, 10, 2] if variant == "unscaled" else [46, 21, 13, 4])
        assert vec(s.data[variant]["output"]) == vec(SEED_SCENE[variant]["output"])
    assert vec(s.data["unscaled"]["output"]) == "(0.75, 0.05)"
    assert vec(s.data["scaled"]["output"]) == "(0.63, 0.06)"
    # the seed's scores 1.8, 0.7, 0, -1.6 (river, sat, bank, the rest)
    assert sorted({round(x, 6) for x in s.data["unscaled"]["scores"]}, reverse=True) == SEED_SCENE["scores"]
    assert "60 %, 20 %, 10 %, 2 % → (riverbank, money) = (0.75, 0.05)" in s.findings[1]


def test_std_of_dot_products_reproduces_the_seed_exactly(scaling):
    rows = scaling.data["std"]
    assert [r["d"] for r in rows] == [1, 2, 64, 512]
    for r in rows:
        assert round(r["std"], 1) == SEED_SCALING["std"][str(r["d"])]
        assert round(r["std_scaled"], 2) == 1.0
    assert [round(r["std"], 1) for r in rows] == [1.0, 1.4, 8.0, 22.6]


def _largest_weight_population(scale: float, draws: int = 20_000) -> tuple[float, float]:
    """Mean and standard deviation of softmax's largest weight over 8 random keys, d_k = 64, by simulation."""
    rng = np.random.default_rng(12345)
    s = np.einsum("nd,nkd->nk", rng.standard_normal((draws, 64)), rng.standard_normal((draws, 8, 64))) * scale
    e = np.exp(s - s.max(-1, keepdims=True))
    top = (e / e.sum(-1, keepdims=True)).max(-1)
    return float(top.mean()), float(top.std())


def test_saturation_is_near_the_seeds_figures_and_reported_honestly(scaling):
    sat = scaling.data["saturation"]
    assert (sat["keys"], sat["d_k"], sat["draws"]) == (8, 64, 100)
    for name, scale, seed_says in (("unscaled", 1.0, 0.89), ("scaled", 1 / 8, 0.36)):
        mean, std = _largest_weight_population(scale)
        sem = std / np.sqrt(sat["draws"])  # of a mean of 100 draws
        assert abs(sat[f"{name}_mean"] - mean) <= 4 * sem  # the lesson's draw of 100 is a draw of this population
        assert abs(seed_says - mean) <= 4 * sem  # and so is the seed's
        assert sat[f"{name}_sem"] == pytest.approx(sem, rel=0.5)
    assert sat["unscaled_mean"] > 2 * sat["scaled_mean"]
    same = round(sat["unscaled_mean"], 2) == 0.89 and round(sat["scaled_mean"], 2) == 0.36
    assert scaling.data["saturation_matches_seed"] == same
    text = scaling.findings[1]
    assert f"{sat['unscaled_mean']:.2f} unscaled" in text and "0.89" in text and "0.36" in text
    assert ("the same to two decimals" in text) == same and ("differs" in text) == (not same)


def test_jacobian_norm_vanishes_as_scores_grow(scaling):
    g = scaling.data["gradient"]
    f, norm = np.array(g["factors"]), np.array(g["jacobian_norm"])
    past = norm[f >= 2]
    assert np.all(np.diff(past) < 0)  # falls steadily once the scores outgrow unit variance
    assert norm[-1] < 0.25 * norm[np.argmin(np.abs(f - 1))]
    assert np.all(np.diff(g["largest_weight"]) > 0)


def test_heads_cost_the_same_arithmetic_at_d_model_512():
    s = heads_section(MINILM, n=128)
    one, eight = s.data["one_head_512"], s.data["eight_heads_512"]
    assert one["total"] == eight["total"] and s.data["ratio_8_to_1"] == 1.0
    assert (one["d_head"], eight["d_head"]) == (512, 64)
    n = 128
    assert eight["scores"] == n * n * 512 and eight["projections"] == 3 * n * 512 * 512
    assert eight["exponentials"] == 8 * one["exponentials"]
    bert = s.data["bert_base"]
    assert (bert["heads"], bert["d_head"], bert["d_model"], bert["layers"]) == (12, 64, 768, 12)
    assert s.data["model"]["total_heads"] == 72 and s.data["model"]["d_head"] == 32


def test_qkv_self_cross_and_additive():
    s = qkv_section(seed=0)
    assert np.array(s.data["self"]["weights"]).shape == (2, 4, 4)  # 2 heads over 4 tokens
    assert s.data["cross"]["shape"] == [2, 4, 6]  # Tq ≠ Tk
    dva = s.data["dot_vs_additive"]
    x, h = np.array(s.data["x"]), np.array(dva["states"])
    scores = x @ h.T / np.sqrt(8)  # by hand: s·h/√d over the same inputs
    np.testing.assert_allclose(dva["dot_scores"], scores, atol=1e-12)
    np.testing.assert_allclose(dva["dot_weights"], np.exp(scores) / np.exp(scores).sum(-1, keepdims=True), atol=1e-12)
    np.testing.assert_allclose(dva["dot_output"], np.array(dva["dot_weights"]) @ h, atol=1e-12)
    e = np.array(dva["additive_scores"])  # the same softmax and weighted sum over the additive scores
    np.testing.assert_allclose(dva["additive_weights"], np.exp(e) / np.exp(e).sum(-1, keepdims=True), atol=1e-12)
    np.testing.assert_allclose(dva["additive_output"], np.array(dva["additive_weights"]) @ h, atol=1e-12)
    assert not np.allclose(dva["dot_weights"], dva["additive_weights"])
    listing = s.data["listing"]
    assert [pct(w) for w in listing["weights"][0]] == ["6 %", "47 %", "47 %"]
    assert vec(listing["head1"][0]) == "(1.94, 6.68, 1.60)"


def test_order_blindness_causal_and_hidden_token_are_checked():
    s = next_section(seed=3)
    ob = s.data["order_blindness"]
    perm = ob["permutation"]
    assert sorted(perm) == list(range(len(s.data["tokens"]))) and perm != sorted(perm)
    # token perm[i] sits at row i after shuffling: its weights over the same tokens, in their new order
    np.testing.assert_allclose(ob["weights_shuffled"], np.array(ob["weights"])[np.ix_(perm, perm)], atol=1e-12)
    w = np.array(s.data["causal"]["weights"])
    assert np.all(w[np.triu_indices_from(w, 1)] == 0) and np.allclose(w.sum(-1), 1)
    h = np.array(s.data["hidden"]["weights"])
    assert np.all(h[:, s.data["hidden"]["position"]] == 0) and np.allclose(h.sum(-1), 1)


def test_growth_exponent():
    ns = [256, 512, 1024]
    assert growth_exponent(ns, [n**2 * 3.0 for n in ns]) == pytest.approx(2.0)
    assert growth_exponent(ns, [n * 7.0 for n in ns]) == pytest.approx(1.0)


def test_largest_context_finds_the_limit_of_a_known_cost(monkeypatch):
    # a fake path whose time is n² ns and memory 8·n² bytes: 2 ms deadline → n ≤ 1414, 8 MB → n ≤ 1000
    fake = lambda n: Measurement("numpy", n, 64, 1, False, n * n * 1e-9, peak_bytes=8 * n * n)  # noqa: E731
    monkeypatch.setattr(cost_mod, "_measure", lambda method, sizes, cfg: [fake(n) for n in sizes])
    cfg = CostConfig(deadline_ms=2.0, memory_mb=8.0, sizes=(128, 256))
    best = largest_context("numpy", cfg, [fake(128), fake(256)])
    assert best["n"] % 64 == 0 and best["n"] <= 1000 < best["n"] + 64 * 2
    assert best["first_failing_n"] > 1000
    assert all(r["fits"] == (r["n"] * r["n"] * 8 <= 8e6 and r["n"] ** 2 * 1e-9 <= 2e-3) for r in best["tried"])


def test_cost_section_measures_memory_growing_as_n_squared():
    s = cost_mod.cost_section(CostConfig(deadline_ms=1.0, memory_mb=4.0, sizes=(256, 512, 1024), repeats=1))
    full, blockwise = s.data["paths"]["n×n (NumPy reference)"], s.data["paths"]["blockwise (NumPy)"]
    assert full["memory_exponent"] == pytest.approx(2.0, abs=0.15)
    # blockwise never holds n × n: its memory grows at most linearly (a fixed tile buffer dominates here)
    assert blockwise["memory_exponent"] < 1.2 < 1.8 < full["memory_exponent"]
    assert blockwise["points"][-1]["peak_bytes"] < full["points"][-1]["peak_bytes"]
    # by hand: n² float64 scores must fit 4 MB, so the n × n path's largest context is at most √(4e6 / 8) ≈ 707
    assert full["largest_context"]["n"] <= 707
    assert [r["layer"] for r in s.data["table_1"]][:2] == ["Self-attention", "Recurrent"]
    # measured by attnlab.bench, and the text says which memory it is
    assert full["memory_measure"] == blockwise["memory_measure"] == "tracemalloc"
    assert full["points"][0]["method"] == "numpy" and blockwise["points"][0]["method"] == "blockwise-numpy"
    assert full["points"][0]["max_error"] < 1e-5 and len(full["points"][0]["times_s"]) == 1
    measured = [t for t in s.tables if t.title.startswith("Measured")]
    assert any("tracemalloc" in f for f in s.findings) and len(measured) == 2
    assert all("tracemalloc" in t.title for t in measured)
    assert s.tables[-1].title.startswith("Serving llama-3.1-8b")  # the planner's answer to the second source


def test_bench_sweep_interleaves_sizes_and_measures_memory_with_tracemalloc():
    from attnlab import bench

    ms = bench.measure_sweep("numpy", (64, 128), d=8, repeats=2, memory="tracemalloc", blas_threads=1)
    assert [m.n for m in ms] == [64, 128] and all(len(m.times_s) == 2 for m in ms)
    # the n × n path's buffers are NumPy's: 128² float64 scores alone are 131 kB
    assert ms[1].peak_bytes >= 128 * 128 * 8 and ms[1].peak_bytes > 3 * ms[0].peak_bytes
    with pytest.raises(ValueError, match="memory must be one of rss, tracemalloc"):
        bench.measure_sweep("numpy", (64,), memory="heap")
    with pytest.raises(ValueError, match="blas_threads"):
        bench.measure_sweep("numpy", (64,), blas_threads=0)


@pytest.mark.parametrize("kwargs", [{"deadline_ms": 0}, {"memory_mb": -1}, {"deadline_ms": math.nan}, {"repeats": 0}])
def test_cost_config_rejects_bad_limits(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        CostConfig(**kwargs)
