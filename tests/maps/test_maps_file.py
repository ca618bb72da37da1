"""One file format for captured maps, written and read back losslessly."""

import numpy as np
import pytest

import attnlab
from attnlab.maps.records import AttentionMaps


def _maps():
    rng = np.random.default_rng(0)
    w1 = rng.random((2, 3, 4, 4), dtype=np.float32)
    w2 = rng.random((2, 3, 5, 5), dtype=np.float32)
    return AttentionMaps(
        sentences=["Héllo wörld.", ("A b", "c")], tokens=[["[CLS]", "hé", "##llo", "[SEP]"], ["[CLS]", "a", "b", "[SEP]", "c"]],
        weights=[w1, w2], word_of=[[0, 1, 1, 2], [0, 1, 2, 3, 4]], words=[["[CLS]", "Héllo", "[SEP]"], ["[CLS]", "A", "b", "[SEP]", "c"]],
        kinds=[["cls", "word", "sep"], ["cls", "word", "word", "sep", "word"]], model_id="m/x", revision="abc",
        num_layers=2, num_heads=3, config={"model_type": "bert", "num_hidden_layers": 2},
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_round_trip_is_lossless(tmp_path, dtype):
    maps = _maps().astype(dtype)
    path = maps.save(tmp_path / "maps")
    assert path.name == "maps.npz"
    back = attnlab.load_maps(path)
    for a, b in zip(maps.weights, back.weights):
        assert b.dtype == dtype and np.array_equal(a, b)
    for name in ("sentences", "tokens", "word_of", "words", "kinds", "model_id", "revision", "num_layers",
                 "num_heads", "config"):
        assert getattr(back, name) == getattr(maps, name), name


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
    with pytest.raises(ValueError, match=r"weights\[0\] has shape \(2, 3, 4, 4\), expected \(2, 3, 5, 5\)"):
        AttentionMaps(sentences=m.sentences[:1], tokens=[m.tokens[0] + ["x"]], weights=m.weights[:1],
                      word_of=m.word_of[:1], words=m.words[:1], kinds=m.kinds[:1], model_id="m", revision=None,
                      num_layers=2, num_heads=3)
    with pytest.raises(ValueError, match="float32 or float16"):
        m.astype(np.float64)
