"""Activation patching and its first-order estimate: which activations carry a behaviour.

Run the model on a ``corrupted`` input, put back one activation from the ``clean`` run (one head's
output, one layer's residual stream, ...), and measure how much of the behaviour returns
(TransformerLens's ``patching``; Meng et al. 2022, Wang et al. 2022). The behaviour is a
``metric``: ``metric(logits)`` gives one value per sequence of the batch ([B]; a scalar when B = 1),
e.g. the logit difference of the right and a wrong next token at the last position. With
``names=[hook, …]`` the metric is called ``metric(logits, cache)`` instead, ``cache`` holding those
hook points' tensors of the same run ({name: (B, …)}, gradients kept), so it may read any
intermediate (a head's attention pattern, say), not only the logits.

Every result is normalised as (M − M_corrupted) / (M_clean − M_corrupted), **on the batch means**
of the metric: 1 where the patch restores the clean behaviour, 0 where it changes nothing. The raw
per-sequence values are kept (``raw``, ``clean``, ``corrupted``).

**Batched.** Many patches share one forward pass: the corrupted input is stacked k times along the
batch and each copy has a different activation patched (``copies`` = k; by default as many as
about :data:`~attnlab.interventions.ablation.PASS_TOKENS` positions and :data:`PASS_LOGITS` logits allow), so an [L, H] grid
costs L·H / k passes rather than L·H. ``copies=1`` is one pass per patch.

Sites (the hook point patched at every layer) and the grids they give (``over``):

- head sites "z" (``attn.hook_z``), "pattern" (``attn.hook_pattern``: needs backend "torch" or
  "auto"), "q", "k", "v" (``attn.hook_q/k/v``): ``over="head"`` an [L, H] grid, ``"head_pos"``
  [L, H, T] (one head at one query position). Under grouped-query attention "k" and "v" patch the
  H_kv key/value heads: [L, H_kv].
- residual sites "resid_pre", "attn_out", "mlp_out": ``over="layer"`` [L], ``"layer_pos"`` [L, T].

:func:`attribution_patch` estimates the same grid from one forward and one backward pass on the
corrupted run (Nanda 2023, "attribution patching"): M(a_clean) − M(a_corrupted) ≈
(a_clean − a_corrupted) · ∂M/∂a at the corrupted activations. Path patching, the same through one
path only, is :mod:`attnlab.interventions.paths`.

Heads are :class:`~attnlab.maps.heads.Head`, 0-based (docs/design.md, the index rule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attnlab.interventions.ablation import PASS_TOKENS
from attnlab.maps.heads import ScoredHead, ranked

SITES = {"z": "attn.hook_z", "pattern": "attn.hook_pattern", "q": "attn.hook_q", "k": "attn.hook_k",
         "v": "attn.hook_v", "resid_pre": "hook_resid_pre", "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out"}
PASS_LOGITS = 2 ** 25  # logits per pass when patched copies share it (128 MiB in float32)
HEAD_SITES = ("z", "pattern", "q", "k", "v")
# over → the axes of its grid after the layer: how many leading dims of a site's tensor (after the batch) a patch names
OVERS = {"head": ("head",), "head_pos": ("head", "position"), "layer": (), "layer_pos": ("position",)}


@dataclass(frozen=True)
class Patching:
    """What patching (or its estimate) found, one entry per patch.

    effect: the grid (axes ``axes``: [L, H], [L, H, T], [L] or [L, T]), normalised
    (M − M_corrupted) / (M_clean − M_corrupted) on the batch means of the metric.
    raw: the metric per sequence with each patch, the grid + [B]. clean, corrupted: the metric [B]
    on the two runs. method: "activation" (:func:`patch`) or "attribution" (:func:`attribution_patch`,
    then ``correlation``: Pearson's r with true patching over the grid, when asked for).
    """

    effect: np.ndarray
    raw: np.ndarray
    site: str
    over: str
    clean: np.ndarray
    corrupted: np.ndarray
    axes: tuple[str, ...]
    method: str = "activation"
    correlation: float | None = None

    def top(self, k: int = 5) -> list[ScoredHead]:
        """The ``k`` heads whose patch changes most, largest effect in size first, the sign kept, as
        (Head, effect); for ``over="head_pos"`` each head scores its effect largest in size over the positions."""
        if self.axes[:2] != ("layer", "head"):
            raise ValueError(f"top ranks heads; this patching is over {self.over!r} of site {self.site!r}, "
                             f"a grid over {list(self.axes)}")
        grid = self.effect if self.effect.ndim == 2 else np.take_along_axis(
            self.effect, np.abs(self.effect).argmax(-1)[..., None], -1)[..., 0]  # (L, H): each head's largest in size
        return ranked(grid, n=k, by_size=True)

    def to_dict(self) -> dict:
        """JSON-ready, 0-based (layers, heads and positions index the nested lists)."""
        out = {"method": self.method, "site": self.site, "over": self.over, "axes": list(self.axes),
               "normalised": "(M - M_corrupted) / (M_clean - M_corrupted) on the batch means of the metric",
               "effect": self.effect.tolist(), "raw": self.raw.tolist(), "clean": self.clean.tolist(),
               "corrupted": self.corrupted.tolist(), "correlation": self.correlation}
        if self.axes[:2] == ("layer", "head"):
            out["top"] = [s.to_dict() for s in self.top(10)]  # the ten largest (all, in a smaller model)
        return out


def token_ids(model: Any, ids: Any, argument: str) -> Any:
    """Token ids as a (B, T) long tensor on the model's device: (T,) is one sequence; ids in the vocabulary."""
    import torch

    t = torch.as_tensor(ids, device=model.device)
    if t.dim() == 1:
        t = t[None]
    if t.dim() != 2 or t.shape[1] == 0 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise ValueError(f"{argument} must be token ids (B, T) or (T,) of ints, got {t.dtype} of shape {tuple(t.shape)}")
    v = model.config.vocab_size
    if bool((t < 0).any()) or bool((t >= v).any()):
        raise ValueError(f"{argument} must hold token ids in 0..{v - 1}, got {int(t.min())}..{int(t.max())}")
    return t.long()


def pair(model: Any, clean: Any, corrupted: Any) -> tuple[Any, Any]:
    """The clean and corrupted ids, (B, T) each, of one shape."""
    a, b = token_ids(model, clean, "clean"), token_ids(model, corrupted, "corrupted")
    if a.shape != b.shape:
        raise ValueError(f"clean and corrupted must have the same shape (B, T), position for position; got clean "
                         f"{tuple(a.shape)} and corrupted {tuple(b.shape)}")
    return a, b


def check_names(model: Any, names: Any) -> list[str] | None:
    """The hook points a metric reads (None: it reads the logits only); an unknown name is refused with the list."""
    from attnlab.transformer.hooks import build

    if names is None:
        return None
    names = [names] if isinstance(names, str) else list(names)
    build(model.config, (), names)  # refuses an unknown name, listing the model's hook points
    return names


def values(metric: Callable, logits: Any, cache: dict | None, batch: int) -> Any:
    """metric(logits) or metric(logits, cache) as a float64 [batch] tensor; any other shape is refused."""
    import torch

    if not callable(metric):
        raise TypeError(f"metric must be callable as metric(logits) (or metric(logits, cache) with names=), "
                        f"got {type(metric).__name__}")
    m = metric(logits) if cache is None else metric(logits, cache)
    m = torch.as_tensor(m)
    if m.dim() == 0 and batch == 1:
        m = m.reshape(1)
    if tuple(m.shape) != (batch,) or m.dtype == torch.bool:
        raise ValueError(f"metric must return one number per sequence, a [B] = [{batch}] tensor (a scalar when "
                         f"B = 1), got {'a ' + str(m.dtype) if m.dtype == torch.bool else 'shape'} {list(m.shape)}")
    return m.to(torch.float64)


def run(model: Any, ids: Any, metric: Callable, names: list[str] | None, fwd_hooks: list, copies: int) -> Any:
    """The metric of each of ``copies`` stacked copies of ``ids`` (B, T) with ``fwd_hooks`` → (copies, B) float64.

    The hooks see the stacked batch (copies · B); the metric is called on each copy's rows (B) alone."""
    import torch

    seen: dict = {}

    def keep(x: Any, name: str) -> None:
        seen[name] = x

    hooks = list(fwd_hooks) + [(n, keep) for n in names or ()]  # after the patches at the same point
    logits = model.run_with_hooks(ids.repeat(copies, 1), fwd_hooks=hooks)
    B = ids.shape[0]
    out = []
    for j in range(copies):
        rows = slice(j * B, (j + 1) * B)
        out.append(values(metric, logits[rows], None if names is None else {n: t[rows] for n, t in seen.items()}, B))
    return torch.stack(out)


def with_backend(model: Any, backend: str | None) -> Any:
    """``model`` computing its attention by ``backend`` for one call (None: its own): the model's
    :meth:`~attnlab.transformer.Transformer.with_backend`, so that nothing below threads a backend."""
    return model if backend is None else model.with_backend(backend)


def normalised(raw: np.ndarray, clean: np.ndarray, corrupted: np.ndarray) -> np.ndarray:
    """(mean M − mean M_corrupted) / (mean M_clean − mean M_corrupted) of ``raw`` (…, B) over the batch."""
    span = clean.mean() - corrupted.mean()
    if span == 0 or not np.isfinite(span):
        raise ValueError(f"metric must differ between the clean and corrupted runs to normalise a patch, got "
                         f"{clean.mean():.6g} on both (batch means)")
    return (raw.mean(-1) - corrupted.mean()) / span


def group_size(model: Any, ids: Any, copies: int | None, total: int) -> int:
    """How many patched copies of ``ids`` share a pass: ``copies``, or about PASS_TOKENS positions' worth and
    at most PASS_LOGITS logits (a large vocabulary's logits are most of a pass's memory)."""
    if copies is None:
        return max(1, min(total, PASS_TOKENS // ids.numel(), PASS_LOGITS // (ids.numel() * model.config.vocab_size)))
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be None or an int >= 1 (patched copies per forward pass), got {copies!r}")
    return min(copies, total)


def _site(model: Any, site: Any, over: Any) -> str:
    """The hook point (after ``blocks.{l}.``) of ``site``, checked against ``over`` and the model."""
    if site not in SITES:
        raise ValueError(f"site must be one of {', '.join(SITES)}, got {site!r}")
    allowed = ("head", "head_pos") if site in HEAD_SITES else ("layer", "layer_pos")
    if over not in allowed:
        raise ValueError(f"over must be one of {', '.join(allowed)} for site {site!r}, got {over!r}")
    if f"blocks.0.{SITES[site]}" not in model.hook_names():
        raise ValueError(f"site {site!r}: this model has no blocks.{{l}}.{SITES[site]} (no feed-forward network)")
    return SITES[site]


def _caches(model: Any, ids: Any, point: str) -> list:
    """The site's tensor at every layer of the run on ``ids``: L × (B, …)."""
    import torch

    L = model.config.num_layers
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=[f"blocks.{l}.{point}" for l in range(L)])
    return [cache[f"blocks.{l}.{point}"] for l in range(L)]


def _swap_hooks(point: str, clean: list, patches: Any, units: tuple) -> list:
    """fwd_hooks patching copy j of the stacked batch at ``patches[j]`` = (layer, flat unit): the site's
    entries of that unit (the leading ``units`` dims after the batch) take their clean values."""
    import torch

    hooks = []
    for layer in sorted({int(p[0]) for p in patches}):
        chosen = torch.zeros(len(patches), int(np.prod(units)), dtype=torch.bool)  # (G, units)
        for j, (l, u) in enumerate(patches):
            if l == layer:
                chosen[j, u] = True

        def fn(x: Any, name: str, c: Any = clean[layer], m: Any = chosen) -> Any:
            g, b = m.shape[0], c.shape[0]
            xs = x.reshape(g, b, *x.shape[1:])  # (G, B, …): one copy of the batch per patch
            mask = m.to(x.device).reshape(g, 1, *units, *[1] * (x.dim() - 1 - len(units)))
            return torch.where(mask, c[None], xs).reshape(x.shape)
        hooks.append((f"blocks.{layer}.{point}", fn))
    return hooks


def _grid(clean: list, over: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(axes, the unit dims after the layer) of the grid of ``over`` on tensors like ``clean[0]`` (B, …)."""
    names = OVERS[over]
    return ("layer", *names), tuple(clean[0].shape[1:1 + len(names)])


def patch(model: Any, clean: Any, corrupted: Any, metric: Callable, site: str = "z", over: str = "head", *,
          names: Any = None, copies: int | None = None, backend: str | None = None) -> Patching:
    """Activation patching: the metric with each activation of the clean run put into the corrupted one.

    model: a causal :class:`~attnlab.transformer.Transformer` (an encoder's metric gets its last hidden
    state). clean, corrupted: token ids (B, T) of one shape ((T,): B = 1). metric(logits [B, T, V]) →
    [B] (or metric(logits, cache) with ``names``: see the module). site, over: see the module.
    copies: patched copies per forward pass (None: about PASS_TOKENS positions, at most PASS_LOGITS logits; 1: one
    pass per patch).
    """
    import torch

    model = with_backend(model, backend)
    point = _site(model, site, over)
    a, b = pair(model, clean, corrupted)
    names = check_names(model, names)
    with torch.no_grad():
        m_clean = run(model, a, metric, names, [], 1)[0].numpy()
        m_corr = run(model, b, metric, names, [], 1)[0].numpy()
        acts = _caches(model, a, point)
        axes, units = _grid(acts, over)
        n, L = int(np.prod(units)), model.config.num_layers
        todo = [(i // n, i % n) for i in range(L * n)]
        g = group_size(model, b, copies, len(todo))
        raw = [run(model, b, metric, names, _swap_hooks(point, acts, todo[s:s + g], units), len(todo[s:s + g]))
               for s in range(0, len(todo), g)]
    raw = torch.cat(raw).numpy().reshape(L, *units, b.shape[0])
    return Patching(normalised(raw, m_clean, m_corr), raw, site, over, m_clean, m_corr, axes)


def attribution_patch(model: Any, clean: Any, corrupted: Any, metric: Callable, site: str = "z",
                      over: str = "head", *, names: Any = None, compare: bool = False,
                      backend: str | None = None) -> Patching:
    """Attribution patching: :func:`patch`'s grid estimated to first order from one forward and one backward
    pass on the corrupted run, raw[…, b] = M_b(corrupted) + Σ (a_clean − a_corrupted) · ∂M_b/∂a over
    each patch's entries; normalised as :func:`patch`. ``compare=True`` also runs :func:`patch` and sets
    ``correlation``, Pearson's r of the two grids. Arguments as :func:`patch`.
    """
    import torch

    model = with_backend(model, backend)
    point = _site(model, site, over)
    a, b = pair(model, clean, corrupted)
    names = check_names(model, names)
    acts = _caches(model, a, point)
    axes, units = _grid(acts, over)
    with torch.no_grad():
        m_clean = run(model, a, metric, names, [], 1)[0].numpy()
    m_corr, corr, grads = _gradients(model, b, metric, names, point)
    raw = np.stack([_first_order(acts[l] - corr[l], grads[l], len(units)) for l in range(len(acts))])
    raw = raw + m_corr  # (L, *units, B)
    result = Patching(normalised(raw, m_clean, m_corr), raw, site, over, m_clean, m_corr, axes, "attribution")
    if not compare:
        return result
    true = patch(model, clean, corrupted, metric, site, over, names=names)
    r = float(np.corrcoef(result.effect.ravel(), true.effect.ravel())[0, 1])
    return replace(result, correlation=r)


def _gradients(model: Any, ids: Any, metric: Callable, names: list[str] | None, point: str) -> tuple:
    """On the run of ``ids``: the metric [B] (NumPy), the site's tensor per layer and ∂(Σ_b M_b)/∂ of it."""
    import torch

    L, seen = model.config.num_layers, {}

    def leaf(x: Any, name: str) -> Any:  # the embeddings start the graph, whatever the weights' requires_grad
        return x.detach().requires_grad_(True)

    def keep(x: Any, name: str) -> None:
        seen[name] = x

    sites = [f"blocks.{l}.{point}" for l in range(L)]
    with torch.enable_grad():
        hooks = [("hook_embed", leaf)] + [(n, keep) for n in dict.fromkeys(sites + (names or []))]
        logits = model.run_with_hooks(ids, fwd_hooks=hooks)
        m = values(metric, logits, None if names is None else {n: seen[n] for n in names}, ids.shape[0])
        grads = torch.autograd.grad(m.sum(), [seen[n] for n in sites], allow_unused=True)
    grads = [torch.zeros_like(seen[n]) if g is None else g for n, g in zip(sites, grads)]
    return m.detach().numpy(), [seen[n].detach() for n in sites], [g.detach() for g in grads]


def _first_order(delta: Any, grad: Any, units: int) -> np.ndarray:
    """Σ delta · grad over every dim but the batch and the ``units`` leading ones → (*units, B)."""
    prod = (delta * grad).to(dtype=grad.dtype)  # (B, …)
    summed = prod.sum(dim=tuple(range(1 + units, prod.dim()))) if prod.dim() > 1 + units else prod
    return summed.movedim(0, -1).double().numpy()
