"""One description of a call's options (attnlab.backends.options.Options): defaults in one place,
unknown keywords named, help(attention) lists every option, refusals composed from declared facts."""

from __future__ import annotations

import dataclasses
import pydoc

import numpy as np
import pytest

from attnlab.backends import base
from attnlab.backends.api import attention
from attnlab.backends.blockwise import BlockwiseBackend
from attnlab.backends.dispatch import BACKENDS, NoBackendError
from attnlab.backends.options import NAMES, Options
from attnlab.backends.request import prepare

X = np.random.default_rng(0).standard_normal((2, 5, 4))


def test_an_unknown_keyword_is_named_with_every_known_one():
    with pytest.raises(TypeError, match=r"unknown keyword 'casual'.*causal") as e:
        attention(X, X, X, casual=True)
    for name in NAMES:
        assert name in str(e.value)


def test_help_of_attention_tells_every_option_and_its_default():
    text = pydoc.render_doc(attention, renderer=pydoc.plaintext)
    for f in dataclasses.fields(Options):
        assert f"{f.name}: " in text, f.name  # its description
        assert f"{f.name}={f.default!r}" in text, f.name  # its default
    assert "{" not in text.split("Options")[0]  # the template was filled


def test_options_are_checked_and_normalised_once():
    o = Options(window=3, softcap=30, scale=1)
    assert (o.window, o.softcap, o.scale) == ((3, 3), 30.0, 1.0)
    seen = prepare(np.zeros((1, 9, 2)), np.zeros((1, 9, 2)), np.zeros((1, 9, 2)), Options(causal=True, window=(4, 2))).visible
    lo, hi = seen.spans  # causal cuts the window's right side at 0: row i sees i − 4 .. i
    assert (lo[0, 0, :, 0] == np.maximum(np.arange(9) - 4, 0)).all() and (hi[0, 0, :, 0] == np.arange(9) + 1).all()
    for bad, err in (({"causal": 1}, TypeError), ({"window": -1}, ValueError), ({"scale": 0}, ValueError),
                     ({"return_weights": True, "weights_rows": [0]}, ValueError), ({"kv_checked": True}, ValueError),
                     ({"k_norm": 1.0}, ValueError)):
        with pytest.raises(err):
            Options(**bad)


def test_a_call_with_no_options_is_the_default_one():
    assert prepare(X, X, X).request == prepare(X, X, X, Options()).request
    np.testing.assert_array_equal(attention(X, X, X, backend="numpy"), attention(X, X, X, backend="numpy", causal=False, scale=None))


def test_refusals_are_composed_from_the_declared_support():
    r = prepare(X, X, X, Options(return_weights=True)).request
    why = BlockwiseBackend().refusals(r)
    s = BlockwiseBackend.supports
    assert why == [base.refusal(s, "weights")]
    assert why[0] == f"does not support {base.FEATURES['weights']} ({s.instead['weights']})"
    with pytest.raises(NoBackendError, match="ask weights_rows="):
        attention(X, X, X, backend="blockwise", return_weights=True)
    for b in BACKENDS.values():  # every hint is for a feature the backend declares it does not serve
        assert set(b.supports.instead) <= set(base.FEATURES) - b.supports.features, b.name


@pytest.mark.parametrize(("tq", "tk", "kw", "hides"), [
    (1, 7, {"causal": True}, False),  # a decoding step: the one query sees every key
    (2, 7, {"causal": True}, True),
    (1, 7, {"causal": True, "window": (6, 0)}, False),  # the window reaches key 0 from position 6
    (1, 7, {"causal": True, "window": (5, 0)}, True),
    (3, 3, {"window": (2, 2)}, False),
    (3, 3, {"window": (1, 2)}, True),
    (1, 7, {"causal": True, "lengths": np.array([7, 7])}, False),
    (1, 7, {"causal": True, "lengths": np.array([7, 4])}, True),  # padding: the lengths restrict it
])
def test_a_band_that_hides_no_key_is_the_call_without_it(tq, tk, kw, hides):
    """Dropped before any backend sees it (a step of generate is served as plain attention, no mask),
    and the result is the reference's either way."""
    rng = np.random.default_rng(tq * tk)
    q, k, v = rng.standard_normal((2, tq, 4)), rng.standard_normal((2, tk, 4)), rng.standard_normal((2, tk, 4))
    call = prepare(q, k, v, Options(**kw))
    masked = call.request.band or call.request.lengths
    assert masked == hides
    if not hides:
        assert call.visible.mask is None and call.visible.spans is None and not call.request.structure
        np.testing.assert_allclose(attention(q, k, v, **kw), attention(q, k, v), rtol=1e-12, atol=1e-12)
    for name in ("numpy", "torch", "blockwise", "kernel", "sdpa"):
        if not BACKENDS[name].refusals(call.request):
            np.testing.assert_allclose(attention(q, k, v, backend=name, **kw), attention(q, k, v, backend="numpy", **kw),
                                       rtol=1e-6, atol=1e-6)
