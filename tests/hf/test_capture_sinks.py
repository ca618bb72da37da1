"""capture() of a model with learned sinks (a tiny random gpt-oss, tests/tiny_models.py): the weights equal
transformers' eager weights, each row adds up to 1 minus its sink share, and the share equals attnlab's own
transformer's 1 − hook_pattern.sum(-1); qk=True's facts reproduce the weights with the sinks; the file, the
word rule, the API's head and the page keep the share (docs/design.md, "Maps": the sink share)."""

import base64
import json

import numpy as np
import pytest
import tiny_models

from attnlab.hf.capture import capture
from attnlab.hf.encoding import encode
from attnlab.hf.loading import load_model

pytestmark = pytest.mark.needs("torch", "transformers")
SENTENCES = ["I sat on the bank of the river.", "I put the money in the bank."]  # two lengths: a padded batch


@pytest.fixture(scope="module")
def oss(tiny_folder):
    return tiny_folder("gpt_oss")


def _ids(folder, sentence: str) -> list[int]:
    lm = load_model(str(folder))
    return encode(lm.tokenizer, (sentence,), lm.max_tokens, "sentence", lm.model_id).ids


def _eager(folder, ids: list[int]) -> np.ndarray:
    """transformers' eager weights [L, H, T, T] (its softmax over the sinks too, their column dropped)."""
    import torch
    from transformers import AutoModel

    net = AutoModel.from_pretrained(folder, attn_implementation="eager", use_safetensors=True).eval()
    with torch.inference_mode():
        return torch.stack(net(input_ids=torch.tensor([ids]), output_attentions=True).attentions, 1)[0].numpy()


def _patterns(folder, ids: list[int]) -> np.ndarray:
    """attnlab's own transformer's hook_pattern [L, H, T, T] (float32, torch backend)."""
    import torch

    from attnlab.transformer import Transformer

    m = Transformer.from_pretrained(folder, backend="torch")
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(m.config.num_layers)]
    with torch.no_grad():
        _, cache = m.run_with_cache(torch.tensor([ids]), names=names)
    return np.stack([cache[n][0].float().numpy() for n in names])


def test_sink_share_is_the_rest_of_each_row_and_equals_attnlabs_transformer(oss):
    maps = capture(SENTENCES, str(oss))
    own = maps.self_attention
    assert own.has_sinks and maps.to_dict()["sentences"][0]["sink_share"] is not None
    for i, sentence in enumerate(SENTENCES):
        ids, w, share = _ids(oss, sentence), maps.weights[i], own.sink_share[i]
        assert share.shape == w.shape[:-1] == (2, 4, len(ids)) and share.dtype == np.float32
        assert 0 < share.min() and 0.1 < share.max() < 1  # the sinks take a part of every row, a large one of some
        np.testing.assert_allclose(share, 1 - w.sum(-1, dtype=np.float64), atol=2e-6)
        np.testing.assert_allclose(w, _eager(oss, ids), atol=1e-5)
        pattern = _patterns(oss, ids)
        np.testing.assert_allclose(w, pattern, atol=1e-5)
        np.testing.assert_allclose(share, 1 - pattern.sum(-1, dtype=np.float64), atol=1e-5)
        assert not w[0, :, -1, : len(ids) - tiny_models.WINDOW].any()  # layer 0 slides: its window is in the map


def test_qk_facts_hold_the_sinks_and_reproduce_the_weights(oss):
    import attnlab

    maps = capture(SENTENCES[:1], str(oss), qk=True)
    own = maps.self_attention
    assert [f.sink_logits for f in own.layers] == [pytest.approx(s) for s in tiny_models.SINKS]
    assert own.layers[0].window == (tiny_models.WINDOW - 1, 0) and own.layers[1].window is None
    q, k = own.queries[0].astype(np.float64), own.keys[0].astype(np.float64)
    for layer, f in enumerate(own.layers):
        _, w = attnlab.attention(q[layer], k[layer], k[layer], causal=f.causal, window=f.window, scale=f.scale,
                                 sink_logits=np.asarray(f.sink_logits), return_weights=True, backend="numpy")
        np.testing.assert_allclose(w, maps.weights[0][layer], atol=1e-5)


def test_file_words_api_head_and_page_keep_the_share(oss, tmp_path):
    import attnlab
    from attnlab.viz.page import page_data
    from attnlab.web.attentions import attention_head

    maps = capture(SENTENCES, str(oss))
    back = attnlab.load_maps(maps.save(tmp_path / "oss"))
    with np.load(tmp_path / "oss.npz") as archive:
        assert json.loads(archive["header"].tobytes())["version"] == 4
    assert all(np.array_equal(a, b) for a, b in zip(maps.self_attention.sink_share, back.self_attention.sink_share))
    words = back.to_words()
    for w, share in zip(words.weights, words.self_attention.sink_share):
        np.testing.assert_allclose(w.sum(-1, dtype=np.float64) + share, 1, atol=2e-6)
    head = attention_head(maps, "encoder", 1, 1, 2)
    assert np.array_equal(head["sink_share"], maps.self_attention.sink_share[1][1, 2])
    packed = page_data(maps)["maps"]["sink_share"][0]  # [L, H, T] as uint16, as the page embeds the weights
    shares = np.frombuffer(base64.b64decode(packed), "<u2").reshape(maps.self_attention.sink_share[0].shape) / 65535
    np.testing.assert_allclose(shares, maps.self_attention.sink_share[0], atol=1 / 65535)


@pytest.mark.needs("fastapi")
def test_the_served_head_has_the_share_and_a_model_without_sinks_has_none(oss, tiny_llama):
    from fastapi.testclient import TestClient

    from attnlab.web.server import create_app

    maps = capture(SENTENCES, str(oss))
    body = {"sentences": SENTENCES, "sentence": 1, "layer": 1, "head": 3, "level": "token"}
    with TestClient(create_app(str(oss)), base_url="http://127.0.0.1") as client:
        got = client.post("/api/head", json=body).json()
    np.testing.assert_allclose(got["sink_share"], maps.self_attention.sink_share[1][1, 3], atol=1e-6)
    np.testing.assert_allclose(np.sum(got["weights"], -1) + got["sink_share"], 1, atol=1e-5)
    with TestClient(create_app(str(tiny_llama)), base_url="http://127.0.0.1") as client:
        assert client.post("/api/head", json=body | {"head": 1}).json()["sink_share"] is None
    assert capture(SENTENCES, str(tiny_llama)).self_attention.sink_share is None


def test_cli_maps_shows_a_sink_column_and_writes_the_share(oss, tmp_path, capsys):
    from attnlab.cli.app import main

    js = tmp_path / "m.json"
    assert main(["maps", SENTENCES[0], "--model", str(oss), "--layer", "2", "--head", "1", "--json", str(js)]) == 0
    first = json.loads(js.read_text())["sentences"][0]
    np.testing.assert_allclose(np.sum(first["weights"], -1) + first["sink_share"], 1, atol=1e-5)
    assert main(["maps", SENTENCES[0], "--model", str(oss), "--layer", "2", "--head", "1"]) == 0
    assert "(sink)" in capsys.readouterr().out


def test_a_generations_maps_keep_the_share_of_attnlabs_transformer(oss, tmp_path):
    """generation_maps (`attnlab generate --maps`): the prompt's rows and each step's cached row of attnlab's
    own gpt-oss keep their sink share, 1 − the row's sum, equal to a full pass's hook_pattern."""
    import attnlab
    from attnlab.transformer import Transformer
    from attnlab.viz.generation import generation_maps

    m = Transformer.from_pretrained(oss, backend="torch")
    gen = m.generate([_ids(oss, SENTENCES[0])], 5, maps=True, stop_at_eos=False)
    maps = generation_maps(m, gen, "tiny-gpt-oss")
    w, share = maps.weights[0], maps.self_attention.sink_share[0]
    np.testing.assert_allclose(share, 1 - w.sum(-1, dtype=np.float64), atol=1e-6)
    full = _patterns(oss, gen.sequences[0][: w.shape[-1]])
    np.testing.assert_allclose(w, full, atol=1e-5)
    np.testing.assert_allclose(share, 1 - full.sum(-1, dtype=np.float64), atol=1e-5)
    back = attnlab.load_maps(maps.save(tmp_path / "generated"))
    assert np.array_equal(back.self_attention.sink_share[0], share)


def test_the_long_view_and_head_stats_keep_the_sinks(oss):
    """capture_long through transformers hands the sinks to the kernel, whose LSE includes them: each query's
    sink share equals capture()'s, and so does head_stats' mean share (its other statistics:
    tests/interventions/test_stats_sinks.py)."""
    import attnlab
    from attnlab.analysis import longview
    from attnlab.hf.capture_long import capture_long

    long = capture_long(SENTENCES[0], str(oss))
    assert np.allclose(long.sink_logits, tiny_models.SINKS)
    maps = capture(SENTENCES[:1], str(oss))
    for layer, head in ((0, 0), (1, 3)):
        np.testing.assert_allclose(longview.sink_share(long, layer, head), maps.self_attention.sink_share[0][layer, head],
                                   atol=1e-5)
    found = attnlab.head_stats([SENTENCES[0]], str(oss))
    np.testing.assert_allclose(found.sink_share, maps.self_attention.sink_share[0].mean(-1), atol=1e-5)
