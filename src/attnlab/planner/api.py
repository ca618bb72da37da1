"""``attnlab.plan``: will this model, at this context length, on this hardware, meet the deadline and fit?"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from attnlab.planner import predict as P
from attnlab.planner.cache_format import cache_format
from attnlab.planner.hardware import Hardware
from attnlab.planner.models import Architecture, load_model
from attnlab.planner.search import Search

MAX_TOKENS = 1 << 24  # prompt and new tokens above this are beyond every model's positions: a typo, not a plan
MEMORY_SAYS = ("weights + max(KV of the prompt + the prefill's largest live activations (one sublayer's "
               "inputs and outputs; the attention kernels never hold n × n), KV after the last new token)")


@dataclass(frozen=True)
class Row:
    """One prompt length: latency by term, memory by part, what limits it, and whether it fits.

    ``terms``: the prefill's (once) and a mean decode step's (per output token after the first);
    ``limiting``: the term that takes the most of the total (a decode term counted over every new token);
    ``ranges``: for ``ttft_s``, ``tpot_s`` and ``total_s``, (low, high) at the fast and the slow end of this
    machine's measurements (None where no range is known: an accelerator's assumed efficiencies)."""

    prompt_tokens: int
    ttft_s: float
    tpot_s: float
    total_s: float
    terms: tuple[P.Term, ...]
    kv_bytes: float
    weight_bytes: float
    activation_bytes: float
    peak_bytes: float
    fits_memory: bool
    meets_deadline: bool | None
    beyond_positions: bool
    max_batch: int
    limiting: P.Term
    ranges: dict[str, tuple[float, float] | None]

    @property
    def fits(self) -> bool:
        return self.fits_memory and self.meets_deadline is not False and not self.beyond_positions

    @property
    def limited_by(self) -> str:
        """The limiting term for people: "decode weights (memory bandwidth)"."""
        t = self.limiting
        return f"{t.phase} {t.name} ({t.limited_by})"

    def term(self, phase: str, name: str) -> P.Term | None:
        return next((t for t in self.terms if t.phase == phase and t.name == name), None)

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return dict(asdict(self), terms=[t.to_dict() for t in self.terms], limiting=self.limiting.to_dict(),
                    limited_by=self.limited_by, fits=self.fits,
                    ranges={k: list(v) if v else None for k, v in self.ranges.items()})


@dataclass(frozen=True)
class Plan:
    """The rows of a plan and the largest prompt meeting both limits. ``ttft_s``, ``tpot_s``, ``total_s``,
    ``kv_bytes``, ``peak_bytes``, ``max_batch``: the one row's value when one length was asked, else a list."""

    model: Architecture
    hardware: Hardware
    dtype: str
    batch: int
    new_tokens: int
    gpus: int
    deadline_ms: float | None
    deadline_on: str
    memory_bytes: float
    rows: tuple[Row, ...]
    max_prompt_tokens: int | None
    search: Search
    notes: tuple[str, ...] = field(default=())
    max_prompt_range: tuple[int, int] | None = None  # (at the slow end, at the fast end) of the measured rates
    cache: Any = None  # the CacheFormat of cache_dtype= / cache_budget= (None: the weights' dtype, every token)

    @property
    def predicted(self) -> bool:
        """True on a named accelerator: datasheet figures and assumed efficiencies, not measurements."""
        return not self.hardware.measured

    def _each(self, name: str) -> Any:
        values = [getattr(r, name) for r in self.rows]
        return values[0] if len(values) == 1 else values

    ttft_s = property(lambda self: self._each("ttft_s"))
    tpot_s = property(lambda self: self._each("tpot_s"))
    total_s = property(lambda self: self._each("total_s"))
    kv_bytes = property(lambda self: self._each("kv_bytes"))
    peak_bytes = property(lambda self: self._each("peak_bytes"))
    max_batch = property(lambda self: self._each("max_batch"))
    weight_bytes = property(lambda self: self.rows[0].weight_bytes)

    def to_dict(self) -> dict:
        return {
            "model": self.model.to_dict(), "hardware": self.hardware.to_dict(), "predicted": self.predicted,
            "dtype": self.dtype, "batch": self.batch, "new_tokens": self.new_tokens, "gpus": self.gpus,
            "deadline_ms": self.deadline_ms, "deadline_on": self.deadline_on, "memory_bytes": self.memory_bytes,
            "memory_model": MEMORY_SAYS, "rows": [r.to_dict() for r in self.rows],
            "max_prompt_tokens": self.max_prompt_tokens, "search": self.search.to_dict(), "notes": list(self.notes),
            "max_prompt_range": list(self.max_prompt_range) if self.max_prompt_range else None,
            "cache": None if self.cache is None else self.cache.to_dict(),
        }


def _positive(name: str, value: Any, kind: type = float) -> None:
    ok = isinstance(value, int) if kind is int else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
        expected = "an int >= 1" if kind is int else "a positive number"
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def _lengths(prompt_tokens: Any) -> tuple[int, ...]:
    many = isinstance(prompt_tokens, (list, tuple))
    values = tuple(prompt_tokens) if many else (prompt_tokens,)
    if not values:
        raise ValueError("prompt_tokens must hold at least one length")
    for v in values:
        _positive("prompt_tokens", v, int)
        _at_most("prompt_tokens", v, MAX_TOKENS)
    return values


def _at_most(name: str, value: int, cap: int, why: str = "beyond every model's positions") -> None:
    if value > cap:
        raise ValueError(f"{name} must be at most {cap:,} ({why}), got {value:,}")


def _splits(a: Architecture, gpus: int) -> None:
    """Tensor parallelism gives each device an equal share of the query heads, and of the k/v heads or whole
    copies of them (as vLLM and TensorRT-LLM require): 3 devices cannot share 8 k/v heads."""
    if gpus == 1:
        return
    if a.latent:  # one latent row for every head, replicated on every device: only the query heads split
        if a.num_heads % gpus:
            raise ValueError(f"gpus must split {a.name}'s {a.num_heads} query heads evenly (tensor parallelism; its "
                             f"latent cache is replicated on every device), got {gpus}")
        return
    if a.num_heads % gpus or (a.num_kv_heads % gpus and gpus % a.num_kv_heads):
        fit = [g for g in range(2, a.num_heads + 1)
               if not a.num_heads % g and not (a.num_kv_heads % g and g % a.num_kv_heads)]
        raise ValueError(f"gpus must split {a.name}'s {a.num_heads} query heads and {a.num_kv_heads} k/v heads "
                         f"evenly (tensor parallelism), got {gpus}; it can be 1, {', '.join(map(str, fit))}")


def _row(s: P.Setup, n: int, batch: int, budget: float, deadline_s: float | None, on: str) -> Row:
    pre, dec = P.prefill_terms(s, n, batch), P.mean_decode_terms(s, n, batch)
    ttft, tpot = P.seconds(pre), P.seconds(dec)
    total = ttft + (s.new_tokens - 1) * tpot
    mem = P.memory(s, n, batch)
    limiting = max(pre + dec, key=lambda t: t.seconds * (1 if t.phase == "prefill" else s.new_tokens - 1))
    return Row(n, ttft, tpot, total, pre + dec, mem["kv_bytes"], mem["weight_bytes"], mem["activation_bytes"],
               mem["peak_bytes"], mem["peak_bytes"] <= budget,
               None if deadline_s is None else (ttft if on == "ttft" else total) <= deadline_s,
               n + s.new_tokens > s.a.max_positions, P.max_batch(s, n, budget).n, limiting, _ranges(s, n, batch))


def _ranges(s: P.Setup, n: int, batch: int) -> dict[str, tuple[float, float] | None]:
    """(low, high) of TTFT, TPOT and total: the same model at the fast and at the slow end of each measured rate."""
    names = ("ttft_s", "tpot_s", "total_s")
    validation = s.hw.details.get("validation")
    if validation:  # an accelerator fitted to published rows: where the held-out rows' measurements fell
        return {k: (v / validation[1], v / validation[0]) for k, v in zip(names, P.latency(s, n, batch))}
    if s.hw.bounds is None:
        return dict.fromkeys(names)
    ends = [P.latency(replace(s, hw=hw), n, batch) for hw in (s.hw, *s.hw.bounds)]
    return {k: (min(e[i] for e in ends), max(e[i] for e in ends)) for i, k in enumerate(names)}


def _predicted_note(hw: Hardware) -> str:
    """What an accelerator's figures rest on: efficiencies fitted to published rows (and how far the rows left out
    of the fit fell), or assumed."""
    from attnlab.planner.hardware import FIT_SOURCE

    effs = ", ".join(f"{k} {v:g}" for k, v in hw.efficiencies.items())
    engine, validation = hw.details.get("engine"), hw.details.get("validation")
    if validation:
        return (f"predicted for {hw.name} under {engine}: datasheet figures ({hw.source}) times efficiencies {effs}, "
                f"{FIT_SOURCE} (matmul and attention assumed); on rows of other models left out of the fit it gave "
                f"{validation[0]:.2f}-{validation[1]:.2f} × the measured total, the range shown beside each figure")
    return (f"predicted for {hw.name}: datasheet figures ({hw.source}) times the assumed efficiencies {effs} "
            f"(no published measurements fitted for engine {engine}), not measured")


def _notes(a: Architecture, hw: Hardware, lengths: tuple[int, ...], new_tokens: int) -> list[str]:
    notes = list(hw.notes)
    if not hw.measured:
        notes.append(_predicted_note(hw))
    formats = [f"{part} in {fmt}" for part, fmt in (("experts", a.expert_format), ("linear layers", a.linear_format)) if fmt]
    if formats:  # the published formats, read from quantization_config; the cache keeps the plan's dtype
        notes.append(f"weights as published: {', '.join(formats)} (scales counted), the rest in the "
                     "plan's dtype")
    if a.num_experts:
        notes.append(f"{a.name}: {a.experts_per_token} of {a.num_experts} experts per token; a decode step reads the "
                     "experts its batch chose (the expected number of distinct ones under uniform routing)")
    beyond = [n for n in lengths if n + new_tokens > a.max_positions]
    if beyond:
        window = (f"; its sliding window ({max(w for w in a.windows if w)} tokens) bounds the KV cache, "
                  "not the positions" if a.windowed else "")
        notes.append(f"prompt_tokens {', '.join(map(str, beyond))} + new_tokens {new_tokens} exceed {a.name}'s "
                     f"{a.max_positions:,} positions{window}")
    return notes


def plan(model: Any, hardware: Any = "this", prompt_tokens: Any = 4096, new_tokens: int = 256, batch: int = 1,
         dtype: str | None = None, deadline_ms: float | None = None, memory_gb: float | None = None, gpus: int = 1,
         deadline_on: str = "total", engine: str | None = None, cache_dtype: str | None = None,
         cache_budget: int | None = None) -> Plan:
    """Predict TTFT, TPOT, total time and memory of serving ``model`` on ``hardware``, per prompt length.

    model: a config.json path (file or folder), a bundled name (:data:`attnlab.planner.models.BUNDLED`),
    or a TransformerConfig. hardware: "this" (measured here, cached), a bundled accelerator name, or a
    :class:`~attnlab.planner.hardware.Hardware`. prompt_tokens: one length or a list (one row each).
    dtype: of weights and cache (default: the config's). deadline_ms on ``deadline_on`` ("total" or "ttft").
    memory_gb: the budget per device in 10⁹ bytes (default: the device's memory; here, what is available).
    gpus: devices in tensor parallelism (named accelerators only). engine: a named accelerator's serving
    engine, "vllm" (the default), "trt-llm" or "ideal" (the assumed efficiencies): its efficiencies are fitted
    to published measurements where there are some (:data:`attnlab.planner.hardware.FITTED`).
    cache_dtype: the KV cache's dtype when it differs from the weights' (float, or "int8", "int4", "fp8" with
    their scales counted: :mod:`attnlab.planner.cache_format`); cache_budget: the tokens per layer an evicting
    cache keeps (generate's cache="h2o" etc.): memory and the decode read stop growing there.
    """
    lengths = _lengths(prompt_tokens)
    for name, value in (("new_tokens", new_tokens), ("batch", batch), ("gpus", gpus)):
        _positive(name, value, int)
    _at_most("new_tokens", new_tokens, MAX_TOKENS)
    _at_most("batch", batch, P.MAX_BATCH_CAP, "the largest batch the planner searches")
    for name, value in (("deadline_ms", deadline_ms), ("memory_gb", memory_gb)):
        if value is not None:
            _positive(name, value)
    if deadline_on not in ("total", "ttft"):
        raise ValueError(f"deadline_on must be 'total' or 'ttft', got {deadline_on!r}")
    a = load_model(model)
    _splits(a, gpus)
    dtype = dtype or a.dtype
    nbytes = P.nbytes_of(dtype)
    cache = None if cache_dtype is None and cache_budget is None else cache_format(
        a.head_dim, dtype, cache_dtype, cache_budget, a.max_positions,
        a.kv_lora_rank + a.rope_dim if a.latent else None)
    hw = P.resolve_hardware(hardware, a, dtype, engine)
    if gpus > 1 and hw.link is None:
        raise ValueError(f"gpus={gpus}: tensor parallelism needs a named accelerator (with its link), not {hw.name}")
    budget = memory_gb * 1e9 if memory_gb is not None else hw.memory_bytes
    s = P.Setup(a, hw, nbytes, gpus, new_tokens, cache)
    deadline_s = None if deadline_ms is None else deadline_ms / 1000
    rows = tuple(_row(s, n, batch, budget, deadline_s, deadline_on) for n in lengths)
    search = P.largest_prompt(s, batch, budget, deadline_s, deadline_on)
    return Plan(a, hw, dtype, batch, new_tokens, gpus, deadline_ms, deadline_on, budget, rows,
                search.n or None, search, tuple(_notes(a, hw, lengths, new_tokens)),
                _prompt_span(s, batch, budget, deadline_s, deadline_on, search.n), cache)


def _prompt_span(s: P.Setup, batch: int, budget: float, deadline_s: float | None, on: str, n: int) -> tuple[int, int] | None:
    """The range the largest prompt meeting the deadline could be in: searched again at the slow and fast ends
    of this machine's measurements, or, on a fitted accelerator, against the deadline scaled by the held-out
    rows' error (a prediction r × the measured meets it when the measured does). None without a deadline:
    memory alone does not move with the rates."""
    if deadline_s is None:
        return None
    validation = s.hw.details.get("validation")
    if validation:
        ends = [P.largest_prompt(s, batch, budget, deadline_s * r, on).n for r in validation]
    elif s.hw.bounds is not None:
        ends = [P.largest_prompt(replace(s, hw=b), batch, budget, deadline_s, on).n for b in s.hw.bounds]
    else:
        return None
    return min(*ends, n), max(*ends, n)
