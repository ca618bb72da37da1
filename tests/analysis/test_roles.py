"""Role scores find heads planted in synthetic maps."""

import numpy as np
import pytest

import attnlab
from attnlab.maps.heads import Head
from attnlab.analysis.roles import ROLES, RoleAccumulator

SENTENCES = [["[CLS]", "the", "cat", "sat", ".", "[SEP]"], ["[CLS]", "a", "dog", ",", "ran", "[SEP]"]]


@pytest.mark.parametrize(
    "role, columns",
    [
        ("prev", lambda t: [0] + list(range(t - 1))),
        ("next", lambda t: list(range(1, t)) + [t - 1]),
        ("self", lambda t: list(range(t))),
        ("cls", lambda t: [0] * t),
        ("sep", lambda t: [t - 1] * t),
    ],
)
def test_planted_head_is_top_and_over_threshold(make_maps, plant, role, columns):
    maps = make_maps(SENTENCES, num_layers=3, num_heads=4)
    for w in maps.weights:
        w[2, 1] = plant(w.shape[-1], columns(w.shape[-1]))
    roles = attnlab.head_roles(maps.to_words())
    top = roles.top(role)
    assert top.head == Head(2, 1) and str(top.head) == "L3H2"  # 0-based; 1-based only in its label
    assert top.score > 0.8
    assert roles.heads(role)[0] == (2, 1)


def test_punct_and_marks(make_maps, plant):
    maps = make_maps(SENTENCES, num_layers=2, num_heads=2)
    punct = [4, 3]  # "." and ","
    for w, p in zip(maps.weights, punct):
        w[1, 0] = plant(w.shape[-1], [p] * w.shape[-1])
    roles = attnlab.head_roles(maps.to_words())
    assert roles.top("punct").head == (1, 0)
    assert roles.scores["punct"][1, 0] == pytest.approx(1.0)
    assert roles.scores["marks"][1, 0] == pytest.approx(1.0)


def test_broad_is_entropy_in_nats(make_maps):
    maps = make_maps(SENTENCES, num_layers=1, num_heads=2)
    for w in maps.weights:
        w[0, 1] = 1.0 / w.shape[-1]  # uniform rows: entropy ln(6)
    roles = attnlab.head_roles(maps.to_words())
    assert roles.top("broad").head == (0, 1)
    assert roles.scores["broad"][0, 1] == pytest.approx(np.log(6), abs=1e-5)


def test_previous_word_average_uses_rows_that_have_one(make_maps, plant):
    maps = make_maps([SENTENCES[0]], num_layers=1, num_heads=1)
    maps.weights[0][0, 0] = plant(6, [0, 0, 1, 2, 3, 4])
    assert attnlab.head_roles(maps.to_words()).scores["prev"][0, 0] == pytest.approx(1.0)


def test_to_dict_is_zero_based_and_complete(make_maps):
    d = attnlab.head_roles(make_maps(SENTENCES, num_layers=2, num_heads=3).to_words()).to_dict()
    assert set(d["roles"]) | set(d["not_applicable"]) == set(ROLES)
    assert set(d["not_applicable"]) == {"duplicate", "induction"}  # no word repeats within a sentence
    for r in d["roles"].values():
        scores = np.asarray(r["scores"])
        assert scores.shape == (2, 3)
        layer, head = np.unravel_index(scores.argmax(), scores.shape)  # the top head, 0-based as every field
        assert (r["top"]["layer"], r["top"]["head"]) == (layer, head)


def test_accumulating_in_parts_equals_all_at_once(make_maps):
    maps = make_maps(SENTENCES, num_layers=2, num_heads=3)
    words = maps.to_words()
    whole = attnlab.head_roles(words)
    acc = RoleAccumulator(2, 3)
    for i in range(len(words)):
        part = make_maps([SENTENCES[i]], num_layers=2, num_heads=3)
        part.weights[0][...] = maps.weights[i]
        acc.add(part.to_words())
    parts = acc.result("synthetic", None)
    assert set(parts.scores) == set(whole.scores) and parts.not_applicable == whole.not_applicable
    for name in whole.scores:
        np.testing.assert_allclose(parts.scores[name], whole.scores[name], atol=1e-12)


def test_unknown_role_is_an_error(make_maps):
    roles = attnlab.head_roles(make_maps(SENTENCES).to_words())
    with pytest.raises(LookupError, match="role 'diagonal' is unknown"):
        roles.top("diagonal")
