"""Direct logit attribution adds up to the model's own logit (difference) within 1e-10 in float64, and the
logit lens's last layer is the model's logits within 1e-12, on GPT-2, Llama and Gemma-2-style models;
a head's share is its output through the frozen norms, computed here from the weights."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.needs("torch")
try:
    import torch
except ImportError:  # the needs mark skips every test here (on CI: fails them)
    torch = None

import circuit_models as cm  # noqa: E402

from attnlab import Attribution, Head, logit_attribution, logit_lens  # noqa: E402
from attnlab.interventions.attribution import Mlp  # noqa: E402


def _softcapped(m, x):
    c = m.config.final_softcap
    return x if c is None else c * np.tanh(x / c)


@pytest.mark.parametrize("style", cm.STYLES)
@pytest.mark.parametrize("baseline,position", [(None, -1), (7, -1), (7, 4)])
def test_the_parts_add_up_to_the_logit(style, baseline, position):
    m = cm.model(style)
    ids = cm.pair(batch=1)[0][0]
    out = logit_attribution(m, ids, 3, baseline, position)
    logits = m.run_with_hooks(ids[None])[0, position].numpy()
    want = logits[3] - (0.0 if baseline is None else logits[7])
    assert out.error == out.total - out.logit and abs(out.error) < 1e-10
    assert abs(out.logit - _pre_cap(m, ids, position, baseline)) < 1e-10  # the model's own, before any softcap
    if baseline is None or m.config.final_softcap is None:  # what the model's logits say
        assert abs(_softcapped(m, out.logit) - want) < 1e-10
    L, H = m.config.num_layers, m.config.num_heads
    assert len(out.components) == 1 + (style == "gpt2") + L * H + L + 1 and out.position == position % 9


def _pre_cap(m, ids, position, baseline):
    """The logit of token 3 (minus ``baseline``'s) before any final softcap, from the last hidden state."""
    h = m(ids[None])[0, position]
    unembed = m.tok_emb.weight if m.lm_head is None else m.lm_head.weight
    return float(h @ (unembed[3] - (0.0 if baseline is None else unembed[baseline])))


def test_a_heads_share_is_its_output_through_the_frozen_final_norm():
    """GPT-2: z_h W_O,h, centred, over the final LayerNorm's scale of the real run, times its weight, · W_U[target]."""
    m = cm.model("gpt2")
    ids = cm.pair(batch=1)[0][0]
    out = logit_attribution(m, ids, 3)
    _, cache = m.run_with_cache(ids[None], names=["blocks.1.attn.hook_z", "blocks.2.hook_resid_post",
                                                  "blocks.0.hook_mlp_out"])
    x = cache["blocks.2.hook_resid_post"][0, -1]
    scale = ((x - x.mean()) ** 2).mean().add(m.config.norm_eps).sqrt()
    dh = m.config.head_dim
    w_o = m.blocks[1].attn.o.weight[:, 2 * dh:3 * dh]  # (d, Dh): head 2's columns
    y = w_o @ cache["blocks.1.attn.hook_z"][0, 2, -1]  # (d,)
    want = float(((y - y.mean()) / scale * m.final_norm.weight) @ m.tok_emb.weight[3])
    values = dict(zip(out.components, out.values))
    assert abs(values[Head(1, 2)] - want) < 1e-12
    mlp = cache["blocks.0.hook_mlp_out"][0, -1]
    assert abs(values[Mlp(0)] - float(((mlp - mlp.mean()) / scale * m.final_norm.weight) @ m.tok_emb.weight[3])) < 1e-12


def test_ranked_names_components_and_to_dict_is_0_based():
    m = cm.model("llama")
    out = logit_attribution(m, cm.pair(batch=1)[0][0], 3, 7)
    assert isinstance(out, Attribution)
    top = out.ranked()
    assert len(top) == len(out.components) and abs(top[0][1]) == np.abs(out.values).max()
    assert [abs(v) for _, v in top] == sorted((abs(v) for _, v in top), reverse=True)
    kinds = {type(c) for c, _ in top}
    assert kinds == {Head, Mlp, str} and str(Mlp(1)) == "mlp 2" and str(Head(1, 2)) == "L2H3"
    d = json.loads(json.dumps(out.to_dict()))
    head = next(c for c in d["components"] if c["kind"] == "head" and c["layer"] == 1 and c["head"] == 2)
    assert head["label"] == "L2H3" and head["value"] == dict(zip(out.components, out.values))[Head(1, 2)]
    assert {c["kind"] for c in d["components"]} == {"embed", "head", "mlp", "bias"}
    assert d["target"] == 3 and d["baseline"] == 7 and d["error"] == out.error


@pytest.mark.parametrize("style", cm.STYLES)
def test_the_lens_ends_at_the_logits(style):
    m = cm.model(style)
    ids = cm.pair(batch=1)[0][0]
    lens = logit_lens(m, ids)
    assert lens.shape == (4, 9, cm.V) and lens.dtype == np.float64
    assert np.abs(lens[-1] - m.run_with_hooks(ids[None])[0].numpy()).max() < 1e-12
    _, cache = m.run_with_cache(ids[None], names=["hook_embed"])
    first = m.logits(m.final_norm(cache["hook_embed"] + (0 if m.pos_emb is None else m.pos_emb.weight[:9])))[0]
    assert np.abs(lens[0] - first.numpy()).max() < 1e-12  # entry 0: the embeddings read out


@pytest.mark.parametrize("call,message", [
    (lambda m, ids: logit_attribution(m, ids, 50), r"target must be a token id in 0\.\.49"),
    (lambda m, ids: logit_attribution(m, ids, 3, baseline=-1), "baseline must be a token id"),
    (lambda m, ids: logit_attribution(m, ids, "the"), "target 'the' is text, which needs the model's tokenizer"),
    (lambda m, ids: logit_attribution(m, ids, 3, position=9), r"position must be an int in -9\.\.8"),
    (lambda m, ids: logit_attribution(m, torch.stack([ids, ids]), 3), "input_ids must be one sequence"),
    (lambda m, ids: logit_lens(m, ids.float()), "input_ids must be token ids"),
])
def test_bad_input_is_refused_by_name(call, message):
    m = cm.model("gpt2")
    with pytest.raises((ValueError, TypeError), match=message):
        call(m, cm.pair(batch=1)[0][0])


def test_an_encoder_is_refused():
    from attnlab.transformer import Transformer, TransformerConfig

    enc = Transformer(TransformerConfig(vocab_size=20, d_model=8, num_layers=1, num_heads=2, causal=False,
                                        post_norm=True))
    with pytest.raises(ValueError, match="model must be a pre-norm causal language model"):
        logit_attribution(enc, [1, 2, 3], 1)
