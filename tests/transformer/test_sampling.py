"""Sampling: greedy is argmax, a seed draws the same tokens, top-k and top-p keep what they say, bad values are named."""

from __future__ import annotations

import pytest

from attnlab.transformer.sampling import Sampling


def _logits():
    import torch

    # probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 in a shuffled order, twice
    p = torch.tensor([0.0625, 0.5, 0.125, 0.0625, 0.25])
    return p.log()[None].repeat(2, 1)


def test_greedy_is_the_first_largest_logit():
    import torch

    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    assert Sampling().choose(logits, None).tolist() == [1, 0]


def test_a_seed_draws_the_same_tokens_and_another_seed_others():
    import torch

    logits = torch.zeros(4, 50)

    def draw(seed):
        rule = Sampling(sample=True, seed=seed)
        gen = rule.generator("cpu")
        return torch.stack([rule.choose(logits, gen) for _ in range(8)]).tolist()

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)


def test_top_k_and_top_p_keep_exactly_their_tokens():
    import torch

    logits = _logits()
    kept = lambda rule: torch.isfinite(rule.filtered(logits))[0].nonzero()[:, 0].tolist()  # noqa: E731
    assert kept(Sampling(sample=True, top_k=2)) == [1, 4]
    assert kept(Sampling(sample=True, top_p=0.75)) == [1, 4]  # 0.5 + 0.25 reaches 0.75
    assert kept(Sampling(sample=True, top_p=0.76)) == [1, 2, 4]
    assert kept(Sampling(sample=True, top_p=0.01)) == [1]  # the most likely token always stays
    assert kept(Sampling(sample=True, top_k=3, top_p=0.6)) == [1, 4]
    rule = Sampling(sample=True, top_k=2, seed=0)
    gen = rule.generator("cpu")
    draws = {int(t) for _ in range(200) for t in rule.choose(logits, gen)}
    assert draws == {1, 4}


def test_temperature_sharpens_and_flattens():
    import torch

    logits = _logits()
    cold = Sampling(sample=True, temperature=0.5).filtered(logits).softmax(-1)[0]
    hot = Sampling(sample=True, temperature=2.0).filtered(logits).softmax(-1)[0]
    assert float(cold[1]) > 0.5 > float(hot[1])
    torch.testing.assert_close(cold, (logits[0] * 2).softmax(-1))


@pytest.mark.parametrize("kw, match", [
    ({"sample": True, "temperature": 0.0}, r"temperature must be a finite number in \(0, 100\], got 0.0"),
    ({"sample": True, "temperature": -1.0}, r"temperature must be a finite number in \(0, 100\]"),
    ({"sample": True, "temperature": float("inf")}, r"temperature must be a finite number in \(0, 100\], got inf"),
    ({"sample": True, "temperature": float("nan")}, r"temperature must be a finite number in \(0, 100\], got nan"),
    ({"sample": True, "temperature": 100.5}, r"temperature must be a finite number in \(0, 100\], got 100.5"),
    ({"temperature": float("inf")}, r"temperature must be a finite number in \(0, 100\]"),
    ({"sample": True, "top_p": 0.0}, r"top_p must lie in \(0, 1\]"),
    ({"sample": True, "top_p": 1.5}, r"top_p must lie in \(0, 1\]"),
    ({"sample": True, "top_k": 0}, "top_k must be an int >= 1"),
    ({"top_k": 5}, "take effect only when sampling"),
    ({"temperature": 0.7, "seed": 1}, "temperature=0.7, seed=1 take effect only when sampling"),
])
def test_bad_values_name_the_argument(kw, match):
    with pytest.raises(ValueError, match=match):
        Sampling(**kw)


def test_the_largest_temperature_samples():
    import torch

    torch.manual_seed(0)
    rule = Sampling(sample=True, temperature=100, seed=3)
    assert rule.choose(torch.randn(2, 7), rule.generator("cpu")).shape == (2,)


def test_a_tiny_temperature_samples_the_largest_logit_not_nan():
    """5e-324 is in (0, 100]: the logits over it would overflow; shifted by their largest first, they give −inf
    (and 0 for the largest), so the draw is the argmax, never a NaN probability."""
    import torch

    rule = Sampling(sample=True, temperature=5e-324, seed=0)
    logits = torch.tensor([[0.5, 3.0, -1.0], [2.0, 1.0, 0.0]])
    assert rule.choose(logits, rule.generator("cpu")).tolist() == [1, 0]
