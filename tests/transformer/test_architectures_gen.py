"""The decoders of today in attnlab's transformer: Mistral, Qwen2, Gemma-2, Llama-3's rope scaling, Qwen3,
Gemma-3 and gpt-oss equal transformers' (float32, padded batches, windows smaller than the sequences), in every dtype, with or without a tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import WINDOW

FAMILIES = ("gpt2", "llama", "llama3", "mistral", "qwen2", "gemma2", "qwen3", "gemma3", "gpt_oss")
TOL = 1e-4
pytestmark = pytest.mark.usefixtures("one_thread")


def _padded_batch(vocab: int):
    import torch

    g = torch.Generator().manual_seed(1)
    lens = [17, 11, 4]  # every window (6) smaller than the longer sequences
    ids = torch.randint(1, vocab, (3, max(lens)), generator=g)
    mask = torch.arange(max(lens))[None] < torch.tensor(lens)[:, None]
    return ids * mask, mask.long()


@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_state_and_logits_equal_transformers(decoder_folder, family):
    import torch
    from transformers import AutoModelForCausalLM

    from attnlab.transformer import Transformer

    folder = decoder_folder(family)
    theirs = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    ours = Transformer.from_pretrained(folder, backend="torch")
    ids, mask = _padded_batch(ours.config.vocab_size)
    with torch.no_grad():
        ref = theirs(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        hidden = ours(ids, mask)
        logits = ours.logits(hidden)
    real = mask.bool()
    assert float((hidden - ref.hidden_states[-1])[real].abs().max()) < TOL
    assert float((logits - ref.logits)[real].abs().max()) < TOL


def test_the_sliding_window_is_transformers_off_by_one(decoder_folder):
    """transformers' sliding_window = W: a token sees itself and W − 1 before it, which is
    attnlab.attention's causal=True, window=(W − 1, 0), read here from transformers' own weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from attnlab.reference.masks import band_mask
    from attnlab.transformer import Transformer

    folder = decoder_folder("mistral")
    theirs = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    ids = torch.arange(1, 15)[None]
    with torch.no_grad():
        w = theirs(input_ids=ids, output_attentions=True).attentions[0][0, 0]  # (T, T)
    seen = (w > 0).numpy()
    assert seen.sum(-1).max() == WINDOW
    np.testing.assert_array_equal(seen, band_mask(14, left=WINDOW - 1, right=0))
    c = Transformer.from_pretrained(folder).config
    assert c.layer_window(0) == WINDOW and (c.attention_window(0).left, c.attention_window(0).right) == (WINDOW - 1, 0)


def test_configs_read_what_changes_the_math(decoder_folder):
    import json

    from attnlab.transformer import TransformerConfig

    read = lambda family: TransformerConfig.from_hf(json.loads((decoder_folder(family) / "config.json").read_text()))  # noqa: E731
    qwen, gemma, mistral, llama3 = read("qwen2"), read("gemma2"), read("mistral"), read("llama3")
    assert [qwen.layer_window(i) for i in range(2)] == [None, WINDOW]  # max_window_layers=1: layer 1 slides
    assert (qwen.bias, qwen.out_bias) == (True, False)
    assert [gemma.layer_window(i) for i in range(2)] == [WINDOW, None]  # alternating, local first
    assert (gemma.attn_scale, gemma.attn_softcap, gemma.final_softcap) == (16 ** -0.5, 5.0, 3.0)
    assert gemma.norm_plus_one and gemma.sandwich_norm and gemma.embed_scale and gemma.activation == "gelu_new"
    assert [mistral.layer_window(i) for i in range(2)] == [WINDOW, WINDOW]
    assert (llama3.rope_type, llama3.rope_factor, llama3.rope_original_positions) == ("llama3", 8.0, 16)
    off = TransformerConfig.from_hf({**json.loads((decoder_folder("qwen2") / "config.json").read_text()),
                                     "use_sliding_window": False})
    assert off.layer_window(1) is None


@pytest.mark.parametrize("rope", [
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {"rope_type": "default", "rope_theta": 10000.0},
])
def test_rotary_frequencies_equal_transformers(rope):
    import torch
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from attnlab.transformer import TransformerConfig
    from attnlab.transformer.rotary import frequencies

    hf = transformers.LlamaConfig(hidden_size=128, num_attention_heads=2, max_position_embeddings=512, rope_parameters=rope)
    theirs = (ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu")[0] if rope["rope_type"] != "default" else
              1.0 / (rope["rope_theta"] ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64)))
    ours = frequencies(TransformerConfig.from_hf(hf))
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, theirs.double(), rtol=1e-6, atol=0)  # theirs: float32, rounded at each step


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
def test_weights_in_any_dtype_end_to_end(decoder_folder, dtype):
    import torch

    from attnlab.transformer import Transformer

    folder = decoder_folder("gemma2")
    m = Transformer.from_pretrained(folder, dtype=dtype, backend="torch")
    assert {p.dtype for p in m.parameters()} == {getattr(torch, dtype)}
    ids, mask = _padded_batch(m.config.vocab_size)
    with torch.no_grad():
        out = m.logits(m(ids, mask))
        ref = Transformer.from_pretrained(folder, dtype="float64", backend="torch").logits(
            Transformer.from_pretrained(folder, dtype="float64", backend="torch")(ids, mask))
    assert out.dtype == getattr(torch, dtype)
    err = float((out.double() - ref)[mask.bool()].abs().max())
    assert err < {"float64": 1e-12, "float32": 1e-4, "bfloat16": 0.5, "float16": 0.05}[dtype]


def test_a_folder_without_a_tokenizer_takes_ids(decoder_folder):
    import torch

    from attnlab.transformer import Transformer

    m = Transformer.from_pretrained(decoder_folder("mistral"))
    assert m.tokenizer is None
    g = m.generate(torch.tensor([[3, 4, 5]]), 4)
    assert g.text is None and g.ids.shape == (1, 4)
    with pytest.raises(ValueError, match="input_ids: text needs a tokenizer"):
        m.generate("hello", 4)
    with pytest.raises(ValueError, match="dtype must be one of"):
        Transformer.from_pretrained(decoder_folder("mistral"), dtype="int8")
