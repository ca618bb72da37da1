"""attnlab's transformer is the real one: its last hidden state equals transformers' (float32) within
1e-4 and its embeddings have cosine >= 0.99999, with every attention backend, in padded batches."""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import BACKENDS, TEXTS

BANK = ["I sat on the bank of the river.", "I put the money in the bank."]
SENTENCES = BANK + ["Hi", "The bank of the river was steep, muddy and slippery after three days of rain."]
TOL = 1e-4


def _reference(folder, attn, sentences, lm=False):
    """transformers' own forward (float32): the last hidden state (or logits) and the padded batch."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    cls = AutoModelForCausalLM if lm else AutoModel
    net = cls.from_pretrained(folder, attn_implementation=attn, use_safetensors=True, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "right"
    enc = tok(sentences, padding=True, return_tensors="pt")
    with torch.inference_mode():
        out = net(**enc, output_hidden_states=lm)
    return (out.logits if lm else out.last_hidden_state), enc


def _max_diff(ours, theirs, mask) -> float:
    real = mask.bool()  # padded positions are compared too, but the test is about real tokens
    return float((ours - theirs)[real].abs().max())


@pytest.mark.model
@pytest.mark.parametrize("backend", BACKENDS)
def test_default_model_hidden_state_equals_transformers(default_transformer, backend):
    import torch

    from attnlab.locate.folder import resolve

    ref, enc = _reference(resolve(None)[0], "eager", SENTENCES)
    assert len(set(enc["attention_mask"].sum(-1).tolist())) == len(SENTENCES)  # unequal lengths: padding
    with torch.no_grad():
        ours = default_transformer(enc["input_ids"], enc["attention_mask"], backend=backend)
    assert ours.shape == ref.shape == (len(SENTENCES), enc["input_ids"].shape[1], 384)
    assert ours.dtype == torch.float32
    assert _max_diff(ours, ref, enc["attention_mask"]) < TOL


@pytest.mark.model
@pytest.mark.parametrize("backend", BACKENDS)
def test_default_model_embeddings_equal_mean_pooled_transformers(default_transformer, backend):
    import torch

    from attnlab.locate.folder import resolve

    ref, enc = _reference(resolve(None)[0], "sdpa", SENTENCES)
    m = enc["attention_mask"][..., None].float()
    theirs = torch.nn.functional.normalize((ref * m).sum(1) / m.sum(1), dim=-1)  # sentence-transformers' pooling
    default_transformer.backend = backend
    try:
        ours = default_transformer.embed(SENTENCES, batch_size=3)  # batches of unequal lengths
    finally:
        default_transformer.backend = "auto"
    assert ours.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(ours.norm(dim=-1).numpy(), 1.0, atol=1e-6)
    assert float((ours * theirs).sum(-1).min()) >= 0.99999


@pytest.mark.model
def test_padding_does_not_change_a_sentence(default_transformer):
    import torch

    tok = default_transformer.tokenizer
    alone = tok(BANK[1:], return_tensors="pt")
    batch = tok(BANK[1:] + [SENTENCES[-1]], padding=True, return_tensors="pt")
    with torch.no_grad():
        a = default_transformer(alone["input_ids"], alone["attention_mask"], backend="torch")
        b = default_transformer(batch["input_ids"], batch["attention_mask"], backend="torch")
    t = a.shape[1]
    assert float((a[0] - b[0, :t]).abs().max()) < 1e-5


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ["gpt2", "llama", "roberta"])
def test_tiny_models_equal_transformers(request, family, backend, attn):
    import torch

    from attnlab.transformer import Transformer

    folder = request.getfixturevalue(f"{family}_folder")
    ref, enc = _reference(folder, attn, TEXTS[:5])
    m = Transformer.from_pretrained(folder, backend=backend)
    assert m.config.family == family
    with torch.no_grad():
        ours = m(enc["input_ids"], enc["attention_mask"])
    assert _max_diff(ours, ref, enc["attention_mask"]) < TOL


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_tiny_lm_logits_equal_transformers(request, family):
    import torch

    from attnlab.transformer import Transformer

    folder = request.getfixturevalue(f"{family}_folder")
    ref, enc = _reference(folder, "eager", TEXTS[:3], lm=True)
    m = Transformer.from_pretrained(folder, backend="torch")
    assert m.config.tie_embeddings == (family == "gpt2")
    with torch.no_grad():
        ours = m.logits(m(enc["input_ids"], enc["attention_mask"]))
    assert _max_diff(ours, ref, enc["attention_mask"]) < TOL


def test_left_padding_goes_as_a_mask(gpt2_folder):
    """Padding that is not on the right cannot be lengths: it goes to the backends as a key mask."""
    import torch

    from attnlab.transformer import Transformer

    m = Transformer.from_pretrained(gpt2_folder, backend="torch")
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    with torch.no_grad():
        h = m(torch.tensor([[5, 6, 7, 8], [0, 9, 10, 11]]), mask)
        h2 = m(torch.tensor([[5, 6, 7, 8], [3, 9, 10, 11]]), mask)
    assert float((h[1, 1:] - h2[1, 1:]).abs().max()) == 0.0  # the pad token is never attended to
    with pytest.raises(ValueError, match="kernel"):
        m(torch.tensor([[5, 6, 7, 8], [0, 9, 10, 11]]), mask, backend="kernel")  # no dense masks: it says so
