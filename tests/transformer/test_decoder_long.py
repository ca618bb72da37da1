"""attnlab:decoder-long, the bundled decoder with a context of 2,048 tokens: it loads offline by name in
attnlab's transformer and in transformers to the same logits, ships as package data under the size
limit, and predicts held-out standard-library source far better than its unigram statistics (the
figures training.json states, and a small live check of them)."""

from __future__ import annotations

import importlib.util
import json
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from attnlab.locate.folder import (
    BUNDLED_DECODERS,
    DECODER,
    DECODER_LONG,
    decoder_folder,
    resolve,
)

pytestmark = pytest.mark.needs("torch", "transformers")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("train_decoder_long", ROOT / "scripts" / "train_decoder_long.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def training():
    return json.loads((decoder_folder(DECODER_LONG) / "training.json").read_text())


@pytest.fixture(scope="module")
def long_decoder():
    from attnlab.transformer import Transformer

    return Transformer.from_pretrained(DECODER_LONG)


def test_the_name_finds_its_own_folder():
    folder, model_id, revision = resolve(DECODER_LONG)
    assert folder == decoder_folder(DECODER_LONG) != decoder_folder(DECODER)
    assert model_id == DECODER_LONG and revision.startswith("sha256:")
    with pytest.raises(ValueError, match="no revisions"):
        resolve(DECODER_LONG, revision="main")
    with pytest.raises(ValueError, match=r"name must be a bundled decoder .*got 'attnlab:nope'"):
        decoder_folder("attnlab:nope")
    assert set(BUNDLED_DECODERS) == {DECODER, DECODER_LONG}


def test_it_ships_as_package_data_with_a_long_context_under_25_mb():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["attnlab"]
    assert "transformer/decoder_long/*" in data
    folder = decoder_folder(DECODER_LONG)
    files = {f.name: f.stat().st_size for f in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "training.json"} <= set(files)
    assert files["model.safetensors"] < 25 * 2**20
    config = json.loads((folder / "config.json").read_text())
    assert config["max_position_embeddings"] >= 2048 and config["model_type"] == "llama"


def test_transformers_reads_the_same_folder_to_the_same_logits(long_decoder):
    import torch
    from transformers import LlamaForCausalLM

    c = long_decoder.config
    assert c.causal and c.family == "llama" and c.max_positions >= 2048 and c.num_kv_heads < c.num_heads
    hf = LlamaForCausalLM.from_pretrained(decoder_folder(DECODER_LONG), dtype=torch.float32).eval()
    text = "def read(path):\n    with open(path) as f:\n        return f.read()\n"
    ids = torch.tensor([long_decoder.tokenizer(text)["input_ids"]])
    assert long_decoder.tokenizer.decode(ids[0].tolist()) == text  # byte-level: every text round-trips
    with torch.no_grad():
        ours = long_decoder.run_with_hooks(ids)
        theirs = hf(ids).logits
    assert float((ours - theirs).abs().max()) < 1e-4


def test_training_json_states_the_held_out_loss_by_position(training):
    """What training.json states: the held-out loss keeps falling past position 128 (each bucket below the one
    before it: the model uses its context), and a stretch written again 100 and 400 tokens on costs less the
    second time (it copies)."""
    by = training["held_out_nats_by_position"]
    assert set(by) == {"0-127", "128-511", "512-2047"} and by["0-127"] > by["128-511"] > by["512-2047"]
    for distance in ("100", "400"):
        copy = training["held_out_copy_nats"][distance]
        assert copy["second"] < copy["first"] - 0.5
    assert training["held_out_bits_per_char"] < training["unigram_bits_per_char"]
    assert training["context"] >= 2048 and len(training["held_out_nats_per_128_positions"]) * 128 == training["context"]
    phases = []
    while training:  # each phase's tokens: the total counts every phase
        phases.append(training)
        training = training.get("continued_from")
    # the first phases' records predate "batch" and "context" under continued_from: they ran 2 windows of 2,048
    tokens = sum(p["steps"] * p.get("batch", 2) * p.get("context", 2048) for p in phases)
    assert phases[0]["tokens_seen"] == tokens


@pytest.fixture(scope="module")
def held_out(long_decoder, training, script):
    """The first 12 held-out files (those present in this Python's library) as one stream of ids."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [(root / name).read_text(encoding="utf-8") for name in training["held_out_files"][:12]
             if (root / name).is_file()]
    stream = script.shared.encode(long_decoder.tokenizer.backend_tokenizer, texts)
    if len(stream) < 2 * 1024 + 1:
        pytest.skip("this Python's library lacks the held-out files")
    return stream


def test_held_out_source_is_predicted_far_better_than_by_unigrams(long_decoder, training, script, held_out):
    """Live: two windows of 1,024 tokens of held-out files."""
    import torch

    x, y = script.shared.windows(held_out[: 2 * 1024 + 1], 1024)
    with torch.no_grad():
        nats = script.shared.token_losses(long_decoder, x, y).mean(0)  # (1024,)
    assert float(nats.mean()) < training["unigram_nats_per_token"] - 1.5
    assert abs(float(nats.mean()) - training["held_out_nats_per_token"]) < 0.5  # a slice of the held-out split


def test_it_copies_held_out_text_it_read_100_tokens_back(long_decoder, script, held_out):
    """Live: 4 stretches of 48 held-out tokens written again 100 tokens on cost far less the second time."""
    copy = script.copying(long_decoder, held_out, distances=(100,), samples=4)["100"]
    assert copy["second"] < copy["first"] - 0.5


def test_the_corpus_is_whole_files_in_order_with_every_20th_held_out(script, training):
    files = script.source_files()
    names = [n for n, _ in files]
    assert names == sorted(names) and not any("/test/" in f"/{n}" for n in names)
    train, held = script.split(files)
    assert len(train) + len(held) == len(files) and {n for n, _ in held} == set(names[10::20])
    if training["python"] == sys.version.split()[0]:  # the standard library changes between releases
        assert script.corpus_sha256(files) == training["corpus_sha256"]
        assert [n for n, _ in held] == training["held_out_files"]


def test_its_cached_decoding_past_128_tokens_is_its_full_forward(long_decoder):
    import torch

    text = "import os\n\n\ndef walk(top):\n" + "".join(f"    name_{i} = os.path.join(top, '{i}')\n" for i in range(30))
    ids = torch.tensor([long_decoder.tokenizer(text)["input_ids"]])
    prompt = ids.shape[1]
    assert prompt > 128
    out = long_decoder.generate(ids, 4)
    seq = torch.tensor([out.sequences[0]])
    with torch.no_grad():
        full = long_decoder.run_with_hooks(seq[:, :-1])  # (1, prompt + 3, V)
    torch.testing.assert_close(out.logits[0], full[0, prompt - 1:], atol=1e-4, rtol=0)


def test_a_repeated_window_carries_each_stretch_again_further_on_and_nothing_else_changes(script):
    import torch

    shared = sys.modules["decoder_training"]  # imported by the training script
    window = torch.arange(1000, 3049)  # distinct ids: where each token came from can be read off
    out = shared.repeated(window, torch.Generator().manual_seed(0), spans=1)
    changed = (out != window).nonzero().flatten()
    assert 16 <= len(changed) <= 256 and int(changed[-1] - changed[0]) + 1 == len(changed)  # one contiguous stretch
    src = int(out[changed[0]] - 1000)
    assert src + len(changed) <= int(changed[0])  # copied from before it, whole
    assert torch.equal(out[changed], window[src:src + len(changed)])
    again = shared.repeated(window, torch.Generator().manual_seed(0), spans=1)
    assert torch.equal(out, again) and out.shape == window.shape  # seeded: the same window each time


def test_planted_stretches_are_random_ids_written_again_and_only_their_first_copy_goes_unscored(script):
    import torch

    shared = sys.modules["decoder_training"]
    window = torch.arange(5000, 5000 + 2049)  # ids above the vocabulary: a planted id (< 4096) is told apart
    out, scored = shared.planted(window, torch.Generator().manual_seed(1), vocab=4096, kind="pairs", spans=1)
    where = (out < 4096).nonzero().flatten()
    assert out.shape == window.shape and scored.shape == (2048,) and bool((out[where] >= 1).all())  # never EOS
    half = len(where) // 2
    first, second = where[:half], where[half:]
    assert 8 <= half <= 64 and torch.equal(out[first], out[second])  # one stretch, written twice
    assert int(first[-1] - first[0]) + 1 == half and int(second[0]) > int(first[-1])
    assert not scored[first - 1].any() and bool(scored[second - 1].all())  # the first copy's targets are left out
    assert int((~scored).sum()) == half  # and nothing else
    out, scored = shared.planted(window, torch.Generator().manual_seed(2), vocab=4096, kind="periodic")
    where = (out < 4096).nonzero().flatten()
    ids = out[where]
    period = next(p for p in range(4, 33) if torch.equal(ids[p:], ids[:-p]))  # one stretch, again and again
    assert len(ids) % period == 0 and int((~scored).sum()) == period and not scored[where[0] - 1:where[0] + period - 1].any()
    again = shared.planted(window, torch.Generator().manual_seed(2), vocab=4096, kind="periodic")
    assert torch.equal(again[0], out) and torch.equal(again[1], scored)  # seeded
    with pytest.raises(ValueError, match="kind must be 'pairs' or 'periodic', got 'nope'"):
        shared.planted(window, torch.Generator(), vocab=4096, kind="nope")
