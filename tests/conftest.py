"""Shared fixtures. The bundled default model is loaded once per test session, for every test that needs it."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.models.maps import AttentionMaps

# The lesson's two "bank" sentences (seed 000): "river" decides the meaning in one, "money" in the other.
BANK_SENTENCES = ("I sat on the bank of the river.", "I put the money in the bank.")


@pytest.fixture(scope="session")
def default_model():
    """all-MiniLM-L6-v2 from the installed package, with attnlab's capturing attention (a LoadedModel)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from attnlab.models.loading import load_model

    return load_model()


@pytest.fixture(scope="session")
def bank_maps(default_model):
    """AttentionMaps of the lesson's two "bank" sentences on the default model."""
    from attnlab.models.capture import capture

    return capture(list(BANK_SENTENCES), default_model)


def pytest_collection_modifyitems(items):
    for item in items:  # a test that loads the model is a `model` test, whoever wrote it
        if "default_model" in getattr(item, "fixturenames", ()) or "bank_maps" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)


# Synthetic maps for the models/ and analysis/ tests: no model needed, heads planted by hand.
def _kind(text: str) -> str:
    if text == "[CLS]":
        return "cls"
    if text == "[SEP]":
        return "sep"
    return "punct" if text in {".", ",", "!", "?"} else "word"


@pytest.fixture
def make_maps():
    """make_maps(sentences as word lists, num_layers, num_heads, pieces=None, seed=0) → AttentionMaps.

    Each word is one token unless ``pieces[i]`` gives how many tokens each word of sentence i has.
    Weights are random rows (softmax of noise) that tests then overwrite to plant a head.
    """

    def build(word_lists, num_layers=2, num_heads=3, pieces=None, seed=0):
        rng = np.random.default_rng(seed)
        tokens, weights, word_of, kinds = [], [], [], []
        for i, words in enumerate(word_lists):
            counts = pieces[i] if pieces else [1] * len(words)
            wo = [w for w, c in enumerate(counts) for _ in range(c)]
            toks = [words[w] if k == 0 else f"##{k}" for w, c in enumerate(counts) for k in range(c)]
            t = len(toks)
            logits = rng.standard_normal((num_layers, num_heads, t, t))
            w = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
            tokens.append(toks)
            weights.append(w.astype(np.float32))
            word_of.append(wo)
            kinds.append([_kind(x) for x in words])
        return AttentionMaps(
            sentences=[" ".join(w) for w in word_lists], tokens=tokens, weights=weights, word_of=word_of,
            words=[list(w) for w in word_lists], kinds=kinds, model_id="synthetic", revision=None,
            num_layers=num_layers, num_heads=num_heads, config={"num_hidden_layers": num_layers},
        )

    return build


def one_hot_rows(t: int, columns) -> np.ndarray:
    """A [t, t] map whose row r puts all its weight on columns[r]."""
    m = np.zeros((t, t), dtype=np.float32)
    m[np.arange(t), columns] = 1.0
    return m


@pytest.fixture
def plant():
    return one_hot_rows
