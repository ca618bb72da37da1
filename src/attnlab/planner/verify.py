"""``attnlab plan --verify``: the planner's figures for this machine beside a run of the model here.

The model is built from its config with random weights (only the shapes set the time), in the plan's
dtype, by attnlab's own :class:`~attnlab.transformer.Transformer`; ``generate`` runs each prompt length
once to warm up, then ``repeats`` times, each token stamped (TTFT: the first stamp; TPOT: the mean gap
between the later ones, vLLM's definitions). Each row holds the prediction with its range, the measured
[median, low, high] and predicted ÷ measured. The CLI, ``benchmarks/bench_planner.py`` and the tests run
this one path.

Before anything is allocated, the plan's own peak (weights, cache, the prefill's activations) at the longest
prompt is compared with the memory available: a model that would not fit is refused, with the bytes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from attnlab.planner import noise
from attnlab.planner.api import Plan, plan
from attnlab.planner.models import Architecture, load_model

REPEATS = 5


@dataclass(frozen=True)
class Check:
    """One prompt length: predicted (with its range), measured ([median, low, high]) and their ratio."""

    prompt_tokens: int
    predicted_ttft_s: tuple[float, float | None, float | None]  # the figure, then its range (None: unknown)
    predicted_tpot_s: tuple[float, float | None, float | None]
    measured_ttft_s: tuple[float, float, float]
    measured_tpot_s: tuple[float, float, float]

    @property
    def ttft_ratio(self) -> float:
        return self.predicted_ttft_s[0] / self.measured_ttft_s[0]

    @property
    def tpot_ratio(self) -> float:
        return self.predicted_tpot_s[0] / self.measured_tpot_s[0]

    def to_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "predicted_ttft_s": list(self.predicted_ttft_s),
                "measured_ttft_s": list(self.measured_ttft_s), "ttft_ratio": self.ttft_ratio,
                "predicted_tpot_s": list(self.predicted_tpot_s), "measured_tpot_s": list(self.measured_tpot_s),
                "tpot_ratio": self.tpot_ratio}


@dataclass(frozen=True)
class Verification:
    """The plan that was checked, one :class:`Check` per prompt length, and the runs each measurement took."""

    plan: Plan
    checks: tuple[Check, ...]
    repeats: int

    @property
    def notes(self) -> tuple[str, ...]:
        """The plan's notes, and whether the runs themselves were taken on a busy machine (their spread past
        :data:`attnlab.planner.noise.BUSY_SPREAD`): then a ratio is the machine's load as much as the plan's error."""
        spreads = [noise.spread(m) for c in self.checks for m in (c.measured_ttft_s, c.measured_tpot_s)]
        busy = () if max(spreads) <= noise.BUSY_SPREAD else (
            f"the runs spread up to {100 * max(spreads):.0f} %: the machine was busy while they ran, so the ratios "
            "say its load as much as the plan's error",)
        return self.plan.notes + busy

    def to_dict(self) -> dict:
        return {"plan": self.plan.to_dict(), "repeats": self.repeats, "checks": [c.to_dict() for c in self.checks],
                "notes": list(self.notes)}


def transformer_config(a: Architecture, positions: int) -> Any:
    """attnlab's :class:`~attnlab.transformer.TransformerConfig` of the same shapes: GPT-2's learned positions
    and plain MLP, or Llama's rotary and gated one; each layer's window kept. ``positions``: the rotary
    model's (a learned table keeps the model's own, its size counting in the weights)."""
    from dataclasses import replace

    from attnlab.transformer import TransformerConfig

    if a.learned_positions:
        return TransformerConfig.from_hf({
            "model_type": "gpt2", "n_embd": a.hidden_size, "n_head": a.num_heads, "n_layer": a.num_layers,
            "n_inner": a.intermediate_size, "vocab_size": a.vocab_size, "n_positions": a.max_positions,
            "tie_word_embeddings": a.tied})
    c = TransformerConfig.from_hf({
        "model_type": "llama", "hidden_size": a.hidden_size, "num_hidden_layers": a.num_layers,
        "num_attention_heads": a.num_heads, "num_key_value_heads": a.num_kv_heads, "head_dim": a.head_dim,
        "intermediate_size": a.intermediate_size, "vocab_size": a.vocab_size, "attention_bias": a.qkv_bias,
        "max_position_embeddings": min(a.max_positions, positions), "tie_word_embeddings": a.tied})
    if not a.windowed:
        return c
    window = max(w for w in a.windows if w)
    types = tuple("full_attention" if w is None else "sliding_attention" for w in a.windows)
    return replace(c, sliding_window=window, layer_types=types)


def check_memory(p: Plan, available: float) -> None:
    """Refuse, before anything is allocated, a run whose predicted peak exceeds the memory available."""
    row = max(p.rows, key=lambda r: r.peak_bytes)
    if row.peak_bytes > available:
        raise ValueError(
            f"--verify would need {row.peak_bytes:,.0f} bytes for {p.model.name} in {p.dtype} at {row.prompt_tokens:,} "
            f"prompt tokens (weights {row.weight_bytes:,.0f}, KV cache {row.kv_bytes:,.0f}); this machine has "
            f"{available:,.0f} bytes available")


@contextlib.contextmanager
def _default_dtype(dtype: Any) -> Iterator[None]:
    """Build the weights in their dtype from the start: a float32 copy first would need twice a 16-bit model's bytes."""
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def build(a: Architecture, dtype: str, positions: int) -> Any:
    """attnlab's Transformer of ``a``'s shapes in ``dtype``, random weights, ready to generate."""
    import torch

    from attnlab.transformer import Transformer

    tdtype = getattr(torch, dtype)
    with _default_dtype(tdtype), torch.no_grad():
        return Transformer(transformer_config(a, positions), dtype=tdtype).eval()


def run_once(model: Any, prompt: int, new: int, seed: int = 0) -> dict:
    """Seconds of one ``generate``: ``ttft_s`` (to the first new token), ``tpot_s`` (the mean gap between the
    later ones; None with one new token) and ``total_s``."""
    import torch

    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(seed))
    stamps: list[float] = []
    t0 = time.perf_counter()
    model.generate(ids, new, on_token=lambda step, tok: stamps.append(time.perf_counter()))
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"ttft_s": stamps[0] - t0, "tpot_s": sum(gaps) / len(gaps) if gaps else None, "total_s": stamps[-1] - t0}


def measure_generate(model: Any, prompt: int, new: int, repeats: int = REPEATS) -> dict:
    """Each of :func:`run_once`'s figures as [median, low, high] over ``repeats`` runs after a warm one (a
    length's first run pays its first calls: auto's choices for new shapes, allocations)."""
    run_once(model, prompt, new, seed=prompt)
    runs = [run_once(model, prompt, new, seed=prompt + i) for i in range(repeats)]
    return {k: noise.summary([r[k] for r in runs]) if runs[0][k] is not None else None for k in runs[0]}


def verify(model: Any, prompt_tokens: Any = (1024, 4096), new_tokens: int = 32, dtype: str | None = None,
           repeats: int = REPEATS, hardware: Any = "this") -> Verification:
    """Plan ``model`` on this machine, then run it here at each prompt length: predicted beside measured.

    hardware: "this" or this machine's :class:`~attnlab.planner.hardware.Hardware` (measured already);
    new_tokens >= 2 (a time per output token needs two). Refused before allocating when the plan's peak
    exceeds the memory available.
    """
    from attnlab.bench.sweep import memory_available

    if isinstance(new_tokens, int) and not isinstance(new_tokens, bool) and new_tokens < 2:
        raise ValueError(f"new_tokens must be >= 2 to measure a time per output token, got {new_tokens}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    a = load_model(model)
    if not (hardware == "this" or getattr(hardware, "measured", False)):
        raise ValueError(f"hardware must be 'this' or this machine's measured Hardware (verify runs the model here), "
                         f"got {getattr(hardware, 'name', hardware)!r}")
    p = plan(a, hardware, prompt_tokens=prompt_tokens, new_tokens=new_tokens, dtype=dtype)
    check_memory(p, float(memory_available() or 0))
    m = build(a, p.dtype, max(r.prompt_tokens for r in p.rows) + new_tokens + 1)
    checks = []
    for r in p.rows:
        got = measure_generate(m, r.prompt_tokens, new_tokens, repeats)
        predicted = [(getattr(r, k), *(r.ranges[k] or (None, None))) for k in ("ttft_s", "tpot_s")]
        checks.append(Check(r.prompt_tokens, *predicted, tuple(got["ttft_s"]), tuple(got["tpot_s"])))
    return Verification(p, tuple(checks), repeats)
