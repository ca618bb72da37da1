"""The decoders of 2025 in attnlab's transformer: Qwen3 and Gemma-3 (QK-norm; Gemma-3's local and global layers
with a rotary base each) and gpt-oss (learned sinks, alternating window, YaRN, routed experts). Their logits and
greedy ids against transformers are in test_architectures_gen.py and test_generate.py with the other families;
here: what their configs are read as, what is refused, every backend, the hook points of the new parts, the
sinks in the pattern, and the experts each run once."""

from __future__ import annotations

import json
import math

import pytest

from .conftest import BACKENDS, WINDOW
from .test_architectures_gen import _padded_batch

pytestmark = pytest.mark.usefixtures("one_thread")
NEW = ("qwen3", "gemma3", "gpt_oss")
TOL = 1e-4


def _config_dict(decoder_folder, family: str) -> dict:
    return json.loads((decoder_folder(family) / "config.json").read_text())


def _theirs(folder, dtype=None):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                dtype=dtype or torch.float32).eval()


def test_configs_read_what_changes_the_math(decoder_folder):
    from attnlab.transformer import TransformerConfig

    qwen, gemma, oss = (TransformerConfig.from_hf(_config_dict(decoder_folder, f)) for f in NEW)
    assert qwen.qk_norm and not qwen.norm_plus_one and qwen.layer_window(0) is None and not qwen.bias
    slides = TransformerConfig.from_hf(_config_dict(decoder_folder, "qwen3") | {
        "use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1, "layer_types": None})
    assert [slides.layer_window(i) for i in range(2)] == [None, 5]  # as Qwen2: from max_window_layers on
    assert gemma.qk_norm and gemma.norm_plus_one and gemma.sandwich_norm and gemma.attn_scale == 16 ** -0.5
    assert [gemma.layer_window(i) for i in range(2)] == [WINDOW, None]
    assert [gemma.local_rope(i) for i in range(2)] == [True, False]  # the sliding layer turns by the local base
    assert (gemma.rope_local_theta, gemma.rope_theta, gemma.rope_type, gemma.rope_factor) == (1e4, 1e6, "linear", 8.0)
    assert oss.attn_sinks and oss.bias and [oss.layer_window(i) for i in range(2)] == [WINDOW, None]
    assert (oss.ffn, oss.num_experts, oss.experts_per_token) == ("experts", 8, 2)
    assert (oss.rope_type, oss.rope_factor, oss.rope_original_positions, oss.rope_truncate) == ("yarn", 5.0, 64, False)
    assert oss.rope_attention_factor == pytest.approx(0.1 * math.log(5.0) + 1.0)


def test_old_gemma3_configs_name_the_bases_apart(decoder_folder):
    """Configs written before transformers 5 give the local base as rope_local_base_freq and the global
    scaling as rope_scaling; both spellings read the same."""
    from attnlab.transformer import TransformerConfig

    new = _config_dict(decoder_folder, "gemma3")
    old = {k: v for k, v in new.items() if k != "rope_parameters"} | {
        "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    assert TransformerConfig.from_hf(old) == TransformerConfig.from_hf(new)


@pytest.mark.parametrize("family", ["Qwen3Config", "Gemma3TextConfig", "GptOssConfig"])
def test_a_config_that_leaves_out_defaults_reads_as_transformers_fills_them(family):
    """config.json without rope keys: gpt-oss's YaRN, Gemma-3's two bases (1e6 global, 1e4 local) as transformers'."""
    import transformers

    from attnlab.transformer import TransformerConfig

    tiny = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=256 * 1024)
    cls = getattr(transformers, family)
    assert TransformerConfig.from_hf({"model_type": cls.model_type, **tiny}) == TransformerConfig.from_hf(cls(**tiny))


@pytest.mark.parametrize("family, change, match", [
    ("qwen3", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
     "rope_parameters.rope_type .* got 'dynamic'"),
    ("qwen3", {"layer_types": ["full_attention", "linear_attention"]},  # Qwen3-Next's hybrid layers
     r"layer_types\[1\] .* got 'linear_attention'"),
    ("gemma3", {"rope_parameters": {"sliding_attention": {"rope_type": "yarn", "factor": 2.0},
                                    "full_attention": {"rope_type": "default"}}},
     "rope_parameters.sliding_attention.rope_type must be 'default' .* got 'yarn'"),
    ("gemma3", {"rope_parameters": {"sliding_attention": {"rope_type": "default"},
                                    "full_attention": {"rope_type": "longrope"}}},
     "rope_parameters.full_attention.rope_type .* got 'longrope'"),
    ("gpt_oss", {"model_type": "qwen3_next"}, "model_type must be one of .* got 'qwen3_next'"),
])
def test_what_it_does_not_compute_is_refused_by_key_and_value(decoder_folder, family, change, match):
    from attnlab.transformer import TransformerConfig

    with pytest.raises(ValueError, match=match):
        TransformerConfig.from_hf(_config_dict(decoder_folder, family) | change)


@pytest.mark.parametrize("rope", [
    {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
     "truncate": False, "original_max_position_embeddings": 4096},  # gpt-oss's own
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128},
])
def test_yarn_frequencies_and_factor_equal_transformers(rope):
    import torch
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from attnlab.transformer import TransformerConfig
    from attnlab.transformer.rotary import frequencies

    hf = transformers.LlamaConfig(hidden_size=128, num_attention_heads=2, max_position_embeddings=4096 * 32,
                                  rope_parameters=rope)
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    c = TransformerConfig.from_hf(hf)
    torch.testing.assert_close(frequencies(c), inv.double(), rtol=1e-6, atol=0)  # theirs: float32
    assert c.rope_attention_factor == pytest.approx(factor, rel=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", NEW)
def test_every_backend_equals_transformers(decoder_folder, family, backend):
    """The kernel serves gpt-oss's sinks fused (sink_logits=); numpy, the float64 reference, too. sdpa has
    no sinks: a model with them is refused by name there, never run without."""
    import torch

    from attnlab.transformer import Transformer

    folder = decoder_folder(family)
    ours = Transformer.from_pretrained(folder, backend=backend)
    ids, mask = _padded_batch(ours.config.vocab_size)
    if family == "gpt_oss" and backend == "sdpa":
        with pytest.raises(ValueError, match="sdpa.*sink_logits"):
            ours(ids, mask)
        return
    with torch.no_grad():
        ref = _theirs(folder)(input_ids=ids, attention_mask=mask).logits
        logits = ours.logits(ours(ids, mask))
    assert float((logits - ref)[mask.bool()].abs().max()) < TOL


def test_sinks_keep_part_of_each_row_as_transformers_does(decoder_folder):
    """With learned sinks a row's weights add up to less than 1 (the rest is the sink share); the pattern
    equals transformers' eager weights, which drop the sink's column as attnlab does."""
    import torch

    from attnlab.transformer import Transformer

    folder = decoder_folder("gpt_oss")
    ours = Transformer.from_pretrained(folder, backend="torch")
    ids = torch.arange(1, 15)[None]
    with torch.no_grad():
        _, cache = ours.run_with_cache(ids, names=lambda n: n.endswith("hook_pattern"))
        ref = _theirs(folder)(input_ids=ids, output_attentions=True).attentions
    for layer in range(2):
        w = cache[f"blocks.{layer}.attn.hook_pattern"][0]  # (H, T, T)
        share = 1 - w.sum(-1)  # (H, T): each row's sink share
        assert float(share.min()) > 0 and float(share.max()) < 1
        assert float((w - ref[layer][0]).abs().max()) < 1e-5
    assert bool((cache["blocks.0.attn.hook_pattern"][0, :, -1, : 14 - WINDOW] == 0).all())  # layer 0 slides


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_qk_norm_scales_are_hook_points(decoder_folder, family):
    """TransformerLens's names for QK-norm (use_qk_norm): blocks.{l}.attn.q_norm.hook_scale and k_norm, (B, H, T, 1)
    and (B, H_kv, T, 1), between hook_q/hook_k and rotary; watched, a norm is computed by hand (as every norm's
    hook_scale, docs/design.md): the same logits to rounding; patched, the scale takes effect."""
    import torch

    from attnlab.transformer import Transformer

    m = Transformer.from_pretrained(decoder_folder(family), dtype="float64", backend="torch")
    names = m.hook_names()
    block = [n.removeprefix("blocks.0.") for n in names if n.startswith("blocks.0.")]
    assert block.index("attn.hook_v") < block.index("attn.q_norm.hook_scale") < block.index("attn.k_norm.hook_scale") \
        < block.index("attn.hook_rot_q")
    ids, mask = _padded_batch(m.config.vocab_size)
    with torch.no_grad():
        plain = m.logits(m(ids, mask))
        logits, cache = m.run_with_cache(ids, mask, names=lambda n: "_norm." in n)
        doubled = m.run_with_hooks(ids, mask, fwd_hooks=[("blocks.1.attn.q_norm.hook_scale", lambda s, _: 2 * s)])
    assert float((plain - logits).abs().max()) < 1e-12
    assert cache["blocks.1.attn.q_norm.hook_scale"].shape == (3, 4, ids.shape[1], 1)
    assert cache["blocks.1.attn.k_norm.hook_scale"].shape == (3, 2, ids.shape[1], 1)
    assert float((doubled - plain).abs().max()) > 1e-3


def test_experts_are_hook_points_and_each_runs_once(decoder_folder, monkeypatch):
    """TransformerLens's MoE names and meanings: blocks.{l}.mlp.hook_expert_weights, the router's softmax over
    every expert before the top-k (B, T, E), and hook_expert_indices, the k chosen (B, T, k). A forward runs
    each expert at most once per layer, on its tokens only."""
    import torch

    from attnlab.transformer import Transformer
    from attnlab.transformer.experts import Experts

    m = Transformer.from_pretrained(decoder_folder("gpt_oss"), dtype="float64", backend="torch")
    ids, mask = _padded_batch(m.config.vocab_size)
    runs: list = []
    real = Experts._expert
    monkeypatch.setattr(Experts, "_expert", lambda self, e, x: runs.append((e, x.shape[0])) or real(self, e, x))
    with torch.no_grad():
        plain = m.logits(m(ids, mask))
        logits, cache = m.run_with_cache(ids, mask, names=lambda n: ".mlp." in n)
    B, T = ids.shape
    first = runs[: len(runs) // 2]  # the plain forward's runs
    for layer_runs in (first[: len(first) // 2], first[len(first) // 2:]) if len(first) % 2 == 0 else ():
        assert len({e for e, _ in layer_runs}) == len(layer_runs) <= 8  # no expert twice in a layer
    assert sum(n for _, n in first) == 2 * B * T * 2  # every token, k = 2 choices, in 2 layers: once each
    assert len({e for e, _ in first}) > 2  # routing differs between tokens
    assert torch.equal(plain, logits)
    w, idx = cache["blocks.0.mlp.hook_expert_weights"], cache["blocks.0.mlp.hook_expert_indices"]
    assert w.shape == (B, T, 8) and idx.shape == (B, T, 2) and idx.dtype == torch.long
    torch.testing.assert_close(w.sum(-1), torch.ones(B, T, dtype=w.dtype))
    assert torch.equal(idx, w.topk(2, dim=-1).indices)
    with torch.no_grad():  # every token sent to its second choice alone: a different output
        swapped = m.run_with_hooks(ids, mask, fwd_hooks=[("blocks.0.mlp.hook_expert_indices", lambda i, _: i.flip(-1))])
    assert float((swapped - plain).abs().max()) > 1e-3
    with torch.no_grad():  # the router's distribution replaced by a uniform one over experts 0 and 1: both chosen
        even = torch.zeros(8, dtype=w.dtype)
        even[:2] = 0.5
        forced, seen = m.run_with_cache(ids, mask, names=["blocks.0.mlp.hook_expert_indices"], fwd_hooks=[
            ("blocks.0.mlp.hook_expert_weights", lambda p, _: even.expand_as(p))])
    assert set(seen["blocks.0.mlp.hook_expert_indices"].unique().tolist()) == {0, 1}
    with pytest.raises(ValueError, match=r"blocks.0.mlp.hook_expert_indices must hold expert ids .* in 0..7, got .*8"):
        m.run_with_hooks(ids, mask, fwd_hooks=[("blocks.0.mlp.hook_expert_indices", lambda i, _: i + 8 - i.max())])


@pytest.mark.parametrize("family", ["gemma3", "gpt_oss"])
def test_local_layers_keep_the_window_cache(decoder_folder, family):
    """cache='window': the sliding layers keep a ring of W slots, the global ones stay dense (exact)."""
    import torch

    from attnlab.transformer import Transformer

    m = Transformer.from_pretrained(decoder_folder(family), dtype="float64", backend="torch")
    g = m.generate(torch.tensor([[5, 17, 3, 42, 8, 23, 11, 2, 30]]), 24, cache="window")
    assert g.kv_cache.kinds == ("window", "dense")
    assert g.kv_cache.layers[0].capacity == WINDOW
    c = m.config
    assert g.kv_cache.layers[0].nbytes == 2 * c.heads_kv * c.head_dim * WINDOW * 8


@pytest.mark.parametrize("family", NEW)
def test_logit_attribution_adds_up(decoder_folder, family):
    """Direct logit attribution over heads, MLPs (gpt-oss: its experts together, one component per layer) and
    the biases adds up to the logit difference within 1e-10 in float64 (Gemma-3's post-norms frozen)."""
    import torch

    from attnlab.interventions.attribution import logit_attribution
    from attnlab.transformer import Transformer

    m = Transformer.from_pretrained(decoder_folder(family), dtype="float64", backend="torch")
    a = logit_attribution(m, torch.tensor([[5, 17, 3, 42, 8, 23, 11, 2, 30]]), 7, baseline=9)
    assert abs(a.error) < 1e-10 and len(a.components) == 2 * (4 + 1) + 2  # embed, 2 × (4 heads + mlp), bias


def test_quantized_weights_are_refused_by_their_method(decoder_folder, tmp_path):
    """gpt-oss as published stores its experts in MXFP4 (quantization_config): refused by name, not read as
    missing tensors or as something else."""
    import shutil

    from attnlab.transformer import Transformer

    for f in decoder_folder("gpt_oss").iterdir():
        shutil.copy(f, tmp_path / f.name)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quantization_config.quant_method is 'mxfp4'.*dequantize"):
        Transformer.from_pretrained(tmp_path)
