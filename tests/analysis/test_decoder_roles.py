"""Decoder roles: TransformerLens's detection patterns (hand-built here), the attention sink, and
which roles do not apply to causal maps."""

import numpy as np
import pytest

import attnlab
from attnlab.analysis.induction import duplicate_pattern, induction_pattern

WORDS = ["the", "cat", "sat", "on", "the", "cat", "."]


def test_patterns_match_transformerlens_definitions():
    dup = duplicate_pattern(WORDS)
    expect = np.zeros((7, 7))
    expect[4, 0] = expect[5, 1] = 1  # the second "the" looks at the first, the second "cat" at the first
    np.testing.assert_array_equal(dup, expect)
    ind = induction_pattern(WORDS)
    expect = np.zeros((7, 7))
    expect[4, 1] = expect[5, 2] = 1  # the token after the earlier copy: "cat" after "the", "sat" after "cat"
    np.testing.assert_array_equal(ind, expect)


def _causal(make_maps, plant):
    maps = make_maps([WORDS], num_layers=2, num_heads=3)
    w = maps.weights[0]
    w[:] = np.tril(w)
    w /= w.sum(-1, keepdims=True)
    w[1, 2] = plant(7, [0, 1, 2, 3, 1, 2, 6])  # induction where it can, itself elsewhere
    w[0, 1] = plant(7, [0] * 7)  # an attention sink
    return maps


def test_induction_duplicate_and_sink_are_found(make_maps, plant):
    roles = attnlab.head_roles(_causal(make_maps, plant).to_words())
    assert roles.top("induction").head == (1, 2)
    assert roles.scores["induction"][1, 2] == pytest.approx(2 / 7)  # TransformerLens "mul": 2 rows of 7
    assert roles.top("sink") == ((0, 1), pytest.approx(1.0))  # layer 1, head 2 (L1H2)
    assert roles.heads("sink") == [(0, 1)]


def test_roles_that_do_not_apply_to_a_causal_decoder_say_why(make_maps, plant):
    roles = attnlab.head_roles(_causal(make_maps, plant).to_words())
    assert set(roles.not_applicable) == {"next", "cls", "sep", "marks"}
    assert "never attends to the next word" in roles.not_applicable["next"]
    assert "next" not in roles.scores and roles.heads("next") == []
    with pytest.raises(LookupError, match="does not apply here"):
        roles.top("cls")
    assert roles.to_dict()["not_applicable"]["marks"].startswith("marks-based")


def test_roles_on_a_real_tiny_decoder(tiny_llama):
    maps = attnlab.capture(["the cat sat on the mat and the cat sat"], tiny_llama)
    roles = attnlab.head_roles(maps.to_words())
    assert "induction" in roles.scores and "next" in roles.not_applicable
    assert roles.scores["sink"].shape == (2, 4)
