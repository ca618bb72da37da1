"""What a word is, and finding a target that is several words ("sea-shells", "don't") or has accents."""

import numpy as np
import pytest

import attnlab

SEA = ["[CLS]", "she", "sells", "sea", "-", "shells", "by", "the", "sea", "[SEP]"]


def test_a_run_of_words_is_found_by_its_text(make_maps):
    words = make_maps([SEA, ["[CLS]", "I", "don", "'", "t", "know", "[SEP]"]]).to_words()
    assert words.spans(0, "sea-shells") == [(3, 6)]
    assert words.spans(0, "Sea - Shells") == [(3, 6)]  # spacing and case do not matter
    assert words.spans(1, "don't") == [(2, 5)]
    assert words.spans(0, "sea") == [(3, 4), (8, 9)]
    assert words.spans(0, "seashell") == []  # a run must end where a word ends
    assert words.index(1, "don't") == 2
    with pytest.raises(LookupError, match="occurrence 3 of 'sea' was asked for, but sentence 1 has it 2 times"):
        words.span(0, "sea", occurrence=3)
    assert words.span(0, "sea", occurrence=2) == (8, 9)


def test_accents_are_ignored_only_where_nothing_matches_exactly(make_maps):
    words = make_maps([["[CLS]", "un", "café", "et", "cafe", "[SEP]"], ["[CLS]", "le", "Café", "[SEP]"]]).to_words()
    assert words.spans(0, "cafe") == [(4, 5)]  # the exact word first
    assert words.spans(1, "cafe") == [(2, 3)]  # then without accents, as an uncased tokenizer sees it
    assert words.spans(1, "CAFÉ") == [(2, 3)]


def test_find_heads_takes_a_run_as_one_word(make_maps, plant):
    maps = make_maps([SEA], num_layers=1, num_heads=2)
    t = maps.weights[0].shape[-1]
    maps.weights[0][0, 1] = plant(t, [8] * t)  # head (0, 1): every word looks at the last "sea"
    words = maps.to_words()
    res = attnlab.find_heads(words, "sea-shells", ["sells"])
    w = words.weights[0][:, :, 3:6, :].mean(axis=2)  # by hand: the run's row is the mean of its words' rows
    np.testing.assert_allclose(res.decider_weights[:, :, 0], w[:, :, 2], atol=1e-6)
    res = attnlab.find_heads(words, "sells", ["sea-shells"])
    w = words.weights[0][:, :, 2, 3:6].sum(axis=-1)  # and a run's column the sum of its words' columns
    np.testing.assert_allclose(res.decider_weights[:, :, 0], w, atol=1e-6)


def test_a_repeated_target_says_which_occurrence_and_can_be_chosen(make_maps, plant):
    maps = make_maps([SEA], num_layers=1, num_heads=1)
    maps.weights[0][0, 0] = plant(10, [0, 0, 0, 0, 0, 0, 0, 0, 2, 0])  # only the second "sea" looks at "sells"
    words = maps.to_words()
    first = attnlab.find_heads(words, "sea", ["sells"])
    assert first.qualifying == [] and first.target_spans == [(3, 4)] and first.target_counts == [2]
    assert first.occurrence_note() == '"sea" occurs more than once: sentence 1 has it 2 times; occurrence 1 (word 4) was used.'
    second = attnlab.find_heads(words, "sea", ["sells"], occurrence=2)
    assert second.qualifying == [(0, 0)] and second.to_dict()["target_occurrence"] == [{"occurrence": 2, "of": 2, "words": [9, 9]}]
    assert attnlab.find_heads(words, "shells", ["sells"]).occurrence_note() is None
    with pytest.raises(LookupError, match="occurrence 3"):
        attnlab.find_heads(words, "sea", ["sells"], occurrence=3)
    with pytest.raises(ValueError, match="occurrence has 2 entries for 1 sentences"):
        attnlab.find_heads(words, "sea", ["sells"], occurrence=[1, 2])


def test_the_default_tokenizer_cuts_words_as_documented(default_model):
    """The README's examples of what a word is, on the bundled model's tokenizer."""
    from attnlab.hf.capture import capture

    maps = capture(["I don't sell state-of-the-art sea-shells for $5 or 5€ at a@b.", "un café"], default_model)
    words, kinds = maps.words[0], dict(zip(maps.words[0], maps.kinds[0]))
    assert words[2:5] == ["don", "'", "t"]
    assert words[6:13] == ["state", "-", "of", "-", "the", "-", "art"]  # 7 words
    assert words[17:19] == ["$", "5"] and kinds["$"] == "word"  # cut off, but a symbol: not a mark
    assert words[20] == "5€" and kinds["5€"] == "word"  # BERT cuts only ASCII symbols off
    assert kinds["@"] == "punct" and kinds["-"] == "punct" and kinds["'"] == "punct"
    wm = maps.to_words()
    assert wm.spans(0, "sea-shells") == [(13, 16)] and wm.spans(0, "don't") == [(2, 5)]
    assert wm.spans(1, "cafe") == [(2, 3)]  # MiniLM strips accents: "cafe" is the word it sees


def test_the_decider_is_its_first_occurrence_outside_the_target(make_maps, plant):
    maps = make_maps([SEA], num_layers=1, num_heads=1)
    maps.weights[0][0, 0] = plant(10, [8] * 10)  # every word looks at the last "sea"
    words = maps.to_words()
    res = attnlab.find_heads(words, "sea-shells", ["sea"])  # the first "sea" is inside the target
    assert res.qualifying == [(0, 0)] and res.decider_weights[0, 0, 0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="decider 'sea-shells' of sentence 1 is the target itself"):
        attnlab.find_heads(words, "sea-shells", ["sea-shells"])
    with pytest.raises(LookupError, match="word 'whale' is not in sentence 1"):
        attnlab.find_heads(words, "sea-shells", ["whale"])
