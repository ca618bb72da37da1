"""The configs of the mixture-of-experts decoders: DeepSeek-V3 (multi-head latent attention, sigmoid
routing with a correction bias over groups of experts, shared experts, dense first layers) and
Qwen3-MoE (Qwen3's attention, softmax routing), read from a transformers config dict as transformers
fills in what it leaves out. :meth:`TransformerConfig.from_hf` hands these families here and builds the
config from what comes back (the dict with the family's defaults, and the fields beyond a rotary
decoder's); an option that changes the math and is not computed is refused naming the key and value."""

from __future__ import annotations

import math

from attnlab.transformer.shapes import Latent, Routing

LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers' names (as config.LAYER_TYPES)

# DeepSeek-V3's config defaults where config.json leaves them out (transformers' DeepseekV3Config)
DEEPSEEK_V3 = {"n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1,
               "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
               "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
               "norm_topk_prob": True, "rope_interleave": True, "max_position_embeddings": 4096,
               "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


def _refuse(c: dict, key: str, allowed: tuple) -> None:
    if key in c and c[key] not in allowed:
        raise ValueError(f"{key} must be one of {', '.join(map(repr, allowed))} (what attnlab's transformer computes), "
                         f"got {c[key]!r}")


def deepseek_v3(c: dict) -> tuple[dict, dict]:
    """DeepSeek-V3: MLA (its softmax scale 1/√(nope + rope) times YaRN's mscale(factor, mscale_all_dim)²,
    as transformers' ``yarn_apply_mscale``), routed and shared experts, ``first_k_dense_replace`` dense layers."""
    c = DEEPSEEK_V3 | {k: v for k, v in c.items() if v is not None or k == "q_lora_rank"}
    _refuse(c, "scoring_func", ("sigmoid",))
    _refuse(c, "topk_method", ("noaux_tc",))
    latent = Latent(kv_rank=c["kv_lora_rank"], rope_dim=c["qk_rope_head_dim"], nope_dim=c["qk_nope_head_dim"],
                    v_dim=c["v_head_dim"], q_rank=c.get("q_lora_rank"), interleave=bool(c["rope_interleave"]))
    params = dict(c.get("rope_scaling") or {}) | dict(c.get("rope_parameters") or {})
    scale, m_all = latent.qk_dim ** -0.5, params.get("mscale_all_dim")
    if params.get("rope_type", params.get("type", "default")) != "default" and m_all:
        factor = float(params.get("factor") or c["max_position_embeddings"] / params["original_max_position_embeddings"])
        scale *= (0.1 * m_all * math.log(factor) + 1.0) ** 2 if factor > 1 else 1.0
    layers, experts = c["num_hidden_layers"], c["n_routed_experts"]
    routing = Routing(d_ff=c["moe_intermediate_size"], score="sigmoid", normalize=bool(c["norm_topk_prob"]),
                      scale=float(c["routed_scaling_factor"]), groups=c["n_group"], top_groups=c["topk_group"],
                      score_bias=True, shared_d_ff=c["moe_intermediate_size"] * c["n_shared_experts"],
                      dense_layers=tuple(range(min(c["first_k_dense_replace"], layers))))
    return c, dict(d_head=latent.qk_dim, num_kv_heads=None, attn_scale=scale, latent=latent, ffn="experts",
                   num_experts=experts, experts_per_token=c["num_experts_per_tok"], routing=routing)


def qwen3_moe(c: dict) -> tuple[dict, dict]:
    """Qwen3 (QK-norm) whose FFNs are routed experts: softmax over every expert, the top-k renormalised when
    ``norm_topk_prob``; the layers of ``mlp_only_layers``, and those off ``decoder_sparse_step``, dense."""
    c = {"max_position_embeddings": 32768} | c  # Qwen3MoeConfig's default
    n, step = c["num_hidden_layers"], c.get("decoder_sparse_step", 1)
    experts = c.get("num_local_experts", c.get("num_experts", 128))  # transformers 5 saves the former
    only = set(c.get("mlp_only_layers") or ())
    dense = tuple(i for i in range(n) if i in only or experts == 0 or (i + 1) % step)
    window = c.get("sliding_window", 4096) if c.get("use_sliding_window", False) else None
    for i, kind in enumerate(c.get("layer_types") or ()):  # a hybrid's layer type is refused by name
        if kind not in LAYER_TYPES:
            raise ValueError(f"layer_types[{i}] must be one of {', '.join(LAYER_TYPES)} (the layer kinds attnlab's "
                             f"transformer computes), got {kind!r}")
    routing = Routing(d_ff=c.get("moe_intermediate_size", 768), score="softmax",
                      normalize=bool(c.get("norm_topk_prob", False)), dense_layers=dense)
    return c, dict(qk_norm=True, sliding_window=window, ffn="experts", num_experts=experts,
                   experts_per_token=c.get("num_experts_per_tok", 8), routing=routing)
