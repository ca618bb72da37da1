"""Word-level maps of an encoder–decoder (T5 with SentencePiece pieces, BART with byte-level BPE):
the decoder's self-attention and the cross-attention go to words by the encoder's rule (columns
summed over a word's pieces, rows averaged), checked here by loops over the pieces."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.hf.capture import capture

PAIRS = [("I sat on the bank of the river.", "The river runs past the bank, slowly!"),
         ("I put the money in the bank.", "bank")]


def _by_pieces(w, q_word_of, k_word_of):
    """[L, H, Tq, Tk] → [L, H, Wq, Wk] by hand: per pair of words, the mean over the query word's pieces
    of the sum over the key word's pieces."""
    wq, wk = max(q_word_of) + 1, max(k_word_of) + 1
    out = np.zeros(w.shape[:2] + (wq, wk))
    for a in range(wq):
        rows = [i for i, x in enumerate(q_word_of) if x == a]
        for b in range(wk):
            cols = [j for j, x in enumerate(k_word_of) if x == b]
            out[..., a, b] = w[..., rows, :][..., :, cols].sum(-1).mean(-1)
    return out


@pytest.mark.needs("torch", "transformers")
@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_decoder_and_cross_attention_go_to_words_by_the_encoders_rule(arch, tiny_folder):
    maps = capture(PAIRS, tiny_folder(arch))
    words = maps.to_words()
    dec, tgt = maps.decoder, maps.target
    assert words.is_word_level and words.decoder is not None and len(words.cross) == len(PAIRS)
    assert words.cross.query_side is words.target and words.cross.key_side is words.source
    for i in range(len(PAIRS)):
        assert words.target.words[i] == tgt.words[i] and words.words[i] == maps.words[i]
        cross = words.cross.weights[i]
        assert cross.shape == (dec.num_layers, dec.num_heads, len(tgt.words[i]), len(maps.words[i]))
        np.testing.assert_allclose(cross, _by_pieces(maps.cross.weights[i], tgt.word_of[i], maps.word_of[i]), atol=1e-6)
        np.testing.assert_allclose(words.decoder.weights[i], _by_pieces(dec.weights[i], tgt.word_of[i], tgt.word_of[i]),
                                   atol=1e-6)
        np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-5)  # each target word's row still sums to 1
    split = [len(w) < len(t) for w, t in zip(tgt.words, tgt.tokens)]
    assert any(split), "the test's sentences should split some target word into several pieces"


def test_cross_maps_need_the_keys_words():
    from attnlab.maps.words import aggregate

    with pytest.raises(ValueError, match="key_word_of"):
        aggregate(np.ones((1, 1, 2, 3)), [0, 1], 2)
