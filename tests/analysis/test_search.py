"""The target-word search on synthetic maps: planted heads, counts, near misses, errors."""

import numpy as np
import pytest

import attnlab

RIVER = ["[CLS]", "I", "sat", "on", "the", "bank", "of", "the", "river", ".", "[SEP]"]
MONEY = ["[CLS]", "I", "put", "the", "money", "in", "the", "bank", ".", "[SEP]"]
L, H = 3, 4


def _maps(make_maps):
    maps = make_maps([RIVER, MONEY], num_layers=L, num_heads=H)
    for w in maps.weights:  # every head: "bank" parks 60 % on [CLS], the rest spread evenly
        t = w.shape[-1]
        bank = 5 if t == len(RIVER) else 7
        w[:, :, bank, :] = 0.4 / (t - 1)
        w[:, :, bank, 0] = 0.6
    return maps


def _set_bank_row(maps, layer, head, river_w, money_w):
    for w, bank, decider, dw in ((maps.weights[0], 5, 8, river_w), (maps.weights[1], 7, 4, money_w)):
        t = w.shape[-1]
        w[layer, head, bank, :] = (1 - dw) / (t - 1)
        w[layer, head, bank, decider] = dw


def test_planted_heads_qualify_and_the_strongest_is_best(make_maps):
    maps = _maps(make_maps)
    _set_bank_row(maps, 1, 2, 0.93, 0.60)
    _set_bank_row(maps, 2, 0, 0.50, 0.50)
    res = attnlab.find_heads(maps.to_words(), target="bank", deciders=["river", "money"])
    assert res.qualifying == [(1, 2), (2, 0)]
    assert res.best == (1, 2)
    assert res.total_heads == L * H
    assert res.decider_weights.shape == (L, H, 2)
    np.testing.assert_allclose(res.decider_weights[1, 2], [0.93, 0.60], atol=1e-6)
    assert res.mark_heads == L * H - 2  # every other head parks "bank" on [CLS] in both sentences
    assert res.mark_heads_per_sentence == [L * H - 2, L * H - 2]
    assert res.summary() == f"2 of {L * H} heads; layer 2, head 3: 93 % and 60 %"
    assert res.closest == []
    d = res.to_dict()
    assert d["best"]["layer"] == 1 and d["best"]["head"] == 2 and d["qualifying"][1] == {"layer": 2, "head": 0}


def test_a_head_that_wins_one_sentence_does_not_qualify(make_maps):
    maps = _maps(make_maps)
    _set_bank_row(maps, 0, 1, 0.9, 0.2)  # the decider takes the largest weight in both sentences
    w = maps.weights[1]
    w[0, 1, 7, 0] += 0.5  # now [CLS] beats money in sentence 2
    w[0, 1, 7] /= w[0, 1, 7].sum()
    res = attnlab.find_heads(maps.to_words(), "bank", ["river", "money"])
    assert res.qualifying == [] and res.best is None
    assert res.summary().startswith(f"No head of {L * H} qualifies")
    top = res.closest[0]
    assert (top.head, top.sentences_won) == ((0, 1), 1)
    assert top.winners == ("river", "[CLS]")
    assert "layer 1, head 2: river 90 % and money" in res.summary()


def test_excluding_marks_lets_the_decider_win(make_maps):
    maps = _maps(make_maps)
    for w, bank, decider in ((maps.weights[0], 5, 8), (maps.weights[1], 7, 4)):
        w[2, 3, bank, decider] += 0.1  # decider is second after [CLS]
        w[2, 3, bank] /= w[2, 3, bank].sum()
    words = maps.to_words()
    assert attnlab.find_heads(words, "bank", ["river", "money"]).qualifying == []
    assert (2, 3) in attnlab.find_heads(words, "bank", ["river", "money"], exclude_marks=True).qualifying


def test_excluding_self(make_maps):
    maps = _maps(make_maps)
    for w, bank, decider in ((maps.weights[0], 5, 8), (maps.weights[1], 7, 4)):
        w[1, 1, bank] = 0.0
        w[1, 1, bank, bank], w[1, 1, bank, decider] = 0.7, 0.3
    words = maps.to_words()
    assert (1, 1) not in attnlab.find_heads(words, "bank", ["river", "money"]).qualifying
    assert (1, 1) in attnlab.find_heads(words, "bank", ["river", "money"], exclude_self=True).qualifying


@pytest.mark.parametrize(
    "target, deciders, error, message",
    [
        ("bonk", ["river", "money"], LookupError, "'bonk' is not in sentence 1"),
        ("bank", ["river", "cash"], LookupError, "'cash' is not in sentence 2"),
        ("bank", ["river"], ValueError, "1 words for 2 sentences"),
        ("bank", ["bank", "money"], ValueError, "is the target itself"),
        ("", ["river", "money"], ValueError, "target must be a non-empty word"),
    ],
)
def test_bad_input(make_maps, target, deciders, error, message):
    with pytest.raises(error, match=message):
        attnlab.find_heads(_maps(make_maps).to_words(), target, deciders)


def test_minilm_bank_facts(bank_maps):
    """The search on all-MiniLM-L6-v2's maps of the lesson's sentences, recounted by hand from the same maps."""
    words = bank_maps.to_words()
    res = attnlab.find_heads(words, "bank", ["river", "money"])
    assert res.total_heads == 72
    tops = [w[:, :, words.index(s, "bank"), :].argmax(-1) for s, w in enumerate(words.weights)]  # (L, H) per sentence
    deciders = [tops[0] == words.index(0, "river"), tops[1] == words.index(1, "money")]
    assert res.qualifying == [(int(l), int(h)) for l, h in zip(*np.nonzero(deciders[0] & deciders[1]))]
    marks = [np.isin(np.array(words.words[s]), ["[CLS]", "[SEP]", "."])[t] for s, t in enumerate(tops)]
    assert res.mark_heads_per_sentence == [int(m.sum()) for m in marks]
    assert res.mark_heads == int((marks[0] & marks[1]).sum())
    if not res.qualifying:  # the lesson's case: it says so and shows the near misses
        assert res.best is None and res.closest and "No head of 72 qualifies" in res.summary()
