"""The maps data model: one record per attention, one protocol for token- and word-level maps,
and no attribute name built from a string."""

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import attnlab
from attnlab.maps.records import Attention, Maps, Words
from attnlab.maps.words import WordMaps, to_words

SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"
SENTENCES = [["[CLS]", "Sea", "-", "shells", "!", "[SEP]"], ["[CLS]", "shells", "bank", ".", "[SEP]"]]
PIECES = [[1, 1, 1, 3, 1, 1], [1, 1, 2, 1, 1]]


def test_both_levels_answer_the_same_protocol(make_maps):
    maps = make_maps(SENTENCES, num_layers=2, num_heads=3, pieces=PIECES)
    words = maps.to_words()
    for m, level, n in ((maps, "token", 8), (words, "word", 6)):
        assert isinstance(m, Maps) and m.level == level and m.is_word_level == (level == "word")
        assert (m.num_layers, m.num_heads, len(m), m.is_seq2seq) == (2, 3, 2, False)
        assert [name for name, _ in m.attentions()] == ["self_attention"] and m.decoder is m.cross is None
        assert m.weights is m.self_attention.weights and m.weights[0].shape == (2, 3, n, n)
        assert m.self_attention.query_side is m.self_attention.key_side is m.source and m.target is None
        assert len(m.labels(0)) == len(m.marks(0)) == n
    assert maps.labels(0) == ["[CLS]", "Sea", "-", "shells", "##1", "##2", "!", "[SEP]"]
    assert words.labels(0) == SENTENCES[0] and words.marks(0) == [True, False, False, False, True, True]  # conftest: "-" is a word
    # a token is a mark where its word is
    assert maps.marks(0) == [words.marks(0)[w] for w in maps.word_of[0]]


def test_word_maps_choose_their_marks_again(make_maps):
    words = make_maps(SENTENCES, pieces=PIECES).to_words()
    assert words.to_words() is words
    chosen = words.to_words(marks={"bank", "[cls]"})
    assert chosen.is_mark[1] == [True, False, True, False, False] and chosen.weights is words.weights
    assert chosen.self_attention.query_side is chosen.self_attention.key_side is chosen.source
    with pytest.raises(TypeError, match="to_words takes token-level maps, got word-level WordMaps"):
        to_words(words)


def test_a_record_over_the_wrong_level_is_refused(make_maps):
    maps = make_maps(SENTENCES, pieces=PIECES)
    words = maps.to_words()
    with pytest.raises(ValueError, match="self_attention is over tokens; word-level maps hold words"):
        WordMaps(sentences=maps.sentences, self_attention=maps.self_attention, model_id="m", revision=None)
    other = Words(words=words.words, kinds=words.kinds, is_mark=[[False] * len(w) for w in words.words])
    bad = replace(words.self_attention, key_side=other)
    with pytest.raises(ValueError, match="self_attention's key side must be its query side"):
        replace(words, self_attention=bad)


def test_an_encoder_decoders_records_share_their_sides(make_maps):
    maps = make_maps(SENTENCES, num_layers=2, num_heads=3, pieces=PIECES)
    source = maps.source
    target = replace(source, tokens=[t[:3] for t in source.tokens], word_of=[w[:3] for w in source.word_of],
                     words=[w[:3] for w in source.words], kinds=[k[:3] for k in source.kinds])
    rng = np.random.default_rng(1)

    def record(q, k, layers):
        w = [rng.random((layers, 3, len(a), len(b)), dtype=np.float32) for a, b in zip(q.tokens, k.tokens)]
        return Attention(weights=w, query_side=q, key_side=k, num_layers=layers, num_heads=3)

    seq2seq = replace(maps, decoder=record(target, target, 4), cross=record(target, source, 4))
    assert seq2seq.is_seq2seq and seq2seq.target is target and seq2seq.cross.weights[0].shape == (4, 3, 3, 8)
    assert [name for name, _ in seq2seq.attentions()] == ["self_attention", "decoder", "cross"]
    assert seq2seq.nbytes == sum(x.nbytes for _, r in seq2seq.attentions() for x in r.weights)
    words = seq2seq.to_words()
    assert words.cross.query_side is words.target and words.cross.key_side is words.source
    assert words.cross.weights[1].shape == (4, 3, 3, 5)
    with pytest.raises(ValueError, match="cross's key side must be self_attention's"):
        replace(maps, decoder=record(target, target, 4), cross=record(target, target, 4))


def test_roles_search_and_rollout_take_either_level(make_maps):
    maps = make_maps(SENTENCES, num_layers=2, num_heads=3, pieces=PIECES, seed=3)
    words = maps.to_words()
    assert attnlab.head_roles(maps).to_dict() == attnlab.head_roles(words).to_dict()
    a = attnlab.find_heads(maps, target="shells", deciders=["sea", "bank"])
    b = attnlab.find_heads(words, target="shells", deciders=["sea", "bank"])
    assert a.to_dict() == b.to_dict()
    assert attnlab.rollout(maps)[0].shape == (2, 8, 8) and attnlab.rollout(words)[0].shape == (2, 6, 6)


def test_no_attribute_name_is_built_from_a_string():
    built = re.compile(r"\b(getattr|setattr|hasattr|delattr)\([^)]*\bf[\"']")
    found = [f"{p.relative_to(SRC)}:{n}" for p in sorted(SRC.rglob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if built.search(line)]
    assert found == []
