"""Path patching: one head's effect through one path, into another head's queries, keys or values.

:func:`path_patch` puts the sender head's clean output into the corrupted run **only where the
receiver head reads it**: its queries, keys or values (Wang et al. 2022, "path patching"; the
K-composition of Elhage et al. 2021 is a previous-token head reaching an induction head's keys).

1. The corrupted run with the sender's ``hook_z`` taken from the clean run and everything else
   frozen at the corrupted run (every other head's ``hook_z`` and every ``hook_mlp_out``), so the
   sender reaches the receiver's layer directly: its ``hook_q`` / ``hook_k`` / ``hook_v`` there is kept.
2. The corrupted run again, with only the receiver's q, k or v replaced by what step 1 kept; the
   metric is measured on this run. Under grouped-query attention a k/v head is shared by several query
   heads, so step 2 runs twice: once with the shared k/v head patched, from which only the receiver's
   own scores, pattern and output are taken into the second (the shared head expanded per query head:
   only the receiver sees the patch). This needs the scores materialised (backend "torch" or "auto").

The metric is as :mod:`attnlab.interventions.patching` has it: ``metric(logits)`` → [B], or with
``names=[hook, …]`` ``metric(logits, cache)`` reading those hook points of the patched run (the
receiver's own ``hook_pattern``, say). The effect is normalised as patching's, on the batch means.
A sender at or after the receiver's layer cannot reach it: its effect is exactly 0 (computed for one
sender; the grid does not run those, its other senders share forward passes as patching's do).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.interventions.patching import (
    check_names,
    group_size,
    normalised,
    pair,
    run,
    with_backend,
)
from attnlab.maps.heads import Head, ScoredHead, ranked

INPUTS = ("q", "k", "v")


@dataclass(frozen=True)
class PathPatching:
    """What the sender's clean output did through the receiver's ``input`` ("q", "k" or "v").

    effect: normalised as patching's (on the batch means); one number for one sender, an [L, H] grid
    (every head as the sender) when ``sender`` is None. raw: the metric per sequence, [B] or [L, H, B].
    clean, corrupted: the metric [B] on the two runs.
    """

    effect: Any
    raw: np.ndarray
    sender: Head | None
    receiver: Head
    input: str
    clean: np.ndarray
    corrupted: np.ndarray

    def top(self, k: int = 5) -> list[ScoredHead]:
        """The grid's ``k`` senders of largest effect in size, the sign kept, as (Head, effect)."""
        if self.sender is not None:
            raise ValueError(f"top ranks the senders of a grid (sender=None); this path patching has one sender, "
                             f"{tuple(self.sender)}")
        return ranked(self.effect, n=k, by_size=True)

    def to_dict(self) -> dict:
        """JSON-ready, 0-based."""
        effect = float(self.effect) if self.sender is not None else self.effect.tolist()
        return {"sender": None if self.sender is None else self.sender.to_dict(), "receiver": self.receiver.to_dict(),
                "input": self.input, "effect": effect, "raw": self.raw.tolist(), "clean": self.clean.tolist(),
                "corrupted": self.corrupted.tolist(),
                "normalised": "(M - M_corrupted) / (M_clean - M_corrupted) on the batch means of the metric"}


def _receiver(c: Any, receiver: Any) -> tuple[Head, str]:
    if not isinstance(receiver, (tuple, list)) or len(receiver) != 3 or receiver[2] not in INPUTS:
        raise ValueError(f"receiver must be a 0-based (layer, head, input) with input one of {', '.join(INPUTS)}, "
                         f"got {receiver!r}")
    return Head.of(tuple(receiver[:2]), c.num_layers, c.num_heads, "receiver"), receiver[2]


def _frozen(c: Any, z_clean: list, z_corr: list, mlp_corr: list, senders: list) -> list:
    """fwd_hooks for step 1 on copies of the corrupted batch: every hook_z and hook_mlp_out at the corrupted
    run, copy j's sender ``senders[j]`` at its clean output."""
    import torch

    g, hooks = len(senders), []
    for layer in range(c.num_layers):
        chosen = torch.zeros(g, 1, c.num_heads, 1, 1, dtype=torch.bool)  # (G, 1, H, 1, 1)
        for j, s in enumerate(senders):
            if s.layer == layer:
                chosen[j, 0, s.head] = True

        def z(x: Any, name: str, a: Any = z_clean[layer], b: Any = z_corr[layer], m: Any = chosen) -> Any:
            return torch.where(m.to(x.device), a[None], b[None]).reshape(x.shape)  # (G, B, H, T, Dh) → (G·B, …)
        hooks.append((f"blocks.{layer}.attn.hook_z", z))
    for layer, out in enumerate(mlp_corr):
        hooks.append((f"blocks.{layer}.hook_mlp_out", lambda x, name, o=out: o.repeat(g, *[1] * (o.dim() - 1))))
    return hooks


def _capture(model: Any, ids: Any, fwd_hooks: list, copies: int, wanted: list) -> dict:
    """The tensors at ``wanted`` of the run on ``copies`` stacked copies of ``ids`` with ``fwd_hooks``."""
    seen: dict = {}
    keep = [(n, lambda x, name: seen.__setitem__(name, x)) for n in wanted]
    model.run_with_hooks(ids.repeat(copies, 1), fwd_hooks=list(fwd_hooks) + keep)
    return seen


def _heads(name: str, head: int, new: Any) -> tuple:
    """A hook replacing head ``head`` (dim 1) of the tensor at ``name`` by ``new``'s."""
    def fn(x: Any, _: str) -> Any:
        x = x.clone()
        x[:, head] = new[:, head]
        return x
    return (name, fn)


def _into_receiver(model: Any, ids: Any, receiver: Head, which: str, kept: Any, copies: int) -> list:
    """Step 2's fwd_hooks: the receiver's ``which`` input at ``kept`` (G·B, H or H_kv, T, Dh), only its own."""
    c = model.config
    group = c.num_heads // c.heads_kv
    at = f"blocks.{receiver.layer}.attn."
    if which == "q" or group == 1:
        return [_heads(at + f"hook_{which}", receiver.head // (1 if which == "q" else group), kept)]
    shared = [_heads(at + f"hook_{which}", receiver.head // group, kept)]
    own = [at + "hook_attn_scores", at + "hook_pattern", at + "hook_z"]
    got = _capture(model, ids, shared, copies, own)
    return [_heads(n, receiver.head, got[n]) for n in own]


def path_patch(model: Any, clean: Any, corrupted: Any, metric: Callable, sender: Any = None, receiver: Any = None, *,
               names: Any = None, copies: int | None = None, backend: str | None = None) -> PathPatching:
    """Path patching from ``sender`` (a Head or 0-based (layer, head); None: every head, an [L, H] grid) into
    ``receiver`` = (layer, head, "q" | "k" | "v"): see the module for the two steps and the metric.

    clean, corrupted: token ids (B, T) of one shape ((T,): B = 1); copies: senders per forward pass
    (None: about PASS_TOKENS positions and at most PASS_LOGITS logits each)."""
    import torch

    model = with_backend(model, backend)
    c = model.config
    recv, which = _receiver(c, receiver)
    senders = [Head(l, h) for l in range(c.num_layers) for h in range(c.num_heads)] if sender is None else \
        [Head.of(sender, c.num_layers, c.num_heads, "sender")]
    a, b = pair(model, clean, corrupted)
    names = check_names(model, names)
    watch = _watched(c, recv, which)
    with torch.no_grad():
        m_clean = run(model, a, metric, names, watch, 1)[0].numpy()
        m_corr = run(model, b, metric, names, watch, 1)[0].numpy()
        raw = np.tile(m_corr, (len(senders), 1))  # (senders, B)
        reach = [i for i, s in enumerate(senders) if s.layer < recv.layer or sender is not None]
        if reach:
            raw[reach] = _through(model, a, b, metric, names, [senders[i] for i in reach], recv, which, watch, copies)
    effect = normalised(raw, m_clean, m_corr)
    if sender is not None:
        return PathPatching(float(effect[0]), raw[0], senders[0], recv, which, m_clean, m_corr)
    return PathPatching(effect.reshape(c.num_layers, c.num_heads), raw.reshape(c.num_layers, c.num_heads, -1), None,
                        recv, which, m_clean, m_corr)


def _through(model: Any, a: Any, b: Any, metric: Callable, names: Any, senders: list, recv: Head, which: str,
             watch: list, copies: int | None) -> np.ndarray:
    """The metric (senders, B) with each sender's clean output reaching only the receiver's input (steps 1, 2)."""
    import torch

    c = model.config
    z_clean, z_corr, mlp_corr = _runs(model, a, b)
    point = f"blocks.{recv.layer}.attn.hook_{which}"
    g = group_size(model, b, copies, len(senders))
    raw = []
    for s in range(0, len(senders), g):
        part = senders[s:s + g]
        kept = _capture(model, b, _frozen(c, z_clean, z_corr, mlp_corr, part), len(part), [point])[point]
        hooks = _into_receiver(model, b, recv, which, kept, len(part))
        raw.append(run(model, b, metric, names, watch + hooks, len(part)))
    return torch.cat(raw).numpy()


def _watched(c: Any, recv: Head, which: str) -> list:
    """Hooks that only watch: under GQA a k/v receiver's layer computes its scores in the model in every run
    (step 2 replaces them there), so the clean and corrupted runs take the same path."""
    if which == "q" or c.num_heads == c.heads_kv:
        return []
    at = f"blocks.{recv.layer}.attn."
    return [(at + "hook_attn_scores", lambda x, name: None)]


def _runs(model: Any, a: Any, b: Any) -> tuple[list, list, list]:
    """Every layer's hook_z on the clean run, and hook_z and hook_mlp_out on the corrupted run."""
    c = model.config
    zs = [f"blocks.{l}.attn.hook_z" for l in range(c.num_layers)]
    mlps = [f"blocks.{l}.hook_mlp_out" for l in range(c.num_layers)] if c.ffn != "none" else []
    _, clean = model.run_with_cache(a, names=zs)
    _, corr = model.run_with_cache(b, names=zs + mlps)
    return [clean[n] for n in zs], [corr[n] for n in zs], [corr[n] for n in mlps]
