"""The planner's reading of the models of 2025 (:mod:`attnlab.planner.models` holds the rest): what Qwen3,
Qwen3-MoE, Gemma-3, gpt-oss and DeepSeek-V3 configs add to an :class:`~attnlab.planner.models.Architecture`
(latent attention, experts, published weight formats), their bundled configs, and the same fields from
attnlab's own TransformerConfig. Plain dicts in and out: no import of the models module."""

from __future__ import annotations

from typing import Any

# (config.json numbers, where published, which version, aliases): transcribed from the published files
# (the hub cannot be reached here), the URL says where each can be checked. Gemma-3's is the text config
# of its multimodal config.json; gpt-oss's and DeepSeek-V3's keep their quantization_config.
_QWEN3 = {"model_type": "qwen3", "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
_GPT_OSS = {"model_type": "gpt_oss", "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
            "hidden_size": 2880, "intermediate_size": 2880, "vocab_size": 201088, "max_position_embeddings": 131072,
            "sliding_window": 128, "experts_per_token": 4, "attention_bias": True, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "mxfp4"}}
BUNDLED_2025: dict[str, tuple] = {
    "qwen3-8b": (_QWEN3 | {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                           "hidden_size": 4096, "intermediate_size": 12288},
                 "https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json", "Qwen3, April 2025", ("qwen/qwen3-8b",)),
    "qwen3-32b": (_QWEN3 | {"num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
                            "hidden_size": 5120, "intermediate_size": 25600},
                  "https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json", "Qwen3, April 2025", ("qwen/qwen3-32b",)),
    "qwen3-30b-a3b": (_QWEN3 | {"model_type": "qwen3_moe", "num_hidden_layers": 48, "num_attention_heads": 32,
                                "num_key_value_heads": 4, "hidden_size": 2048, "intermediate_size": 6144,
                                "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                                "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []},
                      "https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json", "Qwen3, April 2025",
                      ("qwen/qwen3-30b-a3b",)),
    "gemma-3-27b": ({"model_type": "gemma3_text", "num_hidden_layers": 62, "num_attention_heads": 32,
                     "num_key_value_heads": 16, "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
                     "vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window": 1024,
                     "sliding_window_pattern": 6, "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
                    "https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json (text_config)",
                    "Gemma 3, March 2025", ("google/gemma-3-27b-it", "gemma-3-27b-it")),
    "gpt-oss-20b": (_GPT_OSS | {"num_hidden_layers": 24, "num_local_experts": 32},
                    "https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json", "gpt-oss, August 2025",
                    ("openai/gpt-oss-20b",)),
    "gpt-oss-120b": (_GPT_OSS | {"num_hidden_layers": 36, "num_local_experts": 128},
                     "https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json", "gpt-oss, August 2025",
                     ("openai/gpt-oss-120b",)),
    "deepseek-v3": ({"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128,
                     "num_key_value_heads": 128, "hidden_size": 7168, "intermediate_size": 18432,
                     "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
                     "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
                     "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                     "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
                     "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                     "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}},
                    "https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json", "DeepSeek-V3, December 2024",
                    ("deepseek-ai/deepseek-v3", "deepseek-v3-0324")),
}


def _int(c: dict, name: str, where: str, default: Any = None) -> int:
    value = c.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: {name} must be an int >= 0, got {value!r}")
    return value


def _formats(c: dict, where: str) -> dict:
    """The published weight formats from ``quantization_config``: gpt-oss's MXFP4 experts, DeepSeek's FP8 blocks."""
    q = c.get("quantization_config")
    if not q:
        return {}
    method = q.get("quant_method")
    if method == "mxfp4":
        return {"expert_format": "mxfp4"}
    if method == "fp8" and list(q.get("weight_block_size") or []) == [128, 128]:
        return {"linear_format": "fp8-block128"}
    raise ValueError(f"{where}: quantization_config must be MXFP4 (quant_method 'mxfp4') or FP8 in 128 x 128 blocks "
                     f"(quant_method 'fp8', weight_block_size [128, 128]), the published formats the planner counts, "
                     f"got {q!r}")


def extra_fields(c: dict, kind: str, where: str, layers: int) -> dict:
    """The fields beyond a dense decoder's that the config of ``kind`` gives (head_dim where MLA's differs)."""
    out = _formats(c, where)
    if kind == "deepseek_v3":
        rope, nope = _int(c, "qk_rope_head_dim", where, 64), _int(c, "qk_nope_head_dim", where, 128)
        out.update(head_dim=nope + rope, kv_lora_rank=_int(c, "kv_lora_rank", where, 512), rope_dim=rope,
                   q_lora_rank=_int(c, "q_lora_rank", where, 0) if c.get("q_lora_rank") is not None else 0,
                   v_head_dim=_int(c, "v_head_dim", where, 128), num_experts=_int(c, "n_routed_experts", where, 256),
                   experts_per_token=_int(c, "num_experts_per_tok", where, 8),
                   expert_size=_int(c, "moe_intermediate_size", where, 2048),
                   shared_size=_int(c, "moe_intermediate_size", where, 2048) * _int(c, "n_shared_experts", where, 1),
                   dense_layers=min(_int(c, "first_k_dense_replace", where, 3), layers))
    elif kind == "qwen3_moe":
        step, only = _int(c, "decoder_sparse_step", where, 1) or 1, set(c.get("mlp_only_layers") or ())
        experts = c.get("num_local_experts", c.get("num_experts", 128))
        out.update(num_experts=experts, experts_per_token=_int(c, "num_experts_per_tok", where, 8),
                   expert_size=_int(c, "moe_intermediate_size", where, 768),
                   dense_layers=sum(1 for i in range(layers) if i in only or (i + 1) % step))
    elif kind == "gpt_oss":
        out.update(num_experts=c.get("num_local_experts", 128),
                   experts_per_token=c.get("num_experts_per_tok", c.get("experts_per_token", 4)),
                   expert_size=_int(c, "intermediate_size", where, 2880))
    return out


def transformer_fields(cfg: Any) -> dict:
    """The same fields from attnlab's own TransformerConfig (latent attention, routed or gpt-oss experts)."""
    out: dict = {}
    a, r = getattr(cfg, "latent", None), getattr(cfg, "routing", None)
    if a is not None:
        out.update(kv_lora_rank=a.kv_rank, rope_dim=a.rope_dim, q_lora_rank=a.q_rank or 0, v_head_dim=a.v_dim)
    if getattr(cfg, "ffn", None) == "experts":
        out.update(num_experts=cfg.num_experts, experts_per_token=cfg.experts_per_token,
                   expert_size=cfg.hidden_ff if r is None else r.d_ff)
        if r is not None:
            out.update(shared_size=r.shared_d_ff, dense_layers=len(r.dense_layers))
    return out
