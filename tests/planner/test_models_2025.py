"""The planner on the models of 2025: bundled Qwen3, Qwen3-MoE, Gemma-3, gpt-oss and DeepSeek-V3 give their published
sizes; latent attention's cache is its latent and rotary key, replicated under tensor parallelism; experts count
as stored and as active; weights in their published formats (MXFP4, FP8 blocks) with their scales."""

from __future__ import annotations

import pytest

from attnlab.planner import formulas as f
from attnlab.planner.models import BUNDLED, WEIGHT_FORMATS, load_model


def _active(a) -> float:
    """Parameters a token goes through, without the embedding table (one row of it is read): OpenAI's count."""
    p = f.weight_params(a)
    return a.num_layers * sum(f.layer_matmul_params(a).values()) + p["norms_and_biases"] + p["lm_head"]


@pytest.mark.parametrize("name, billions", [
    ("qwen3-8b", 8.19), ("qwen3-32b", 32.8), ("qwen3-30b-a3b", 30.5), ("gemma-3-27b", 27.0),
    ("gpt-oss-20b", 20.9), ("gpt-oss-120b", 116.8), ("deepseek-v3", 671.0),
])
def test_parameter_counts_match_the_published_sizes(name, billions):
    assert sum(f.weight_params(load_model(name)).values()) / 1e9 == pytest.approx(billions, rel=0.005)


@pytest.mark.parametrize("name, billions", [("gpt-oss-20b", 3.61), ("gpt-oss-120b", 5.13), ("deepseek-v3", 37.0)])
def test_active_parameters_match_the_published_counts(name, billions):
    # OpenAI's model card: 3.61B and 5.13B active; DeepSeek-V3's report: 37B activated per token
    assert _active(load_model(name)) / 1e9 == pytest.approx(billions, rel=0.015)


def test_deepseek_v3_caches_its_latent_and_rotary_key():
    a = load_model("deepseek-v3")
    assert a.latent and f.kv_bytes(a, 1, 1, 2) == 61 * (512 + 64) * 2 == 70272
    per_head = 61 * 128 * (192 + 128) * 2  # each head's key (nope 128 + rope 64) and value (128)
    assert per_head // 70272 == 71  # the "about 1/71"


def test_mla_is_replicated_under_tensor_parallelism_and_gpus_need_only_split_the_query_heads():
    import attnlab

    one = attnlab.plan("deepseek-v3", hardware="h200", prompt_tokens=8000, gpus=1)
    eight = attnlab.plan("deepseek-v3", hardware="h200", prompt_tokens=8000, gpus=8)
    assert eight.kv_bytes == one.kv_bytes == 70272 * (8000 + 256)  # every device holds the whole latent cache
    assert eight.weight_bytes == pytest.approx(one.weight_bytes / 8)
    with pytest.raises(ValueError, match="gpus must split deepseek-v3's 128 query heads evenly .* got 3"):
        attnlab.plan("deepseek-v3", hardware="h200", prompt_tokens=8000, gpus=3)


def test_published_formats_count_their_scales():
    oss, ds = load_model("gpt-oss-120b"), load_model("deepseek-v3")
    assert (oss.expert_format, ds.linear_format) == ("mxfp4", "fp8-block128")
    assert WEIGHT_FORMATS["mxfp4"] == 4.25 / 8 and WEIGHT_FORMATS["fp8-block128"] == 1 + 4 / 128 ** 2
    p = f.weight_params(oss)
    rest = p["layers"] * 2 + (p["norms_and_biases"] + p["embedding"] + p["lm_head"]) * 2
    assert f.weight_bytes(oss, 2) == pytest.approx(p["experts"] * 4.25 / 8 + rest)
    assert 60e9 < f.weight_bytes(oss, 2) < 70e9  # the published checkpoint: about 65 GB
    with pytest.raises(ValueError, match="quantization_config must be MXFP4 .* got"):
        load_model(dict(BUNDLED["deepseek-v3"].config, quantization_config={"quant_method": "awq"}))


def test_a_decode_step_reads_the_experts_its_batch_chose():
    a = load_model("gpt-oss-120b")  # 128 experts, 4 per token
    expert = 3 * a.hidden_size * a.expert_size * WEIGHT_FORMATS["mxfp4"]
    one, sixty_four = f.decode_weight_bytes(a, 2, 1), f.decode_weight_bytes(a, 2, 64)
    assert one - f.decode_weight_bytes(load_model(dict(BUNDLED["gpt-oss-120b"].config, num_experts_per_tok=1)), 2, 1) \
        == pytest.approx(3 * a.num_layers * expert)
    assert f.distinct_experts(a, 1) == pytest.approx(4) and f.distinct_experts(a, 64) == pytest.approx(
        128 * (1 - (1 - 4 / 128) ** 64))
    assert sixty_four - one == pytest.approx((f.distinct_experts(a, 64) - 4) * a.num_layers * expert)


def test_local_layers_bound_their_cache():
    gemma, oss = load_model("gemma-3-27b"), load_model("gpt-oss-120b")
    assert gemma.windows[:6] == (1024,) * 5 + (None,) and oss.windows[:2] == (128, None)
    assert f.kv_bytes(gemma, 100000, 1, 2) == 2 * 16 * 128 * 2 * (52 * 1024 + 10 * 100000)


def test_gemma_3s_multimodal_config_is_read_as_its_text_model():
    text = BUNDLED["gemma-3-27b"].config
    wrapped = {"model_type": "gemma3", "torch_dtype": "bfloat16", "vision_config": {"hidden_size": 1152},
               "text_config": {k: v for k, v in text.items() if k != "model_type"}}
    assert load_model(wrapped).windows == load_model("gemma-3-27b").windows
    assert f.kv_bytes(load_model(wrapped), 4096, 1, 2) == f.kv_bytes(load_model("gemma-3-27b"), 4096, 1, 2)


def test_a_latent_cache_counts_its_row_in_a_float_cache_dtype_and_refuses_a_quantized_one():
    from attnlab.planner.cache_format import cache_format
    a = load_model("deepseek-v3")
    c = cache_format(a.head_dim, "bfloat16", "float32", None, a.max_positions, a.kv_lora_rank + a.rope_dim)
    assert f.kv_bytes(a, 10, 1, 2, **c.terms()) == 61 * (512 + 64) * 4 * 10
    with pytest.raises(ValueError, match="latent attention cache"):
        cache_format(a.head_dim, "bfloat16", "int8", None, a.max_positions, a.kv_lora_rank + a.rope_dim)


def test_a_config_file_is_named_by_its_own_name_a_folders_by_the_folder(tmp_path):
    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 256}
    (tmp_path / "small-llama.json").write_text(__import__("json").dumps(config))
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "config.json").write_text(__import__("json").dumps(config))
    assert load_model(str(tmp_path / "small-llama.json")).name == "small-llama"
    assert load_model(str(tmp_path / "folder")).name == "folder"
