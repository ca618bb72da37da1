"""Heads as causes: knock heads out of attnlab's transformer and measure what changes.

A map says where a head looks, not whether the model needs it. :func:`ablate` runs the model with
chosen heads taken out (their output zeroed, or replaced by their mean over the input) and reports
the effect: for an encoder made for sentence embeddings (the default all-MiniLM-L6-v2) the cosine
between each sentence's embedding with and without the heads; for a causal language model the
change in its next-token loss. :func:`head_importance` gives every head's effect alone [L, H] next
to the gradient-based importance of Michel et al. 2019 ("Are Sixteen Heads Really Better than
One?"): each head's output is multiplied by a gate ξ_h = 1 and the importance is
E_x |∂L(x)/∂ξ_h|, the first-order estimate of what removing the head costs. For an embedding model
the loss 1 − cos(e_ξ, e) has zero gradient at ξ = 1 (it is at its minimum there), so the
gradient score is its first-order analogue, E_x ‖∂e(x)/∂ξ_h‖, the length of the embedding's move
per unit of gate (1 − cos ≈ ‖Δe‖²/2 for unit embeddings).

Heads are named by :class:`~attnlab.maps.heads.Head`, 0-based as the [L, H] arrays index them; the
CLI prints them 1-based ("layer 3, head 11").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.maps.heads import Head, ScoredHead, heads_of, ranked

HOWS = ("zero", "mean")
PASS_TOKENS = 8192  # positions per forward pass when copies of the batch are run together (ablations, probes)


@dataclass(frozen=True)
class Ablation:
    """What taking ``heads`` out did to each sentence.

    ``metric`` is "cosine" (encoder: ``cosine`` (N,) between the embeddings with and without) or
    "loss" (language model: ``loss`` and ``ablated_loss`` (N,), mean next-token cross-entropy in nats).
    ``effect``: one number, 1 − mean cosine or the mean loss change.
    """

    model_id: str
    heads: tuple[Head, ...]
    how: str
    metric: str
    sentences: tuple[str, ...]
    cosine: np.ndarray | None
    loss: np.ndarray | None
    ablated_loss: np.ndarray | None
    effect: float

    def to_dict(self) -> dict:
        arr = lambda a: None if a is None else [float(x) for x in a]  # noqa: E731
        return {"model_id": self.model_id, "heads": [h.to_dict() for h in self.heads], "how": self.how,
                "metric": self.metric, "sentences": list(self.sentences), "cosine": arr(self.cosine),
                "loss": arr(self.loss), "ablated_loss": arr(self.ablated_loss), "effect": self.effect}


@dataclass(frozen=True)
class Importance:
    """Every head's importance [L, H], two ways: ``ablation`` (its effect alone, as :class:`Ablation`'s
    ``effect``) and ``gradient`` (Michel et al. 2019; see the module docstring); ``spearman`` is the
    rank correlation of the two over all heads."""

    model_id: str
    metric: str
    how: str
    sentences: tuple[str, ...]
    ablation: np.ndarray
    gradient: np.ndarray
    spearman: float

    def top(self, n: int = 5, by: str = "ablation") -> list[ScoredHead]:
        """The ``n`` most important heads and their scores, most important first."""
        if by not in ("ablation", "gradient"):
            raise ValueError(f"by must be 'ablation' or 'gradient', got {by!r}")
        return ranked(self.ablation if by == "ablation" else self.gradient, n=n)

    def to_dict(self) -> dict:
        return {"model_id": self.model_id, "metric": self.metric, "how": self.how, "sentences": list(self.sentences),
                "ablation": self.ablation.tolist(), "gradient": self.gradient.tolist(), "spearman": self.spearman}


@functools.lru_cache(maxsize=2)
def _pretrained(model: Any, backend: str) -> Any:
    from attnlab.transformer.model import Transformer

    return Transformer.from_pretrained(model, backend=backend)


def _load(model: Any, backend: str) -> tuple[Any, str]:
    """(transformer, its name): a Transformer passes through; None, a folder or a hub id is loaded once."""
    from attnlab.transformer.model import Transformer

    if isinstance(model, Transformer):
        return model.with_backend(backend), model.config.family
    from pathlib import Path

    name = "all-MiniLM-L6-v2" if model is None else Path(model).name if Path(model).is_dir() else str(model)
    return _pretrained(None if model is None else str(model), backend), name


def _encode(net: Any, sentences: Any) -> tuple[tuple[str, ...], Any, Any]:
    sentences = (sentences,) if isinstance(sentences, str) else tuple(sentences)
    if not sentences or not all(isinstance(s, str) and s for s in sentences):
        raise ValueError(f"sentences must be non-empty strings, got {sentences!r}")
    if net.tokenizer is None:
        raise ValueError("sentences need the model's tokenizer: load it with Transformer.from_pretrained")
    enc = net.tokenizer(list(sentences), padding=True, truncation=True, return_tensors="pt",
                        max_length=net.config.max_positions - net.config.position_offset)
    if net.config.causal and int(enc["attention_mask"].sum(-1).min()) < 2:
        raise ValueError("sentences must have at least two tokens each for a language model's next-token loss")
    return sentences, enc["input_ids"], enc["attention_mask"]


def knockout(c: Any, keep: Any, fill: Any = None) -> list[tuple[str, Any]]:
    """``fwd_hooks`` that knock heads out at each layer's ``hook_z``: z ← keep·z + (1 − keep)·fill, per head.

    keep [L, H] (or [B, L, H], one per sequence): 0 takes a head out, 1 leaves it in; as a gate its
    gradient is the head importance of Michel et al. 2019. fill [L, H, Dh] takes the place of what is
    taken out (None: zeros; each head's mean output, :func:`head_means`: a mean ablation).
    """
    L, H = c.num_layers, c.num_heads
    if keep.dim() not in (2, 3) or tuple(keep.shape[-2:]) != (L, H):
        raise ValueError(f"keep must be [L, H] = {[L, H]} or [B, L, H], got {list(keep.shape)}")
    if fill is not None and tuple(fill.shape) != (L, H, c.value_dim):
        raise ValueError(f"fill must be [L, H, Dv] = {[L, H, c.value_dim]}, got {list(fill.shape)}")

    def gate(layer: int) -> Any:
        def fn(z: Any, name: str) -> Any:  # z (B, H, T, Dh)
            k = keep[..., layer, :].to(z.dtype).reshape(-1, H, 1, 1)  # (1 or B, H, 1, 1)
            f = 0.0 if fill is None else fill[layer].to(z.dtype)[None, :, None, :]  # (1, H, 1, Dh)
            return k * z + (1 - k) * f
        return fn

    return [(f"blocks.{layer}.attn.hook_z", gate(layer)) for layer in range(L)]


def lm_loss(net: Any, ids: Any, mask: Any, targets: Any = None, *, fwd_hooks: Any = ()) -> Any:
    """Mean next-token cross-entropy of each sequence (B,) over its real targets (or ``targets`` (B, T),
    true where the token at t is to be scored), with ``fwd_hooks`` run (e.g. :func:`knockout`)."""
    import torch.nn.functional as F

    logits = net.run_with_hooks(ids, mask, fwd_hooks=fwd_hooks)[:, :-1]  # (B, T−1, V)
    nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # (B, T−1)
    scored = (mask if targets is None else targets)[:, 1:].to(nll.dtype)  # (B, T−1)
    return (nll * scored).sum(-1) / scored.sum(-1).clamp(min=1)


def _embed(net: Any, ids: Any, mask: Any, *, fwd_hooks: Any = ()) -> Any:
    import torch.nn.functional as F

    from attnlab.transformer.model import mean_pool

    h = net.run_with_hooks(ids, mask, fwd_hooks=fwd_hooks)  # (B, T, d)
    return F.normalize(mean_pool(h, mask), dim=-1)  # (B, d)


def head_means(net: Any, ids: Any, mask: Any) -> Any:
    """Each head's output averaged over the real tokens of the input: the fill of a mean ablation [L, H, Dh]."""
    import torch

    with torch.no_grad():
        _, cache = net.run_with_cache(ids, mask, names=lambda n: n.endswith(".attn.hook_z"))
    heads = [cache[f"blocks.{layer}.attn.hook_z"] for layer in range(net.config.num_layers)]  # L × (B, H, T, Dh)
    m = mask.to(heads[0].dtype)[:, None, :, None]  # (B, 1, T, 1)
    return torch.stack([(h * m).sum((0, 2)) / m.sum((0, 2)) for h in heads])  # (L, H, Dh)


def _run(net: Any, ids: Any, mask: Any, fwd_hooks: Any) -> Any:
    import torch

    with torch.no_grad():
        if net.config.causal:
            return lm_loss(net, ids, mask, fwd_hooks=fwd_hooks)
        return _embed(net, ids, mask, fwd_hooks=fwd_hooks)


def ablate(sentences: Any, heads: Any, model: Any = None, how: str = "zero", backend: str = "auto") -> Ablation:
    """Run ``model`` on ``sentences`` with ``heads`` knocked out: Heads or 0-based (layer, head) pairs.

    model: None (the bundled default), a folder, a hub id, or a :class:`~attnlab.transformer.Transformer`.
    how: "zero" (the heads' outputs are zeroed) or "mean" (each is replaced by its mean over the input).
    """
    import torch

    if how not in HOWS:
        raise ValueError(f"how must be one of {', '.join(HOWS)}, got {how!r}")
    net, name = _load(model, backend)
    c = net.config
    picked = heads_of(heads, c.num_layers, c.num_heads, "heads")
    sentences, ids, mask = _encode(net, sentences)
    keep = torch.ones(c.num_layers, c.num_heads)
    for layer, head in picked:
        keep[layer, head] = 0.0
    fill = head_means(net, ids, mask) if how == "mean" else None
    clean, hit = _run(net, ids, mask, ()), _run(net, ids, mask, knockout(c, keep, fill))
    if c.causal:
        loss, ablated = clean.numpy().astype(np.float64), hit.numpy().astype(np.float64)
        return Ablation(name, picked, how, "loss", sentences, None, loss, ablated, float((ablated - loss).mean()))
    cos = (clean * hit).sum(-1).clamp(-1, 1).numpy().astype(np.float64)  # unit vectors: the dot is the cosine
    return Ablation(name, picked, how, "cosine", sentences, cos, None, None, float(1.0 - cos.mean()))


def head_importance(sentences: Any, model: Any = None, how: str = "zero", backend: str = "auto",
                    probes: int | None = 64, seed: int = 0) -> Importance:
    """Every head's effect alone [L, H] (one ablation per head) and Michel et al.'s gradient importance [L, H].

    probes, seed: for an encoder, how many random directions (seeded) estimate ‖∂e/∂ξ_h‖ (None: all
    d, exact; the cost grows with them); a language model's gradient needs one backward pass in all.
    """
    import torch

    if how not in HOWS:
        raise ValueError(f"how must be one of {', '.join(HOWS)}, got {how!r}")
    net, name = _load(model, backend)
    c = net.config
    sentences, ids, mask = _encode(net, sentences)
    fill = head_means(net, ids, mask) if how == "mean" else None
    clean = _run(net, ids, mask, ())  # (B,) losses or (B, d) embeddings
    L, H, B = c.num_layers, c.num_heads, ids.shape[0]
    effect = np.zeros(L * H)
    per_pass = _copies(ids)
    for start in range(0, L * H, per_pass):  # several heads per pass: each copy of the batch loses one head
        group = range(start, min(L * H, start + per_pass))
        keep = torch.ones(len(group), B, L, H)
        for j, g in enumerate(group):
            keep[j, :, g // H, g % H] = 0.0
        hooks = knockout(c, keep.reshape(-1, L, H), fill)
        hit = _run(net, ids.repeat(len(group), 1), mask.repeat(len(group), 1), hooks)
        hit = hit.reshape(len(group), B, *clean.shape[1:])  # (G, B) or (G, B, d)
        change = (hit - clean).mean(1) if c.causal else 1.0 - (hit * clean).sum(-1).mean(1)  # (G,)
        effect[start:start + len(group)] = change.numpy()
    effect = effect.reshape(L, H)
    grad = _gradient(net, ids, mask, probes, seed)
    return Importance(name, "loss" if c.causal else "cosine", how, sentences, effect, grad, _spearman(effect, grad))


def _gradient(net: Any, ids: Any, mask: Any, probes: int | None, seed: int) -> np.ndarray:
    """Michel et al.'s E_x |∂L(x)/∂ξ_h| (language model), or E_x ‖∂e(x)/∂ξ_h‖ (encoder), [L, H].

    Each sequence has its own gates [B, L, H], so one backward pass gives every sequence's gradient.
    The encoder's norm needs the Jacobian ∂e/∂ξ row by row (several rows a pass, each on its own copy
    of the batch): all d rows when ``probes``
    is None, else its projections on ``probes`` random orthonormal directions (seeded), scaled by
    d / probes, an unbiased estimate of the squared norm (with probes = d, exact in any basis).
    """
    import torch

    c, B, dtype = net.config, ids.shape[0], net.tok_emb.weight.dtype
    gates = torch.ones(B, c.num_layers, c.num_heads, dtype=dtype, requires_grad=True)
    with torch.enable_grad():
        if c.causal:
            (g,) = torch.autograd.grad(lm_loss(net, ids, mask, fwd_hooks=knockout(c, gates)).sum(), gates)
            return g.abs().mean(0).numpy().astype(np.float64)
        d = c.d_model
        if probes is None:
            basis, weight = torch.eye(d, dtype=dtype), 1.0  # (d, d): every row of the Jacobian
        else:
            if isinstance(probes, bool) or not isinstance(probes, int) or not 1 <= probes <= d:
                raise ValueError(f"probes must be None or an int in 1..{d}, got {probes!r}")
            rng = np.random.default_rng(seed)
            q, _ = np.linalg.qr(rng.standard_normal((d, probes)))  # (d, probes), orthonormal columns
            basis, weight = torch.from_numpy(q.T.copy()).to(dtype), d / probes  # (probes, d)
        sq = torch.zeros(B, c.num_layers, c.num_heads, dtype=dtype)
        per_pass = _copies(ids)
        for start in range(0, len(basis), per_pass):  # R copies of the batch, each projected on its own direction
            u = basis[start:start + per_pass]  # (R, d)
            r = len(u)
            copies = torch.ones(r * B, c.num_layers, c.num_heads, dtype=dtype, requires_grad=True)
            e = _embed(net, ids.repeat(r, 1), mask.repeat(r, 1), fwd_hooks=knockout(c, copies))  # (R·B, d)
            (g,) = torch.autograd.grad((e.reshape(r, B, -1) * u[:, None, :]).sum(), copies)  # (R·B, L, H)
            sq += (g.detach() ** 2).reshape(r, B, c.num_layers, c.num_heads).sum(0)
    return (sq * weight).sqrt().mean(0).numpy().astype(np.float64)


def _copies(ids: Any) -> int:
    """How many copies of the batch one pass takes: about PASS_TOKENS positions, at least one copy."""
    return max(1, PASS_TOKENS // ids.numel())


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their average rank (as Spearman's rho wants)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation over all heads (0 when either has no spread)."""
    ra, rb = _ranks(a.ravel()), _ranks(b.ravel())
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])
