"""The index rule (docs/design.md, "Conventions → Layers and heads"): every argument, field and
JSON output naming a layer or head is 0-based, and a head is an :class:`attnlab.Head`.

On a 2-layer × 3-head model, head (1, 2) (the last: "L2H3") must work and (2, 3) must be refused by
a message naming the argument, in every public function and endpoint that takes a head; every
result that names a head names it with the type. Maps built by hand (``make_maps``) serve the
functions on maps; a tiny random BERT of 2 × 3 (the default model's tokenizer) serves those that
run a model.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import attnlab
from attnlab import Head, ScoredHead

L, H = 2, 3
GOOD, BAD = (1, 2), (2, 3)
WORDS = [["[CLS]", "the", "cat", "sat", "on", "the", "cat", ".", "[SEP]"], ["[CLS]", "a", "dog", "ran", ".", "[SEP]"]]
SENTENCES = ["the river bank, the river bank.", "money in the bank."]


# ---------------------------------------------------------------- the type


def test_head_is_zero_based_with_a_one_based_label():
    h = Head(*GOOD)
    assert (h.layer, h.head) == GOOD and h == GOOD and hash(h) == hash(GOOD)
    assert str(h) == "L2H3" and h.label() == "layer 2, head 3" and h.to_dict() == {"layer": 1, "head": 2}
    assert sorted([Head(1, 0), Head(0, 2), Head(0, 1)]) == [(0, 1), (0, 2), (1, 0)]
    assert Head.parse("2.3") == Head.parse("L2H3") == h  # text for people is 1-based
    assert np.arange(L * H).reshape(L, H)[h] == 5  # a Head indexes an [L, H] array
    assert Head.of(GOOD, L, H) == h and Head.of(h, L, H) is not None
    with pytest.raises(ValueError, match=r"^where must be a 0-based \(layer, head\) with layer 0\.\.1 and head 0\.\.2"):
        Head.of(BAD, L, H, "where")
    with pytest.raises(TypeError, match="where must be a Head"):
        Head.of("1.2", L, H, "where")
    with pytest.raises(ValueError, match="--heads takes a 1-based"):
        Head.parse("0.1", "--heads")


# ---------------------------------------------------------------- functions on maps


@pytest.fixture()
def maps(make_maps, plant):
    m = make_maps(WORDS, num_layers=L, num_heads=H)
    for w in m.weights:
        w[GOOD] = plant(w.shape[-1], [max(i - 1, 0) for i in range(w.shape[-1])])  # L2H3 looks at the previous word
    return m


def test_roles_and_search_name_heads_with_the_type(maps):
    roles = attnlab.head_roles(maps.to_words())
    top = roles.top("prev")
    assert isinstance(top, ScoredHead) and isinstance(top.head, Head) and top.head == GOOD
    assert all(isinstance(h, Head) for h in roles.heads("prev")) and roles.heads("prev")[0] == GOOD
    assert roles.to_dict()["roles"]["prev"]["top"] == {**Head(*GOOD).to_dict(), "score": top.score}
    found = attnlab.find_heads(maps.to_words(), ".", ["cat", "ran"])
    named = found.qualifying + ([found.best] if found.best else []) + [c.head for c in found.closest]
    assert named and all(isinstance(h, Head) for h in named)
    d = found.to_dict()
    for entry in d["qualifying"] + d["closest"] + ([d["best"]] if d["best"] else []):
        assert 0 <= entry["layer"] < L and 0 <= entry["head"] < H


def test_flow_and_the_rollout_view_take_a_zero_based_layer(maps):
    from attnlab.viz import rollout_view

    words = maps.to_words()
    assert attnlab.flow(words, layer=GOOD[0])[0].shape == (9, 9)
    with pytest.raises(ValueError, match=r"layer must be a 0-based layer index in 0\.\.1, got 2"):
        attnlab.flow(words, layer=BAD[0])
    got = rollout_view.rollout_layer(words, 0, GOOD[0])
    np.testing.assert_allclose(got["weights"], attnlab.rollout(words)[0][GOOD[0]])
    with pytest.raises(ValueError, match=r"layer must be 0\.\.1 \(0-based"):
        rollout_view.rollout_layer(words, 0, BAD[0])
    assert rollout_view.page_rollout(words)["flow_layer"] == L - 1


def test_the_viewers_head_functions_take_zero_based_heads(maps):
    from attnlab.analysis.overview import maps_record
    from attnlab.viz import payload
    from attnlab.web.attentions import attention_head

    np.testing.assert_array_equal(payload.head_matrix(maps, 0, *GOOD), maps.weights[0][GOOD])
    assert attention_head(maps, "encoder", 0, *GOOD)["weights"] is not None
    for call in (lambda *lh: payload.head_matrix(maps, 0, *lh), lambda *lh: attention_head(maps, "encoder", 0, *lh)):
        with pytest.raises(ValueError, match=r"^layer must be 0\.\.1 \(0-based\), got 2"):
            call(*BAD)
        with pytest.raises(ValueError, match=r"^head must be 0\.\.2 \(0-based\), got 3"):
            call(GOOD[0], BAD[1])
    record = maps_record(maps, GOOD)
    assert (record["layer"], record["head"]) == GOOD
    np.testing.assert_allclose(record["sentences"][0]["weights"], maps.weights[0][GOOD].round(6))
    with pytest.raises(ValueError, match="^pick must be a 0-based"):
        maps_record(maps, BAD)
    badges = payload.roles_payload(maps.to_words())["badges"]
    assert {"role": "prev", "layer": 1, "head": 2} in [{k: b[k] for k in ("role", "layer", "head")} for b in badges]


# ---------------------------------------------------------------- functions that run a model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, default_model):
    """A random BERT of 2 layers × 3 heads with the default model's tokenizer."""
    import torch
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("tiny-bert-2x3")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=default_model.tokenizer.vocab_size, hidden_size=24, num_hidden_layers=L,
                        num_attention_heads=H, intermediate_size=48, max_position_embeddings=128)
    BertModel(config).save_pretrained(folder, safe_serialization=True)
    for f in default_model.path.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special_tokens")):
            shutil.copy(f, folder / f.name)
    return folder


@pytest.fixture(scope="module")
def tiny_qk(tiny_dir):
    return attnlab.capture(SENTENCES, str(tiny_dir), qk=True)


def test_neuron_data_take_zero_based_heads(tiny_qk):
    from attnlab.viz.neuron import head_qk

    one = head_qk(tiny_qk, 0, *GOOD)
    np.testing.assert_allclose(one["q"], tiny_qk.self_attention.queries[0][GOOD], atol=1e-5)
    with pytest.raises(ValueError, match=r"^layer must be 0\.\.1"):
        head_qk(tiny_qk, 0, *BAD)


def test_ablation_and_importance_take_and_give_heads(tiny_dir):
    from attnlab.transformer import Transformer

    net = Transformer.from_pretrained(str(tiny_dir))
    out = attnlab.ablate(SENTENCES, [GOOD], model=net)
    assert out.heads == (GOOD,) and isinstance(out.heads[0], Head)
    assert out.to_dict()["heads"] == [{"layer": 1, "head": 2}]
    assert attnlab.ablate(SENTENCES, [Head(*GOOD)], model=net).effect == out.effect
    with pytest.raises(ValueError, match=r"^heads\[0\] must be a 0-based \(layer, head\)"):
        attnlab.ablate(SENTENCES, [BAD], model=net)
    imp = attnlab.head_importance(SENTENCES, model=net, probes=4)
    top = imp.top(L * H)
    assert all(isinstance(t, ScoredHead) and isinstance(t.head, Head) for t in top)
    assert {t.head for t in top} == {Head(l, h) for l in range(L) for h in range(H)}
    assert top[0].score == imp.ablation[top[0].head] == imp.ablation.max()


def test_the_induction_probe_names_heads_with_the_type(tiny_dir):
    found = attnlab.induction_scores(str(tiny_dir), length=6, batch=2)
    assert found.scores.shape == (L, H)
    heads = found.heads(threshold=-1.0)  # every head
    assert len(heads) == L * H and all(isinstance(h, Head) for h in heads)
    for entry in found.to_dict()["induction_heads"]:
        assert 0 <= entry["layer"] < L and 0 <= entry["head"] < H


@pytest.mark.needs("torch")
def test_the_circuit_tools_take_and_give_heads():
    import torch

    from attnlab.transformer import Transformer, TransformerConfig

    torch.manual_seed(0)
    net = Transformer(TransformerConfig(vocab_size=20, d_model=12, num_layers=L, num_heads=H), dtype="float64")
    clean, corrupted = torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[6, 2, 7, 4, 5]])

    def metric(logits):
        return logits[:, -1, 0] - logits[:, -1, 1]

    grid = attnlab.patch(net, clean, corrupted, metric)
    assert grid.effect.shape == (L, H) and all(isinstance(t.head, Head) for t in grid.top(L * H))
    assert grid.top(1)[0].score == grid.effect[grid.top(1)[0].head]
    path = attnlab.path_patch(net, clean, corrupted, metric, sender=(0, 2), receiver=(*GOOD, "k"))
    assert path.sender == (0, 2) and path.receiver == GOOD and path.to_dict()["receiver"] == {"layer": 1, "head": 2}
    for kw, argument in (({"sender": (0, 2), "receiver": (*BAD, "k")}, "receiver"),
                         ({"sender": BAD, "receiver": (*GOOD, "k")}, "sender")):
        with pytest.raises(ValueError, match=rf"^{argument} must be a 0-based \(layer, head\)"):
            attnlab.path_patch(net, clean, corrupted, metric, **kw)
    parts = attnlab.logit_attribution(net, clean[0], 0)
    assert Head(*GOOD) in parts.components and str(Head(*GOOD)) == "L2H3"
    entry = next(c for c in parts.to_dict()["components"] if c["label"] == "L2H3")
    assert (entry["layer"], entry["head"]) == GOOD


# ---------------------------------------------------------------- the web API and the CLI


@pytest.fixture(scope="module")
def client(tiny_dir):
    from fastapi.testclient import TestClient

    from attnlab.web.server import create_app

    with TestClient(create_app(str(tiny_dir)), base_url="http://127.0.0.1") as c:
        yield c


@pytest.mark.parametrize("path, level", [("/api/head", "word"), ("/api/neuron", None), ("/api/rollout", "word")])
def test_the_api_is_zero_based(client, tiny_qk, path, level):
    body = {"sentences": SENTENCES, "sentence": 0, "layer": GOOD[0]}
    if path != "/api/rollout":
        body["head"] = GOOD[1]
    if level:
        body["level"] = level
    res = client.post(path, json=body)
    assert res.status_code == 200, res.text
    got = res.json()
    assert got["layer"] == GOOD[0] and got.get("head", GOOD[1]) == GOOD[1]
    if path == "/api/neuron":
        np.testing.assert_allclose(got["q"], tiny_qk.self_attention.queries[0][GOOD], atol=1e-5)
    res = client.post(path, json={**body, "layer": BAD[0]})
    assert res.status_code == 400 and "layer must be 0..1" in res.json()["detail"]
    if path != "/api/rollout":
        res = client.post(path, json={**body, "head": BAD[1]})
        assert res.status_code == 400 and "head must be 0..2" in res.json()["detail"]


def test_badges_and_find_head_are_zero_based(client):
    body = client.post("/api/maps", json={"sentences": SENTENCES}).json()
    assert all(0 <= b["layer"] < L and 0 <= b["head"] < H for b in body["roles"]["badges"])
    shown = client.post("/api/find-head", json={"sentences": SENTENCES, "target": "bank",
                                                 "deciders": ["river", "money"]}).json()["shown"]
    assert 0 <= shown["layer"] < L and 0 <= shown["head"] < H


def test_the_cli_takes_one_based_heads_and_writes_zero_based_json(tiny_dir, tmp_path, capsys):
    from attnlab.cli.app import main

    out = tmp_path / "m.json"
    assert main(["maps", SENTENCES[1], "--model", str(tiny_dir), "--layer", "2", "--head", "3", "--json", str(out)]) == 0
    assert (json.loads(out.read_text())["layer"], json.loads(out.read_text())["head"]) == GOOD
    assert main(["maps", SENTENCES[1], "--model", str(tiny_dir), "--layer", "3", "--head", "4"]) == 2
    assert "--layer 3 is out of range" in capsys.readouterr().err
    assert main(["ablate", SENTENCES[1], "--model", str(tiny_dir), "--heads", "2.3", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["heads"] == [{"layer": 1, "head": 2}]
    assert main(["ablate", SENTENCES[1], "--model", str(tiny_dir), "--heads", "3.4"]) == 2
    assert "heads[0] must be a 0-based" in capsys.readouterr().err
