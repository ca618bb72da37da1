"""The Generation view's steps and the maps file of a generation, from steps computed without a cache
(tests/generation_steps.py): the rows go through unchanged, and the maps file is the full map of the
tokens the model read, saved and loaded like any other maps."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.maps.tokens import load_maps
from attnlab.viz.generation import _words, generation_maps, steps_payload, token_texts
from generation_steps import recomputed

pytestmark = pytest.mark.needs("torch", "transformers")


@pytest.fixture(scope="module")
def steps(decoder):
    prompt = decoder.tokenizer("Return the number of items")["input_ids"]
    return recomputed(decoder, prompt, 6)


def test_steps_payload_carries_every_row(decoder, steps):
    got = steps_payload(decoder, steps, "attnlab:decoder")
    c, P = decoder.config, steps.prompt_lengths[0]
    assert got["model"] == {"id": "attnlab:decoder", "num_layers": c.num_layers, "num_heads": c.num_heads}
    assert got["prompt_length"] == P and len(got["labels"]) == P + 6 and len(got["steps"]) == 6
    assert "".join(got["labels"][P:]).replace("␣", " ") == steps.text[0].replace("\n", "↵")
    for t, s in enumerate(got["steps"]):
        assert s["position"] == P - 1 + t and s["token"] == steps.sequences[0][P + t]
        rows = np.array(s["rows"])
        assert rows.shape == (c.num_layers, c.num_heads, P + t)
        np.testing.assert_allclose(rows, steps.attention[0][t], atol=5e-6)
        np.testing.assert_allclose(rows.sum(-1), 1, atol=1e-4)


def test_generation_maps_is_the_full_map_and_loads(decoder, steps, tmp_path):
    maps = generation_maps(decoder, steps, "attnlab:decoder")
    P, T = steps.prompt_lengths[0], steps.prompt_lengths[0] + 5
    assert maps.weights[0].shape == (decoder.config.num_layers, decoder.config.num_heads, T, T)
    np.testing.assert_allclose(maps.weights[0], steps.full, atol=1e-6)  # prompt rows from a pass, the rest the steps'
    assert maps.tokens[0] == decoder.tokenizer.convert_ids_to_tokens(steps.sequences[0][:T])
    assert maps.config["generated"] == {"prompt_length": P, "new_tokens": 6, "positions": steps.positions[0]}
    back = load_maps(maps.save(tmp_path / "gen"))
    np.testing.assert_array_equal(back.weights[0], maps.weights[0])
    words = back.to_words()
    np.testing.assert_allclose(words.weights[0].sum(-1), 1, atol=1e-5)
    assert "".join(words.words[0]).replace("␣", "") == maps.sentences[0].replace(" ", "").replace("\n", "↵")


def test_words_start_at_spaces_and_punctuation():
    word_of, words, kinds = _words(["Return", " the", " num", "ber", ",", " items", ".)", "↵", "␣", "x"])
    assert words == ["Return", "the", "number", ",", "items", ".)", "↵", "␣x"]
    assert word_of == [0, 1, 2, 2, 3, 4, 5, 6, 7, 7]
    assert kinds == ["word", "word", "word", "punct", "word", "punct", "word", "word"]


def test_token_texts_show_newlines(decoder):
    ids = decoder.tokenizer("a\nb")["input_ids"] + decoder.tokenizer.convert_tokens_to_ids(["Ġ"])
    assert "".join(token_texts(decoder.tokenizer, ids)) == "a↵b␣"


def test_rows_are_required():
    from types import SimpleNamespace

    with pytest.raises(ValueError, match="maps=True"):
        steps_payload(None, SimpleNamespace(attention=None), "m")
