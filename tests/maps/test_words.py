"""Word-level aggregation: to a word = sum over its pieces, from a word = mean over its pieces."""

import numpy as np
import pytest

from attnlab.maps.words import aggregate


def test_unsplit_sentence_is_unchanged(make_maps):
    maps = make_maps([["[CLS]", "I", "sat", ".", "[SEP]"]])
    words = maps.to_words()
    np.testing.assert_allclose(words.weights[0], maps.weights[0], rtol=0, atol=1e-7)


def test_split_word_column_is_sum_and_row_is_mean_of_pieces(make_maps):
    maps = make_maps([["[CLS]", "embeddings", "are", "great", "[SEP]"]], pieces=[[1, 3, 1, 1, 1]])
    w, wm = maps.weights[0], maps.to_words().weights[0]  # tokens 1..3 are the three pieces of word 1
    assert wm.shape == (2, 3, 5, 5)
    np.testing.assert_allclose(wm[:, :, 0, 1], w[:, :, 0, 1:4].sum(-1), atol=1e-6)  # column: sum
    np.testing.assert_allclose(wm[:, :, 1, 0], w[:, :, 1:4, 0].mean(-1), atol=1e-6)  # row: mean
    np.testing.assert_allclose(wm[:, :, 1, 1], w[:, :, 1:4, 1:4].sum(-1).mean(-1), atol=1e-6)
    np.testing.assert_allclose(wm[:, :, 4, 2], w[:, :, 6, 4], atol=1e-7)  # unsplit words keep their weight


def test_word_rows_sum_to_one(make_maps):
    maps = make_maps([["[CLS]", "a", "b", "c", "[SEP]"], ["[CLS]", "x", "y", "[SEP]"]], pieces=[[1, 2, 3, 1, 1], [1, 4, 1, 1]])
    for w in maps.to_words().weights:
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)


def test_marks_default_and_chosen(make_maps):
    maps = make_maps([["[CLS]", "I", "sat", ".", "[SEP]"]])
    assert maps.to_words().is_mark[0] == [True, False, False, True, True]
    assert maps.to_words(marks={"[cls]", "sat"}).is_mark[0] == [True, False, True, False, False]
    with pytest.raises(TypeError, match="marks"):
        maps.to_words(marks=".")


def test_index_is_case_insensitive_and_names_missing_words(make_maps):
    words = make_maps([["[CLS]", "Bank", "[SEP]"]]).to_words()
    assert words.index(0, "bank") == 1
    with pytest.raises(LookupError, match="'river' is not in sentence 1"):
        words.index(0, "river")


def test_aggregate_keeps_dtype():
    w = np.full((1, 1, 2, 2), 0.5, dtype=np.float16)
    assert aggregate(w, [0, 0], 1).dtype == np.float16


def test_real_word_rows_sum_to_one(bank_maps):
    words = bank_maps.to_words()
    assert words.words[0] == ["[CLS]", "I", "sat", "on", "the", "bank", "of", "the", "river", ".", "[SEP]"]
    for w in words.weights:
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
