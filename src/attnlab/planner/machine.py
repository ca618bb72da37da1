"""This machine, measured: the rates the planner's time model needs, at the model's own shapes, cached.

For a model and a dtype it times, once (cached as JSON beside auto's table, keyed by the same
machine facts and torch's thread count: another CPU, thread count or library version measures anew;
``attnlab plan --calibrate`` measures again; with ``ATTNLAB_CALIBRATE=0`` nothing is written and the
measurements last for the process):

- the matmul rate: one layer's matrices (the transformer's ``linear`` at the model's (d_in, d_out)) at
  several row counts, as (FLOPs, seconds) points;
- the read bandwidth: one matrix-vector product over a set of the model's matrices and its LM head as
  large as a decode step's read (capped at :data:`BANDWIDTH_BYTES`, far beyond the caches), through the
  transformer's own linear layers, as a decode step reads them;
- the prefill attention's rate: :func:`attnlab.attention`, causal, at the model's head dim and k/v
  grouping (FLOPs → seconds), by the backend attnlab's transformer uses;
- the decode attention's: a one-layer model of that head dim and grouping decoding after prompts of
  several lengths through ``Transformer.generate`` (the extra KV bytes → the extra seconds per step):
  the path generate takes, whichever kernel serves it;
- the elementwise rate: one product of two tensors into a third at sizes from the caches' to memory's
  (bytes moved → seconds), for the norms, rotary and activations;
- the fixed costs of a step through ``Transformer.generate``: per layer (the growth of a tiny model's
  step from one layer to several: dispatch and Python, its arithmetic negligible) and per step (the
  rest: the loop, sampling), for the first token (with the cache's set-up) and the later ones apart;
- the memory available is read at each plan (it changes), never cached.

Every time is the median of :data:`REPEATS` samples after a warm call, a sample of a short call being
several calls in a row: the planner predicts the typical run, and on a shared or virtual machine the
fastest of a few samples is well below it (a quarter and more for a decoding step's few milliseconds).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.backends.calibrate import cache_path as auto_cache_path
from attnlab.backends.calibrate import enabled, machine_facts
from attnlab.planner.formulas import decode_weight_bytes, layer_matmul_params, matmul_shapes
from attnlab.planner.hardware import Hardware, Rate
from attnlab.planner.models import DTYPE_BYTES, Architecture

log = logging.getLogger(__name__)

REPEATS = 5
MIN_SAMPLE_S = 0.02  # a sample shorter than this is several calls in a row
ROWS = (16, 128, 512, 2048)  # matmul row counts measured (fewer where a point would exceed MAX_MATMUL_FLOPS)
MAX_MATMUL_FLOPS = 1e11
BANDWIDTH_BYTES = 512 * 2**20
PREFILL_N = (256, 1024, 4096)  # attention lengths measured (fewer where a point would exceed MAX_ATTENTION_FLOPS)
MAX_ATTENTION_FLOPS = 6e10
OVERHEAD_PROMPT = 8  # the tiny models' prompt: the fixed costs are a step's over so few keys
# prompts of the one-layer model whose decode steps give the KV read's cost, from the overheads' prompt on:
# what a step over more keys costs beyond theirs, whatever path attention takes (a kernel's fixed cost included)
DECODE_T = (OVERHEAD_PROMPT, 512, 2048, 8192)
GEN_NEW = 17  # new tokens per generate run: 16 decode steps timed
ELEMENTWISE = (1 << 16, 1 << 19, 1 << 22, 1 << 24)  # elements of the tensors multiplied  # cache lengths for one decode query
MAX_HEADS = 8  # attention is measured on at most this many query heads (the rate per head is what counts)
BACKEND = "auto"  # attnlab's transformer's default backend
OVERHEAD_LAYERS = 4
MEASURABLE = ("float32", "bfloat16", "float16", "float64")  # dtypes torch computes in on a CPU
PROFILE_VERSION = 6  # what a profile holds or how it is measured (5: the linear layers' few-row path; 6: decode
# from 8 keys, medians): a new one measures anew
_MEMO: dict[str, dict] = {}  # this process's measurements, also where the cache is not written


def cache_file() -> Path:
    return auto_cache_path().with_name(auto_cache_path().name.replace("calibration-", "planner-"))


def _load() -> dict:
    try:
        data = json.loads(cache_file().read_text())
        if data.get("machine") == machine_facts():
            return data.get("profiles", {})
    except (OSError, ValueError, AttributeError):
        pass
    return {}


def _save(profiles: dict) -> None:
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump({"machine": machine_facts(), "profiles": profiles}, f, indent=1)
        os.replace(f.name, path)
    except OSError as e:  # a read-only home: the measurements live for this process only
        log.warning("could not save the planner's calibration to %s: %s", path, e)


def _typical(fn: Callable[[], Any]) -> float:
    """Seconds per call: the median of REPEATS samples, each over enough calls in a row to last MIN_SAMPLE_S."""
    t0 = time.perf_counter()
    fn()  # warm: first-call costs are not the rate's
    calls = max(1, int(MIN_SAMPLE_S / max(time.perf_counter() - t0, 1e-7)))
    samples = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples)


def _matmul_points(a: Architecture, dtype: Any) -> list[list[float]]:
    """(FLOPs, seconds) of one layer's matmuls at each row count of :data:`ROWS`."""
    import torch

    from attnlab.transformer.linear import linear

    layer = sum(layer_matmul_params(a).values())
    rows = [r for r in ROWS if 2 * r * layer <= MAX_MATMUL_FLOPS] or [ROWS[0]]
    points = []
    weights = {(i, o): torch.randn(o, i, dtype=dtype) for i, o, _ in matmul_shapes(a)}
    for r in rows:
        seconds = 0.0
        for i, o, many in matmul_shapes(a):
            x = torch.randn(r, i, dtype=dtype)
            seconds += many * _typical(lambda: linear(x, weights[(i, o)]))
        points.append([2.0 * r * layer, seconds])
    return points


def _bandwidth(a: Architecture, dtype: Any, nbytes: int) -> float:
    """Bytes/s of matrix-vector products over the model's matrices and its LM head, cycled until they hold
    what a decode step reads (at most :data:`BANDWIDTH_BYTES`): a step's weight reads, from whichever
    level of the memory holds that many bytes."""
    import torch

    from attnlab.transformer.linear import linear

    target = min(decode_weight_bytes(a, nbytes), BANDWIDTH_BYTES)
    head = min(a.vocab_size, max(1, target // (a.hidden_size * nbytes)))  # the LM head, its rows capped by the target
    mats = [(torch.randn(1, a.hidden_size, dtype=dtype), torch.randn(head, a.hidden_size, dtype=dtype))]
    total = head * a.hidden_size * nbytes
    while total < target:
        for i, o, many in matmul_shapes(a):
            for _ in range(many):
                mats.append((torch.randn(1, i, dtype=dtype), torch.randn(o, i, dtype=dtype)))
                total += i * o * nbytes

    def sweep() -> None:
        for x, w in mats:
            linear(x, w)

    return total / _typical(sweep)


def _elementwise_points(dtype: Any, nbytes: int) -> list[list[float]]:
    """(bytes moved, seconds) of one elementwise product into a new tensor (two read, one written), as the
    model's norms, rotary and activations run, at sizes from the caches' to memory's."""
    import torch

    points = []
    for size in ELEMENTWISE:
        x, y = torch.randn(size, dtype=dtype), torch.randn(size, dtype=dtype)
        points.append([3.0 * size * nbytes, _typical(lambda: x * y)])
    return points


def _heads(a: Architecture) -> tuple[int, int]:
    """Query and k/v heads to measure with: at most MAX_HEADS query heads, the model's grouping kept."""
    g = a.num_heads // a.num_kv_heads
    h = max(g, min(a.num_heads, MAX_HEADS) // g * g)
    return h, h // g


def _attention_points(a: Architecture, dtype: Any) -> list[list[float]]:
    """Prefill (FLOPs, s) points of :func:`attnlab.attention`, causal, at the model's head dim and grouping."""
    import torch

    from attnlab.backends.api import attention

    h, kv, d = *_heads(a), a.head_dim
    prefill = []
    for n in PREFILL_N:
        flops = 4.0 * h * d * n * (n + 1) / 2
        if prefill and flops > MAX_ATTENTION_FLOPS:
            break
        q, k, v = (torch.randn(1, heads, n, d, dtype=dtype) for heads in (h, kv, kv))
        prefill.append([flops, _typical(lambda: attention(q, k, v, causal=True, backend=BACKEND))])
    return prefill


def _model(a: Architecture, dtype: Any, layers: int, heads: int, kv: int, head_dim: int, positions: int) -> Any:
    """A Llama-style model of random weights with these attention shapes and the smallest everything else."""
    from attnlab.transformer import Transformer, TransformerConfig

    config = {"model_type": "llama", "hidden_size": heads * head_dim, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim, "intermediate_size": 32,
              "vocab_size": 64, "max_position_embeddings": positions}
    return Transformer(TransformerConfig.from_hf(config)).to(dtype).eval()


def _generate(model: Any, prompt: int, repeats: int) -> tuple[float, float]:
    """(TTFT, TPOT) of ``model.generate`` on a prompt of ``prompt`` tokens, each the median of ``repeats`` runs
    after a warm one: TTFT the first new token's time, TPOT the mean gap between the later ones (vLLM's definitions)."""
    import torch

    ids = torch.randint(0, 64, (1, prompt), generator=torch.Generator().manual_seed(0))
    ttft, tpot = [], []
    for run in range(repeats + 1):
        stamps: list[float] = []
        t0 = time.perf_counter()
        model.generate(ids, GEN_NEW, on_token=lambda step, tok: stamps.append(time.perf_counter()))
        if run:  # the first run warms up
            ttft.append(stamps[0] - t0)
            tpot.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
    return statistics.median(ttft), statistics.median(tpot)


def _overheads(a: Architecture, dtype: Any) -> dict:
    """The fixed costs of ``generate`` through tiny models of one and OVERHEAD_LAYERS layers (their arithmetic
    is negligible): per layer, the growth from one to the other; per step, the rest (the loop, sampling). The
    first token's (the prefill's set-up: the cache, the checks) apart from the later tokens'."""
    g = a.num_heads // a.num_kv_heads
    runs = [_generate(_model(a, dtype, layers, 2 * g, 2, 16, 64), OVERHEAD_PROMPT, REPEATS) for layers in (1, OVERHEAD_LAYERS)]
    out = {}
    for i, name in ((1, ""), (0, "prefill_")):  # (TTFT, TPOT): index 0 the prefill, 1 a decode step
        per_layer = max((runs[1][i] - runs[0][i]) / (OVERHEAD_LAYERS - 1), 0.0)
        out[f"{name}layer_overhead_s"], out[f"{name}step_overhead_s"] = per_layer, max(runs[0][i] - per_layer, 0.0)
    return out


def _decode_points(a: Architecture, dtype: Any, nbytes: int) -> list[list[float]]:
    """(KV bytes read, seconds) of one decode step's attention through ``generate``: a one-layer model of the
    model's head dim and grouping, its step time at each prompt of DECODE_T beyond its time at the first (what
    more cache costs: the path generate takes, whatever kernel it uses). A step is a few milliseconds that move
    by a tenth from run to run, so the points are a least-squares line's, seconds = fixed + bytes / rate."""
    h, kv, d = *_heads(a), a.head_dim
    model = _model(a, dtype, 1, h, kv, d, max(DECODE_T) + GEN_NEW + 1)
    steps = [_generate(model, t, 3 if t > 4096 else REPEATS)[1] for t in DECODE_T]
    per_token = 2.0 * kv * d * nbytes
    work = [per_token * (t - DECODE_T[0]) for t in DECODE_T[1:]]
    slope, fixed = np.polyfit(work, [s - steps[0] for s in steps[1:]], 1)
    slope = max(slope, 1e-15)  # more keys never cost less
    return [[w, max(fixed + slope * w, slope * w)] for w in work]


def profile_key(a: Architecture, dtype: str) -> str:
    import torch

    return (f"v{PROFILE_VERSION}/t{torch.get_num_threads()}/{dtype}/d{a.hidden_size}/h{a.num_heads}/kv{a.num_kv_heads}/D{a.head_dim}/ff{a.intermediate_size}"
            f"/{'gated' if a.gated else 'mlp'}/L{a.num_layers}")


def measure(a: Architecture, dtype: str) -> dict:
    """Every measurement for ``a`` in ``dtype`` on this machine (seconds to a minute)."""
    import torch

    tdtype, nbytes = getattr(torch, dtype), DTYPE_BYTES[dtype]
    return {"matmul": _matmul_points(a, tdtype), "bandwidth": _bandwidth(a, tdtype, nbytes),
            "attention": _attention_points(a, tdtype), "decode_attention": _decode_points(a, tdtype, nbytes),
            "elementwise": _elementwise_points(tdtype, nbytes), **_overheads(a, tdtype),
            "torch_threads": torch.get_num_threads(), "backend": BACKEND, "measured_at": time.time()}


def this_machine(a: Architecture, dtype: str, refresh: bool = False) -> Hardware:
    """This machine's :class:`Hardware` for ``a`` in ``dtype``: cached measurements, measured when missing."""
    from attnlab.bench.sweep import memory_available

    if dtype not in MEASURABLE:
        raise ValueError(f"dtype {dtype!r} cannot be measured on this machine; use {', '.join(MEASURABLE)}")
    key = profile_key(a, dtype)
    profiles = {**_load(), **_MEMO}
    if refresh or key not in profiles:
        log.info("planner: measuring %s on this machine (once; cached in %s)", key, cache_file())
        profiles[key] = _MEMO[key] = measure(a, dtype)
        if enabled():  # ATTNLAB_CALIBRATE=0 (the tests): measured for this process only, nothing written
            _save(profiles)
    m, facts = profiles[key], machine_facts()
    pts = lambda name: tuple(tuple(p) for p in m[name])  # noqa: E731
    return Hardware(
        f"this machine ({facts['cpu']}, {m['torch_threads']} torch threads)", Rate(points=pts("matmul")),
        Rate(m["bandwidth"]), Rate(points=pts("attention")), Rate(points=pts("decode_attention")),
        Rate(points=pts("elementwise")), float(memory_available() or 0), m["layer_overhead_s"], True,
        f"measured, cached in {cache_file()}", step_overhead_s=m["step_overhead_s"],
        prefill_overhead_s=(m["prefill_layer_overhead_s"], m["prefill_step_overhead_s"]), details={"profile": key, "backend": m["backend"], "measured_at": m["measured_at"]})
