"""Head roles: the sentence average, entropy normalised by length, and top() named 1-based."""

import dataclasses

import numpy as np
import pytest

import attnlab
from attnlab.analysis.roles import ROLES, RoleAccumulator
from attnlab.maps.heads import Head, ScoredHead
from attnlab.maps.records import Words

SHORT = ["[CLS]", "a", "b", "[SEP]"]  # 4 words
LONG = ["[CLS]"] + [f"w{i}" for i in range(14)] + ["[SEP]"]  # 16 words


def _one(words, s):
    """Sentence s of ``words`` alone."""
    pick, side = slice(s, s + 1), words.source
    one = Words(words=side.words[pick], kinds=side.kinds[pick], is_mark=side.is_mark[pick])
    own = dataclasses.replace(words.self_attention, weights=words.weights[pick], query_side=one, key_side=one)
    return dataclasses.replace(words, sentences=words.sentences[pick], self_attention=own)


def _self_in_short_prev_in_long(make_maps, plant):
    """Head (0, 0): itself in the short sentence, the previous word in the long one."""
    maps = make_maps([SHORT, LONG], num_layers=1, num_heads=1)
    maps.weights[0][0, 0] = plant(4, list(range(4)))
    maps.weights[1][0, 0] = plant(16, [0] + list(range(15)))
    return maps.to_words()


def test_sentence_average_weighs_each_sentence_the_same(make_maps, plant):
    words = _self_in_short_prev_in_long(make_maps, plant)
    by_row = attnlab.head_roles(words)
    by_sentence = attnlab.head_roles(words, average="sentence")
    # by hand: "self" is 1 on the short sentence's 4 rows and on 1 of the long one's 16 rows (its first)
    assert by_row.scores["self"][0, 0] == pytest.approx(5 / 20)
    assert by_sentence.scores["self"][0, 0] == pytest.approx((1 + 1 / 16) / 2)
    # "prev" has 3 rows in the short sentence (weight 0) and 15 in the long one (weight 1)
    assert by_row.scores["prev"][0, 0] == pytest.approx(15 / 18)
    assert by_sentence.scores["prev"][0, 0] == pytest.approx((0 + 1) / 2)
    assert by_row.average == "row" and by_sentence.to_dict()["average"] == "sentence"


def test_sentence_average_in_parts_and_corpus_checks_it(make_maps, plant):
    words = _self_in_short_prev_in_long(make_maps, plant)
    acc = RoleAccumulator(1, 1, average="sentence")
    for i in range(2):  # one sentence at a time, as a corpus streams
        acc.add(_one(words, i))
    assert acc.result("m", None).scores["self"][0, 0] == pytest.approx((1 + 1 / 16) / 2)
    with pytest.raises(ValueError, match="average must be 'row' or 'sentence', got 'rows'"):
        attnlab.head_roles(words, average="rows")
    with pytest.raises(ValueError, match="average must be"):
        attnlab.corpus_roles(["a b"], model=object(), average="mean")


def test_spread_is_entropy_over_log_of_attendable_words(make_maps):
    """A uniform row has spread 1 at every length, where its entropy in nats grows as log n."""
    maps = make_maps([SHORT, LONG], num_layers=1, num_heads=1)
    for w in maps.weights:
        w[0, 0] = 1.0 / w.shape[-1]
    words = maps.to_words()
    for s in range(2):
        one = attnlab.head_roles(_one(words, s))
        n = len(words.words[s])
        assert one.scores["broad"][0, 0] == pytest.approx(np.log(n), abs=1e-5)
        assert one.scores["spread"][0, 0] == pytest.approx(1.0, abs=1e-5)
    assert ROLES["spread"].unit == "ratio" and 0 < ROLES["spread"].threshold < 1


def test_spread_of_a_causal_row_counts_only_the_words_it_may_see(make_maps):
    maps = make_maps([SHORT], num_layers=1, num_heads=1)
    w = np.tril(np.ones((4, 4)))
    maps.weights[0][0, 0] = w / w.sum(-1, keepdims=True)  # uniform over 1, 2, 3, 4 words
    roles = attnlab.head_roles(maps.to_words())
    assert roles.scores["spread"][0, 0] == pytest.approx(1.0, abs=1e-5)  # rows 2..4 each uniform over what they see
    by_hand = (np.log(2) + np.log(3) + np.log(4)) / 4  # broad: row 1 has entropy 0 and counts
    assert roles.scores["broad"][0, 0] == pytest.approx(by_hand, abs=1e-5)


def test_top_is_a_scored_zero_based_head(make_maps, plant):
    maps = make_maps([SHORT], num_layers=2, num_heads=3)
    maps.weights[0][1, 2] = plant(4, [0, 0, 1, 2])  # layer 2, head 3 looks at the previous word
    roles = attnlab.head_roles(maps.to_words())
    top = roles.top("prev")
    assert isinstance(top, ScoredHead) and isinstance(top.head, Head)
    assert top.head == Head(1, 2) and str(top.head) == "L2H3"
    assert top.score == pytest.approx(roles.scores["prev"][top.head])
    assert roles.to_dict()["roles"]["prev"]["top"] == {"layer": 1, "head": 2, "score": top.score}
