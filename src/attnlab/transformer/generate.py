"""Token-by-token generation with a KV cache: :meth:`Transformer.generate` and its result.

One path serves the prompt and every new token: the transformer's forward with ``kv_cache=``
(new ids + the cache → the new positions' hidden states, the cache filled). The prompts of a batch
go in left-padded, so each one's last token is the last column and the per-sequence causal rule
puts its tokens at positions 0..P_b − 1; then one token per sequence per step. Each step's choice
comes from :class:`~attnlab.transformer.sampling.Sampling`.

With ``maps=True`` each step keeps one attention row per layer and head: step t's row is the
attention of the query at position P − 1 + t (the token fed at that step, whose output chose new
token t) over positions 0..P − 1 + t, post-softmax, window and sink slots put back at their
positions (zeros where a key was dropped). It costs a row per step, never a T × T map.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnlab.backends.reads import Reads
from attnlab.transformer.cache import KINDS, KVCache, layer_kinds
from attnlab.transformer.evict_cache import check_budget
from attnlab.transformer.hooks import LAST_PATTERN, Hooks, build
from attnlab.transformer.quant_cache import cache_dtype_of, check_backend
from attnlab.transformer.sampling import Sampling
from attnlab.transformer.step import plan
from attnlab.transformer.threads import step_threads


@dataclass(frozen=True)
class Generation:
    """What :meth:`Transformer.generate` produced for a batch of B prompts and N steps.

    ids [B, N]: the new tokens; after a stop id, ``pad_id``. lengths [B]: new tokens per sequence
    (a stop id included). logits [B, N, V]: the model's logits each token was chosen from (before
    temperature and filtering; zeros after a sequence stopped). sequences: per sequence, prompt +
    new ids. text: per sequence the new tokens decoded, when the model has a tokenizer.
    attention (``maps=True``): per sequence a list of ``lengths[b]`` arrays [L, H, P_b + t]; row t
    is the query at ``positions[b][t]`` = P_b − 1 + t over positions 0..P_b − 1 + t (after a cache
    passed back in, P_b counts what it held too). kv_cache: the cache, every position fed so far (the
    prompt and each new token but the last; a sequence writes nothing after its stop id).
    """

    ids: torch.Tensor
    lengths: torch.Tensor
    logits: torch.Tensor
    sequences: list[list[int]]
    prompt_lengths: list[int]
    pad_id: int
    text: list[str] | None = None
    attention: list[list[np.ndarray]] | None = None
    positions: list[list[int]] | None = None
    kv_cache: Any = None  # the KVCache it ran with: every position fed (not the last new token), to pass back in

    def to_dict(self) -> dict:
        """JSON-ready: ids, lengths, sequences, text, positions and the KV cache's kinds, dtype and bytes; logits and attention by shape
        (they are arrays: write them with the maps format or NumPy)."""
        return {
            "ids": self.ids.tolist(), "lengths": self.lengths.tolist(), "sequences": self.sequences,
            "prompt_lengths": self.prompt_lengths, "pad_id": self.pad_id, "text": self.text,
            "positions": self.positions, "logits_shape": list(self.logits.shape),
            "attention_shapes": None if self.attention is None else [[list(a.shape) for a in seq] for seq in self.attention],
            "kv_cache": None if self.kv_cache is None else self.kv_cache.to_dict(),
        }


def _prompts(model: Any, input_ids: Any, attention_mask: Any) -> list[list[int]]:
    """The prompts as lists of ids: from text (with a tokenizer), a [B, T] tensor or list (padding
    marked by ``attention_mask``, each row's real tokens one run), or a list of unequal lists."""
    if isinstance(input_ids, str) or (isinstance(input_ids, (list, tuple)) and input_ids
                                      and all(isinstance(s, str) for s in input_ids)):
        if model.tokenizer is None:
            raise ValueError("input_ids: text needs a tokenizer; this model has none (pass token ids)")
        if attention_mask is not None:
            raise ValueError("attention_mask goes with token ids; text is tokenized one prompt at a time")
        texts = [input_ids] if isinstance(input_ids, str) else list(input_ids)
        return [list(model.tokenizer(t)["input_ids"]) for t in texts]
    if isinstance(input_ids, (list, tuple)) and input_ids and all(isinstance(s, (list, tuple)) for s in input_ids) \
            and len({len(s) for s in input_ids}) > 1:
        if attention_mask is not None:
            raise ValueError("attention_mask: prompts of unequal lengths need none (their lengths say it)")
        rows = [torch.as_tensor(s, dtype=torch.long) for s in input_ids]
    else:
        ids = torch.as_tensor(input_ids)
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() == 2 and ids.shape[1] == 0:
            raise ValueError("input_ids: prompt 0 is empty; generation starts from at least one token")
        if ids.dim() != 2 or ids.dtype in (torch.bool,) or ids.dtype.is_floating_point:
            raise ValueError(f"input_ids must be [B, T] token ids, got {tuple(ids.shape)} of {ids.dtype}")
        rows = list(ids.long())
        if attention_mask is not None:
            mask = torch.as_tensor(attention_mask).bool()
            if mask.shape != ids.shape:
                raise ValueError(f"attention_mask must have input_ids' shape {tuple(ids.shape)}, got {tuple(mask.shape)}")
            rows = [_real_run(r, m, b) for b, (r, m) in enumerate(zip(rows, mask))]
    prompts = [r.tolist() for r in rows]
    for b, p in enumerate(prompts):
        if not p:
            raise ValueError(f"input_ids: prompt {b} is empty; generation starts from at least one token")
        bad = [i for i in p if not 0 <= i < model.config.vocab_size]
        if bad:
            raise ValueError(f"input_ids: prompt {b} has ids outside 0..{model.config.vocab_size - 1}: {bad[:4]}")
    return prompts


def _real_run(row: torch.Tensor, mask: torch.Tensor, b: int) -> torch.Tensor:
    where = mask.nonzero()[:, 0]
    if where.numel() and int(where[-1] - where[0]) + 1 != where.numel():
        raise ValueError(f"attention_mask row {b} must mark one run of real tokens (left or right padding), got gaps")
    return row[where]


def _check_continued(model: Any, kv: Any, kinds: list[tuple], batch: int, cache: str) -> None:
    """A cache passed back in: one of this model's, for this batch, of the kinds ``cache`` asks for."""
    if not isinstance(kv, KVCache):
        raise TypeError(f"kv_cache must be a KVCache (Generation.kv_cache or KVCache.for_model), got {type(kv).__name__}")
    kv.check_fits(model.config, batch, device=model.device)
    held = [(lc.kind, None if lc.kind == "dense" else lc.window, getattr(lc, "sink", None)) for lc in kv.layers]
    if held != list(kinds):
        raise ValueError(f"kv_cache holds layers {held} (kind, W, S); cache={cache!r} with these window=/sink= asks "
                         f"for {list(kinds)}")


def _check_limits(model: Any, prompts: list[list[int]], max_new_tokens: Any, kinds: list[tuple], cache: str,
                  offset: int = 0) -> int:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    c, longest = model.config, offset + max(len(p) for p in prompts)
    total = longest + max_new_tokens
    if total <= c.max_positions:
        return max_new_tokens
    if c.positions == "learned":
        raise ValueError(f"max_new_tokens={max_new_tokens}: a prompt of {longest} tokens + {max_new_tokens} new = {total} "
                         f"passes the model's {c.max_positions} learned positions; no cache goes past them")
    if kinds[0][0] == "latent":
        raise ValueError(f"max_new_tokens={max_new_tokens}: a prompt of {longest} tokens + {max_new_tokens} new = {total} "
                         f"passes the model's {c.max_positions} positions; latent attention's cache keeps every one")
    if any(kind == "dense" for kind, _, _ in kinds):
        allow = "cache='sink' or cache='window'" if cache == "dense" else "cache='sink', or cache='window' with window="
        raise ValueError(f"max_new_tokens={max_new_tokens}: a prompt of {longest} tokens + {max_new_tokens} new = {total} "
                         f"passes the model's {c.max_positions} positions with a dense cache; {allow} keeps memory "
                         "constant there (rotary positions beyond the trained length)")
    return max_new_tokens


def end_of_text(model: Any) -> int | None:
    """The model's end-of-text token: its tokenizer's ``eos_token_id``, or None (no tokenizer, or none said)."""
    eos = getattr(model.tokenizer, "eos_token_id", None)
    return eos if isinstance(eos, int) and 0 <= eos < model.config.vocab_size else None


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def _stops(stop_ids: Any, vocab: int, eos: int | None = None) -> torch.Tensor:
    """The stop ids (S,): ``stop_ids`` checked, then ``eos`` where given and not among them."""
    ids = [stop_ids] if isinstance(stop_ids, int) else list(stop_ids)
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab for i in ids):
        raise ValueError(f"stop_ids must be token ids in 0..{vocab - 1}, got {stop_ids!r}")
    return torch.tensor(ids + ([eos] if eos is not None and eos not in ids else []), dtype=torch.long)


def _left_padded(prompts: list[list[int]], pad: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P_max) ids with each prompt at the right end, and (B, P_max) bool real tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.tensor(p, dtype=torch.long)
    cols = torch.arange(width)[None]
    real = cols >= torch.tensor([width - len(p) for p in prompts])[:, None]
    return ids.to(device), real.to(device)


def _row(cache: dict, layers: int, b: int, width: int) -> np.ndarray:
    """Sequence b's attention row [L, H, width] from each layer's ``hook_last_pattern`` (B, H, P), in position order."""
    rows = [cache[f"blocks.{layer}.{LAST_PATTERN}"][b, :, :width] for layer in range(layers)]  # (H, width) each
    wide = torch.float64 if rows[0].dtype == torch.float64 else torch.float32
    return torch.stack(rows).to(wide).cpu().numpy()


def generate(model: Any, input_ids: Any, max_new_tokens: int, *, attention_mask: Any = None, sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             stop_ids: Sequence[int] | int = (), cache: str = "dense", window: int | None = None,
             sink: int | None = None, cache_dtype: Any = None, maps: bool = False,
             on_token: Callable[[int, torch.Tensor], Any] | None = None, backend: str | None = None,
             fwd_hooks: Any = None, kv_cache: KVCache | None = None, cache_budget: int | None = None,
             stop_at_eos: bool = True, rotate: bool = False) -> Generation:
    """Generate up to ``max_new_tokens`` per prompt (see :class:`Generation`); every check before any work.

    A sequence stops at any of ``stop_ids`` and, with ``stop_at_eos`` (the default), at the model's
    end-of-text token (its tokenizer's ``eos_token_id``; a model without one has none): the stop id is its
    last new token, and its text ends before it. ``stop_at_eos=False`` goes on past it.
    ``kv_cache``: continue from a cache an earlier call returned (``Generation.kv_cache``); it holds
    every position fed so far, so ``input_ids`` start with the last token that call chose.
    ``cache`` "h2o", "snapkv", "knorm" or "random" evicts down to ``cache_budget`` tokens per layer and k/v
    head (:mod:`attnlab.transformer.evict_cache`; ``window``: its recent positions, ``sink``: its sinks).
    ``cache_dtype``: a float dtype, or "int8", "int4", "fp8" (a quantized dense cache, read as stored;
    ``rotate=True``: keys Hadamard-rotated after rotary, before quantizing): docs/generation.md.
    """
    c = model.config
    if not c.causal:
        raise ValueError(f"generate needs a causal decoder; this model is a {c.family} encoder")
    rule = Sampling(sample, temperature, top_k, top_p, seed)
    if on_token is not None and not callable(on_token):
        raise TypeError(f"on_token must be callable as on_token(step, ids), got {type(on_token).__name__}")
    if not isinstance(cache, str):
        raise TypeError(f"cache must be a cache kind ({', '.join(KINDS)}), got {type(cache).__name__}")
    prompts = _prompts(model, input_ids, attention_mask)
    kinds = layer_kinds(c, cache, window, sink, cache_budget)
    stored = cache_dtype_of(cache_dtype, rotate, c, cache)
    if kv_cache is not None:
        check_budget(getattr(kv_cache, "layers", ()), cache_budget)
        _check_continued(model, kv_cache, kinds, len(prompts), cache)
    check_backend(backend or model.backend, stored if kv_cache is None else kv_cache.cache_dtype)
    offset = 0 if kv_cache is None else int(kv_cache.lengths.max())
    n = _check_limits(model, prompts, max_new_tokens, kinds, cache, offset)
    stops = _stops(stop_ids, c.vocab_size, end_of_text(model) if _flag("stop_at_eos", stop_at_eos) else None)
    # maps: every layer's newest-query row, kept by the hooks (recomputed from the LSE: no scores held)
    hooks = build(c, fwd_hooks or (), [f"blocks.{layer}.{LAST_PATTERN}" for layer in range(c.num_layers)] if maps else ())
    weights_dtype, device = model.dtype, model.device
    kv_dtype = weights_dtype if stored is None else stored
    pad = c.pad_token_id if c.pad_token_id is not None else (int(stops[0]) if len(stops) else 0)
    B, longest = len(prompts), max(len(p) for p in prompts)
    kv = kv_cache or KVCache.for_model(c, B, kind=cache, window=window, sink=sink, capacity=longest + n - 1,
                                       dtype=kv_dtype, device=device, budget=cache_budget, seed=seed or 0,
                                       rotate=rotate, model_dtype=weights_dtype)
    reads = Reads(backend or model.backend)  # how each layer reads the cache: kept from step to step
    lean = plan(model, kv, hooks, maps, reads, offset + longest + n)  # None: the model's forward serves each step
    with step_threads(model, kv):
        return _loop(model, prompts, n, rule, stops.to(device), pad, kv, maps, on_token, backend, hooks, reads, lean)


def _loop(model: Any, prompts: list[list[int]], n: int, rule: Sampling, stops: torch.Tensor, pad: int, kv: KVCache,
          maps: bool, on_token: Any, backend: str | None, hooks: Hooks, reads: Reads, lean: Any = None) -> Generation:
    """Prefill, then one token per sequence per step until ``n`` or every sequence has stopped."""
    B, device = len(prompts), kv.lengths.device
    start = [int(x) + len(p) for x, p in zip(kv.lengths, prompts)]  # each prompt's end: its first new token's position
    gen = rule.generator(device)
    ids, real = _left_padded(prompts, pad, device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    lengths = torch.zeros(B, dtype=torch.long, device=device)
    chosen, logits_seen, attention = [], [], [[] for _ in range(B)]
    stopped = False  # some sequence has stopped (done.any())
    for t in range(n):
        with torch.no_grad():
            if lean is not None and lean.serves(ids, real):  # nothing watches: the same step, its fixed costs cut
                last = lean(ids)  # (B, V)
            else:
                last = model._decode_step(ids, real, kv, backend=backend, hooks=hooks, reads=reads)  # (B, V)
        nxt = rule.choose(last, gen)  # (B,)
        if stopped:  # a stopped sequence gets the pad id and zero logits (none stopped: nothing to change)
            nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
            last = torch.where(done[:, None], torch.zeros_like(last), last)
        logits_seen.append(last)
        if maps:
            for b in range(B):
                if not done[b]:
                    attention[b].append(_row(hooks.kept, model.config.num_layers, b, start[b] + t))
        lengths += (~done).long() if stopped else 1
        chosen.append(nxt)
        if len(stops):  # without stop ids no sequence stops before n
            done = done | torch.isin(nxt, stops)
            stopped = bool(done.any())
        if on_token is not None:
            on_token(t, nxt)
        if stopped and bool(done.all()):
            break
        ids, real = nxt[:, None], ((~done)[:, None] if stopped else None)  # a stopped sequence writes no more
    new = torch.stack(chosen, dim=1)  # (B, N)
    seqs = [p + new[b, : int(lengths[b])].tolist() for b, p in enumerate(prompts)]
    text = None
    if model.tokenizer is not None:
        text = [model.tokenizer.decode(new[b, : int(lengths[b])].tolist(), skip_special_tokens=True) for b in range(B)]
    positions = [[start[b] - 1 + t for t in range(int(lengths[b]))] for b in range(B)] if maps else None
    return Generation(new, lengths.cpu(), torch.stack(logits_seen, dim=1), seqs, [len(p) for p in prompts], pad, text,
                      attention if maps else None, positions, kv)
