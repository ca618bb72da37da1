"""Direct logit attribution and the logit lens: what the residual stream writes into the logits.

In a pre-norm causal decoder the last residual stream at a position is a sum of parts: the
embeddings, every head's output (its z through its slice of the output projection), the output
projections' biases and every MLP's output. Freeze every norm that lies between a part and the
logits at the scale it had in the real run, and the logit of a token is linear in the stream, so it
splits exactly into one number per part (Elhage et al. 2021, "direct path"): the part's **direct**
contribution, not what it does through later layers.

The norms frozen: the final norm (LayerNorm: (y − mean y) / s · w, the mean taken per part, its bias
a part of its own; RMSNorm: y / s · w), and for Gemma-2 each layer's post-attention norm
(``ln1_post``: a head's output y / s₁ · (1 + w)). Gemma-2's post-feed-forward norm is inside its
MLP's part (``hook_mlp_out`` is after it). Gemma-2's final softcap c·tanh(x / c) is not linear:
the attribution is of the logit **before** it, as ``Attribution.logit`` is.

:func:`logit_lens` reads the stream after each layer through the final norm (computed, not frozen)
and the unembedding, what each layer "would predict" (nostalgebraist 2020).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from attnlab.interventions.patching import token_ids
from attnlab.maps.heads import Head


class Mlp(NamedTuple):
    """Layer ``layer``'s MLP (0-based); ``str()`` is the 1-based label "mlp 3", as ``str(Head)`` is "L3H1"."""

    layer: int

    def __str__(self) -> str:
        return f"mlp {self.layer + 1}"

    def to_dict(self) -> dict:
        return {"mlp": int(self.layer)}


@dataclass(frozen=True)
class Attribution:
    """Each part's direct contribution to the logit of ``target`` (minus ``baseline``'s) at ``position``.

    components: "embed" (token embeddings, Gemma-2's × √d included), "pos_embed" (learned positions),
    every :class:`~attnlab.maps.heads.Head`, every :class:`Mlp`, "bias" (the output projections' biases
    and the final norm's); values: theirs, float64, in that order. total: their sum; logit: the model's
    own logit (difference), before any final softcap (``softcap``); error: total − logit.
    position: 0-based, counted from the start.
    """

    components: tuple
    values: np.ndarray
    target: int
    baseline: int | None
    position: int
    total: float
    logit: float
    error: float
    softcap: float | None

    def ranked(self, n: int | None = None) -> list[tuple[Any, float]]:
        """(component, value) pairs, the largest in size first (the sign kept); at most ``n``."""
        order = np.argsort(-np.abs(self.values), kind="stable")[:n]
        return [(self.components[i], float(self.values[i])) for i in order]

    def to_dict(self) -> dict:
        """JSON-ready, 0-based: each component as {"kind", "label", "value"} (+ "layer", "head" where it has them)."""
        def one(c: Any, v: float) -> dict:
            kind = "head" if isinstance(c, Head) else "mlp" if isinstance(c, Mlp) else c
            layer = {} if isinstance(c, str) else {"layer": int(c.layer)}
            return {"kind": kind, "label": str(c), **layer, **({"head": int(c.head)} if kind == "head" else {}),
                    "value": float(v)}
        return {"target": self.target, "baseline": self.baseline, "position": self.position, "total": self.total,
                "logit": self.logit, "error": self.error, "softcap": self.softcap,
                "components": [one(c, v) for c, v in zip(self.components, self.values)]}


def token_id(model: Any, token: Any, argument: str) -> int:
    """A token id from an int or, with the model's tokenizer, a string that is exactly one token."""
    v = model.config.vocab_size
    if isinstance(token, str):
        if model.tokenizer is None:
            raise ValueError(f"{argument} {token!r} is text, which needs the model's tokenizer; give a token id")
        ids = model.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            split = f" ({' + '.join(repr(model.tokenizer.decode([i])) for i in ids)})" if ids else ""
            raise ValueError(f"{argument} must be one token, got {token!r}, which is {len(ids)} tokens {ids}{split}")
        return int(ids[0])
    if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < v:
        raise ValueError(f"{argument} must be a token id in 0..{v - 1} or one token's text, got {token!r}")
    return int(token)


def _one_sequence(model: Any, input_ids: Any) -> Any:
    c = model.config
    if not c.causal or c.post_norm:
        raise ValueError(f"model must be a pre-norm causal language model for logit attribution and the lens, got "
                         f"a {c.family} {'encoder' if not c.causal else 'post-norm model'}")
    ids = token_ids(model, input_ids, "input_ids")
    if ids.shape[0] != 1:
        raise ValueError(f"input_ids must be one sequence, (T,) or (1, T), got shape {tuple(ids.shape)}")
    return ids


def _position(position: Any, t: int) -> int:
    if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or not -t <= position < t:
        raise ValueError(f"position must be an int in {-t}..{t - 1} (the sequence has {t} tokens), got {position!r}")
    return int(position) % t


def _frozen(n: Any, scale: Any) -> Any:
    """The linear part of norm ``n`` with its scale frozen at ``scale`` (1,): y → (y [− mean y]) / scale · w."""
    from torch import nn

    from attnlab.transformer.norms import RMSNormPlusOne

    w = 1.0 + n.weight if isinstance(n, RMSNormPlusOne) else n.weight
    centre = isinstance(n, nn.LayerNorm)
    return lambda y: ((y - y.mean(-1, keepdim=True)) if centre else y) / scale * w


def _names(c: Any) -> list[str]:
    names = ["hook_embed"] + (["hook_pos_embed"] if c.positions == "learned" else []) + ["ln_final.hook_scale"]
    for layer in range(c.num_layers):
        names.append(f"blocks.{layer}.attn.hook_z")
        names += [f"blocks.{layer}.hook_mlp_out"] if c.ffn != "none" else []
        names += [f"blocks.{layer}.ln1_post.hook_scale"] if c.sandwich_norm else []
    return names


def _parts(model: Any, cache: dict, p: int) -> tuple[list, list]:
    """(components, their vectors (d,)) of the residual stream at position ``p``, before the final norm:
    post-attention norms frozen (Gemma-2), the biases gathered in one "bias" vector (without the final norm's)."""
    import torch

    c = model.config
    comps, vecs = ["embed"], [cache["hook_embed"][0, p]]
    if c.positions == "learned":
        comps.append("pos_embed")
        vecs.append(cache["hook_pos_embed"][0, p])
    bias = torch.zeros_like(vecs[0])
    for layer, block in enumerate(model.blocks):
        o = block.attn.o
        w = o.weight.view(c.d_model, c.num_heads, c.value_dim)  # (d, H·Dv) → (d, H, Dv)
        heads = torch.einsum("hk,dhk->hd", cache[f"blocks.{layer}.attn.hook_z"][0, :, p], w)  # (H, d)
        post = (lambda y: y) if block.norm1_post is None else _frozen(
            block.norm1_post, cache[f"blocks.{layer}.ln1_post.hook_scale"][0, p])
        comps += [Head(layer, h) for h in range(c.num_heads)]
        vecs += list(post(heads))
        if o.bias is not None:
            bias = bias + post(o.bias)
        if block.ffn is not None:
            comps.append(Mlp(layer))
            vecs.append(cache[f"blocks.{layer}.hook_mlp_out"][0, p])
    return comps + ["bias"], vecs + [bias]


def logit_attribution(model: Any, input_ids: Any, target: Any, baseline: Any = None,
                      position: int = -1) -> Attribution:
    """Each component's direct contribution to the logit of ``target`` (minus ``baseline``'s) at ``position``.

    model: a pre-norm causal :class:`~attnlab.transformer.Transformer` (GPT-2, Llama, Mistral, Qwen2,
    Gemma-2). input_ids: one sequence, (T,) or (1, T). target, baseline: token ids, or one token's text
    with the model's tokenizer. The norms on the path are frozen at their scale from the real run and a
    final softcap is left out (the module says which); the values add up to ``Attribution.logit``.
    """
    import torch

    ids = _one_sequence(model, input_ids)
    p = _position(position, ids.shape[1])
    t = token_id(model, target, "target")
    b = None if baseline is None else token_id(model, baseline, "baseline")
    unembed = model.tok_emb.weight if model.lm_head is None else model.lm_head.weight  # (V, d)
    with torch.no_grad():
        u = unembed[t] - (0.0 if b is None else unembed[b])  # (d,): the logit (difference) direction
        logit = float(model(ids)[0, p] @ u)  # the model's own, before any softcap
        _, cache = model.run_with_cache(ids, names=_names(model.config))
        comps, vecs = _parts(model, cache, p)
        final = _frozen(model.final_norm, cache["ln_final.hook_scale"][0, p])
        vals = [float(final(v) @ u) for v in vecs]
        if getattr(model.final_norm, "bias", None) is not None:
            vals[-1] += float(model.final_norm.bias @ u)
    values = np.array(vals, dtype=np.float64)
    total = float(values.sum())
    return Attribution(tuple(comps), values, t, b, p, total, logit, total - logit, model.config.final_softcap)


def logit_lens(model: Any, input_ids: Any) -> np.ndarray:
    """What the residual stream predicts after each layer, [L + 1, T, V]: entry l is the stream entering
    block l (0: the embeddings), entry L the stream after the last block, each through the final norm
    (computed on it), the unembedding and any final softcap, so entry L is the model's logits.

    input_ids: one sequence, (T,) or (1, T); the array has the model's float dtype."""
    import torch

    ids = _one_sequence(model, input_ids)
    L = model.config.num_layers
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=names)
        stream = torch.stack([cache[n][0] for n in names])  # (L + 1, T, d)
        out = model.logits(model.final_norm(stream))  # (L + 1, T, V)
    return out.cpu().numpy()
