"""The planner's time and memory model, term by term, and ``plan()``.

Per device, for a prompt of n tokens, batch B, on G devices in tensor parallelism:

- **TTFT** (the prefill, which yields the first token) = matmuls: max(2·B·n·W_layer / matmul rate,
  weight bytes / bandwidth) over the layers, plus the LM head on the last token + attention:
  4·B·H·D·pairs per layer / the attention kernel's rate, pairs = Σ_i min(i, w_l) (causal halves n²; a
  window bounds it) + elementwise: the bytes norms, rotary and activations move
  (:func:`attnlab.planner.formulas.elementwise_bytes`) / their rate + L · the per-layer overhead + the
  per-step one + (G > 1) 2·L ring all-reduces of B·n·d.
- **TPOT** (each token after the first, the mean over the new tokens, as vLLM defines it) =
  max(decode matmul FLOPs / rate, weight bytes / bandwidth) + the KV bytes read / the decode attention's
  rate + L · overhead + the per-step one (one token's elementwise work is part of them) + (G > 1) 2·L
  all-reduces of B·d. **total** = TTFT + (new_tokens − 1) · TPOT.
- **memory** = weights + max(KV of the prompt + the prefill's largest live activations, KV after the
  last new token) (:func:`attnlab.planner.formulas.prefill_activation_bytes` says which activations).

Tensor parallelism splits the matmul weights, the FLOPs and the k/v heads over G (k/v heads are
replicated where G exceeds them); the rates are per device.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass

from attnlab.planner import formulas as f
from attnlab.planner.cache_format import CacheFormat
from attnlab.planner.hardware import DEFAULT_ENGINE, Hardware, accelerator
from attnlab.planner.models import DTYPE_BYTES, Architecture
from attnlab.planner.search import Search, largest_length

DECODE_SAMPLES = 8  # decode steps evaluated for the mean TPOT (midpoints of equal spans of the new tokens)
MAX_BATCH_CAP = 1 << 20  # the batch search's cap


@dataclass(frozen=True)
class Setup:
    """What every evaluation of one plan shares."""

    a: Architecture
    hw: Hardware
    nbytes: int
    gpus: int
    new_tokens: int
    cache: CacheFormat | None = None  # the KV cache's bytes (None: the weights' dtype, every token)

    @property
    def kv(self) -> dict:
        """:func:`attnlab.planner.formulas.kv_bytes`'s keywords for this cache."""
        return {} if self.cache is None else self.cache.terms()

    @property
    def kv_share(self) -> float:
        """The fraction of the k/v heads each device holds (latent attention: its one latent row on every device)."""
        if self.a.latent:
            return 1.0
        return math.ceil(self.a.num_kv_heads / self.gpus) / self.a.num_kv_heads


@dataclass(frozen=True)
class Term:
    """One term of the time model: its name ("matmuls", "KV cache read", …), its phase ("prefill": once;
    "decode": per output token), its seconds and what limits it ("compute", "memory bandwidth", "dispatch and
    host", "interconnect")."""

    name: str
    phase: str
    seconds: float
    limited_by: str

    def to_dict(self) -> dict:
        return asdict(self)


def _matmuls(s: Setup, rows: int, batch: int, decode: bool = False) -> Term:
    """The layers' matmuls for ``rows`` tokens and the LM head's for the last token of each of ``batch``
    sequences: the slower of computing them and reading their weights. A prefill's compute is timed at its
    row count (measured points carry the lower efficiency of few rows); a decode step's at the full rate,
    since what few rows cost beyond that is reading the weights and the per-call overhead, both counted."""
    a, g = s.a, s.gpus
    layer_flops = 2 * rows * sum(f.layer_matmul_params(a).values()) / g
    head_flops = 2 * batch * a.hidden_size * a.vocab_size / g
    if decode:
        compute = (a.num_layers * layer_flops + head_flops) / s.hw.matmul.at_largest
    else:
        compute = a.num_layers * s.hw.matmul.seconds(layer_flops) + s.hw.matmul.seconds(head_flops)
    memory = s.hw.bandwidth.seconds(f.decode_weight_bytes(a, s.nbytes, rows) / g)  # a mixture: the experts chosen
    return Term("weights" if decode else "matmuls", "decode" if decode else "prefill", max(compute, memory),
                "compute" if compute >= memory else "memory bandwidth")


def _allreduce(s: Setup, tokens: int, batch: int, phase: str) -> tuple[Term, ...]:
    if s.gpus == 1:
        return ()
    size = f.allreduce_bytes(s.a, tokens, batch, s.nbytes) / (2 * s.a.num_layers)
    one = 2 * (s.gpus - 1) / s.gpus * size / s.hw.link + s.hw.allreduce_latency_s
    return (Term("all-reduce", phase, 2 * s.a.num_layers * one, "interconnect"),)


def prefill_terms(s: Setup, n: int, batch: int) -> tuple[Term, ...]:
    a = s.a
    heads_share = 1 / s.gpus
    width = a.head_dim + a.value_dim  # q·k over D, the weights times v over Dv
    attention = sum(count * s.hw.attention.seconds(2 * batch * a.num_heads * heads_share * width * f.causal_pairs(n, w))
                    for w, count in Counter(a.windows).items())
    per_layer = f.elementwise_bytes(a, n, batch, s.nbytes) / s.gpus
    return (_matmuls(s, batch * n, batch), Term("attention", "prefill", attention, "compute"),
            Term("elementwise", "prefill", a.num_layers * s.hw.elementwise.seconds(per_layer), "memory bandwidth"),
            Term("overhead", "prefill", s.hw.overhead(a.num_layers, prefill=True), "dispatch and host"),
            *_allreduce(s, n, batch, "prefill"))


def decode_terms(s: Setup, keys: int, batch: int) -> tuple[Term, ...]:
    """One decode step whose attention reads ``keys`` keys per sequence (the cache and the new token)."""
    a = s.a
    kv = sum(count * s.hw.decode_attention.seconds(s.kv_share * f.kv_layer_bytes(a, keys, batch, s.nbytes, w, **s.kv))
             for w, count in Counter(a.windows).items())  # the bytes the cache stores for those keys, read as stored
    return (_matmuls(s, batch, batch, decode=True), Term("KV cache read", "decode", kv, "memory bandwidth"),
            Term("overhead", "decode", s.hw.overhead(a.num_layers, prefill=False), "dispatch and host"),
            *_allreduce(s, 1, batch, "decode"))


def mean_decode_terms(s: Setup, n: int, batch: int) -> tuple[Term, ...]:
    """The decode terms averaged over the new tokens after the first (step j reads n + j keys)."""
    steps = max(s.new_tokens - 1, 1)
    k = min(steps, DECODE_SAMPLES)
    samples = [decode_terms(s, n + 1 + int((i + 0.5) * steps / k), batch) for i in range(k)]
    out = []
    for i, first in enumerate(samples[0]):
        labels = Counter(t[i].limited_by for t in samples)
        out.append(Term(first.name, "decode", sum(t[i].seconds for t in samples) / k, labels.most_common(1)[0][0]))
    return tuple(out)


def memory(s: Setup, n: int, batch: int) -> dict:
    """Bytes per device: weights, KV (at the prompt and at the end), activations, and the peak."""
    a, g = s.a, s.gpus
    weights = f.weight_bytes(a, s.nbytes) / g
    kv_prompt = f.kv_bytes(a, n, batch, s.nbytes, **s.kv) * s.kv_share
    kv_end = f.kv_bytes(a, n + s.new_tokens, batch, s.nbytes, **s.kv) * s.kv_share
    acts = f.prefill_activation_bytes(a, n, batch, s.nbytes)
    activations = max(acts["attention"], acts["feed_forward"]) / g + acts["logits"]
    peak = weights + max(kv_prompt + activations, kv_end)
    return {"weight_bytes": weights, "kv_bytes": kv_end, "kv_prompt_bytes": kv_prompt,
            "activation_bytes": activations, "peak_bytes": peak}


def seconds(terms: tuple[Term, ...]) -> float:
    return sum(t.seconds for t in terms)


def latency(s: Setup, n: int, batch: int) -> tuple[float, float, float]:
    """(TTFT, TPOT, total) in seconds."""
    ttft, tpot = seconds(prefill_terms(s, n, batch)), seconds(mean_decode_terms(s, n, batch))
    return ttft, tpot, ttft + (s.new_tokens - 1) * tpot


def resolve_hardware(hardware: object, a: Architecture, dtype: str, engine: str | None = None) -> Hardware:
    """A Hardware as given, this machine (measured), or a named accelerator under ``engine`` (default: vLLM)."""
    if isinstance(hardware, Hardware) or not (isinstance(hardware, str) and hardware.strip().lower() != "this"):
        if engine is not None:
            raise ValueError(f"engine applies to a named accelerator, not to {getattr(hardware, 'name', hardware)!r}")
    if isinstance(hardware, Hardware):
        return hardware
    if not isinstance(hardware, str):
        raise TypeError(f"hardware must be 'this', an accelerator name or a Hardware, got {hardware!r}")
    if hardware.strip().lower() == "this":
        from attnlab.planner.machine import this_machine

        return this_machine(a, dtype)
    return accelerator(hardware, engine=engine or DEFAULT_ENGINE)


def max_batch(s: Setup, n: int, budget: float) -> Search:
    """The most sequences of n prompt tokens (plus the new ones) whose caches fit beside the weights."""
    return largest_length(lambda b: memory(s, n, b)["peak_bytes"] <= budget, start=1, cap=MAX_BATCH_CAP)


def largest_prompt(s: Setup, batch: int, budget: float, deadline_s: float | None, on: str) -> Search:
    """The largest prompt (tokens) whose latency meets the deadline and whose peak fits the budget,
    searched up to the model's positions less the new tokens."""
    def fits(n: int) -> bool:
        if memory(s, n, batch)["peak_bytes"] > budget:
            return False
        if deadline_s is None:
            return True
        ttft, _, total = latency(s, n, batch)
        return (ttft if on == "ttft" else total) <= deadline_s

    return largest_length(fits, start=1, cap=s.a.max_positions - s.new_tokens)


def nbytes_of(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    return DTYPE_BYTES[dtype]
