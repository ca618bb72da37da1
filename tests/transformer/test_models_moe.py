"""The mixture-of-experts decoders in attnlab's transformer: DeepSeek-V3 (multi-head latent attention, grouped
sigmoid routing with its correction bias, shared experts, dense first layers) and Qwen3-MoE (softmax routing).
Tiny random models built from transformers' own config classes (conftest's DECODERS): logits equal
transformers' on padded batches, 128 cached float64 steps equal a recompute, greedy ids equal transformers'
generate; the latent cache holds the latent and the rotary key only, and decoding in the latent space equals
the expanded keys and values."""

from __future__ import annotations

import json
import math

import pytest

from .test_architectures_gen import _padded_batch

pytestmark = pytest.mark.usefixtures("one_thread")
MOE = ("deepseek_v3", "deepseek_v3_plain", "qwen3_moe")
PROMPT = [5, 17, 3, 42, 8, 23, 11, 2, 30]


def _ours(decoder_folder, family, dtype="float32", backend="torch"):
    from attnlab.transformer import Transformer

    return Transformer.from_pretrained(decoder_folder(family), dtype=dtype, backend=backend)


def _theirs(decoder_folder, family, dtype):
    """transformers' model, eager attention and its eager experts loop (its grouped matmul refuses float64)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(decoder_folder(family), dtype=dtype, attn_implementation="eager",
                                                experts_implementation="eager").eval()


@pytest.mark.parametrize("family", MOE)
def test_logits_equal_transformers(decoder_folder, family):
    import torch

    ours = _ours(decoder_folder, family)
    ids, mask = _padded_batch(ours.config.vocab_size)
    with torch.no_grad():
        ref = _theirs(decoder_folder, family, torch.float32)(input_ids=ids, attention_mask=mask,
                                                             output_hidden_states=True)
        hidden = ours(ids, mask)
    real = mask.bool()
    assert float((hidden - ref.hidden_states[-1])[real].abs().max()) < 1e-5
    assert float((ours.logits(hidden) - ref.logits)[real].abs().max()) < 1e-5


@pytest.mark.parametrize("backend", ["sdpa", "blockwise", "kernel", "numpy", "auto"])
def test_every_backend_equals_transformers(decoder_folder, backend):
    import torch

    ours = _ours(decoder_folder, "deepseek_v3", backend=backend)
    ids, mask = _padded_batch(ours.config.vocab_size)
    with torch.no_grad():
        ref = _theirs(decoder_folder, "deepseek_v3", torch.float32)(input_ids=ids, attention_mask=mask).logits
        logits = ours.logits(ours(ids, mask))
    assert float((logits - ref)[mask.bool()].abs().max()) < 1e-4


@pytest.mark.parametrize("family", MOE)
def test_128_cached_steps_equal_recomputing_the_sequence(decoder_folder, family):
    """DeepSeek-V3's cached steps attend in the latent space (W_UK absorbed into the query, W_UV after), its
    recompute with every head's expanded keys and values: the two agree within 1e-12 in float64."""
    import torch

    m = _ours(decoder_folder, family, "float64")
    g = m.generate([PROMPT], 128)
    with torch.no_grad():
        full = m.run_with_hooks(torch.tensor([g.sequences[0]]))[0]  # (P + 128, V)
    P = len(PROMPT)
    assert float((g.logits[0] - full[P - 1: P + 127]).abs().max()) < 1e-12
    assert torch.equal(g.ids[0], g.logits[0].argmax(-1))


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_moe"])
def test_greedy_ids_equal_transformers_generate(decoder_folder, family):
    import torch

    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        ref = _theirs(decoder_folder, family, torch.float64).generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False, eos_token_id=None,
            pad_token_id=0)[0, len(PROMPT):]
    assert _ours(decoder_folder, family, "float64").generate(ids, 64).ids[0].tolist() == ref.tolist()


def test_the_latent_cache_holds_the_latent_and_the_rotary_key_only(decoder_folder):
    """Per token and layer kv_rank + rope_dim numbers (16 + 8 here; DeepSeek-V3: 512 + 64), one row for all heads,
    against 2 · H · head widths for a per-head cache (H · (nope + rope) keys + H · v values)."""
    import torch

    m = _ours(decoder_folder, "deepseek_v3", "float64")
    g = m.generate([PROMPT, PROMPT[:4]], 7)
    kv, c, a = g.kv_cache, m.config, m.config.latent
    capacity = len(PROMPT) + 7 - 1
    assert kv.kinds == ("latent",) * c.num_layers
    assert kv.nbytes == c.num_layers * 2 * capacity * (16 + 8) * 8  # B = 2, float64
    per_head = c.num_layers * 2 * capacity * c.num_heads * (a.qk_dim + a.v_dim) * 8
    assert per_head / kv.nbytes == pytest.approx(4 * (16 + 12) / 24)
    assert all(layer.v is layer.k for layer in kv.layers)  # the values are the latent rows, not a copy
    assert json.loads(json.dumps(g.to_dict()))["kv_cache"]["nbytes"] == kv.nbytes
    with pytest.raises(ValueError, match="cache='window'.*latent attention.*not implemented"):
        m.generate([PROMPT], 4, cache="window", window=4)
    assert torch.equal(g.ids[1], m.generate([PROMPT[:4]], 7).ids[0])  # a ragged batch: each prompt as alone


def test_latent_decoding_equals_expanded_keys_and_values(decoder_folder):
    """One decoding step's z of every layer, from the latent read, equals attention over the expanded per-head
    keys and values rebuilt from the same cached rows (float64)."""
    import torch

    from attnlab.transformer.cache import KVCache
    from attnlab.transformer.latent import pairs_to_halves
    from attnlab.transformer.rotary import rotate

    m = _ours(decoder_folder, "deepseek_v3", "float64")
    c, a = m.config, m.config.latent
    kv = KVCache.for_model(c, 1, dtype=torch.float64)
    with torch.no_grad():
        m(torch.tensor([PROMPT]), kv_cache=kv)
        _, got = m.run_with_cache(torch.tensor([[9]]), kv_cache=kv, names=lambda n: n.endswith(("hook_z", "hook_q")))
    T = len(PROMPT) + 1
    for layer, block in enumerate(m.blocks):
        rows = kv.layers[layer].k[:, :, :T]  # (1, 1, T, r + rope)
        k, v = block.attn.expand(rows[..., : a.kv_rank], rows[..., a.kv_rank:])  # (1, H, T, ·)
        q = got[f"blocks.{layer}.attn.hook_q"]  # (1, H, 1, nope + rope) before rotary
        cos, sin = (x[-1:] for x in m._rope(torch.arange(T))["rope"])  # the new token's angles (1, rope)
        q = torch.cat((q[..., : a.nope_dim], rotate(pairs_to_halves(q[..., a.nope_dim:]), (cos, sin))), dim=-1)
        w = ((q @ k.transpose(-1, -2)) * c.attn_scale).softmax(-1)  # (1, H, 1, T)
        assert float((w @ v - got[f"blocks.{layer}.attn.hook_z"]).abs().max()) < 1e-12


def test_the_kernel_decodes_the_latent_cache_in_place(decoder_folder, monkeypatch):
    """A float32 decoding step reaches the compiled decode pass with k and v the cache's own rows (no copy)."""
    from attnlab.backends import kernel

    seen = []
    real = kernel._run_decode
    monkeypatch.setattr(kernel, "_run_decode", lambda call: seen.append(call) or real(call))
    m = _ours(decoder_folder, "deepseek_v3", backend="kernel")
    g = m.generate([PROMPT], 3)
    assert len(seen) == 3 * m.config.num_layers  # the prompt (9 rows: up to 32 go to the decode pass) and 2 steps
    for call in seen:
        assert call.k.data_ptr() == call.v.data_ptr() and call.k.shape[1] == 1 and call.q.shape[-1] == 16 + 8
    assert g.ids.tolist() == _ours(decoder_folder, "deepseek_v3").generate([PROMPT], 3).ids.tolist()


def test_configs_read_what_changes_the_math(decoder_folder):
    import transformers

    from attnlab.transformer import TransformerConfig

    ds = TransformerConfig.from_hf(json.loads((decoder_folder("deepseek_v3") / "config.json").read_text()))
    a, r = ds.latent, ds.routing
    assert (a.kv_rank, a.rope_dim, a.nope_dim, a.v_dim, a.q_rank, a.interleave) == (16, 8, 8, 12, 24, True)
    assert (ds.d_head, ds.rotary_dim, ds.num_experts, ds.experts_per_token) == (16, 8, 8, 2)
    assert (r.score, r.groups, r.top_groups, r.score_bias, r.scale, r.shared_d_ff, r.dense_layers) == (
        "sigmoid", 4, 2, True, 2.5, 16, (0,))
    assert [ds.routed(i) for i in range(3)] == [False, True, True]
    assert ds.attn_scale == pytest.approx(16 ** -0.5 * (0.1 * math.log(5.0) + 1) ** 2)
    qm = TransformerConfig.from_hf(json.loads((decoder_folder("qwen3_moe") / "config.json").read_text()))
    assert qm.qk_norm and qm.routing.score == "softmax" and qm.routing.normalize and qm.routing.dense_layers == (1,)
    # config.json without the MoE keys reads as transformers fills them in
    tiny = dict(vocab_size=64, hidden_size=64, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4)
    for cls in (transformers.DeepseekV3Config, transformers.Qwen3MoeConfig):
        assert TransformerConfig.from_hf({"model_type": cls.model_type, **tiny}) == TransformerConfig.from_hf(cls(**tiny))


@pytest.mark.parametrize("change, match", [
    ({"scoring_func": "softmax"}, "scoring_func must be one of 'sigmoid'.* got 'softmax'"),
    ({"topk_method": "greedy"}, "topk_method must be one of 'noaux_tc'.* got 'greedy'"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type .* got 'longrope'"),
    ({"hidden_act": "gelu"}, "hidden_act must be 'silu', got 'gelu'"),
])
def test_what_it_does_not_compute_is_refused_by_key_and_value(decoder_folder, change, match):
    from attnlab.transformer import TransformerConfig

    c = json.loads((decoder_folder("deepseek_v3") / "config.json").read_text())
    with pytest.raises(ValueError, match=match):
        TransformerConfig.from_hf(c | change)


def test_hook_points_of_latent_attention_and_routing(decoder_folder, monkeypatch):
    """Every hook point fires once, in order; the dense layer has no routing points; the latent is (B, 1, T, r);
    the routing's scores (B, T, E) and choice (B, T, k); replacing the choice reroutes; each expert runs at most
    once per layer, on its own tokens."""
    import torch

    from attnlab.transformer.routed import RoutedExperts

    m = _ours(decoder_folder, "deepseek_v3", "float64")
    names = m.hook_names()
    assert "blocks.0.mlp.hook_expert_weights" not in names and "blocks.1.mlp.hook_expert_weights" in names
    assert "blocks.0.attn.hook_latent" in names and "blocks.0.attn.hook_k" not in names
    ids, mask = _padded_batch(m.config.vocab_size)
    runs: list = []
    real = RoutedExperts._expert
    with monkeypatch.context() as patch, torch.no_grad():
        patch.setattr(RoutedExperts, "_expert", lambda self, e, x: runs.append((id(self), e, x.shape[0])) or real(self, e, x))
        plain = m.logits(m(ids, mask))
    assert len({(layer, e) for layer, e, _ in runs}) == len(runs)  # each expert at most once per layer
    assert sum(n for _, _, n in runs) == 2 * ids.numel() * 2  # two routed layers: every token's two choices
    with torch.no_grad():
        logits, cache = m.run_with_cache(ids, mask)
        fixed = m.run_with_hooks(ids, mask, fwd_hooks=[("blocks.2.mlp.hook_expert_indices",
                                                        lambda x, _: torch.zeros_like(x) + torch.arange(2))])
    assert list(cache) == list(names) and float((plain - logits).abs().max()) < 1e-12
    T = ids.shape[1]
    assert cache["blocks.1.attn.hook_latent"].shape == (3, 1, T, 16)
    assert cache["blocks.1.attn.hook_rot_k"].shape == (3, 1, T, 8) and cache["blocks.1.attn.hook_z"].shape == (3, 4, T, 12)
    assert cache["blocks.1.mlp.hook_expert_weights"].shape == (3, T, 8)
    assert cache["blocks.1.mlp.hook_expert_indices"].shape == (3, T, 2)
    assert float((fixed - plain).abs().max()) > 1e-3
    with pytest.raises(ValueError, match="hook_expert_indices must hold expert ids"):
        m.run_with_hooks(ids, mask, fwd_hooks=[("blocks.1.mlp.hook_expert_indices", lambda x, _: x + 8)])


def test_attribution_patching_and_ablation_work_on_latent_heads(decoder_folder):
    """Direct logit attribution over heads (z of v_dim through their slice of the output projection), the dense
    MLP, the mixtures (routed and shared experts as one component per layer) adds up to the logit difference
    within 1e-10 in float64; patching every head's z restores the clean run; a head knocked out by ablation
    changes the loss."""
    import numpy as np
    import torch

    from attnlab import patch
    from attnlab.interventions.ablation import knockout, lm_loss
    from attnlab.interventions.attribution import logit_attribution

    m = _ours(decoder_folder, "deepseek_v3", "float64")
    a = logit_attribution(m, torch.tensor([PROMPT]), 7, baseline=9)
    assert abs(a.error) < 1e-10 and len(a.components) == 1 + 3 * (4 + 1) + 1  # embed, 3 × (4 heads + mlp), bias
    clean, corrupted = torch.tensor([PROMPT]), torch.tensor([[6] + PROMPT[1:]])
    out = patch(m, clean, corrupted, lambda logits: logits[:, -1, 7] - logits[:, -1, 9])
    assert out.effect.shape == (3, 4) and np.isfinite(out.effect).all()
    ids, mask = _padded_batch(m.config.vocab_size)
    keep = torch.ones(3, 4, dtype=torch.float64)
    keep[1, 2] = 0
    with torch.no_grad():
        assert float((lm_loss(m, ids, mask, fwd_hooks=knockout(m.config, keep)) - lm_loss(m, ids, mask)).abs().max()) > 0


def test_past_the_trained_positions_is_refused_by_name(decoder_folder):
    m = _ours(decoder_folder, "deepseek_v3")
    with pytest.raises(ValueError, match="max_new_tokens=400: .* passes the model's 320 positions; latent attention"):
        m.generate([PROMPT], 400)


@pytest.mark.parametrize("family, cache", [("qwen3", "dense"), ("gemma3", "window"), ("gpt_oss", "window"),
                                           ("deepseek_v3", "dense"), ("qwen3_moe", "dense")])
def test_the_planners_kv_bytes_equal_the_cache_generate_keeps(decoder_folder, family, cache):
    """The planner reads the model's config.json as the transformer does: its KV bytes for the tokens held equal
    the cache's nbytes after generate (local layers' rings of W, MLA's latent rows)."""
    from attnlab.planner import formulas as f
    from attnlab.planner.models import load_model

    m = _ours(decoder_folder, family, "float64")
    g = m.generate([PROMPT], 20, cache=cache)
    held = len(PROMPT) + 20 - 1
    for a in (load_model(decoder_folder(family)), load_model(m.config)):  # its config.json, attnlab's own config
        assert f.kv_bytes(a, held, 1, 8) == g.kv_cache.nbytes


def test_generate_maps_of_latent_attention_are_rows_of_the_full_map(decoder_folder):
    """Each step's row (the latent read's weights, in position order) equals that row of the expanded forward's
    pattern in float64: the weights are the same numbers whichever way the scores are summed."""
    import torch

    m = _ours(decoder_folder, "deepseek_v3", "float64")
    g = m.generate([PROMPT], 6, maps=True)
    with torch.no_grad():
        _, cache = m.run_with_cache(torch.tensor([g.sequences[0]]), names=lambda n: n.endswith("hook_pattern"))
    full = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"][0] for layer in range(3)])  # (L, H, T, T)
    for t, row in enumerate(g.attention[0]):
        p = g.positions[0][t]
        assert float((torch.from_numpy(row) - full[:, :, p, : p + 1]).abs().max()) < 1e-12


def test_a_config_whose_parts_do_not_fit_is_refused_by_name():
    from attnlab.transformer import TransformerConfig
    from attnlab.transformer.shapes import Latent, Routing

    base = dict(vocab_size=64, d_model=32, num_layers=2, num_heads=4, positions="rotary")
    with pytest.raises(ValueError, match="latent attention needs rotary positions and d_head = nope_dim \\+ rope_dim = 24"):
        TransformerConfig(**base, latent=Latent(kv_rank=16, rope_dim=8, nope_dim=16, v_dim=8))
    with pytest.raises(ValueError, match="routing goes with ffn='experts', num_experts .* routing.groups=3"):
        TransformerConfig(**base, ffn="experts", num_experts=8, experts_per_token=2, routing=Routing(d_ff=8, groups=3))
    with pytest.raises(ValueError, match="routing.top_groups must be at most groups=2, got 3"):
        Routing(d_ff=8, groups=2, top_groups=3)
    with pytest.raises(ValueError, match="latent.rope_dim must be even"):
        Latent(kv_rank=16, rope_dim=7, nope_dim=8, v_dim=8)


def test_deepseek_v3s_published_config_reads_as_transformers_reads_it():
    """DeepSeek-V3's config.json as published (older keys: rope_scaling with "type", scoring_func, topk_method):
    YaRN's frequencies over the 64 rotary dims and its cos/sin factor as transformers computes them, and the softmax
    scale 1/√192 times mscale(40, mscale_all_dim)² (transformers' yarn_apply_mscale)."""
    import torch
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    from attnlab.transformer import TransformerConfig
    from attnlab.transformer.rotary import frequencies

    published = {"model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
                 "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
                 "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
                 "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
                 "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
                 "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True, "scoring_func": "sigmoid",
                 "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
                 "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                                  "original_max_position_embeddings": 4096, "type": "yarn"},
                 "tie_word_embeddings": False, "hidden_act": "silu"}
    c = TransformerConfig.from_hf(published)
    hf = transformers.DeepseekV3Config(**{k: v for k, v in published.items() if k != "model_type"})
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    torch.testing.assert_close(frequencies(c), inv.double(), rtol=1e-6, atol=0)
    assert c.rope_attention_factor == pytest.approx(factor, rel=1e-12)
    assert c.attn_scale == pytest.approx(yarn_apply_mscale(hf.rope_parameters, 192 ** -0.5), rel=1e-12)
    assert (c.latent.cached, c.routing.dense_layers, c.num_experts) == (576, (0, 1, 2), 256)
