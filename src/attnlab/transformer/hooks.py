"""Hook points of attnlab's transformer: TransformerLens's names and meanings, attnlab's shapes.

A hook point is a named tensor of the forward pass (``hook_embed``, ``blocks.0.attn.hook_z``, …;
docs/design.md tables each with its shape beside TransformerLens's). :class:`Hooks` is what one
forward pass carries for them: the functions to run at each, ``fn(tensor, name)``, whose return
value (when not None) replaces the tensor, and the names to keep, whose tensors come back from
:meth:`~attnlab.transformer.model.Transformer.run_with_cache`. Nothing is global: each call builds
its own :class:`Hooks`, and a forward pass without any runs exactly the plain forward.

This module needs no torch: the model calls it with tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from attnlab.transformer.config import TransformerConfig

# Hook points that see the attention scores or weights: a layer with one of them watched computes
# its attention in the model itself (the scores materialised), whatever the backend would do.
WEIGHT_HOOKS = ("attn.hook_attn_scores", "attn.hook_pattern")
# The newest query's weights over key positions (B, H, P): what generate's maps keep of every step. Rows of
# weights recomputed from the LSE, so watching it materialises no scores (not a TransformerLens name: it has none).
LAST_PATTERN = "attn.hook_last_pattern"


def _block_names(c: TransformerConfig, layer: int | None = None) -> list[str]:
    """Block ``layer``'s hook points (without the ``blocks.{l}.`` prefix), in the order they fire (None: any
    block's, a mixture's dense layers included)."""
    rotary = ["attn.hook_rot_q", "attn.hook_rot_k"] if c.positions == "rotary" else []
    post1, post2 = (["ln1_post.hook_scale"], ["ln2_post.hook_scale"]) if c.sandwich_norm else ([], [])  # Gemma-2
    qk = ["attn.q_norm.hook_scale", "attn.k_norm.hook_scale"] if c.qk_norm else []  # TransformerLens's use_qk_norm names
    # latent attention (MLA): the query, the normed latent, the rotary parts; no per-head k or v to hook
    inputs = ["attn.hook_q", "attn.hook_latent"] if c.latent is not None else ["attn.hook_q", "attn.hook_k", "attn.hook_v"]
    attn = [*inputs, *qk, *rotary, *WEIGHT_HOOKS, LAST_PATTERN, "attn.hook_z", *post1, "hook_attn_out"]
    ffn = c.ffn != "none"
    # TransformerLens's MoE: the router's scores of every expert, then the k experts chosen
    routed = c.ffn == "experts" if layer is None else c.routed(layer)
    experts = ["mlp.hook_expert_weights", "mlp.hook_expert_indices"] if routed else []
    if c.post_norm:  # BERT: the sums are hooked before their norm, the norm's output after it
        mid = ["hook_resid_mid", "ln1.hook_scale", "hook_mlp_out", "hook_resid_post", "ln2.hook_scale"] if ffn else \
            ["hook_resid_post", "ln1.hook_scale"]
        return ["hook_resid_pre", *attn, *mid, "hook_normalized_resid_post"]
    mid = ["hook_resid_mid", "ln2.hook_scale", *experts, *post2, "hook_mlp_out"] if ffn else []
    return ["hook_resid_pre", "ln1.hook_scale", *attn, *mid, "hook_resid_post"]


def _embed_names(c: TransformerConfig) -> list[str]:
    return (["hook_embed"] + (["hook_pos_embed"] if c.positions == "learned" else [])
            + (["hook_token_type_embed"] if c.type_vocab_size else [])
            + (["embed.ln.hook_scale"] if c.embed_norm else []))


def hook_names(c: TransformerConfig) -> tuple[str, ...]:
    """Every hook point of a model with config ``c``, in the order they fire."""
    final = [] if c.post_norm else ["ln_final.hook_scale"]
    return (*_embed_names(c), *(f"blocks.{l}.{n}" for l in range(c.num_layers) for n in _block_names(c, l)), *final)


def describe(c: TransformerConfig) -> str:
    """The hook points in one line, a block's once: what an error about a hook name lists."""
    final = "" if c.post_norm else ", ln_final.hook_scale"
    return (f"{', '.join(_embed_names(c))}, blocks.{{l}}.{{{', '.join(_block_names(c))}}} "
            f"for l in 0..{c.num_layers - 1}{final}")


class Hooks:
    """The hook points of one forward pass: ``fwd`` name → functions run there, ``keep`` the names
    whose tensors (after any replacement, detached) are gathered in ``kept``."""

    __slots__ = ("fwd", "keep", "kept", "watched")

    def __init__(self, fwd: dict[str, tuple[Callable, ...]] | None = None, keep: frozenset = frozenset()):
        self.fwd = fwd or {}
        self.keep = keep
        self.watched = frozenset(self.fwd) | keep
        self.kept: dict[str, Any] = {}

    def wants(self, name: str) -> bool:
        return name in self.watched

    def __call__(self, name: str, x: Any) -> Any:
        if name not in self.watched:
            return x
        for fn in self.fwd.get(name, ()):
            out = fn(x, name)
            if out is not None:
                if tuple(out.shape) != tuple(x.shape):
                    raise ValueError(f"the hook at {name} must return None or a tensor shaped {tuple(x.shape)}, "
                                     f"got shape {tuple(out.shape)}")
                x = out
        if name in self.keep:
            self.kept[name] = x.detach()
        return x


def build(c: TransformerConfig, fwd_hooks: Iterable = (), names: Any = ()) -> Hooks:
    """:class:`Hooks` from ``fwd_hooks`` [(name, fn), …] and the ``names`` to keep: a list of names,
    a predicate ``name → bool``, None (every hook point) or () (none). Unknown names are refused."""
    known = hook_names(c)
    known_set = frozenset(known)

    def check(name: Any, what: str) -> str:
        if name not in known_set:
            raise ValueError(f"{what} {name!r} is not a hook point of this model; its hook points are {describe(c)}")
        return name

    fwd: dict[str, tuple[Callable, ...]] = {}
    for pair in fwd_hooks:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not callable(pair[1]):
            raise TypeError(f"fwd_hooks must be (name, fn) pairs with fn(tensor, name), got {pair!r}")
        fwd[check(pair[0], "fwd_hooks name")] = (*fwd.get(pair[0], ()), pair[1])
    if names is None:
        keep = known_set
    elif callable(names):
        keep = frozenset(n for n in known if names(n))
    elif isinstance(names, str):
        keep = frozenset([check(names, "names entry")])
    else:
        keep = frozenset(check(n, "names entry") for n in names)
    return Hooks(fwd, keep)
