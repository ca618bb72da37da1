"""Per-head statistics of the full attention of long inputs, without any T × T array.

The model's forward runs with attnlab's attention observed (:func:`attnlab.hf.capture_attention.observing`):
each layer's attention goes through the compiled blockwise kernel, whose forward takes the statistics of
the exact weights, α_ij = exp(s_ij − LSE_i), in the same pass (:mod:`attnlab.backends.kernel.fused`:
each query block's tiles of weights kept until its rows' LSE is known), and accumulates:

    prev, self, next, first   the weight on key i − 1, i, i + 1 and 0 (mean over the rows that have it)
    distance                  Σ_j α_ij |i − j|, mean over rows
    entropy                   −Σ_j α_ij log α_ij = LSE_i − Σ_j α_ij s_ij, nats, mean over rows
    entropy_norm              entropy / log(keys row i sees), mean over rows that see more than one key
    sink_share                with learned sinks (gpt-oss): s_i = exp(sink − LSE_i), the rest of the row's 1
                              (docs/design.md's sink share), mean over rows; None without sinks

With learned sinks the LSE includes the sink's logit, so α are the weights the model uses (a row adds up to
1 − s_i), and, as the sink share rule says, the sink is one more outcome of the entropy, −Σ_j α_ij log α_ij
− s_i log s_i, normalised by log(keys row i sees + 1) over the rows that see at least one key; the other
statistics take the weights as they are (the share is given to no key).
    received                  Σ_i α_ij: the attention each token receives, [L, H, T] per text

Memory grows as L · H · T, never T² (the kept tiles: a query block's rows × T per thread). Where they would
exceed ``fused.KEPT_BYTES``, or the build has no such pass, the forward hands over q, k and the LSE and a
second pass recomputes the weights (:func:`attnlab.backends.kernel.stats`: one cache-sized tile at a time,
every statistic from it in one sweep); where the kernel was not built, :func:`layer_stats` does the same in
PyTorch, a block of rows × every key at a time (the masks touch only the columns near the band's edges).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from attnlab import masks
from attnlab.masks.intervals import contains
from attnlab.backends import kernel
from attnlab.backends.kernel import fused
from attnlab.interventions.heap import release_free_memory

ROW_STATS = ("prev", "self", "next", "first", "distance", "entropy", "entropy_norm")
BLOCK_BYTES = 16 * 2**20  # the scores of one block of rows, all heads together: bounds the pass's memory
DEFAULT_TOP = 10


@dataclass(frozen=True)
class HeadStats:
    """Statistics per layer and head over every row of every text: ``means[name]`` is [L, H] for
    each name of :data:`ROW_STATS`; ``received[i]`` is [L, H, T_i] (column sums of text i)."""

    means: dict[str, np.ndarray]
    received: list[np.ndarray] = field(repr=False)
    tokens: list[list[str]] = field(repr=False)
    model_id: str
    revision: str | None
    causal: bool

    @property
    def sink_share(self) -> np.ndarray | None:
        """[L, H] each head's mean sink share over its rows (a model with learned sinks), else None."""
        return self.means.get("sink_share")

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    def top_received(self, i: int = 0, k: int = DEFAULT_TOP) -> list[tuple[int, str, float]]:
        """The ``k`` tokens of text ``i`` that receive the most attention, summed over layers and heads
        and divided by L · H: (position, token, mean attention received)."""
        r = self.received[i].mean(axis=(0, 1))  # (T,)
        order = np.argsort(-r, kind="stable")[:k]
        return [(int(j), self.tokens[i][j], float(r[j])) for j in order]

    def to_dict(self, top: int = DEFAULT_TOP) -> dict:
        """JSON-ready: the [L][H] means, and per text its length and top receiving tokens (layers,
        heads and positions as arrays are 0-based; printed ones 1-based)."""
        return {
            "model_id": self.model_id, "revision": self.revision, "causal": self.causal,
            "num_layers": int(self.received[0].shape[0]), "num_heads": int(self.received[0].shape[1]),
            "means": {k: np.round(v, 6).tolist() for k, v in self.means.items()},
            "texts": [{"tokens": len(t), "top_received": [
                {"position": j, "token": tok, "received": round(r, 6)} for j, tok, r in self.top_received(i, top)]}
                for i, t in enumerate(self.tokens)],
        }


class _Accumulator:
    """Running sums of one text's row statistics, layer by layer (the observing callback)."""

    def __init__(self, t: int, block_rows: int | None) -> None:
        self.t, self.block_rows = t, block_rows
        self.sums: list[dict[str, np.ndarray]] = []  # per layer: name → (H,) sums over rows
        self.counts: list[dict[str, int]] = []
        self.received: list[np.ndarray] = []  # per layer (H, T)

    def __call__(self, query: Any, key: Any, lse: Any, *, scale: float, causal: bool, window: tuple | None,
                 softcap: float | None = None, sinks: Any = None) -> None:
        stats = compiled_layer_stats if kernel.isa() is not None else layer_stats
        self._add(*stats(query[0], key[0], lse[0], scale=scale, causal=causal, window=window, softcap=softcap,
                         block_rows=self.block_rows, sinks=sinks))

    def attend(self, query: Any, key: Any, value: Any, *, scale: float, causal: bool, window: tuple | None,
               softcap: float | None = None, sinks: Any = None) -> Any:
        """The layer's attention output, its statistics taken in the same pass (kernel.fused), or None where that
        pass is not there (no kernel, a build without it) or its kept tiles would exceed fused.KEPT_BYTES: then
        the observer runs the forward and calls this object with the LSE (the statistics pass after it)."""
        built = getattr(kernel._tiles, "forward_stats", None) is not None
        if not built or fused.kept_bytes(self.t, self.block_rows) > fused.KEPT_BYTES:
            return None
        out, lse, sums, received = fused.attention_stats(
            query, key, value, causal=causal, window=window, scale=scale, softcap=softcap, sink_logits=sinks,
            block_size=None if self.block_rows is None else (self.block_rows, kernel.BLOCK[1]))
        self._add(*_kernel_sums(sums, received, lse[0], causal, window, sinks))
        return out

    def _add(self, sums: dict[str, np.ndarray], counts: dict[str, int], received: np.ndarray) -> None:
        self.sums.append(sums)
        self.counts.append(counts)
        self.received.append(received)
        release_free_memory()


def _block_rows(h: int, t: int) -> int:
    return max(8, min(t, BLOCK_BYTES // (4 * h * max(t, 1))))


def visibility(causal: bool, window: tuple | None) -> masks.Mask | None:
    """A layer's causal band and window as the attnlab.masks description both statistics passes read."""
    return masks.from_keywords(causal=causal, window=window)


def _spans(t: int, causal: bool, window: tuple | None) -> tuple[np.ndarray, np.ndarray] | None:
    """Each row's key intervals (T, n) under the layer's description, None: every key."""
    m = visibility(causal, window)
    if m is None:
        return None
    lo, hi = m.spans(m.frame(t, t))
    return lo[0, 0], hi[0, 0]  # (T, n)


def _seen(t: int, spans: tuple | None) -> np.ndarray:
    """How many keys each row sees (T,)."""
    if spans is None:
        return np.full(t, t)
    lo, hi = spans
    return np.clip(hi - lo, 0, None).sum(-1)


def _block_keys(spans: tuple | None, t: int, i0: int, i1: int) -> tuple[int, int]:
    """The keys [j0, j1) some row i0..i1 − 1 sees (all where every key is seen)."""
    if spans is None:
        return 0, t
    lo, hi = spans[0][i0:i1], spans[1][i0:i1]
    live = hi > lo
    if not live.any():
        return 0, 1
    return int(np.where(live, lo, t).min()), int(np.where(live, hi, 0).max())


def _counts(t: int, spans: tuple | None, sinks: bool = False) -> dict[str, int]:
    """The rows each statistic is a mean over: all, but prev and next (t − 1), entropy_norm (rows with more
    than one outcome: keys seen, and the sink); with sinks, the sink share's (all rows)."""
    counts = {name: t for name in ROW_STATS}
    counts["prev"] = counts["next"] = t - 1
    counts["entropy_norm"] = int((_seen(t, spans) + sinks > 1).sum())
    if sinks:
        counts["sink_share"] = t
    return counts


def _sink_terms(lse: Any, sinks: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each row's sink share s = exp(sink − LSE) and entropy term −s ln s, (H, T) float64 each."""
    import torch

    x = torch.as_tensor(sinks).double().reshape(-1, 1) - torch.as_tensor(lse).double()  # (H, T) ln s
    x = torch.where(torch.isfinite(x), x, torch.full_like(x, -math.inf))
    share = x.exp()
    return share.numpy(), torch.where(share > 0, -share * x, torch.zeros_like(x)).numpy()


def compiled_layer_stats(q: Any, k: Any, lse: Any, *, scale: float, causal: bool, window: tuple | None = None,
                         softcap: float | None = None, block_rows: int | None = None,
                         sinks: Any = None) -> tuple[dict[str, np.ndarray], dict[str, int], np.ndarray]:
    """:func:`layer_stats` by the compiled pass (:func:`attnlab.backends.kernel.stats`); ``block_rows``
    the query rows per tile (None: the kernel's)."""
    h, t, d = q.shape
    hkv = k.shape[0]
    sums, received = kernel.stats(q.reshape(hkv, h // hkv, t, d), k, lse.reshape(hkv, h // hkv, t), scale=scale,
                                  mask=visibility(causal, window), softcap=softcap,
                                  block_size=None if block_rows is None else (block_rows, kernel.BLOCK[1]),
                                  sinks=None if sinks is None else _f32_heads(sinks, h).reshape(hkv, h // hkv))
    return _kernel_sums(sums, received, lse, causal, window, sinks)


def _kernel_sums(sums: np.ndarray, received: np.ndarray, lse: Any, causal: bool, window: tuple | None,
                 sinks: Any) -> tuple[dict[str, np.ndarray], dict[str, int], np.ndarray]:
    """A compiled pass's sums (B_kv, G, 7) and received (B_kv, G, T) as :func:`layer_stats` gives them; lse (H, T)."""
    h, t = received.shape[0] * received.shape[1], received.shape[-1]
    sums = sums.reshape(h, len(kernel.STATS))
    out = {name: sums[:, kernel.STATS.index(name)] for name in ROW_STATS}
    if sinks is not None:
        out["sink_share"] = _sink_terms(lse, sinks)[0].sum(-1)
    return out, _counts(t, _spans(t, causal, window), sinks is not None), received.reshape(h, t).astype(np.float32)


def _f32_heads(sinks: Any, h: int) -> np.ndarray:
    """The sink logits as float32 (H,)."""
    import torch

    return torch.as_tensor(sinks).detach().float().cpu().reshape(h).numpy()


def layer_stats(q: Any, k: Any, lse: Any, *, scale: float, causal: bool, window: tuple | None = None,
                softcap: float | None = None, block_rows: int | None = None,
                sinks: Any = None) -> tuple[dict[str, np.ndarray], dict[str, int], np.ndarray]:
    """One layer's row-statistic sums (name → (H,), float64), their row counts, and the attention
    each key receives (H, T), from q (H, T, D), k (H_kv, T, D) and the rows' LSE (H, T) (torch tensors).

    ``window`` (left, right) as attnlab.attention's band; with ``causal`` right is 0; ``softcap`` c: the
    scores are c·tanh(s / c) (Gemma-2), as attention applies it; ``sinks`` (H,) learned sink logits, which
    the LSE includes (the module docstring says how the statistics count the sink).
    """
    import torch

    h, t, d = q.shape
    hkv = k.shape[0]
    g = h // hkv
    q, k, lse = q.float(), k.float(), lse.float()
    spans = _spans(t, causal, window)  # each row's key intervals (T, n): the layer's description
    seen_all = torch.from_numpy(_seen(t, spans)).float()  # (T,) keys each row sees
    rows_per = block_rows or _block_rows(h, t)
    sums = {name: torch.zeros(h, dtype=torch.float64) for name in ROW_STATS}
    received = torch.zeros(h, t, dtype=torch.float64)
    if sinks is not None:
        share, sink_ent = _sink_terms(lse, sinks)  # (H, T) each
    # Two buffers for the block's scores and weights, reused: a fresh block-sized allocation each time
    # would be mapped and faulted in page by page.
    size = h * min(rows_per, t) * t
    buf_x, buf_a = torch.empty(size), torch.empty(size)
    for i0 in range(0, t, rows_per):
        i1 = min(t, i0 + rows_per)
        b = i1 - i0
        j0, j1 = _block_keys(spans, t, i0, i1)  # the keys any row of the block may see
        rows = torch.arange(i0, i1)
        cols = torch.arange(j0, j1)
        qb = q[:, i0:i1].reshape(hkv, g * b, d)  # (H_kv, G·b, D): query head h = kv head h // G
        n = h * b * (j1 - j0)
        # log α = scale · q·k − LSE, rounded as attention rounds its scores: the product, then the scale
        # (baddbmm's fused alpha and the LSE folded into the product both lose 1e-5 of sharp rows' weights)
        x = torch.matmul(qb, k[:, j0:j1].transpose(-1, -2), out=buf_x[:n].view(hkv, g * b, j1 - j0))
        x = x.mul_(scale)
        if softcap is not None:
            x = x.div_(softcap).tanh_().mul_(softcap)
        x = x.view(h, b, j1 - j0).sub_(lse[:, i0:i1, None])  # (H, b, Tk)
        hidden = None if spans is None else torch.from_numpy(~contains(spans[0][i0:i1], spans[1][i0:i1], np.arange(j0, j1)))
        if hidden is not None:  # (b, width): what the rows do not see
            x.masked_fill_(hidden, -math.inf)
        a = torch.exp(x, out=buf_a[:n].view(h, b, j1 - j0))  # (H, b, Tk): the exact weights
        if hidden is not None:
            x.masked_fill_(hidden, 0.0)  # so that α log α is 0, not NaN, where α = 0
        received[:, j0:j1] += torch.matmul(torch.ones(h, 1, b), a)[:, 0]  # column sums as a product: one pass
        # Σ α |i − j| with positions counted from the block's first row, so local heads sum small numbers
        rel = (cols - i0).float()
        if causal:  # every key at or before the row: |i − j| = i − j (Σ_j α = 1 − the sink share, with sinks)
            here = (rows - i0).float() if sinks is None else (rows - i0).float() * a.sum(-1)
            dist = here - torch.matmul(a, rel)
        else:
            dist = (a * (cols[None, :] - rows[:, None]).abs().float()).sum(-1)
        # −Σ α log α term by term (LSE − Σ α s would cancel badly for sharp rows); x is not needed after
        ent = -x.mul_(a).sum(-1)
        seen = seen_all[i0:i1]  # (b,): keys each row sees
        if sinks is not None:  # the sink: one more outcome (its term −s ln s, one more in the count)
            ent = ent + torch.from_numpy(sink_ent[:, i0:i1]).float()
            seen = seen + 1
        many = seen > 1
        sums["entropy"] += ent.sum(-1, dtype=torch.float64)
        sums["entropy_norm"] += (ent[:, many] / torch.log(seen[many])).sum(-1, dtype=torch.float64)
        sums["distance"] += dist.sum(-1, dtype=torch.float64)
        for name, offset in (("prev", -1), ("self", 0), ("next", 1)):
            j = rows + offset
            ok = (j >= j0) & (j < j1)
            sums[name] += a[:, ok.nonzero()[:, 0], (j[ok] - j0)].sum(-1, dtype=torch.float64)
        if j0 == 0:
            sums["first"] += a[:, :, 0].sum(-1, dtype=torch.float64)
    out = {n: v.numpy() for n, v in sums.items()}
    if sinks is not None:
        out["sink_share"] = share.sum(-1)
    return out, _counts(t, spans, sinks is not None), received.float().numpy()


def head_stats(
    texts: Any,
    model: str | os.PathLike | Any = None,
    revision: str | None = None,
    *,
    max_tokens: int | None = None,
    block_rows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    distributed: bool | str = "auto",
    group: Any = None,
) -> HeadStats:
    """Statistics of every layer's and head's full attention over each text, at any length.

    ``texts``: a str or a list of them, each run alone (no padding), tokenized with the model's
    special tokens and cut to ``max_tokens`` when given. ``model``: as :func:`attnlab.capture`;
    encoders and decoders (causal, sliding windows, softcapped scores); not encoder–decoders.
    ``progress(done, total)`` after each text (of this rank's share). ``distributed``: True shares
    the texts between the ranks of ``group`` (joining torchrun's job from its environment if no group
    exists yet), sums the statistics with one all-reduce and gathers each text's attention received;
    "auto" does so under a job of more than one process; False computes everything here. Every rank
    returns the same result, equal to one process's.
    """
    items = [texts] if isinstance(texts, str) else list(texts)
    if not items or not all(isinstance(x, str) and x.strip() for x in items):
        raise ValueError("texts must be a non-empty string or a non-empty list of non-empty strings")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 2):
        raise ValueError(f"max_tokens must be an int >= 2 or None, got {max_tokens!r}")
    from attnlab.distributed import env

    rank, world = env.join(distributed, group)
    if world == 1:
        return _head_stats(items, 0, model, revision, max_tokens, block_rows, progress).stats
    first = sum(len(env.shard_items(items, r, world)) for r in range(rank))
    part = env.on_every_rank(lambda: _head_stats(env.shard_items(items, rank, world), first, model, revision,
                                                 max_tokens, block_rows, progress), "head_stats", group)
    names = list(part.totals)  # ROW_STATS, and sink_share with learned sinks (the same model on every rank)
    totals = env.all_reduce_sum([part.totals[n] for n in names] + [[part.counts[n] for n in names]], group)
    counts = dict(zip(names, totals.pop()))
    shares = env.all_gather_objects((part.stats.received, part.stats.tokens), group)
    return replace(part.stats, means={n: s / max(counts[n], 1) for n, s in zip(names, totals)},
                   received=[r for rec, _ in shares for r in rec], tokens=[t for _, tok in shares for t in tok])


@dataclass(frozen=True)
class _Part:
    """One process's share: its statistics, and the sums and counts behind its means."""

    stats: HeadStats
    totals: dict[str, np.ndarray]
    counts: dict[str, int]


def _head_stats(items: list[str], first: int, model: Any, revision: str | None, max_tokens: int | None,
                block_rows: int | None, progress: Callable[[int, int], None] | None) -> _Part:
    """head_stats of ``items`` in this process (texts numbered from ``first`` in errors), with the sums
    and counts behind its means, which add up over the ranks."""
    import torch

    from attnlab.hf.capture_attention import observing
    from attnlab.hf.loading import LoadedModel, load_model

    lm = model if isinstance(model, LoadedModel) else load_model(model, revision)
    if lm.config.get("is_encoder_decoder"):
        raise ValueError(f"head_stats serves encoders and decoders; {lm.model_id!r} is an encoder–decoder")
    limit = lm.max_tokens
    if max_tokens is not None and max_tokens > limit:
        raise ValueError(f"max_tokens is {max_tokens}; {lm.model_id!r} takes at most {limit} tokens")
    totals: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    received, tokens = [], []
    names = ROW_STATS
    for n, text in enumerate(items):
        # verbose=False: the length is checked just below with attnlab's error, so transformers' own
        # "Token indices sequence length is longer than …" warning would only say it first
        ids = lm.tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"][:max_tokens]
        if len(ids) > limit:
            raise ValueError(f"texts[{first + n}] has {len(ids)} tokens; {lm.model_id!r} takes at most {limit} "
                             f"(pass max_tokens to cut it)")
        acc = _Accumulator(len(ids), block_rows)
        x = torch.tensor([ids])
        with torch.inference_mode(), observing(acc):
            lm.model(input_ids=x, attention_mask=torch.ones_like(x))
        if len(acc.sums) != lm.num_layers:
            raise RuntimeError(f"model {lm.model_id!r} made {len(acc.sums)} attention calls for {lm.num_layers} layers")
        names = ROW_STATS + (("sink_share",) if any("sink_share" in s for s in acc.sums) else ())  # learned sinks
        for name in names:
            layer = np.stack([s.get(name, np.zeros(lm.num_heads)) for s in acc.sums])  # (L, H); no sinks: share 0
            totals[name] = totals.get(name, 0) + layer
            counts[name] = counts.get(name, 0) + acc.counts[0].get(name, len(ids))
        received.append(np.stack(acc.received))  # (L, H, T)
        tokens.append(lm.tokenizer.convert_ids_to_tokens(ids))
        if progress is not None:
            progress(n + 1, len(items))
    means = {name: totals.get(name, 0) / max(counts.get(name, 0), 1) for name in names}
    found = HeadStats(means=means, received=received, tokens=tokens, model_id=lm.model_id, revision=lm.revision,
                      causal=_is_causal(lm))
    return _Part(found, {n: np.asarray(totals.get(n, np.zeros((lm.num_layers, lm.num_heads)))) for n in names},
                 {n: counts.get(n, 0) for n in names})


def _is_causal(lm: Any) -> bool:
    """Whether the model's attention is causal (its attention modules say so)."""
    return any(getattr(m, "is_causal", False) for m in lm.model.modules() if hasattr(m, "is_causal"))
