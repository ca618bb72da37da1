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


def recompute(q, k, facts, bias=None):
    """softmax(softcap(q·kᵀ·scale) + bias + mask) of one layer (its LayerFacts), by hand in float64:
    q (H, Tq, D), k (H, Tk, D)."""
    s = np.einsum("htd,hsd->hts", q.astype(np.float64), k.astype(np.float64)) * facts.scale
    if facts.softcap is not None:
        s = facts.softcap * np.tanh(s / facts.softcap)
    if bias is not None:
        s = s + bias.astype(np.float64)
    tq, tk = s.shape[-2:]
    if facts.causal:  # bottom-right aligned, as everywhere in attnlab
        s = np.where(np.arange(tk)[None, :] <= np.arange(tq)[:, None] + tk - tq, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_queries_keys_and_biases_reproduce_all_three_attentions(tiny_folder, arch):
    maps = capture(PAIRS, tiny_folder(arch), batch_size=3, qk=True)
    assert len({len(t) for t in maps.tokens}) > 1 and len({len(t) for t in maps.target.tokens}) > 1  # padded
    assert [name for name, _ in maps.attentions()] == ["self_attention", "decoder", "cross"]
    for name, rec in maps.attentions():
        for i in range(len(PAIRS)):
            tq, tk = len(rec.query_side.tokens[i]), len(rec.key_side.tokens[i])
            q, k = rec.queries[i], rec.keys[i]
            assert q.shape == (rec.num_layers, 4, tq, 8) and k.shape == (rec.num_layers, 4, tk, 8), name
            assert [f.causal for f in rec.layers] == [name == "decoder"] * rec.num_layers
            for layer, facts in enumerate(rec.layers):
                b = None if rec.position_bias is None else rec.position_bias[i][layer]
                np.testing.assert_allclose(recompute(q[layer], k[layer], facts, b), rec.weights[i][layer],
                                           rtol=0, atol=1e-5, err_msg=f"{arch} {name} sentence {i} layer {layer}")
    own = maps.self_attention
    if arch == "t5":  # relative position bias on both self-attentions, none on cross-attention; no scaling
        assert own.position_bias[0].shape == (2, 4, len(maps.tokens[0]), len(maps.tokens[0]))
        assert maps.decoder.position_bias is not None and maps.cross.position_bias is None
        assert [f.scale for f in own.layers] == [1.0, 1.0]
        t = len(maps.tokens[2])  # the bias depends on the distance j - i only
        b = own.position_bias[2][0, 0]
        assert all(np.all(np.diagonal(b, d) == b[max(0, -d), max(0, d)]) for d in range(1 - t, t))
    else:
        assert own.position_bias is maps.decoder.position_bias is maps.cross.position_bias is None
        assert [f.scale for f in own.layers] == [8 ** -0.5] * 2


def test_without_a_bias_the_scores_alone_fail_for_t5(tiny_folder):
    """The bias matters: T5's weights are not softmax(q·kᵀ) alone (so the test above tests it)."""
    maps = capture(PAIRS[:1], tiny_folder("t5"), qk=True)
    own = maps.self_attention
    plain = recompute(own.queries[0][0], own.keys[0][0], own.layers[0])
    assert np.abs(plain - maps.weights[0][0]).max() > 1e-3


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_a_maps_file_keeps_every_query_key_and_bias(tiny_folder, tmp_path, arch):
    from attnlab.maps.tokens import load_maps

    maps = capture(PAIRS[:2], tiny_folder(arch), qk=True)
    back = load_maps(maps.save(tmp_path / arch))
    for (name, part), (_, other) in zip(maps.attentions(), back.attentions(), strict=True):
        assert part.layers == other.layers and part.arrays().keys() == other.arrays().keys(), name
        for kind, xs in part.arrays().items():
            for a, b in zip(xs, other.arrays()[kind], strict=True):
                np.testing.assert_array_equal(a, b)


def test_neuron_data_carry_the_three_attentions(tiny_folder):
    from attnlab.viz.neuron import head_qk, neuron_payload

    maps = capture(PAIRS[:1], tiny_folder("t5"), qk=True)
    data = neuron_payload(maps)
    assert set(data) >= {"decoder", "cross"} and data["cross"]["model"] == {"num_layers": 3, "num_heads": 4}
    s = data["cross"]["sentences"][0]
    assert s["labels"] == maps.target.tokens[0] and s["key_labels"] == maps.tokens[0] and s["bias"] is None
    assert np.asarray(s["q"]).shape == maps.cross.queries[0].shape
    np.testing.assert_allclose(data["sentences"][0]["bias"], maps.self_attention.position_bias[0], atol=1e-5)
    one = head_qk(maps, 0, 2, 1, "decoder")  # 0-based: L3H2
    np.testing.assert_allclose(one["bias"], maps.decoder.position_bias[0][2, 1], atol=1e-5)
    assert one["meta"] == {"scale": 1.0, "softcap": None, "causal": True, "window": None}
    with pytest.raises(ValueError, match=r"layer of the cross attention must be 0\.\.2"):
        head_qk(maps, 0, 3, 0, "cross")


def test_gathering_batches_fills_zeros_where_a_batch_added_no_bias(make_maps):
    """capture leaves out a batch's bias where it is all zero; batches gathered together then agree."""
    from dataclasses import replace

    from attnlab.maps.records import LayerFacts
    from attnlab.maps.tokens import gather

    def with_qk(m, bias=None):
        q = [np.ones((2, 3, len(m.tokens[0]), 4), dtype=np.float32)]
        own = replace(m.self_attention, queries=q, keys=q, layers=(LayerFacts(scale=0.5),) * 2, position_bias=bias)
        return replace(m, self_attention=own)

    bias = [np.full((2, 3, 3, 3), 0.5, dtype=np.float32)]
    a, b = with_qk(make_maps([["a", "b"]])), with_qk(make_maps([["c", "d", "e"]]), bias)
    got = gather([a, b], [(1, 0), (0, 0)])
    assert got.tokens == [["c", "d", "e"], ["a", "b"]] and got.self_attention.query_side is got.source
    np.testing.assert_array_equal(got.self_attention.position_bias[0], bias[0])
    assert got.self_attention.position_bias[1].shape == (2, 3, 2, 2) and not got.self_attention.position_bias[1].any()
    assert gather([a], [(0, 0)]).self_attention.position_bias is None
