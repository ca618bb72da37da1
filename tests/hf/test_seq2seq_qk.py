"""capture(qk=True) of encoder–decoders (tiny T5 and BART built in the test): the queries, keys and
position biases of the encoder's, the decoder's and the cross-attention reproduce every captured
weight, softmax(q·kᵀ·scale + bias + mask), within 1e-5, for each pair of a padded batch of unequal
lengths; a maps file keeps them; the Neuron data carry all three."""

import numpy as np
import pytest

from attnlab.hf.capture import capture

pytestmark = pytest.mark.needs("torch", "transformers")

PAIRS = [("I sat on the bank.", "The river runs past the bank, slowly!"), ("The money!", "I put it in the bank."),
         ("The river runs past the bank of the river.", "Slowly.")]


def recompute(q, k, meta, layer, bias=None):
    """softmax(softcap(q·kᵀ·scale) + bias + mask) of one layer, by hand in float64: q (H, Tq, D), k (H, Tk, D)."""
    s = np.einsum("htd,hsd->hts", q.astype(np.float64), k.astype(np.float64)) * meta["scale"][layer]
    if meta["softcap"][layer] is not None:
        s = meta["softcap"][layer] * np.tanh(s / meta["softcap"][layer])
    if bias is not None:
        s = s + bias.astype(np.float64)
    tq, tk = s.shape[-2:]
    if meta["causal"][layer]:  # bottom-right aligned, as everywhere in attnlab
        s = np.where(np.arange(tk)[None, :] <= np.arange(tq)[:, None] + tk - tq, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def kinds(maps, i):
    """(name, queries, keys, bias or None, meta, weights) of sentence i's three attentions."""
    dec = maps.decoder
    return [
        ("encoder", maps.queries[i], maps.keys[i], maps.position_bias, maps.qk_meta, maps.weights[i]),
        ("decoder", dec.queries[i], dec.keys[i], dec.position_bias, dec.qk_meta, dec.weights[i]),
        ("cross", maps.cross_queries[i], maps.cross_keys[i], maps.cross_position_bias, maps.cross_qk_meta,
         maps.cross_weights[i]),
    ]


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_queries_keys_and_biases_reproduce_all_three_attentions(tiny_folder, arch):
    maps = capture(PAIRS, tiny_folder(arch), batch_size=3, qk=True)
    assert len({len(t) for t in maps.tokens}) > 1 and len({len(t) for t in maps.decoder.tokens}) > 1  # padded
    for i in range(len(PAIRS)):
        n, m = len(maps.tokens[i]), len(maps.decoder.tokens[i])
        for name, q, k, bias, meta, weights in kinds(maps, i):
            tq, tk = (n, n) if name == "encoder" else (m, m) if name == "decoder" else (m, n)
            layers = weights.shape[0]
            assert q.shape == (layers, 4, tq, 8) and k.shape == (layers, 4, tk, 8), name
            assert meta["causal"] == [name == "decoder"] * layers
            for layer in range(layers):
                b = None if bias is None else bias[i][layer]
                np.testing.assert_allclose(recompute(q[layer], k[layer], meta, layer, b), weights[layer],
                                           rtol=0, atol=1e-5, err_msg=f"{arch} {name} sentence {i} layer {layer}")
    if arch == "t5":  # relative position bias on both self-attentions, none on cross-attention; no scaling
        assert maps.position_bias[0].shape == (2, 4, len(maps.tokens[0]), len(maps.tokens[0]))
        assert maps.decoder.position_bias is not None and maps.cross_position_bias is None
        assert maps.qk_meta["scale"] == [1.0, 1.0]
        t = len(maps.tokens[2])  # the bias depends on the distance j - i only
        b = maps.position_bias[2][0, 0]
        assert all(np.all(np.diagonal(b, d) == b[max(0, -d), max(0, d)]) for d in range(1 - t, t))
    else:
        assert maps.position_bias is maps.decoder.position_bias is maps.cross_position_bias is None
        assert maps.qk_meta["scale"] == [8 ** -0.5] * 2


def test_without_a_bias_the_scores_alone_fail_for_t5(tiny_folder):
    """The bias matters: T5's weights are not softmax(q·kᵀ) alone (so the test above tests it)."""
    maps = capture(PAIRS[:1], tiny_folder("t5"), qk=True)
    plain = recompute(maps.queries[0][0], maps.keys[0][0], maps.qk_meta, 0)
    assert np.abs(plain - maps.weights[0][0]).max() > 1e-3


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_a_maps_file_keeps_every_query_key_and_bias(tiny_folder, tmp_path, arch):
    from attnlab.maps.records import load_maps

    maps = capture(PAIRS[:2], tiny_folder(arch), qk=True)
    back = load_maps(maps.save(tmp_path / arch))
    for part, other in ((maps, back), (maps.decoder, back.decoder)):
        assert part.qk_meta == other.qk_meta
        for name in ("queries", "keys", "position_bias"):
            got, want = getattr(other, name), getattr(part, name)
            assert (got is None) == (want is None), name
            for a, b in zip(want or [], got or []):
                np.testing.assert_array_equal(a, b)
    assert back.cross_qk_meta == maps.cross_qk_meta
    for name in ("cross_queries", "cross_keys", "cross_position_bias"):
        assert (getattr(back, name) is None) == (getattr(maps, name) is None), name
        for a, b in zip(getattr(maps, name) or [], getattr(back, name) or []):
            np.testing.assert_array_equal(a, b)


def test_neuron_data_carry_the_three_attentions(tiny_folder):
    from attnlab.viz.neuron import head_qk, neuron_payload

    maps = capture(PAIRS[:1], tiny_folder("t5"), qk=True)
    data = neuron_payload(maps)
    assert set(data) >= {"decoder", "cross"} and data["cross"]["model"] == {"num_layers": 3, "num_heads": 4}
    s = data["cross"]["sentences"][0]
    assert s["labels"] == maps.decoder.tokens[0] and s["key_labels"] == maps.tokens[0] and s["bias"] is None
    assert np.asarray(s["q"]).shape == maps.cross_queries[0].shape
    np.testing.assert_allclose(data["sentences"][0]["bias"], maps.position_bias[0], atol=1e-5)
    one = head_qk(maps, 0, 3, 2, "decoder")
    np.testing.assert_allclose(one["bias"], maps.decoder.position_bias[0][2, 1], atol=1e-5)
    assert one["meta"] == {"scale": 1.0, "softcap": None, "causal": True, "window": None}
    with pytest.raises(ValueError, match=r"layer of the cross attention must be 1\.\.3"):
        head_qk(maps, 0, 4, 1, "cross")


def test_gathering_batches_fills_zeros_where_a_batch_added_no_bias(make_maps):
    """capture leaves out a batch's bias where it is all zero; batches gathered together then agree."""
    from dataclasses import replace

    from attnlab.maps.records import gather

    def with_qk(m, bias=None):
        q = [np.ones((2, 3, len(m.tokens[0]), 4), dtype=np.float32)]
        return replace(m, queries=q, keys=q, qk_meta={}, position_bias=bias)

    bias = [np.full((2, 3, 3, 3), 0.5, dtype=np.float32)]
    a, b = with_qk(make_maps([["a", "b"]])), with_qk(make_maps([["c", "d", "e"]]), bias)
    got = gather([a, b], [(1, 0), (0, 0)])
    np.testing.assert_array_equal(got.position_bias[0], bias[0])
    assert got.position_bias[1].shape == (2, 3, 2, 2) and not got.position_bias[1].any()
    assert gather([a], [(0, 0)]).position_bias is None
