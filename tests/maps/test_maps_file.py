"""One file format for captured maps, written and read back losslessly."""

import numpy as np
import pytest

import attnlab
import attnlab.maps.files
from attnlab.maps.records import Attention, LayerFacts, Tokens
from attnlab.maps.tokens import AttentionMaps

SOURCE = Tokens(tokens=[["[CLS]", "hé", "##llo", "[SEP]"], ["[CLS]", "a", "b", "[SEP]", "c"]],
                word_of=[[0, 1, 1, 2], [0, 1, 2, 3, 4]], words=[["[CLS]", "Héllo", "[SEP]"], ["[CLS]", "A", "b", "[SEP]", "c"]],
                kinds=[["cls", "word", "sep"], ["cls", "word", "word", "sep", "word"]])


def _maps():
    rng = np.random.default_rng(0)
    w1 = rng.random((2, 3, 4, 4), dtype=np.float32)
    w2 = rng.random((2, 3, 5, 5), dtype=np.float32)
    own = Attention(weights=[w1, w2], query_side=SOURCE, key_side=SOURCE, num_layers=2, num_heads=3)
    return AttentionMaps(sentences=["Héllo wörld.", ("A b", "c")], self_attention=own, model_id="m/x", revision="abc",
                         config={"model_type": "bert", "num_hidden_layers": 2})


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_round_trip_is_lossless(tmp_path, dtype):
    maps = _maps().astype(dtype)
    path = maps.save(tmp_path / "maps")
    assert path.name == "maps.npz"
    back = attnlab.load_maps(path)
    for a, b in zip(maps.weights, back.weights):
        assert b.dtype == dtype and np.array_equal(a, b)
    assert back.source == maps.source
    assert (back.sentences, back.model_id, back.revision, back.config) == (maps.sentences, maps.model_id, maps.revision,
                                                                            maps.config)
    assert (back.num_layers, back.num_heads, back.decoder, back.cross) == (2, 3, None, None)


def test_real_maps_round_trip(bank_maps, tmp_path):
    back = attnlab.load_maps(bank_maps.save(tmp_path / "bank.npz"))
    assert all(np.array_equal(a, b) for a, b in zip(bank_maps.weights, back.weights))
    assert back.to_words().words == bank_maps.to_words().words


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        attnlab.load_maps(tmp_path / "none.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not an attnlab .npz maps file"):
        attnlab.load_maps(tmp_path / "junk.npz")
    np.savez(tmp_path / "other.npz", x=np.zeros(2))
    with pytest.raises(ValueError, match="has no header"):
        attnlab.load_maps(tmp_path / "other.npz")


def test_inconsistent_maps_are_rejected():
    m = _maps()
    longer = Tokens(tokens=[m.tokens[0] + ["x"]], word_of=[m.word_of[0] + [2]], words=m.words[:1], kinds=m.kinds[:1])
    with pytest.raises(ValueError, match=r"weights\[0\] has shape \(2, 3, 4, 4\), expected \(2, 3, 5, 5\)"):
        Attention(weights=m.weights[:1], query_side=longer, key_side=longer, num_layers=2, num_heads=3)
    with pytest.raises(ValueError, match="Tokens of sentence 0: 4 tokens with 3 word_of entries"):
        Tokens(tokens=m.tokens[:1], word_of=[[0, 1, 2]], words=m.words[:1], kinds=m.kinds[:1])
    first = Tokens(tokens=m.tokens[:1], word_of=m.word_of[:1], words=m.words[:1], kinds=m.kinds[:1])
    with pytest.raises(ValueError, match="has 2 sentences and 1 entries of self_attention"):
        AttentionMaps(sentences=m.sentences, self_attention=Attention(
            weights=m.weights[:1], query_side=first, key_side=first, num_layers=2, num_heads=3), model_id="m", revision=None)
    with pytest.raises(ValueError, match="decoder and cross come together"):
        AttentionMaps(sentences=m.sentences, self_attention=m.self_attention, decoder=m.self_attention, model_id="m",
                      revision=None)
    q = [np.zeros((2, 3, len(t), 4), np.float32) for t in m.tokens]
    with pytest.raises(ValueError, match="queries, keys and layers .* come together"):
        Attention(weights=m.weights, query_side=SOURCE, key_side=SOURCE, num_layers=2, num_heads=3, queries=q, keys=q)
    with pytest.raises(ValueError, match=r"keys\[1\] has shape \(2, 3, 4, 4\), expected \(2, 3, 5\) \+ \(D,\)"):
        Attention(weights=m.weights, query_side=SOURCE, key_side=SOURCE, num_layers=2, num_heads=3, queries=q,
                  keys=[q[0], q[0]], layers=(LayerFacts(scale=0.5),) * 2)
    with pytest.raises(ValueError, match="float32 or float16"):
        m.astype(np.float64)


def test_word_maps_are_not_saved(tmp_path):
    with pytest.raises(TypeError, match="maps must be token-level .*, got word-level WordMaps"):
        attnlab.maps.files.write(_maps().to_words(), {}, tmp_path / "w.npz")


def test_qk_round_trip_and_a_newer_version_is_refused(tmp_path):
    import json

    m = _maps()
    q = [np.full((2, 3, len(t), 4), 0.25, np.float32) for t in m.tokens]
    facts = (LayerFacts(scale=0.5, softcap=30.0, causal=True, window=(3, 0)), LayerFacts(scale=0.5, causal=True))
    own = Attention(weights=m.weights, query_side=SOURCE, key_side=SOURCE, num_layers=2, num_heads=3, queries=q, keys=q,
                    layers=facts)
    back = attnlab.load_maps(AttentionMaps(sentences=m.sentences, self_attention=own, model_id="m", revision=None)
                             .save(tmp_path / "qk"))
    assert back.self_attention.layers == facts and back.self_attention.position_bias is None
    assert all(np.array_equal(a, b) for a, b in zip(q, back.self_attention.keys))
    with np.load(tmp_path / "qk.npz") as archive:
        arrays = dict(archive)
    header = json.loads(arrays["header"].tobytes())
    header["version"] = 5
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(tmp_path / "v5.npz", **arrays)
    with pytest.raises(ValueError, match="version 5; expected 'attnlab.maps' version 1 or 2 or 3 or 4"):
        attnlab.load_maps(tmp_path / "v5.npz")
