"""attnlab:decoder, the decoder that ships with attnlab: it loads offline by name with its tokenizer,
transformers reads the same folder to the same logits, it predicts held-out standard-library
docstrings far better than their unigram statistics (the figures training.json states), and its
training script is reproducible."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import tomllib
from pathlib import Path

import pytest

from attnlab.locate.folder import DECODER, decoder_folder, resolve

pytestmark = pytest.mark.needs("torch", "transformers")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("train_decoder", ROOT / "scripts" / "train_decoder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def training():
    return json.loads((decoder_folder() / "training.json").read_text())


def test_the_name_finds_the_bundled_folder_before_any_folder_or_hub_id(tmp_path, monkeypatch):
    (tmp_path / DECODER).mkdir()  # a folder of the same name does not win
    monkeypatch.chdir(tmp_path)
    folder, model_id, revision = resolve(DECODER)
    assert folder == decoder_folder() and model_id == DECODER and revision.startswith("sha256:")
    with pytest.raises(ValueError, match="no revisions"):
        resolve(DECODER, revision="main")
    from attnlab.transformer import DEFAULT_DECODER

    assert DEFAULT_DECODER == DECODER


def test_it_ships_as_package_data_and_is_small():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["attnlab"]
    assert "transformer/decoder/*" in data
    files = {f.name: f.stat().st_size for f in decoder_folder().iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "training.json"} <= set(files)
    assert sum(files.values()) < 8 * 2**20


def test_it_loads_with_its_tokenizer(decoder):
    c = decoder.config
    assert c.causal and c.family == "llama" and c.num_kv_heads < c.num_heads
    tok = decoder.tokenizer
    text = "Return a new list containing all items from the iterable.\n"
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: every text round-trips
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0


def test_transformers_reads_the_same_folder_to_the_same_logits(decoder):
    import torch
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(decoder_folder(), dtype=torch.float32).eval()
    ids = torch.tensor([decoder.tokenizer("Return the number of items in the list.")["input_ids"]])
    with torch.no_grad():
        ours = decoder.run_with_hooks(ids)
        theirs = hf(ids).logits
    assert float((ours - theirs).abs().max()) < 1e-4


def test_it_predicts_held_out_docstrings_far_better_than_unigrams(decoder, script, training):
    import torch

    docs = script.docstrings()
    corpus = "\n".join(docs)
    if training["python"] == sys.version.split()[0]:  # the standard library's docstrings change between releases
        import hashlib

        assert hashlib.sha256(corpus.encode()).hexdigest() == training["corpus_sha256"]
    _, held = script.split(docs)
    stream = script.encode(decoder.tokenizer.backend_tokenizer, held[:60])
    n = (len(stream) - 1) // script.CONTEXT
    x = stream[: n * script.CONTEXT].view(n, script.CONTEXT)
    y = stream[1: n * script.CONTEXT + 1].view(n, script.CONTEXT)
    with torch.no_grad():
        nats = float(torch.nn.functional.cross_entropy(decoder.run_with_hooks(x).flatten(0, 1), y.flatten()))
    assert nats < 0.65 * training["unigram_nats_per_token"]
    assert abs(nats - training["held_out_nats_per_token"]) < 0.35  # a slice of the held-out split, float16 weights
    assert training["held_out_bits_per_char"] < 0.6 * training["unigram_bits_per_char"]
    assert math.isclose(training["tokens_seen"], training["steps"] * training["batch"] * training["context"])


def test_training_is_reproducible(script):
    import torch

    a = script.train(2, seed=3, batch=2, evaluate=False, log=lambda *_: None)
    b = script.train(2, seed=3, batch=2, evaluate=False, log=lambda *_: None)
    assert a[1].to_str() == b[1].to_str()  # the tokenizer
    for (name, x), (_, y) in zip(a[0].state_dict().items(), b[0].state_dict().items()):
        assert torch.equal(x, y), name


def test_capture_reads_it_by_name_to_attnlabs_own_maps(decoder):
    """attnlab.capture (transformers' forward) by the name alone: its maps are attnlab's transformer's."""
    import numpy as np

    import attnlab
    from generation_steps import full_map

    text = "Return the number of items."
    maps = attnlab.capture([text], model=DECODER)
    assert maps.model_id == DECODER and maps.revision.startswith("sha256:")
    ids = decoder.tokenizer(text)["input_ids"]
    np.testing.assert_allclose(maps.weights[0], full_map(decoder, ids), atol=1e-5)
