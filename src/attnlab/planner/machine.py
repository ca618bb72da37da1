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
- the memory available (plus this process's own) is read at each plan (it changes), never cached.

Every time is the median of :data:`REPEATS` samples after a warm call, a sample of a short call being
several calls in a row: the planner predicts the typical run, and on a shared or virtual machine the
fastest of a few samples is well below it (a quarter and more for a decoding step's few milliseconds).
Each measurement keeps its spread, ``[median, low, high]`` (:mod:`attnlab.planner.noise`): the range shown
beside every figure. A profile whose spread is too wide (another program ran) is measured again; if it is
still wide it is used for this process, said to be from a busy machine, and not cached. The decode read's
line must grow with the cache: when its points do not support that, the steps are measured again over more
runs and more tokens, and if they still do not, the plan says so and costs the read at the weights' rate.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.backends.calibrate import cache_path as auto_cache_path
from attnlab.backends.calibrate import enabled, machine_facts
from attnlab.planner import noise
from attnlab.planner.formulas import (
    decode_weight_bytes,
    layer_matmul_params,
    matmul_shapes,
    weight_bytes,
)
from attnlab.planner.hardware import Hardware
from attnlab.planner.models import DTYPE_BYTES, Architecture
from attnlab.planner.profiled import hardware_of, worst_percent

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
DECODE_ATTEMPTS = 2  # measurements of the decode steps, the second over twice the runs and tokens (a third, at four
# times, made a plan on a loaded machine take minutes more and moved nothing there: its steps stayed in the noise)
ELEMENTWISE = (1 << 16, 1 << 19, 1 << 22, 1 << 24)  # elements of the tensors multiplied  # cache lengths for one decode query
MAX_HEADS = 8  # attention is measured on at most this many query heads (the rate per head is what counts)
MAX_KV_HEADS = 4  # a decode step is measured on at most this many k/v heads, each with its whole group (more only lengthens
# the profile: a 2-head stand-in already predicted within 0.91-1.01)
BACKEND = "auto"  # attnlab's transformer's default backend
OVERHEAD_LAYERS = 4
MEASURABLE = ("float32", "bfloat16", "float16", "float64")  # dtypes torch computes in on a CPU
PROFILE_VERSION = 9  # what a profile holds or how it is measured (5: the linear layers' few-row path; 6: decode
# from 8 keys, medians; 7: each measurement [median, low, high], the decode line supported or said not to be,
# the prefill attention called as the model calls it; 8: the decode step's cache read through the trusted entry, its
# k/v check folded into the kernel's pass, one thread for a small step; every rate on the threads the model's own
# generation takes; the decode step on the model's own k/v heads):
# a new one measures anew
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


def _samples(fn: Callable[[], Any]) -> list[float]:
    """Seconds per call, REPEATS samples, each over enough calls in a row to last MIN_SAMPLE_S (the one place
    that times a call: the tests replace it with fixed samples)."""
    t0 = time.perf_counter()
    fn()  # warm: first-call costs are not the rate's
    calls = max(1, int(MIN_SAMPLE_S / max(time.perf_counter() - t0, 1e-7)))
    samples = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls)
    return samples


def _typical(fn: Callable[[], Any]) -> list[float]:
    """[median, low, high] seconds per call."""
    return noise.summary(_samples(fn))


def _matmul_points(a: Architecture, dtype: Any) -> list[list[float]]:
    """(FLOPs, seconds) of one layer's matmuls at each row count of :data:`ROWS`."""
    import torch

    from attnlab.transformer.linear import linear

    layer = sum(layer_matmul_params(a).values())
    rows = [r for r in ROWS if 2 * r * layer <= MAX_MATMUL_FLOPS] or [ROWS[0]]
    points = []
    weights = {(i, o): torch.randn(o, i, dtype=dtype) for i, o, _ in matmul_shapes(a)}
    for r in rows:
        seconds = np.zeros(3)
        for i, o, many in matmul_shapes(a):
            x = torch.randn(r, i, dtype=dtype)
            seconds += many * np.array(_typical(lambda: linear(x, weights[(i, o)])))
        points.append([2.0 * r * layer, *map(float, seconds)])
    return points


def _bandwidth(a: Architecture, dtype: Any, nbytes: int) -> list[float]:
    """Bytes/s of matrix-vector products over the model's matrices and its LM head, cycled until they hold
    what a decode step reads (at most :data:`BANDWIDTH_BYTES`): a step's weight reads, from whichever
    level of the memory holds that many bytes. One point, [bytes, median, low, high] seconds."""
    import torch

    from attnlab.transformer.linear import linear

    target = int(min(decode_weight_bytes(a, nbytes), BANDWIDTH_BYTES))
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

    return [float(total), *_typical(sweep)]


def _elementwise_points(dtype: Any, nbytes: int) -> list[list[float]]:
    """(bytes moved, seconds) of one elementwise product into a new tensor (two read, one written), as the
    model's norms, rotary and activations run, at sizes from the caches' to memory's."""
    import torch

    points = []
    for size in ELEMENTWISE:
        x, y = torch.randn(size, dtype=dtype), torch.randn(size, dtype=dtype)
        points.append([3.0 * size * nbytes, *_typical(lambda: x * y)])
    return points


def _heads(a: Architecture) -> tuple[int, int]:
    """Query and k/v heads to measure the prefill with: at most MAX_HEADS query heads, the model's grouping kept."""
    g = a.num_heads // a.num_kv_heads
    h = max(g, min(a.num_heads, MAX_HEADS) // g * g)
    return h, h // g


def _decode_heads(a: Architecture) -> tuple[int, int]:
    """Query and k/v heads to measure the decode step with: the model's k/v heads (at most MAX_KV_HEADS), each with
    its whole group. A decode step's work is split by k/v head and by chunks of the cache; a stand-in cut down to
    one k/v head read its cache at 7.7-10.8 GB/s where the models with 2-3 k/v heads it stood for grew at about
    15 GB/s (2-core AVX2 EPYC, 16 heads over 2 and 15 over 3, heads of 48), so their TPOT came out 1.15-1.17x."""
    g = a.num_heads // a.num_kv_heads
    kv = min(a.num_kv_heads, MAX_KV_HEADS)
    return kv * g, kv


def _attention_points(a: Architecture, dtype: Any) -> list[list[float]]:
    """Prefill (FLOPs, s) points of :func:`attnlab.attention`, causal, at the model's head dim and grouping,
    called as the model's prefill calls it (:func:`_prefill_call`)."""
    h, kv, d = *_heads(a), a.head_dim
    prefill = []
    for n in PREFILL_N:
        flops = 4.0 * h * d * n * (n + 1) / 2
        if prefill and flops > MAX_ATTENTION_FLOPS:
            break
        prefill.append([flops, *_typical(_prefill_call(h, kv, d, n, dtype))])
    return prefill


def _prefill_call(h: int, kv: int, d: int, n: int, dtype: Any) -> Callable[[], Any]:
    """One prefill attention call as ``generate`` makes it: q a (B, T, H, D) projection seen as (B, H, T, D)
    (its heads split by a transpose, not copied), the keys and values the first n slots of the cache's
    [B, H_kv, capacity, D] buffers, the keyword arguments the cache's read builds (checked once, on append).
    A contiguous q here ran 8-17 % faster than the model's own call on this machine's AVX2 EPYC (the kernel
    reads q's rows with a stride), so timing the call alone mispredicted the model's prefill."""
    import torch

    from attnlab.backends.api import attention
    from attnlab.transformer.layer_cache import Read

    q = torch.randn(1, n, h, d, dtype=dtype).transpose(1, 2)  # (B, H, T, D), strided as the model's
    cache = [torch.zeros(1, kv, n + GEN_NEW, d, dtype=dtype) for _ in range(2)]  # (B, H_kv, capacity, D)
    for buf in cache:
        buf[:, :, :n] = torch.randn(1, n, kv, d, dtype=dtype).transpose(1, 2)
    k, v = (buf[:, :, :n] for buf in cache)
    read = Read(k, v, None, None, torch.arange(n)[None], float(k.float().norm(dim=-1).max()))
    return lambda: attention(q, k, v, backend=BACKEND, **read.kwargs())


def _model(a: Architecture, dtype: Any, layers: int, heads: int, kv: int, head_dim: int, positions: int) -> Any:
    """A Llama-style model of random weights with these attention shapes and the smallest everything else."""
    from attnlab.transformer import Transformer, TransformerConfig

    config = {"model_type": "llama", "hidden_size": heads * head_dim, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim, "intermediate_size": 32,
              "vocab_size": 64, "max_position_embeddings": positions}
    return Transformer(TransformerConfig.from_hf(config)).to(dtype).eval()


def _generate(model: Any, prompt: int, repeats: int, new: int = GEN_NEW) -> tuple[list[float], list[float]]:
    """(TTFT, TPOT) of ``model.generate`` on a prompt of ``prompt`` tokens, each [median, low, high] over
    ``repeats`` runs after a warm one: TTFT the first new token's time, TPOT the mean gap between the later
    ones (vLLM's definitions), over ``new`` new tokens."""
    import torch

    ids = torch.randint(0, 64, (1, prompt), generator=torch.Generator().manual_seed(0))
    ttft, tpot = [], []
    for run in range(repeats + 1):
        stamps: list[float] = []
        t0 = time.perf_counter()
        model.generate(ids, new, on_token=lambda step, tok: stamps.append(time.perf_counter()))
        if run:  # the first run warms up
            ttft.append(stamps[0] - t0)
            tpot.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
    return noise.summary(ttft), noise.summary(tpot)


def _overheads(a: Architecture, dtype: Any) -> dict:
    """The fixed costs of ``generate`` through tiny models of one and OVERHEAD_LAYERS layers (their arithmetic
    is negligible): per layer, the growth from one to the other; per step, the rest (the loop, sampling). The
    first token's (the prefill's set-up: the cache, the checks) apart from the later tokens'. Each is
    [median, low, high], the low and high ends from the runs' own low and high ends. A growth below zero (the
    larger model ran faster: noise) counts as none, and the per-step cost holds the whole."""
    g = a.num_heads // a.num_kv_heads
    runs = [_generate(_model(a, dtype, layers, 2 * g, 2, 16, 64), OVERHEAD_PROMPT, REPEATS) for layers in (1, OVERHEAD_LAYERS)]
    out = {}
    for i, name in ((1, ""), (0, "prefill_")):  # (TTFT, TPOT): index 0 the prefill, 1 a decode step
        per_layer, per_step = [], []
        for end in range(3):  # median, low, high
            one, many = runs[0][i][end], runs[1][i][end]
            per_layer.append(max((many - one) / (OVERHEAD_LAYERS - 1), 0.0))
            per_step.append(max(one - per_layer[-1], 0.0))
        out[f"{name}layer_overhead_s"] = [per_layer[0], min(per_layer), max(per_layer)]
        out[f"{name}step_overhead_s"] = [per_step[0], min(per_step), max(per_step)]
    return out


def _decode_points(a: Architecture, dtype: Any, nbytes: int) -> dict:
    """The KV read of one decode step through ``generate``: a one-layer model of the model's head dim and
    grouping, its step time at each prompt of DECODE_T beyond its time at the first (what more cache costs:
    the path generate takes, whatever kernel it uses), as a least-squares line (a step is a few milliseconds
    that move by a tenth from run to run). When the steps do not support a line that grows
    (:func:`attnlab.planner.noise.decode_line`), they are measured again over twice the runs and twice the
    tokens, DECODE_ATTEMPTS times in all. ``points``: [KV bytes, median, low, high] (empty: never supported)."""
    h, kv, d = *_decode_heads(a), a.head_dim
    model = _model(a, dtype, 1, h, kv, d, max(DECODE_T) + GEN_NEW * 2 ** DECODE_ATTEMPTS + 1)
    work = [2.0 * kv * d * nbytes * t for t in DECODE_T]
    repeats, new = REPEATS, GEN_NEW
    for attempt in range(1, DECODE_ATTEMPTS + 1):
        steps = [_generate(model, t, repeats if t <= 4096 else max(3, repeats // 2), new)[1] for t in DECODE_T]
        line = noise.decode_line(work, steps)
        if line is not None:
            return {"points": noise.decode_points(work, steps, line), "attempts": attempt, "steps": steps}
        log.info("planner: the decode steps %s do not grow beyond their noise; measuring again, longer", steps)
        repeats, new = 2 * repeats, 2 * new - 1
    return {"points": [], "attempts": DECODE_ATTEMPTS, "steps": steps}


def profile_key(a: Architecture, dtype: str) -> str:
    import torch

    return (f"v{PROFILE_VERSION}/t{torch.get_num_threads()}/{dtype}/d{a.hidden_size}/h{a.num_heads}/kv{a.num_kv_heads}/D{a.head_dim}/ff{a.intermediate_size}"
            f"/{'gated' if a.gated else 'mlp'}/L{a.num_layers}")


def _measure_once(a: Architecture, dtype: str) -> dict:
    """Every rate at ``a``'s shapes, on the threads ``a``'s own generation takes (transformer.threads: one for a
    model whose weights read under 16 MiB a step, torch's count otherwise), stand-ins and isolated calls alike:
    the one-layer stand-ins read little enough to run on one thread by themselves, which made the decode line
    of a model that runs on two over-predict its steps by 1.2-1.4x at 2,048-8,192 tokens (2-core AVX2 EPYC)."""
    import torch

    from attnlab.transformer.threads import pinned_threads, threads_for

    tdtype, nbytes = getattr(torch, dtype), DTYPE_BYTES[dtype]
    threads = threads_for(weight_bytes(a, nbytes))
    with pinned_threads(threads):
        return {"matmul": _matmul_points(a, tdtype), "bandwidth": _bandwidth(a, tdtype, nbytes),
                "attention": _attention_points(a, tdtype), "decode_attention": _decode_points(a, tdtype, nbytes),
                "elementwise": _elementwise_points(tdtype, nbytes), **_overheads(a, tdtype),
                "torch_threads": torch.get_num_threads(), "generation_threads": threads, "backend": BACKEND,
                "measured_at": time.time()}


def measure(a: Architecture, dtype: str) -> dict:
    """Every measurement for ``a`` in ``dtype`` on this machine (seconds to a minute). A profile whose spread
    is wider than :data:`attnlab.planner.noise.BUSY_SPREAD` is measured once more and the narrower kept;
    ``busy`` says whether that one is still too wide."""
    first = _measure_once(a, dtype)
    if not noise.busy(first):
        return dict(first, busy=False)
    log.info("planner: the measurements spread %.0f %% (%s): measuring again", *worst_percent(first))
    second = _measure_once(a, dtype)
    best = min(first, second, key=lambda m: noise.worst_spread(m)[0])
    return dict(best, busy=noise.busy(best))


def this_machine(a: Architecture, dtype: str, refresh: bool = False) -> Hardware:
    """This machine's :class:`Hardware` for ``a`` in ``dtype``: cached measurements, measured when missing.
    A profile measured on a busy machine serves this process and is not written to the cache."""
    if dtype not in MEASURABLE:
        raise ValueError(f"dtype {dtype!r} cannot be measured on this machine; use {', '.join(MEASURABLE)}")
    key = profile_key(a, dtype)
    profiles = {**_load(), **_MEMO}
    if refresh or key not in profiles:
        log.info("planner: measuring %s on this machine (once; cached in %s)", key, cache_file())
        profiles[key] = _MEMO[key] = measure(a, dtype)
        if enabled() and not profiles[key]["busy"]:  # ATTNLAB_CALIBRATE=0 (the tests): nothing written
            _save({k: v for k, v in profiles.items() if not v.get("busy")})
    return hardware_of(profiles[key], key, f"measured, cached in {cache_file()}")


def for_model(model: Any, dtype: str | None = None, refresh: bool = False) -> Hardware:
    """This machine for ``model`` (anything :func:`attnlab.planner.models.load_model` takes) in ``dtype``
    (default: the model's): the one call the CLI's ``--hardware this``, ``--calibrate`` and ``--verify`` make."""
    from attnlab.planner.models import load_model

    a = load_model(model)
    return this_machine(a, dtype or a.dtype, refresh=refresh)
