"""Hook points: every name fires, in order, with the shape docs/design.md gives; no hooks is the plain
forward bit for bit; replacing a head's z or a pattern does what a forward written by hand does;
unknown names and backends that cannot give the scores are refused by name."""

from __future__ import annotations

import math

import pytest

import circuit_models as cm

from .conftest import TEXTS

FAMILIES = ("gpt2", "llama", "roberta", "bert", "qwen3", "gemma3", "gpt_oss")
NEW = ("qwen3", "gemma3", "gpt_oss")  # tiny random models of tests/transformer/conftest.py's DECODERS
BACKENDS = ["torch", "sdpa", "blockwise", "kernel", "auto"]
# sdpa has no learned sinks: it refuses gpt-oss by name (test_models_2025.py)
PLAIN = [(f, b) for f in FAMILIES for b in BACKENDS if (f, b) != ("gpt_oss", "sdpa")]


def _model(request, family: str, backend: str = "auto"):
    """A tiny model of the family: GPT-2, Llama (GQA: 4 query heads, 2 k/v heads) and RoBERTa loaded from
    their safetensors folders; BERT built from transformers' config with random weights."""
    import torch
    from transformers import BertConfig

    from attnlab.transformer import Transformer, TransformerConfig

    if family in NEW:
        return Transformer.from_pretrained(request.getfixturevalue("decoder_folder")(family), backend=backend)
    if family == "bert":
        torch.manual_seed(0)
        config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=32)
        return Transformer(TransformerConfig.from_hf(config), backend=backend).eval().requires_grad_(False)
    return Transformer.from_pretrained(request.getfixturevalue(f"{family}_folder"), backend=backend)


def _batch(m):
    """Two sentences padded on the right (ids, mask), or random ids when the model has no tokenizer."""
    import torch

    if m.tokenizer is None:
        ids = torch.randint(1, m.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
        return ids, torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    enc = m.tokenizer(TEXTS[:2], padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def documented_shape(name: str, c, B: int, T: int) -> tuple:
    """The shape of each hook point as docs/design.md's table gives it (attnlab's convention)."""
    last = name.split(".")[-1]
    d, H, Hkv, Dh = c.d_model, c.num_heads, c.heads_kv, c.head_dim
    if ".attn.q_norm." in name or ".attn.k_norm." in name:  # QK-norm: one scale per head and position
        return (B, H if ".q_norm." in name else Hkv, T, 1)
    if last in ("hook_expert_weights", "hook_expert_indices"):  # over every expert; the k chosen
        return (B, T, c.num_experts if last == "hook_expert_weights" else c.experts_per_token)
    return {"hook_scale": (B, T, 1), "hook_q": (B, H, T, Dh), "hook_rot_q": (B, H, T, Dh), "hook_k": (B, Hkv, T, Dh),
            "hook_rot_k": (B, Hkv, T, Dh), "hook_v": (B, Hkv, T, Dh), "hook_attn_scores": (B, H, T, T),
            "hook_pattern": (B, H, T, T), "hook_last_pattern": (B, H, T), "hook_z": (B, H, T, Dh)}.get(last, (B, T, d))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_hook_point_fires_in_order_with_its_documented_shape(request, family):
    import torch

    m = _model(request, family)
    ids, mask = _batch(m)
    (B, T), c = ids.shape, m.config
    fired = []
    out, cache = m.run_with_cache(ids, mask, fwd_hooks=[(n, lambda x, n: fired.append(n)) for n in m.hook_names()])
    assert fired == list(cache) == list(m.hook_names())  # every one, once, in the documented order
    for name, x in cache.items():
        assert tuple(x.shape) == documented_shape(name, c, B, T), name
    # watching everything (norms by hand, every layer's scores materialised) computes the same function
    with torch.no_grad():
        plain = m(ids, mask)
    assert out.shape == ((B, T, c.vocab_size) if c.causal else (B, T, c.d_model))
    assert float((out - m._output(plain)).abs().max()) < 1e-4
    rotary = family not in ("gpt2", "roberta", "bert")
    assert ("blocks.0.attn.hook_rot_q" in cache) == rotary and ("hook_pos_embed" in cache) == (not rotary)
    assert ("ln_final.hook_scale" in cache) == (not c.post_norm) and ("embed.ln.hook_scale" in cache) == c.post_norm


@pytest.mark.parametrize("family, backend", PLAIN)
def test_no_hooks_is_the_plain_forward_bit_for_bit(request, family, backend):
    import torch

    m = _model(request, family, backend)
    ids, mask = _batch(m)
    with torch.no_grad():
        plain = m._output(m(ids, mask))
        assert torch.equal(m.run_with_hooks(ids, mask), plain)
        assert torch.equal(m.run_with_cache(ids, mask, names=[])[0], plain)
        # a hook that only reads (and returns None) leaves every bit as it was
        seen = []
        watched = m.run_with_hooks(ids, mask, fwd_hooks=[("blocks.1.attn.hook_z", lambda z, n: seen.append(n))])
        assert torch.equal(watched, plain) and seen == ["blocks.1.attn.hook_z"]


@pytest.mark.parametrize("backend", ["torch", "kernel"])
def test_replacing_one_heads_z_equals_a_forward_written_by_hand(request, backend):
    import torch

    m = _model(request, "gpt2", backend)
    ids, _ = _batch(m)
    z_new = torch.randn(ids.shape[0], ids.shape[1], m.config.head_dim, generator=torch.Generator().manual_seed(1))

    def swap(z, name):  # z (B, H, T, Dh): head 2 of layer 1 (0-based) writes z_new
        z = z.clone()
        z[:, 2] = z_new
        return z

    with torch.no_grad():
        ours = m.run_with_hooks(ids, fwd_hooks=[("blocks.1.attn.hook_z", swap)])
        by_hand = cm.gpt2_by_hand(m, ids, (1, 2, z_new, slice(None)))
        own = m.run_with_cache(ids, names=["blocks.1.attn.hook_z"])[1]["blocks.1.attn.hook_z"][:, 2]
        clean = cm.gpt2_by_hand(m, ids, (1, 2, own, slice(None)))
    assert float((ours - by_hand).abs().max()) < 1e-4
    assert float((ours - clean).abs().max()) > 1e-2  # the swap mattered


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_replacing_the_pattern_recomputes_pattern_times_v(request, family):
    """Each query attending only to itself: z is its own token's v (its group's k/v head under GQA)."""
    import torch

    m = _model(request, family)
    ids, mask = _batch(m)
    c, T = m.config, ids.shape[1]
    eye = lambda w, n: torch.eye(T, dtype=w.dtype).expand_as(w)  # noqa: E731
    names = ["blocks.0.attn.hook_v", "blocks.0.attn.hook_z", "blocks.0.attn.hook_pattern"]
    out, cache = m.run_with_cache(ids, mask, names=names, fwd_hooks=[("blocks.0.attn.hook_pattern", eye)])
    v = cache["blocks.0.attn.hook_v"].repeat_interleave(c.num_heads // c.heads_kv, dim=1)  # (B, H, T, Dh)
    assert torch.allclose(cache["blocks.0.attn.hook_z"], v, atol=1e-6)
    assert torch.equal(cache["blocks.0.attn.hook_pattern"], eye(cache["blocks.0.attn.hook_pattern"], None))
    with torch.no_grad():
        assert float((out - m._output(m(ids, mask))).abs().max()) > 1e-3


def test_replacing_the_scores_is_softmaxed_into_the_pattern(request):
    import torch

    m = _model(request, "gpt2")
    ids, _ = _batch(m)
    flat = lambda s, n: torch.zeros_like(s).masked_fill(torch.isinf(s), -math.inf)  # noqa: E731: equal scores
    _, cache = m.run_with_cache(ids, names=["blocks.0.attn.hook_pattern"],
                                fwd_hooks=[("blocks.0.attn.hook_attn_scores", flat)])
    T = ids.shape[1]
    uniform = torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]  # causal: query i spreads over i + 1 keys
    assert torch.allclose(cache["blocks.0.attn.hook_pattern"], uniform.expand_as(cache["blocks.0.attn.hook_pattern"]))


def test_run_with_cache_keeps_only_the_names_asked(request):
    m = _model(request, "llama")
    ids, mask = _batch(m)
    _, cache = m.run_with_cache(ids, mask, names=["hook_embed", "blocks.1.attn.hook_rot_k"])
    assert list(cache) == ["hook_embed", "blocks.1.attn.hook_rot_k"]
    _, cache = m.run_with_cache(ids, mask, names=lambda n: n.endswith("hook_scale"))
    assert list(cache) == ["blocks.0.ln1.hook_scale", "blocks.0.ln2.hook_scale", "blocks.1.ln1.hook_scale",
                           "blocks.1.ln2.hook_scale", "ln_final.hook_scale"]
    assert not any(x.requires_grad for x in cache.values())


def test_unknown_names_are_refused_with_the_list(request):
    m = _model(request, "gpt2")
    ids, _ = _batch(m)
    for bad in ("blocks.0.hook_nope", "blocks.2.hook_resid_pre", "hook_rot_q"):
        with pytest.raises(ValueError, match=r"not a hook point.*hook_embed, hook_pos_embed, blocks\.\{l\}\..*"
                                             r"hook_resid_pre.*attn\.hook_z.*for l in 0\.\.1, ln_final\.hook_scale"):
            m.run_with_hooks(ids, fwd_hooks=[(bad, lambda x, n: None)])
    with pytest.raises(ValueError, match="names entry 'attn.hook_z'"):
        m.run_with_cache(ids, names=["attn.hook_z"])
    with pytest.raises(ValueError, match="blocks.0.attn.hook_rot_q"):  # GPT-2 has no rotary positions
        m.run_with_cache(ids, names=["blocks.0.attn.hook_rot_q"])
    with pytest.raises(TypeError, match="fwd_hooks must be"):
        m.run_with_hooks(ids, fwd_hooks=["hook_embed"])


def test_a_replacement_of_another_shape_is_refused(request):
    m = _model(request, "gpt2")
    ids, _ = _batch(m)
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.hook_z must return None or a tensor shaped"):
        m.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, n: z[:, :1])])


@pytest.mark.parametrize("backend", ["kernel", "sdpa", "blockwise", "numpy"])
@pytest.mark.parametrize("hook", ["blocks.1.attn.hook_pattern", "blocks.0.attn.hook_attn_scores"])
def test_scores_and_pattern_refused_by_name_with_a_backend_that_cannot_give_them(request, backend, hook):
    import torch

    m = _model(request, "gpt2", backend)
    ids, _ = _batch(m)
    with torch.no_grad(), pytest.raises(ValueError, match=rf"hook {hook} needs the attention scores.*{backend!r}"):
        m.run_with_cache(ids, names=[hook])
    with torch.no_grad():  # asked for by the call, the weights-capable backend serves it
        assert hook in m.run_with_cache(ids, names=[hook], backend="torch")[1]


def test_a_frozen_norm_scale_gives_the_clean_run_back(request):
    """TransformerLens's use of hook_scale: feed a run the scales of another; replacing them by the run's
    own changes nothing, by a corrupted run's changes the output."""
    import torch

    m = _model(request, "llama")
    ids, mask = _batch(m)
    name = "ln_final.hook_scale"
    clean, cache = m.run_with_cache(ids, mask, names=[name])
    same = m.run_with_hooks(ids, mask, fwd_hooks=[(name, lambda s, n: cache[name])])
    doubled = m.run_with_hooks(ids, mask, fwd_hooks=[(name, lambda s, n: 2 * s)])
    assert float((same - clean).abs().max()) < 1e-6
    with torch.no_grad():  # an RMSNorm without bias: twice the scale halves the normed state, so the logits
        assert torch.allclose(doubled, m._output(m(ids, mask)) / 2, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("family", FAMILIES)
def test_watching_scores_and_pattern_is_the_torch_backends_forward_bit_for_bit(request, family, dtype):
    """The hooked path runs the torch backend's own steps (eager_scores, eager_weights) with the hooks between:
    watching the scores and the pattern of every layer changes no bit of a forward with backend "torch"."""
    import torch

    m = _model(request, family, "torch").to(getattr(torch, dtype))
    ids, mask = _batch(m)
    weights = lambda name: name.endswith(("hook_attn_scores", "hook_pattern"))  # noqa: E731
    with torch.no_grad():
        plain = m._output(m(ids, mask))
        out, cache = m.run_with_cache(ids, mask, names=weights)
    assert len(cache) == 2 * m.config.num_layers
    assert torch.equal(out, plain)
