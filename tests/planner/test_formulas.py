"""The planner's counts against hand computations and published figures."""

from __future__ import annotations

import json

import pytest

from attnlab.planner import formulas as f
from attnlab.planner.models import BUNDLED, load_model


def test_llama_3_1_8b_kv_cache_at_128000_tokens_is_the_published_15_6_gib():
    a = load_model("llama-3.1-8b")
    # 32 layers · 2 (k and v) · 8 k/v heads · 128 dims · 2 bytes = 131,072 bytes per token
    assert f.kv_bytes(a, 1, 1, 2) == 32 * 2 * 8 * 128 * 2 == 131072
    assert f.kv_bytes(a, 128000, 1, 2) == 131072 * 128000
    assert round(f.kv_bytes(a, 128000, 1, 2) / 2**30, 1) == 15.6


@pytest.mark.parametrize("name, tokens, gib", [
    # Hugging Face's Llama 3.1 release post, its table of KV cache memory in 16 bits (1k and 128k tokens)
    ("llama-3.1-8b", 1024, 0.125), ("llama-3.1-8b", 128000, 15.62),
    ("llama-3.1-70b", 1024, 0.313), ("llama-3.1-70b", 128000, 39.06),
])
def test_kv_cache_matches_published_tables(name, tokens, gib):
    assert f.kv_bytes(load_model(name), tokens, 1, 2) / 2**30 == pytest.approx(gib, abs=0.006)


def test_mistral_rolling_buffer_is_eight_times_smaller_at_32k():
    # Mistral 7B (Jiang et al. 2023, §2): the rolling buffer of W = 4,096 saves 8× the cache at 32k tokens
    a, full = load_model("mistral-7b-v0.1"), 32 * 2 * 8 * 128 * 2 * 32768
    assert full / f.kv_bytes(a, 32768, 1, 2) == 8


@pytest.mark.parametrize("name, billions", [
    ("gpt2", 0.124), ("llama-3.1-8b", 8.03), ("llama-3.1-70b", 70.55), ("mistral-7b-v0.1", 7.24),
    ("qwen2.5-7b", 7.62), ("gemma-2-9b", 9.24),
])
def test_parameter_counts_match_the_published_sizes(name, billions):
    total = sum(f.weight_params(load_model(name)).values())
    assert total / 1e9 == pytest.approx(billions, abs=0.006)


def test_windows_bound_the_cache_per_layer():
    mistral = load_model("mistral-7b-v0.1")  # every layer a 4,096 window
    per_token = 2 * 8 * 128 * 2
    assert f.kv_bytes(mistral, 32000, 1, 2) == 32 * per_token * 4096
    assert f.kv_bytes(mistral, 1000, 3, 2) == 32 * per_token * 1000 * 3
    gemma = load_model("gemma-2-9b")  # 21 local layers of 4,096 and 21 global ones; head_dim 256, not 3584/16
    assert gemma.head_dim == 256 and gemma.windows[:2] == (4096, None)
    assert f.kv_bytes(gemma, 8000, 1, 2) == 2 * 8 * 256 * 2 * (21 * 4096 + 21 * 8000)


def test_qwen2_window_is_off_unless_switched_on():
    off = load_model("qwen2.5-7b")
    assert not off.windowed
    on = dict(BUNDLED["qwen2.5-7b"].config, use_sliding_window=True, sliding_window=4096, max_window_layers=20)
    a = load_model(on)
    assert a.windows[:20] == (None,) * 20 and a.windows[20:] == (4096,) * 8


def test_causal_pairs_by_hand():
    assert f.causal_pairs(4, None) == 1 + 2 + 3 + 4
    assert f.causal_pairs(5, 2) == 1 + 2 + 2 + 2 + 2
    assert f.causal_pairs(1, None, past=9) == 10  # one decode query sees the 9 cached keys and itself
    assert f.causal_pairs(3, 4, past=2) == 3 + 4 + 4
    n = 8192
    assert f.causal_pairs(n, None) == n * (n + 1) // 2  # causality halves the n² of full attention


def test_flop_counts_by_hand():
    a = load_model("llama-3.1-8b")
    layer = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336
    assert sum(f.layer_matmul_params(a).values()) == layer
    assert f.prefill_matmul_flops(a, 100, 2) == 2 * 2 * 100 * 32 * layer + 2 * 2 * 4096 * 128256
    assert f.attention_flops(a, 100, 1) == 32 * 4 * 32 * 128 * (100 * 101 // 2)
    assert f.decode_matmul_flops(a, 1) == 2 * (32 * layer + 4096 * 128256)
    assert f.decode_weight_bytes(a, 2) == 2 * (32 * layer + 32 * 2 * 4096 + 4096 + 4096 * 128256)


def test_matmul_shapes_cover_the_layer():
    a = load_model("llama-3.1-8b")
    assert sum(i * o * m for i, o, m in f.matmul_shapes(a)) == sum(f.layer_matmul_params(a).values())


def test_activation_peak_by_hand():
    a = load_model("gpt2")
    acts = f.prefill_activation_bytes(a, 10, 1, 4)
    assert acts["feed_forward"] == (2 * 768 + 2 * 3072) * 10 * 4
    assert acts["attention"] == (2 * 768 + 2 * 3 * 768 + 768) * 10 * 4


def test_config_json_file_and_folder(tmp_path):
    config = dict(BUNDLED["mistral-7b-v0.1"].config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    for path in (tmp_path, tmp_path / "config.json"):
        a = load_model(str(path))
        assert (a.num_kv_heads, a.windows[0], a.max_positions) == (8, 4096, 32768)


@pytest.mark.parametrize("config, match", [
    ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
      "vocab_size": 10, "max_position_embeddings": 64}, "intermediate_size"),
    ({"model_type": "t5"}, "model_type must be one of"),
    ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3,
      "num_hidden_layers": 2, "intermediate_size": 8, "vocab_size": 10, "max_position_embeddings": 64},
     "multiple of num_key_value_heads"),
])
def test_a_config_missing_a_field_names_it(config, match):
    with pytest.raises(ValueError, match=match):
        load_model(config)


def test_unknown_model_lists_the_bundled_ones():
    with pytest.raises(ValueError, match="llama-3.1-8b"):
        load_model("no-such-model")


def test_transformer_config_and_its_windows():
    from attnlab.transformer import TransformerConfig

    c = TransformerConfig(vocab_size=50, d_model=64, num_layers=3, num_heads=4, num_kv_heads=2, ffn="gated",
                          positions="rotary", norm="rmsnorm", activation="silu", d_ff=96, max_positions=128,
                          sliding_window=16, layer_types=("sliding_attention", "full_attention", "sliding_attention"))
    a = load_model(c)
    assert (a.num_layers, a.num_heads, a.num_kv_heads, a.head_dim, a.intermediate_size) == (3, 4, 2, 16, 96)
    assert a.windows == (16, None, 16) and a.dtype == "float32"


def test_the_older_field_names_are_read_too():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Older:  # a TransformerConfig from before the num_layers / num_heads rename
        vocab_size: int = 50
        d_model: int = 64
        n_layers: int = 2
        n_heads: int = 4
        heads_kv: int = 4
        head_dim: int = 16
        hidden_ff: int = 256
        max_positions: int = 128
        ffn: str = "mlp"
        tie_embeddings: bool = True
        positions: str = "learned"
        bias: bool = True

    a = load_model(Older())
    assert (a.num_layers, a.num_heads, a.windows) == (2, 4, (None, None))


@pytest.mark.needs("torch")
@pytest.mark.parametrize(("cache", "window"), [("dense", None), ("window", 8)])
def test_kv_bytes_equal_attnlabs_own_cache_after_generating(cache, window):
    """The formula's bytes are those attnlab's generate holds: a dense cache of prompt + new − 1 tokens
    (the last new token is chosen, never written), a window layer's ring of W beside a full layer."""
    import torch

    from attnlab.transformer import Transformer, TransformerConfig

    types = None if window is None else ("sliding_attention", "full_attention")
    c = TransformerConfig(vocab_size=50, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn="gated",
                          positions="rotary", norm="rmsnorm", activation="silu", d_ff=96, max_positions=128,
                          sliding_window=window, layer_types=types)
    prompt, new = 20, 7
    torch.manual_seed(0)
    g = Transformer(c).eval().generate(torch.randint(0, 50, (2, prompt)), new, cache=cache, stop_ids=[])
    assert int(g.lengths.min()) == new  # no sequence stopped early
    assert g.kv_cache.nbytes == f.kv_bytes(load_model(c), prompt + new - 1, 2, 4)


@pytest.mark.parametrize("cache_dtype, per_token, fixed", [
    ("bfloat16", 2 * 128 * 2, 0), ("float32", 2 * 128 * 4, 0), ("int8", 2 * (128 + 4), 0),  # codes + a scale per token
    ("fp8", 2 * 128, 2 * 4),  # codes; one scale per sequence and head
    ("int4", 2 * (64 + 8 * 4), 2 * 160 * 128 * 2),  # packed codes + a scale and zero per group of 32; the residual
])
def test_a_cache_dtype_counts_its_codes_and_scales(cache_dtype, per_token, fixed):
    """Bytes per token and k/v head of each stored format (docs/generation.md, quantized caches), keys and values."""
    from attnlab.planner.cache_format import cache_format

    c = cache_format(128, "bfloat16", cache_dtype, None, 131072)
    assert (c.per_token, c.fixed) == (per_token, fixed)
    a = load_model("llama-3.1-8b")
    assert f.kv_bytes(a, 1000, 1, 2, **c.terms()) == 32 * 8 * (1000 * per_token + fixed)


def test_a_cache_budget_stops_the_cache_growing_and_bad_ones_are_named():
    from attnlab.planner.cache_format import cache_format

    a = load_model("llama-3.1-8b")
    c = cache_format(128, "bfloat16", None, 4096, a.max_positions)
    assert f.kv_bytes(a, 100000, 1, 2, **c.terms()) == f.kv_bytes(a, 4096, 1, 2) == f.kv_bytes(a, 5000, 1, 2, **c.terms())
    for bad, match in ((("int3", None), "cache_dtype must be one of float32, .*int8, int4, fp8, got 'int3'"),
                       ((None, 4), "cache_budget must be an int from 5"), ((None, 10**6), "cache_budget .* 131,072")):
        with pytest.raises(ValueError, match=match):
            cache_format(128, "bfloat16", *bad, a.max_positions)
    with pytest.raises(ValueError, match="head width 48 is not divisible by 32"):
        cache_format(48, "bfloat16", "int4", None, 1024)
