"""head_stats takes each layer's statistics in the forward's own pass (kernel.fused) where the compiled kernel
has it and the kept tiles fit; the two passes (the forward, then the statistics pass) where they would not:
both give the same statistics, and the model the same hidden states."""

import numpy as np
import pytest

from attnlab.backends.kernel import fused
from attnlab.interventions import stats as stats_module
from attnlab.interventions.stats import ROW_STATS, head_stats

pytestmark = pytest.mark.needs("torch", "transformers")

WORDS = "the river runs past the bank and the money sits in the bank while I sat on the bank of the river".split()


def test_one_pass_and_two_passes_give_the_same_statistics(tiny_llama, monkeypatch):
    from attnlab.backends import kernel
    from attnlab.hf.loading import load_model

    if getattr(kernel._tiles, "forward_stats", None) is None:
        pytest.skip("the compiled kernel with forward_stats was not built here")
    lm = load_model(tiny_llama)
    text = " ".join(np.random.default_rng(3).choice(WORDS, 60))
    calls = []
    real = fused.attention_stats
    monkeypatch.setattr(fused, "attention_stats", lambda *a, **k: calls.append(1) or real(*a, **k))
    one = head_stats(text, lm, max_tokens=64)
    assert len(calls) == lm.num_layers  # every layer took the one pass
    monkeypatch.setattr(fused, "KEPT_BYTES", 0)  # nothing fits: the forward, then the statistics pass
    two = head_stats(text, lm, max_tokens=64)
    assert len(calls) == lm.num_layers
    for name in ROW_STATS:
        np.testing.assert_allclose(one.means[name], two.means[name], rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(one.received[0], two.received[0], rtol=1e-5, atol=1e-6)
    assert stats_module.fused is fused
