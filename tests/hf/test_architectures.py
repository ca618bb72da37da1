"""Every architecture capture serves gives transformers' own eager ``output_attentions``, within
1e-5, for each sentence of a padded batch of unequal lengths: RoPE with grouped-query attention
(Llama, Qwen2), sliding windows (Mistral, Gemma-2), logit softcapping (Gemma-2), T5's relative
position bias and BART's encoder–decoder (encoder, decoder and cross-attention maps)."""

import numpy as np
import pytest

from attnlab.hf.capture import capture

pytestmark = pytest.mark.needs("torch", "transformers")

SENTENCES = ["I sat on the bank of the river.", "The river runs past the bank, slowly!", "I put the money in."]
PAIRS = [("I sat on the bank.", "The river runs past the bank, slowly!"), ("The money!", "I put it in the bank."),
         ("The river runs past the bank of the river.", "Slowly.")]


def _eager(folder):
    from transformers import AutoModel

    return AutoModel.from_pretrained(folder, attn_implementation="eager", use_safetensors=True).eval()


def _stack(att):
    import torch

    return torch.stack(att, dim=1)[0].numpy()  # (L, H, Tq, Tk)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gemma2"])
def test_decoders_equal_eager_in_a_padded_batch(tiny_folder, arch):
    import torch
    from transformers import AutoTokenizer

    folder = tiny_folder(arch)
    maps = capture(SENTENCES, folder, batch_size=3)
    net, tok = _eager(folder), AutoTokenizer.from_pretrained(folder)
    assert len({len(t) for t in maps.tokens}) > 1  # unequal lengths: the batch was padded
    for i, s in enumerate(SENTENCES):
        with torch.inference_mode():
            want = _stack(net(**tok(s, return_tensors="pt"), output_attentions=True).attentions)
        assert maps.weights[i].shape == want.shape
        np.testing.assert_allclose(maps.weights[i], want, rtol=0, atol=1e-5)
        assert np.all(np.triu(maps.weights[i], k=1) == 0), "a decoder token attends to a later one"


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_sliding_window_is_applied(tiny_folder, arch):
    """Transformers' window w: query i sees keys i − w + 1 .. i (Gemma-2: on its sliding layers only)."""
    maps = capture(SENTENCES[:1], tiny_folder(arch))
    w, window = maps.weights[0], maps.config["sliding_window"]
    t = w.shape[-1]
    outside = np.tril(np.ones((t, t), dtype=bool), k=-window)  # j ≤ i − w
    banded = [bool(np.all(w[layer][:, outside] == 0)) for layer in range(maps.num_layers)]
    assert banded == ([True, True] if arch == "mistral" else [True, False])  # Gemma-2 alternates


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_encoder_decoders_equal_eager_in_a_padded_batch(tiny_folder, arch):
    import torch
    from transformers import AutoTokenizer

    folder = tiny_folder(arch)
    maps = capture(PAIRS, folder, batch_size=3)
    net, tok = _eager(folder), AutoTokenizer.from_pretrained(folder)
    start = net.config.decoder_start_token_id
    assert maps.is_seq2seq and maps.decoder.num_layers == 3 and maps.num_layers == 2
    for i, (src, tgt) in enumerate(PAIRS):
        enc = tok(src, return_tensors="pt")
        target = tok(text_target=tgt, return_tensors="pt")["input_ids"]
        dec = torch.cat([torch.tensor([[start]]), target], dim=1)
        with torch.inference_mode():
            out = net(**enc, decoder_input_ids=dec, output_attentions=True)
        assert maps.target.tokens[i] == tok.convert_ids_to_tokens(dec[0].tolist())
        np.testing.assert_allclose(maps.weights[i], _stack(out.encoder_attentions), rtol=0, atol=1e-5)
        np.testing.assert_allclose(maps.decoder.weights[i], _stack(out.decoder_attentions), rtol=0, atol=1e-5)
        np.testing.assert_allclose(maps.cross.weights[i], _stack(out.cross_attentions), rtol=0, atol=1e-5)
        assert maps.cross.weights[i].shape == (3, 4, len(maps.target.tokens[i]), len(maps.tokens[i]))


@pytest.mark.parametrize("arch", ["llama", "t5"])
def test_sentencepiece_words_are_found_without_word_ids(tiny_folder, arch):
    """Llama-style tokenizers give one word_id per sentence; the ▁ pieces and punctuation say where words are."""
    sentence = "The river runs past the bank slowly!"
    pair = (sentence, sentence) if arch == "t5" else sentence
    maps = capture([pair], tiny_folder(arch))
    assert any(t.startswith("▁") for t in maps.tokens[0])
    words = maps.to_words()
    text = ["The", "river", "runs", "past", "the", "bank", "slowly", "!"]
    assert words.words[0] == (["<s>"] + text if arch == "llama" else text + ["</s>"])
    split = [w for w in range(len(words.words[0])) if maps.word_of[0].count(w) > 1]
    assert len(split) >= 2, "the test needs words of several pieces"
    np.testing.assert_allclose(words.weights[0].sum(-1), 1.0, atol=1e-5)
    if arch == "t5":  # the decoder's words: its start token, then the target's
        assert maps.target.words[0] == ["<pad>"] + text + ["</s>"]
        assert maps.target.kinds[0][0] == "cls" and maps.target.kinds[0][-1] == "sep"


def test_byte_level_words_qwen2(tiny_folder):
    maps = capture(["Riverbanks run slowly, moneyed!"], tiny_folder("qwen2"))
    assert maps.words[0] == ["Riverbanks", "run", "slowly", ",", "moneyed", "!"]
    assert max(maps.word_of[0].count(w) for w in range(6)) > 1


def _recompute(q, k, facts):
    """softmax(softcap(q·kᵀ·scale) + mask) for one layer (its LayerFacts), by hand in float64: q, k (H, T, D)."""
    s = np.einsum("htd,hsd->hts", q.astype(np.float64), k.astype(np.float64)) * facts.scale
    if facts.softcap is not None:
        s = facts.softcap * np.tanh(s / facts.softcap)
    t = s.shape[-1]
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    allowed = np.ones((t, t), dtype=bool)
    if facts.causal:
        allowed &= j <= i
    if facts.window is not None:
        left, right = facts.window
        allowed &= (j >= i - left) & (j <= i + right)
    s = np.where(allowed, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "mistral"])
def test_queries_and_keys_reproduce_the_weights(tiny_folder, arch):
    maps = capture(SENTENCES, tiny_folder(arch), batch_size=3, qk=True)
    own = maps.self_attention
    for i in range(len(SENTENCES)):
        t = len(maps.tokens[i])
        assert own.queries[i].shape == own.keys[i].shape == (2, 4, t, 8)  # GQA keys repeated per query head
        for layer in range(2):
            want = _recompute(own.queries[i][layer], own.keys[i][layer], own.layers[layer])
            np.testing.assert_allclose(maps.weights[i][layer], want, rtol=0, atol=1e-5)
    if arch == "gemma2":
        assert [f.softcap for f in own.layers] == [0.5, 0.5] and own.layers[0].window == (3, 0)
    np.testing.assert_array_equal(own.keys[0][0, 0], own.keys[0][0, 1])  # heads 1, 2 share a key head


def test_queries_and_keys_of_an_encoder_and_gpt2(default_model, tiny_folder):
    maps = capture(["I sat on the bank of the river."], default_model, qk=True)
    own = maps.self_attention
    assert own.queries[0].shape == (6, 12, 11, 32) and [f.causal for f in own.layers] == [False] * 6
    for layer in (0, 5):
        want = _recompute(own.queries[0][layer], own.keys[0][layer], own.layers[layer])
        np.testing.assert_allclose(maps.weights[0][layer], want, rtol=0, atol=1e-5)


def test_qk_and_seq2seq_survive_a_file(tiny_folder, tmp_path):
    from attnlab.maps.tokens import load_maps

    for arch, items, qk in (("llama", SENTENCES[:2], True), ("bart", PAIRS[:2], False)):
        maps = capture(items, tiny_folder(arch), qk=qk)
        back = load_maps(maps.save(tmp_path / arch))
        assert back.sentences == maps.sentences and back.self_attention.layers == maps.self_attention.layers
        assert [name for name, _ in back.attentions()] == [name for name, _ in maps.attentions()]
        for (_, a), (_, b) in zip(maps.attentions(), back.attentions()):
            assert a.arrays().keys() == b.arrays().keys() and a.query_side == b.query_side
            for kind, xs in a.arrays().items():
                for x, y in zip(xs, b.arrays()[kind]):
                    np.testing.assert_array_equal(x, y)
        if arch == "bart":
            assert back.target.tokens == maps.target.tokens


def test_seq2seq_needs_pairs(tiny_folder):
    with pytest.raises(ValueError, match=r"sentences\[0\] is one string.*\(source, target\) pairs"):
        capture(["Only a source."], tiny_folder("t5"))
