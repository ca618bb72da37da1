"""The sink share of maps of a model with learned sinks (docs/design.md, "Maps": the sink share): each row's
weights add up to 1 minus it; the records, the word rule, the file (version 4; version 2 without sinks),
to_dict() and the roles' entropy keep it by one rule each. Synthetic maps: no model needed (the captured
ones are tests/hf/test_capture_sinks.py's)."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import attnlab
from attnlab.analysis.roles import entropy, head_roles
from attnlab.maps.files import FORMAT_VERSION, SINK_VERSION

FIXTURES = Path(__file__).parent / "fixtures"
SENTENCES = [["[CLS]", "the", "river", "bank", "."], ["[CLS]", "a", "bank", "a", "bank", "."]]
PIECES = [[1, 1, 2, 3, 1], [1, 1, 1, 2, 1, 1]]  # split words: the word rule averages their rows and shares


def with_sinks(maps, seed: int = 1):
    """``maps`` as a model with learned sinks would give them: each row scaled by 1 − its share (random)."""
    rng = np.random.default_rng(seed)
    own = maps.self_attention
    shares = [rng.uniform(0.05, 0.9, w.shape[:-1]).astype(np.float32) for w in own.weights]  # (L, H, T)
    weights = [(w * (1 - s[..., None])).astype(np.float32) for w, s in zip(own.weights, shares)]
    return replace(maps, self_attention=replace(own, weights=weights, sink_share=shares))


@pytest.fixture
def sink_maps(make_maps):
    return with_sinks(make_maps(SENTENCES, pieces=PIECES))


def test_rows_and_shares_add_up_to_one_and_a_wrong_shape_is_refused(sink_maps):
    own = sink_maps.self_attention
    assert own.has_sinks and [s.shape for s in own.sink_share] == [(2, 3, 8), (2, 3, 7)]
    for w, s in zip(own.weights, own.sink_share):
        np.testing.assert_allclose(w.sum(-1, dtype=np.float64) + s, 1.0, atol=1e-6)
    with pytest.raises(ValueError, match=r"Attention.sink_share\[0\] has shape \(2, 3, 7\), expected \(2, 3, 8\) "
                                         r"\(L, H, Tq\)"):
        replace(own, sink_share=[own.sink_share[0][..., :7], own.sink_share[1]])
    with pytest.raises(ValueError, match="Attention.sink_share has 1 entries, expected 2"):
        replace(own, sink_share=own.sink_share[:1])
    assert not replace(own, sink_share=None).has_sinks


def test_the_word_rule_keeps_the_sink_apart(sink_maps):
    """A word row's share is the mean of its pieces' shares, as its row is the mean of their rows; the
    word row's weights and its share add up to 1."""
    words = sink_maps.to_words()
    for i, pieces in enumerate(PIECES):
        token_share, word_share = sink_maps.self_attention.sink_share[i], words.self_attention.sink_share[i]
        starts = np.r_[0, np.cumsum(pieces)[:-1]]
        want = np.stack([token_share[..., a:a + n].mean(-1) for a, n in zip(starts, pieces)], axis=-1)
        np.testing.assert_allclose(word_share, want, rtol=1e-6)
        np.testing.assert_allclose(words.weights[i].sum(-1, dtype=np.float64) + word_share, 1.0, atol=1e-6)
    assert words.to_words({"."}).self_attention.sink_share is words.self_attention.sink_share  # marks change no rows


def test_to_dict_has_the_sink_share(sink_maps, make_maps):
    record = sink_maps.to_dict()
    assert np.asarray(record["sentences"][1]["sink_share"]).shape == (2, 3, 7)
    one = sink_maps.to_dict(pick=(1, 2))["sentences"][0]["sink_share"]
    np.testing.assert_allclose(one, sink_maps.self_attention.sink_share[0][1, 2], atol=5e-7)
    words = sink_maps.to_words().to_dict(pick=(0, 0))["sentences"][0]
    assert words["words"] == SENTENCES[0] and len(words["sink_share"]) == 5
    plain = make_maps(SENTENCES, pieces=PIECES).to_dict()
    assert [s["sink_share"] for s in plain["sentences"]] == [None, None]


def _header(path) -> dict:
    with np.load(path) as archive:
        return json.loads(archive["header"].tobytes())


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_file_round_trip_is_version_4_and_lossless(tmp_path, sink_maps, dtype):
    maps = sink_maps.astype(dtype)
    path = maps.save(tmp_path / "sinks")
    header = _header(path)
    assert header["version"] == SINK_VERSION == 4
    assert header["attentions"]["self_attention"]["arrays"] == ["weights", "sink_share"]
    back = attnlab.load_maps(path)
    for a, b in zip(maps.self_attention.sink_share, back.self_attention.sink_share):
        assert a.dtype == b.dtype == dtype and np.array_equal(a, b)
    assert all(np.array_equal(a, b) for a, b in zip(maps.weights, back.weights))
    np.testing.assert_allclose(back.to_words().self_attention.sink_share[0],
                               maps.to_words().self_attention.sink_share[0])


def test_maps_without_sinks_stay_version_2_and_old_files_read_as_none(tmp_path, make_maps):
    """Maps of a model without sinks are written as version 2, as before; files of the older versions (2
    written by this code path, 1 from the fixtures) read with no sink share."""
    path = make_maps(SENTENCES, pieces=PIECES).save(tmp_path / "plain")
    assert _header(path)["version"] == FORMAT_VERSION == 2
    assert "sink_logits" not in json.dumps(_header(path))  # the layer facts of such a model read as they did
    back = attnlab.load_maps(path)
    assert back.self_attention.sink_share is None and back.to_words().self_attention.sink_share is None
    for name in ("minilm_qk_v1", "tiny_t5_qk_v1"):
        old = attnlab.load_maps(FIXTURES / f"{name}.npz")
        assert all(rec.sink_share is None for _, rec in old.attentions()), name


def _mean_entropy_with_sink(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """By hand: each row's −Σ p log p − s log s (the sink one more outcome), averaged over rows, [L, H]."""
    p = np.concatenate([w, s[..., None]], axis=-1).astype(np.float64)
    return -(p * np.log(p)).sum(-1).mean(-1)


def test_entropy_counts_the_sink_as_one_more_outcome_and_other_roles_take_the_weights_as_they_are(make_maps, plant):
    maps = with_sinks(make_maps([SENTENCES[0]]))  # one piece per word: word maps are the token maps
    w, s = maps.weights[0].astype(np.float64), maps.self_attention.sink_share[0].astype(np.float64)
    roles = head_roles(maps, roles=["broad", "spread", "prev"])
    np.testing.assert_allclose(roles.scores["broad"], _mean_entropy_with_sink(w, s), rtol=1e-6)
    n = w.shape[-1]  # an encoder's row may attend to every word, and to the sink: log(n + 1) is uniform
    np.testing.assert_allclose(roles.scores["spread"], _mean_entropy_with_sink(w, s) / np.log(n + 1), rtol=1e-6)
    np.testing.assert_allclose(entropy(w, s), entropy(np.concatenate([w, s[..., None]], -1)), rtol=1e-12)
    # a head that parks 70 % on the sink and 30 % on the previous word: prev scores 0.3, nothing redistributed
    prev = 0.3 * plant(n, [max(r - 1, 0) for r in range(n)])
    maps.weights[0][0, 0], maps.self_attention.sink_share[0][0, 0] = prev, 0.7
    prev_score = head_roles(maps, roles=["prev"]).scores["prev"][0, 0]
    assert prev_score == pytest.approx(0.3, rel=1e-6)  # rows 1..n-1, which have a previous word, put 0.3 on it
