"""One error measure for every smaller KV cache: :func:`kv_report` (``attnlab kv``).

The first P tokens of a text are the prompt (one prefill); the next N are fed one at a time
(teacher-forced: the text's own token, whatever the model would have chosen), and the output of each
fed token is scored. Every cache setting runs the model in float32; the reference is the same model in
float64 with a dense cache. Per setting:

- **bytes per token**: the cache's bytes once the P + N tokens are fed (``KVCache.nbytes``: what is
  stored, codes and scales included), divided by P + N; and those bytes themselves (``cache_bytes``).
  An evicting cache's bytes stop at its budget, so its bytes per token fall as the text grows.
- **KL divergence** KL(reference ‖ setting) of the next-token distribution, in nats: mean and 99th
  percentile over the N scored positions.
- **top-1 agreement**: the share of positions whose most likely token is the reference's.
- **each layer's attention-output relative error**: ‖a − a_ref‖ / ‖a_ref‖ of the layer's attention
  output (``hook_attn_out``, after the output projection), averaged over the scored positions.
- **time per step**: the median wall time of one decode step (hooks included, the same for every row).

The dense float32 row is float32's own error: the floor the other rows stand on. A setting is a dict of
:meth:`KVCache.for_model`'s keywords under :meth:`Transformer.generate`'s names (``cache``,
``cache_dtype``, ``cache_budget``, ``window``, ``sink``, and any keyword the cache takes), so a new cache
dtype plugs in without a change here. The default settings skip a quantized dtype the cache does not
offer, and say so (``skipped``).
"""

from __future__ import annotations

import copy
import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PROMPT_TOKENS, SCORED_TOKENS = 1536, 512
FLOAT_DTYPES = ("bfloat16",)  # beside the dense float32 row every report has
QUANTIZED = ("int8", "int4", "fp8")  # the quantized cache dtypes, when the cache offers them
POLICIES = ("h2o", "snapkv", "knorm", "random")
BUDGET_SHARES = (0.25, 0.5)  # evicting caches keep this share of the text's length
ALIASES = {"cache": "kind", "cache_dtype": "dtype", "cache_budget": "budget"}  # generate's names → for_model's


@dataclass(frozen=True)
class KVRow:
    """One setting's figures (see the module's docstring)."""

    name: str
    setting: dict
    bytes_per_token: float
    cache_bytes: int
    kl_mean: float
    kl_p99: float
    top1: float
    layer_error: list[float]
    step_ms: float
    pareto: bool = False


@dataclass(frozen=True)
class KVReport:
    """Every setting's :class:`KVRow`, what was measured on, and the default settings skipped (with why)."""

    model: str
    prompt_tokens: int
    scored_tokens: int
    rows: list[KVRow]
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"model": self.model, "prompt_tokens": self.prompt_tokens, "scored_tokens": self.scored_tokens,
                "context": self.prompt_tokens + self.scored_tokens, "kl_units": "nats",
                "rows": [vars(r) for r in self.rows], "skipped": self.skipped}


def setting_name(setting: dict) -> str:
    """A row's label: cache kind, budget, dtype (the defaults left out)."""
    parts = [str(setting.get("cache", "dense"))]
    if "cache_budget" in setting:
        parts.append(str(setting["cache_budget"]))
    parts.append(str(setting.get("cache_dtype", "float32")))
    parts += [f"{k}={v}" for k, v in setting.items() if k not in ("cache", "cache_budget", "cache_dtype")]
    return " ".join(parts)


def default_settings(config: Any, context: int) -> tuple[list[dict], list[str]]:
    """Dense bfloat16 (beside the dense float32 row every report has), the quantized dtypes the cache offers, and every eviction policy at 25 % and
    50 % of ``context`` (float32); and the skipped ones, each with the cache's reason."""
    settings = [{"cache_dtype": d} for d in FLOAT_DTYPES]
    skipped = []
    for d in QUANTIZED:
        reason = _refusal(config, {"cache_dtype": d})
        settings += [] if reason else [{"cache_dtype": d}]
        skipped += [f"{d}: {reason}"] if reason else []
    budgets = sorted({max(round(s * context), 8) for s in BUDGET_SHARES})
    settings += [{"cache": p, "cache_budget": b} for b in budgets for p in POLICIES]
    return settings, skipped


def _refusal(config: Any, setting: dict) -> str | None:
    """Why the cache refuses ``setting`` for a one-token cache of ``config`` (None: it accepts it)."""
    from attnlab.transformer.cache import KVCache

    try:
        KVCache.for_model(config, 1, capacity=1, **_cache_kwargs(setting))
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def _cache_kwargs(setting: dict) -> dict:
    """A setting's keywords as :meth:`KVCache.for_model` takes them; an unknown key names those it takes."""
    from attnlab.transformer.cache import KVCache

    if not isinstance(setting, dict):
        raise TypeError(f"settings: each setting must be a dict such as {{'cache_dtype': 'bfloat16'}}, got "
                        f"{type(setting).__name__}")
    takes = set(inspect.signature(KVCache.for_model).parameters) - {"config", "batch", "capacity", "device"}
    names = sorted(set(ALIASES) | takes - set(ALIASES.values()))
    unknown = sorted(k for k in setting if ALIASES.get(k, k) not in takes or k in ALIASES.values())
    if unknown:
        raise ValueError(f"settings: unknown key {unknown[0]!r} in {setting}; a setting takes {', '.join(names)}")
    return {ALIASES.get(k, k): v for k, v in setting.items()}


def _ids(model: Any, text: Any, need: int) -> list[int]:
    if isinstance(text, str):
        if model.tokenizer is None:
            raise ValueError("text: a string needs the model's tokenizer; this model has none (pass token ids)")
        ids = list(model.tokenizer(text, verbose=False)["input_ids"])  # a text longer than P + N is cut below, on purpose
    else:
        ids = [int(i) for i in text]
    if len(ids) < need:
        raise ValueError(f"text has {len(ids)} tokens; prompt_tokens + scored_tokens = {need} needs at least that many")
    return ids[:need]


def _check_counts(prompt_tokens: Any, scored_tokens: Any, limit: int) -> None:
    for name, value in (("prompt_tokens", prompt_tokens), ("scored_tokens", scored_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if prompt_tokens + scored_tokens > limit:
        raise ValueError(f"prompt_tokens + scored_tokens = {prompt_tokens + scored_tokens} passes the model's "
                         f"{limit} positions")


def _models(model: Any) -> tuple[Any, Any, str]:
    """(float32 model, float64 model, name) from a Transformer or a name/folder."""
    import torch

    from attnlab.transformer import Transformer

    if isinstance(model, Transformer):
        name = f"Transformer ({model.config.family})"
        f32 = model if model.dtype == torch.float32 else copy.deepcopy(model).to(torch.float32)
    elif isinstance(model, str):
        name, f32 = model, Transformer.from_pretrained(model, dtype="float32")
    else:
        raise TypeError(f"model must be a Transformer or a model name/folder, got {type(model).__name__}")
    if not f32.config.causal:
        raise ValueError(f"model: kv_report needs a causal decoder; this model is a {f32.config.family} encoder")
    return f32, copy.deepcopy(f32).to(torch.float64), name


def _run(model: Any, ids: list[int], prompt: int, setting: dict) -> tuple[np.ndarray, np.ndarray, list[float], int]:
    """Prefill ``prompt`` tokens, then feed the rest one at a time: the log-probabilities (N, V) float64, each
    layer's attention output (L, N, d) float64, each step's seconds and the cache's bytes at the end."""
    import torch

    from attnlab.transformer.cache import KVCache

    c = model.config
    kw = {"dtype": model.dtype, **_cache_kwargs(setting)}  # the reference's cache is float64, as its model
    kv = KVCache.for_model(c, 1, capacity=len(ids), device=model.device, **kw)
    names = [f"blocks.{layer}.hook_attn_out" for layer in range(c.num_layers)]
    x = torch.tensor([ids], device=model.device)  # (1, T)
    logp, outs, times = [], [], []
    with torch.no_grad():
        model.run_with_cache(x[:, :prompt], kv_cache=kv, names=names)
        for t in range(prompt, len(ids)):
            start = time.perf_counter()
            logits, kept = model.run_with_cache(x[:, t:t + 1], kv_cache=kv, names=names)  # (1, 1, V)
            times.append(time.perf_counter() - start)
            logp.append(torch.log_softmax(logits[0, -1].double(), -1).cpu().numpy())  # (V,)
            outs.append(np.stack([kept[n][0, -1].double().cpu().numpy() for n in names]))  # (L, d)
    return np.stack(logp), np.stack(outs, axis=1), times, kv.nbytes


def _row(setting: dict, ref: tuple, got: tuple, context: int) -> KVRow:
    (ref_logp, ref_out, _, _), (logp, out, times, nbytes) = ref, got
    p = np.exp(ref_logp)
    kl = (p * (ref_logp - logp)).sum(-1)  # (N,) nats
    err = np.linalg.norm(out - ref_out, axis=-1) / np.maximum(np.linalg.norm(ref_out, axis=-1), 1e-300)  # (L, N)
    return KVRow(setting_name(setting), dict(setting), nbytes / context, int(nbytes), float(kl.mean()),
                 float(np.percentile(kl, 99)), float((logp.argmax(-1) == ref_logp.argmax(-1)).mean()),
                 [float(e) for e in err.mean(-1)], float(np.median(times)) * 1e3)


def pareto(rows: list[KVRow]) -> list[KVRow]:
    """The rows marked where no other row has both fewer bytes per token and a smaller mean KL divergence."""
    def dominated(r: KVRow) -> bool:
        return any(o.bytes_per_token <= r.bytes_per_token and o.kl_mean <= r.kl_mean
                   and (o.bytes_per_token, o.kl_mean) != (r.bytes_per_token, r.kl_mean) for o in rows)

    return [KVRow(**{**vars(r), "pareto": not dominated(r)}) for r in rows]


def kv_report(model: Any, text: Any, settings: list[dict] | None = None, *, prompt_tokens: int = PROMPT_TOKENS,
              scored_tokens: int = SCORED_TOKENS, on_setting: Any = None) -> KVReport:
    """Score each cache setting (float32) against the same model in float64 with a dense cache, on ``text``
    (a string, or token ids): see the module's docstring. ``settings`` None: :func:`default_settings` at
    P + N tokens; the dense float32 row comes first in every report. ``on_setting(i, n, name)``: called before
    each run (progress). Every check before any work."""
    f32, f64, name = _models(model)
    _check_counts(prompt_tokens, scored_tokens, f32.config.max_positions)
    context = prompt_tokens + scored_tokens
    ids = _ids(f32, text, context)
    skipped: list[str] = []
    if settings is None:
        settings, skipped = default_settings(f32.config, context)
    settings = [dict(s) for s in settings]
    if not settings:
        raise ValueError("settings must hold at least one setting, e.g. [{'cache_dtype': 'bfloat16'}]")
    for s in settings:
        if reason := _refusal(f32.config, s):
            raise ValueError(f"settings: {setting_name(s)}: {reason}")
    ref = _run(f64, ids, prompt_tokens, {})
    rows = []
    for i, s in enumerate([{}] + settings):
        if on_setting is not None:
            on_setting(i, len(settings) + 1, setting_name(s))
        rows.append(_row(s, ref, _run(f32, ids, prompt_tokens, s), context))
    return KVReport(name, prompt_tokens, scored_tokens, pareto(rows), skipped)
