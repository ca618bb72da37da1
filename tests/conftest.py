"""Shared fixtures. The bundled default model is loaded once per test session, for every test that needs it."""

from __future__ import annotations

import pytest

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
