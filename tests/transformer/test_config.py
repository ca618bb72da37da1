"""TransformerConfig: built from transformers configs, refusing what would change the math."""

from __future__ import annotations

import pytest

from attnlab.transformer import TransformerConfig


def test_from_bert_dict_reads_the_default_models_shape():
    c = TransformerConfig.from_hf({"model_type": "bert", "vocab_size": 30522, "hidden_size": 384,
                                   "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536,
                                   "max_position_embeddings": 512, "hidden_act": "gelu", "type_vocab_size": 2})
    assert (c.num_layers, c.num_heads, c.head_dim, c.hidden_ff) == (6, 12, 32, 1536)
    assert c.post_norm and c.embed_norm and not c.causal and c.norm_eps == 1e-12


@pytest.mark.needs("transformers")
def test_from_llama_config_object_has_gqa_and_rotary():
    import transformers
    c = TransformerConfig.from_hf(transformers.LlamaConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                                                           intermediate_size=96, num_hidden_layers=1, vocab_size=50))
    assert (c.positions, c.norm, c.ffn, c.heads_kv, c.head_dim) == ("rotary", "rmsnorm", "gated", 2, 8)


@pytest.mark.parametrize("config, match", [
    ({"model_type": "t5"}, "model_type"),
    ({"model_type": "bert", "position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"model_type": "llama", "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_parameters.rope_type"),
    ({"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
])
def test_refuses_what_it_would_compute_differently(config, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig.from_hf(config)


@pytest.mark.parametrize("kw, match", [
    ({"num_heads": 5}, "multiple of num_heads"),
    ({"num_kv_heads": 3}, "num_kv_heads"),
    ({"positions": "alibi"}, "positions must be one of"),
    ({"num_layers": 0}, "num_layers must be an int"),
])
def test_bad_values_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig(**{"vocab_size": 10, "d_model": 16, "num_layers": 1, "num_heads": 4, **kw})


@pytest.mark.needs("torch")
def test_model_errors_name_the_argument():
    import torch
    from attnlab.transformer import Transformer

    m = Transformer(TransformerConfig(vocab_size=10, d_model=16, num_layers=1, num_heads=4, causal=False))
    with pytest.raises(ValueError, match="input_ids must be"):
        m(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask"):
        m(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 4))
    with pytest.raises(ValueError, match="logits need a causal"):
        m.logits(torch.zeros(1, 3, 16))
    with pytest.raises(ValueError, match="embed needs a tokenizer"):
        m.embed(["a"])


@pytest.mark.needs("torch")
def test_numpy_backend_refuses_gradients_rather_than_dropping_them():
    import torch
    from attnlab.transformer import Transformer

    m = Transformer(TransformerConfig(vocab_size=10, d_model=16, num_layers=1, num_heads=4), backend="numpy")
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="without gradients"):
        m(ids)
    with torch.no_grad():
        assert m(ids).shape == (1, 3, 16)
