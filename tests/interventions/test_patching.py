"""Activation and attribution patching on tiny float64 models, checked against computations that do not
use the tools: a GPT-2 forward written out from the weights with one head's output swapped, and finite
differences; batched patching equals one pass per patch; bad input is refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

import circuit_models as cm

from attnlab import Head, attribution_patch, patch

pytestmark = pytest.mark.needs("torch")


hand_forward = cm.gpt2_by_hand


def test_patching_a_head_equals_the_forward_with_its_output_swapped():
    m = cm.model("gpt2")
    clean, corrupted = cm.pair()
    assert float((hand_forward(m, clean) - m.run_with_hooks(clean)).abs().max()) < 1e-12  # the hand forward is GPT-2's
    _, cache = m.run_with_cache(clean, names=lambda n: n.endswith("hook_z"))
    out = patch(m, clean, corrupted, cm.logit_diff)
    assert out.effect.shape == (3, 4) and out.raw.shape == (3, 4, 2) and out.axes == ("layer", "head")
    every = slice(None)
    for layer in range(3):
        for head in range(4):
            z = cache[f"blocks.{layer}.attn.hook_z"][:, head]  # (B, T, Dh)
            want = cm.logit_diff(hand_forward(m, corrupted, (layer, head, z, every)))
            np.testing.assert_allclose(out.raw[layer, head], want.numpy(), atol=1e-11)
    clean_m, corr_m = cm.logit_diff(hand_forward(m, clean)).numpy(), cm.logit_diff(hand_forward(m, corrupted)).numpy()
    np.testing.assert_allclose(out.clean, clean_m, atol=1e-11)
    want = (out.raw.mean(-1) - corr_m.mean()) / (clean_m.mean() - corr_m.mean())  # normalised on the batch means
    np.testing.assert_allclose(out.effect, want, atol=1e-10)


def test_patching_a_head_at_one_position():
    m = cm.model("gpt2")
    clean, corrupted = cm.pair()
    _, cache = m.run_with_cache(clean, names=["blocks.1.attn.hook_z"])
    out = patch(m, clean, corrupted, cm.logit_diff, over="head_pos")
    assert out.effect.shape == (3, 4, 9)
    z = cache["blocks.1.attn.hook_z"][:, 2]
    for t in (0, 4, 8):
        want = cm.logit_diff(hand_forward(m, corrupted, (1, 2, z, [t])))
        np.testing.assert_allclose(out.raw[1, 2, t], want.numpy(), atol=1e-11)


def test_patching_everything_restores_the_clean_run():
    """Patching the whole residual stream at layer 0 (every position) is the clean run: effect 1."""
    for style in cm.STYLES:
        m = cm.model(style)
        clean, corrupted = cm.pair()
        out = patch(m, clean, corrupted, cm.logit_diff, site="resid_pre", over="layer")
        assert out.effect.shape == (3,) and abs(out.effect[0] - 1.0) < 1e-10
        np.testing.assert_allclose(out.raw[0], out.clean, atol=1e-10)


@pytest.mark.parametrize("style", cm.STYLES)
@pytest.mark.parametrize("site,over", [("z", "head"), ("z", "head_pos"), ("pattern", "head"), ("q", "head"),
                                       ("k", "head"), ("v", "head"), ("resid_pre", "layer_pos"),
                                       ("attn_out", "layer"), ("mlp_out", "layer_pos")])
def test_batched_patching_equals_one_pass_per_patch(style, site, over):
    m = cm.model(style)
    clean, corrupted = cm.pair()
    batched = patch(m, clean, corrupted, cm.logit_diff, site, over)
    alone = patch(m, clean, corrupted, cm.logit_diff, site, over, copies=1)
    np.testing.assert_allclose(batched.raw, alone.raw, atol=1e-10)
    kv = m.config.heads_kv if site in ("k", "v") else m.config.num_heads
    grid = {"head": (3, kv), "head_pos": (3, kv, 9), "layer": (3,), "layer_pos": (3, 9)}[over]
    assert batched.effect.shape == grid


def test_a_metric_may_read_the_patched_run():
    """names= hands the metric the hook points of the same (patched) run."""
    m = cm.model("gpt2")
    clean, corrupted = cm.pair()

    def attention_on_first(logits, cache):  # head (2, 1)'s weight from the last query onto position 0
        return cache["blocks.2.attn.hook_pattern"][:, 1, -1, 0]

    out = patch(m, clean, corrupted, attention_on_first, names=["blocks.2.attn.hook_pattern"])
    np.testing.assert_allclose(out.raw[2], np.broadcast_to(out.corrupted, (4, 2)), atol=1e-12)  # not its own layer's
    assert np.abs(out.raw[:2] - out.corrupted).max() > 1e-6


@pytest.mark.parametrize("style", cm.STYLES)
def test_attribution_patching_is_the_finite_difference(style):
    """raw − M_corrupted = (z_clean − z_corrupted) · ∂M/∂z, the derivative of M along the line from the
    corrupted head output to the clean one, by central differences."""
    m = cm.model(style)
    clean, corrupted = cm.pair()
    est = attribution_patch(m, clean, corrupted, cm.logit_diff)
    assert est.method == "attribution" and est.effect.shape == (3, 4)
    _, zc = m.run_with_cache(clean, names=lambda n: n.endswith("hook_z"))
    _, zx = m.run_with_cache(corrupted, names=lambda n: n.endswith("hook_z"))
    eps = 1e-5
    for layer, head in [(0, 1), (1, 3), (2, 0)]:
        name = f"blocks.{layer}.attn.hook_z"
        delta = zc[name][:, head] - zx[name][:, head]

        slope = (_moved(m, corrupted, name, head, eps * delta) - _moved(m, corrupted, name, head, -eps * delta)) / (2 * eps)
        np.testing.assert_allclose(est.raw[layer, head] - est.corrupted, slope.numpy(), rtol=1e-6, atol=1e-8)


def _moved(m, ids, name, head, step):
    """The metric with head ``head``'s output at hook point ``name`` moved by ``step`` (B, T, Dh)."""
    def fn(z, _):
        z = z.clone()
        z[:, head] = z[:, head] + step
        return z
    return cm.logit_diff(m.run_with_hooks(ids, fwd_hooks=[(name, fn)]))


def test_attribution_patching_reports_its_correlation_with_patching():
    m = cm.model("gpt2")
    clean, corrupted = cm.pair()
    est = attribution_patch(m, clean, corrupted, cm.logit_diff, compare=True)
    true = patch(m, clean, corrupted, cm.logit_diff)
    r = np.corrcoef(est.effect.ravel(), true.effect.ravel())[0, 1]
    assert est.correlation == pytest.approx(r) and attribution_patch(m, clean, corrupted, cm.logit_diff).correlation is None


def test_the_result_ranks_heads_and_is_json_ready():
    m = cm.model("gpt2")
    clean, corrupted = cm.pair()
    out = patch(m, clean, corrupted, cm.logit_diff)
    top = out.top(3)
    biggest = np.abs(out.effect).argmax()  # by size, the sign kept (a head that hurts ranks as one that helps)
    assert all(isinstance(s.head, Head) for s in top) and top[0].score == out.effect.flat[biggest]
    assert top[0].head == np.unravel_index(biggest, out.effect.shape)  # 0-based
    assert [abs(s.score) for s in top] == sorted((abs(s.score) for s in top), reverse=True)
    d = json.loads(json.dumps(out.to_dict()))
    assert d["effect"] == out.effect.tolist() and d["axes"] == ["layer", "head"] and len(d["top"]) == 10
    assert d["top"][0] == {**top[0].head.to_dict(), "score": top[0].score}
    by_pos = patch(m, clean, corrupted, cm.logit_diff, over="head_pos")
    assert by_pos.top(1)[0].score == by_pos.effect.flat[np.abs(by_pos.effect).argmax()]
    with pytest.raises(ValueError, match="top ranks heads"):
        patch(m, clean, corrupted, cm.logit_diff, site="resid_pre", over="layer").top()


def test_one_sequence_and_a_scalar_metric():
    m = cm.model("gpt2")
    clean, corrupted = cm.pair(batch=1)
    one = patch(m, clean[0], corrupted[0], lambda lg: lg[0, -1, 3] - lg[0, -1, 7])
    np.testing.assert_allclose(one.raw, patch(m, clean, corrupted, cm.logit_diff).raw, atol=1e-12)


@pytest.mark.parametrize("call,message", [
    (lambda m, a, b: patch(m, a, b[:, :-1], cm.logit_diff), "clean and corrupted must have the same shape"),
    (lambda m, a, b: patch(m, a, b, lambda lg: lg[:, -1, :2]), r"metric must return one number per sequence, a \[B\]"),
    (lambda m, a, b: patch(m, a, b, lambda lg: lg[0, -1, 3]), r"metric must return one number .* got shape \[\]"),
    (lambda m, a, b: patch(m, a, b, lambda lg, c: lg[:, -1, 3], names=["blocks.7.attn.hook_z"]),
     "names entry 'blocks.7.attn.hook_z' is not a hook point of this model; its hook points are hook_embed"),
    (lambda m, a, b: patch(m, a, b, cm.logit_diff, site="mlp"), "site must be one of z, pattern"),
    (lambda m, a, b: patch(m, a, b, cm.logit_diff, site="resid_pre"), "over must be one of layer, layer_pos"),
    (lambda m, a, b: patch(m, a, b, cm.logit_diff, copies=0), "copies must be None or an int >= 1"),
    (lambda m, a, b: patch(m, a.float(), b, cm.logit_diff), "clean must be token ids"),
    (lambda m, a, b: patch(m, a, b + 100, cm.logit_diff), r"corrupted must hold token ids in 0\.\.49"),
    (lambda m, a, b: patch(m, a, a, cm.logit_diff), "metric must differ between the clean and corrupted runs"),
    (lambda m, a, b: patch(m, a, b, "logit"), "metric must be callable"),
])
def test_bad_input_is_refused_by_name(call, message):
    m = cm.model("gpt2")
    clean, corrupted = cm.pair()
    with pytest.raises((ValueError, TypeError), match=message):
        call(m, clean, corrupted)
