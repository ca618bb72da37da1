"""Corpus statistics: the file format, and streaming batch by batch equals scoring everything at once."""

import numpy as np
import pytest

import attnlab
from attnlab.interventions.corpus import corpus_roles, read_corpus


def test_read_corpus_sentences_and_pairs(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("One sentence.\n\n  \nFirst half.\tSecond half.\n")
    assert read_corpus(path) == ["One sentence.", ("First half.", "Second half.")]


@pytest.mark.parametrize("text, message", [("a\tb\tc\n", r"c.txt:1: expected a sentence"), ("\n\n", "has no sentences"),
                                           ("ok\n\tb\n", r"c.txt:2: expected")])
def test_read_corpus_errors(tmp_path, text, message):
    path = tmp_path / "c.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_corpus(path)


def test_streamed_corpus_equals_head_roles_of_all_maps(default_model):
    sentences = ["I sat on the bank of the river.", "Hi.", ("The cat sat.", "It slept."), "Attention mixes words, gently."]
    streamed = corpus_roles(sentences, default_model, batch_size=2)
    whole = attnlab.head_roles(attnlab.capture(sentences, default_model).to_words())
    assert streamed.num_sentences == 4
    for name, s in whole.scores.items():
        np.testing.assert_allclose(streamed.scores[name], s, atol=1e-5)
