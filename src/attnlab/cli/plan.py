"""`attnlab plan`: time to first token, time per token and memory of serving a model, per context length."""

from __future__ import annotations

import math
from typing import Any

import typer
from rich.table import Table

from attnlab.cli.common import console, err, json_option, names, out_file, print_table, write_json

PROMPT_HELP = "Prompt lengths in tokens, comma-separated; k = 1,000 (4k = 4,000 tokens)."
MODEL_HELP = ("A transformers config.json (file or folder), a bundled name (attnlab plan --list), attnlab:decoder "
              "or attnlab:decoder-long; nothing is downloaded.")
HARDWARE_HELP = "'this' (measured here once, cached) or a bundled accelerator (attnlab plan --list): a prediction."
EFFICIENCY_HELP = ("Override single efficiencies of the accelerator's --engine, e.g. matmul=0.6,bandwidth=0.85 "
                   "(names: matmul, attention, bandwidth, decode_attention, link, layer_overhead_s, allreduce_latency_s).")
ENGINE_HELP = ("A named accelerator's serving engine: vllm (the default) or trt-llm, whose efficiencies are fitted to "
               "published measurements where there are some (H100, A100), or ideal (the assumed efficiencies); "
               "--efficiency replaces single values of it.")
CURVE_POINTS = 33  # prompt lengths on the PNG's curves, log-spaced


def _tokens(text: str) -> tuple[int, ...]:
    from attnlab.planner.api import MAX_TOKENS

    out = []
    for part in names(text):
        scale = 1000 if part[-1] in "kK" else 1
        try:
            value = float(part[:-1] if scale > 1 else part) * scale
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 1 and value == int(value)):
            raise ValueError(f"--prompt takes comma-separated token counts >= 1 such as 4k,8k,32k (k = 1,000), got {part!r}")
        if value > MAX_TOKENS:
            raise ValueError(f"--prompt takes token counts up to {MAX_TOKENS:,} (beyond every model's positions), "
                             f"got {part!r}")
        out.append(int(value))
    if not out:
        raise ValueError(f"--prompt takes comma-separated token counts such as 4k,8k,32k, got {text!r}")
    return tuple(out)


def _positive(flag: str, value: Any, whole: bool = False) -> None:
    if value is None:
        return
    if not (math.isfinite(value) and value > 0 and (not whole or value == int(value))):
        raise ValueError(f"{flag} must be {'an integer >= 1' if whole else 'a positive number'}, got {value!r}")


def _dtype(dtype: str | None, hardware: str) -> None:
    from attnlab.planner.machine import MEASURABLE
    from attnlab.planner.models import DTYPE_BYTES

    here = hardware.strip().lower() == "this"
    allowed = MEASURABLE if here else tuple(DTYPE_BYTES)
    if dtype is not None and dtype not in allowed:
        raise ValueError(f"--dtype must be one of {', '.join(allowed)}{' on this machine' if here else ''}, got {dtype!r}")


def _hardware(hardware: str, efficiency: str | None, engine: str | None) -> Any:
    """'this' (resolved later, at the model's shapes), or the named accelerator under --engine with any
    --efficiency values in place of the engine's."""
    from dataclasses import replace

    from attnlab.planner.hardware import (ACCELERATORS, DEFAULT_ENGINE, ENGINES, Efficiencies, accelerator,
                                          accelerator_key, engine_efficiencies)

    if engine is not None and engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if hardware.strip().lower() == "this":
        for flag, value in (("--efficiency", efficiency), ("--engine", engine)):
            if value is not None:
                raise ValueError(f"{flag} applies to a named accelerator; --hardware this is measured, not assumed")
        return "this"
    engine = engine or DEFAULT_ENGINE
    fields = Efficiencies.__dataclass_fields__
    values = {}
    for part in names(efficiency or ""):
        name, _, val = (x.strip() for x in part.partition("="))
        if name not in fields:
            raise ValueError(f"--efficiency: unknown name {name!r}; names: {', '.join(fields)}")
        try:
            values[name] = float(val)
        except ValueError:
            raise ValueError(f"--efficiency {name} takes a number, got {val!r}") from None
    key = accelerator_key(hardware)
    if key is None:
        raise ValueError(f"--hardware {hardware!r} is not known; known: this, {', '.join(ACCELERATORS)}")
    try:
        eff = replace(engine_efficiencies(key, engine)[0], **values) if values else None
    except ValueError as e:
        raise ValueError(f"--efficiency: {e}") from None
    return accelerator(key, eff, engine)


CALIBRATE_HELP = ("Measure this machine's rates at the model's shapes again (they are measured once and cached), "
                  "then plan.")
VERIFY_HELP = ("Check the plan here: build the model from its config with random weights, run generate at each "
               "--prompt length and print predicted, measured and their ratio (refused when it would not fit in "
               "memory).")


def plan(
    model: str | None = typer.Option(None, "--model", help=MODEL_HELP),
    hardware: str = typer.Option("this", "--hardware", help=HARDWARE_HELP),
    prompt: str = typer.Option("4k,8k,32k,128k", "--prompt", help=PROMPT_HELP),
    new_tokens: int = typer.Option(256, "--new-tokens", help="Tokens generated after the prompt."),
    batch: int = typer.Option(1, "--batch", help="Sequences served together."),
    dtype: str | None = typer.Option(None, "--dtype", help="Weights' and cache's dtype (default: the config's)."),
    cache_dtype: str | None = typer.Option(None, "--cache-dtype", help="The KV cache's dtype, overriding --dtype's "
                                           "cache part: a float dtype, or int8, int4, fp8 (scales counted)."),
    cache_budget: int | None = typer.Option(None, "--cache-budget", help="Tokens per layer an evicting cache keeps "
                                            "(attnlab generate --cache h2o --cache-budget N)."),
    deadline_ms: float | None = typer.Option(None, "--deadline-ms", help="Latency deadline in ms, on --deadline-on."),
    deadline_on: str = typer.Option("total", "--deadline-on", help="What the deadline bounds: total or ttft."),
    memory_gb: float | None = typer.Option(None, "--memory-gb", help="Memory per device in GB (10^9 bytes); default: the device's."),
    gpus: int = typer.Option(1, "--gpus", help="Devices in tensor parallelism (named accelerators)."),
    engine: str | None = typer.Option(None, "--engine", help=ENGINE_HELP),
    efficiency: str | None = typer.Option(None, "--efficiency", help=EFFICIENCY_HELP),
    calibrate: bool = typer.Option(False, "--calibrate", help=CALIBRATE_HELP),
    verify: bool = typer.Option(False, "--verify", help=VERIFY_HELP),
    repeats: int = typer.Option(5, "--repeats", help="--verify: runs per prompt length (medians, with their range)."),
    list_all: bool = typer.Option(False, "--list", help="List the bundled models and accelerators."),
    png_path: str | None = typer.Option(None, "--png", metavar="PATH", help="Write latency and memory against context to this PNG.",
                                        callback=out_file("--png")),
    json_path: str | None = json_option(),
) -> None:
    """Will this model, at these context lengths, on this hardware, meet the deadline and fit in memory?"""
    if list_all:
        return _list(json_path)
    if model is None or not model.strip():
        raise ValueError("--model is required (a config.json path or a bundled name; attnlab plan --list)")
    lengths = _tokens(prompt)
    for flag, value, whole in (("--new-tokens", new_tokens, True), ("--batch", batch, True), ("--gpus", gpus, True),
                               ("--repeats", repeats, True), ("--deadline-ms", deadline_ms, False),
                               ("--memory-gb", memory_gb, False)):
        _positive(flag, value, whole)
    if deadline_on not in ("total", "ttft"):
        raise ValueError(f"--deadline-on must be total or ttft, got {deadline_on!r}")
    _dtype(dtype, hardware)
    hw = _hardware(hardware, efficiency, engine)
    if verify and (cache_dtype is not None or cache_budget is not None):
        raise ValueError("--verify runs the model with a dense cache of --dtype; --cache-dtype and --cache-budget "
                         "are predicted only (attnlab kv measures what they cost in error)")
    for flag, asked in (("--calibrate", calibrate), ("--verify", verify)):
        if asked and hw != "this":
            raise ValueError(f"{flag} measures this machine; it goes with --hardware this")
    if hw == "this":
        from attnlab.planner.machine import for_model

        with _status("measuring this machine at the model's shapes…" if calibrate
                     else "reading (or measuring, once) this machine at the model's shapes…"):
            hw = for_model(model, dtype, refresh=calibrate)
    if verify:
        return _verify(model, hw, lengths, new_tokens, dtype, repeats, json_path)
    from attnlab.planner import plan as run_plan

    kw = dict(new_tokens=new_tokens, batch=batch, dtype=dtype, deadline_ms=deadline_ms, memory_gb=memory_gb,
              gpus=gpus, deadline_on=deadline_on, cache_dtype=cache_dtype, cache_budget=cache_budget)
    result = run_plan(model, hw, prompt_tokens=list(lengths), **kw)
    if png_path:
        _png(png_path, result, model, kw)
    if write_json(json_path, result.to_dict()):
        return
    _print(result)


def _verify(model: str, hw: Any, lengths: tuple[int, ...], new_tokens: int, dtype: str | None, repeats: int,
            json_path: str | None) -> None:
    import os

    from attnlab.planner.verify import verify

    with _status(f"running the model here at {len(lengths)} prompt length(s), {repeats + 1} runs each…"):
        v = verify(model, list(lengths), new_tokens, dtype, repeats, hardware=hw)
    if write_json(json_path, v.to_dict()):
        return
    p = v.plan
    console.print(f"{p.model.name} on {p.hardware.name}, {p.dtype}, batch 1, {p.new_tokens} new tokens, random weights; "
                  f"measured: median (min–max) of {v.repeats} runs after a warm one; load average "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", highlight=False)
    table = Table(title="predicted (its range) beside measured (min–max): predicted ÷ measured", title_justify="left")
    for col in ("prompt", "TTFT predicted", "TTFT measured", "ratio", "TPOT predicted", "TPOT measured", "ratio"):
        table.add_column(col, justify="right")
    for c in v.checks:
        table.add_row(f"{c.prompt_tokens:,}", _ranged(*c.predicted_ttft_s), _ranged(*c.measured_ttft_s),
                      f"{c.ttft_ratio:.2f}", _ranged(*c.predicted_tpot_s), _ranged(*c.measured_tpot_s),
                      f"{c.tpot_ratio:.2f}")
    print_table(table)
    for note in v.notes:
        console.print(f"note: {note}", highlight=False)


def _status(text: str) -> Any:
    from attnlab.cli.common import status

    return status(text)


def _png(path: str, result: Any, model: str, kw: dict) -> None:
    import numpy as np

    from attnlab.planner import plan as run_plan
    from attnlab.viz.planplot import plan_figure

    top = max(result.model.max_positions - result.new_tokens, 2)
    grid = sorted({int(x) for x in np.geomspace(min(256, top), top, CURVE_POINTS)} | {r.prompt_tokens for r in result.rows})
    curve = run_plan(result.model, result.hardware, prompt_tokens=grid, **kw)
    plan_figure(curve.to_dict(), result.to_dict()).savefig(path, dpi=110)
    err.print(f"wrote {path}", highlight=False)


def _per_s(rate: Any, unit: str) -> str:
    """A rate as tables print it: the largest measured point's (or the constant), in G or T."""
    x = rate.at_largest
    return f"{x / 1e12:,.2f} T{unit}" if x >= 1e12 else f"{x / 1e9:,.2f} G{unit}"


def _seconds(s: float) -> str:
    """Seconds with three figures at any scale: a tiny model's step is microseconds, not "0.0 ms"."""
    if s < 1e-3:
        return f"{s * 1e6:,.0f} µs" if s >= 1e-5 else f"{s * 1e6:.2f} µs"
    if s < 1:
        return f"{s * 1e3:,.2f} ms" if s < 0.01 else f"{s * 1e3:,.1f} ms"
    return f"{s:,.2f} s" if s < 600 else f"{s / 60:,.1f} min"


def _ranged(s: float, low: float | None = None, high: float | None = None) -> str:
    """``6.3 ms (5.8–7.0)``: a figure and its range, in the figure's unit; the figure alone when none is known."""
    if low is None or high is None:
        return _seconds(s)
    text, unit = _seconds(s).rsplit(" ", 1)
    scale = float(text.replace(",", "")) / s
    digits = len(text.split(".")[1]) if "." in text else 0
    return f"{text} {unit} ({low * scale:,.{digits}f}–{high * scale:,.{digits}f})"


def _bytes(b: float, binary: bool = True) -> str:
    """Bytes in units sized to the figure (binary or decimal): a tiny model's cache is KiB, not "0.00 GiB"."""
    units = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if binary else (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))
    for unit, size in units:
        if b >= size:
            return f"{b / size:,.2f} {unit}"
    return f"{b:,.0f} B"


def _print(p: Any) -> None:
    a, hw = p.model, p.hardware
    windows = sorted({w for w in a.windows if w})
    shape = (f"{a.num_layers} layers, {a.num_heads} heads ({a.num_kv_heads} k/v) of {a.head_dim}, d = {a.hidden_size}, "
             f"{a.max_positions:,} positions" + (f", windows {', '.join(map(str, windows))} on "
                                                 f"{sum(w is not None for w in a.windows)} layers" if windows else ""))
    console.print(f"{a.name}: {shape} ({a.source})", highlight=False)
    fitted = bool(hw.details.get("validation"))
    kind = ("predicted from rates measured here at the model's shapes (not a run of the model: attnlab plan "
            "--verify runs it)" if hw.measured else
            f"PREDICTED (datasheet × efficiencies fitted to published {hw.details['engine']} measurements)" if fitted
            else "PREDICTED (datasheet × assumed efficiencies, not measured)")
    console.print(f"hardware: {hw.name}{f' × {p.gpus}' if p.gpus > 1 else ''}: {kind}", highlight=False)
    kv = "at the weights' rate" if hw.decode_attention == hw.bandwidth and hw.measured else _per_s(hw.decode_attention, "B/s")
    console.print(f"  rates: matmul {_per_s(hw.matmul, 'FLOP/s')}, weights read {_per_s(hw.bandwidth, 'B/s')}, attention "
                  f"{_per_s(hw.attention, 'FLOP/s')}, KV read {kv}, elementwise "
                  f"{_per_s(hw.elementwise, 'B/s')}; overhead {_seconds(hw.layer_overhead_s)} per layer + "
                  f"{_seconds(hw.step_overhead_s)} per step ({hw.source})", highlight=False)
    limits = [f"memory {p.memory_bytes / 1e9:,.1f} GB ({p.memory_bytes / 2**30:,.1f} GiB) per device"]
    if p.deadline_ms is not None:
        limits.insert(0, f"deadline {p.deadline_ms:g} ms on {p.deadline_on}")
    console.print(f"{p.dtype}, batch {p.batch}, {p.new_tokens} new tokens; {'; '.join(limits)}", highlight=False)
    if p.cache is not None:
        c = p.cache
        keep = f", {c.budget:,} tokens kept per layer (evicting)" if c.budget else ""
        console.print(f"KV cache: {c.dtype}, {c.per_token:g} bytes per token and k/v head (keys and values, scales "
                      f"counted) + {c.fixed:g} per sequence and k/v head{keep}", highlight=False)
    ranged = any(r.ranges["ttft_s"] for r in p.rows)
    where = ("where the measurements of the published rows left out of the fit fell" if fitted
             else "at the fast and slow ends of this machine's measurements")
    table = Table(title="per prompt length (TPOT: mean over the new tokens; total = TTFT + (new − 1) · TPOT"
                  + (f"; in brackets: {where})" if ranged else ")"), title_justify="left")
    for col in ("prompt", "TTFT", "TPOT", "total", "KV cache", "peak", "max batch", "fits?", "limited by"):
        table.add_column(col, justify="left" if col in ("fits?", "limited by") else "right")
    for r in p.rows:
        why = ("beyond positions" if r.beyond_positions else "no: memory" if not r.fits_memory
               else "no: deadline" if r.meets_deadline is False else "yes")
        cells = [_ranged(getattr(r, k), *(r.ranges[k] or ())) for k in ("ttft_s", "tpot_s", "total_s")]
        table.add_row(f"{r.prompt_tokens:,}", *cells, _bytes(r.kv_bytes), _bytes(r.peak_bytes, binary=False),
                      f"{r.max_batch:,}", why, r.limited_by)
    print_table(table)
    print_table(_terms(p))
    console.print(_largest(p), highlight=False)
    for note in p.notes:
        console.print(f"note: {note}", highlight=False)


def _largest(p: Any) -> str:
    best = p.max_prompt_tokens
    meets = "the deadline and the memory" if p.deadline_ms is not None else "the memory"
    text = f"largest prompt meeting {meets}: " + (f"{best:,} tokens" if best else "none")
    if p.search.capped:
        return text + " (the model's positions less the new tokens: the memory would allow more)"
    if p.max_prompt_range and p.max_prompt_range[0] != p.max_prompt_range[1]:
        where = ("within the published rows' held-out error" if p.hardware.details.get("validation")
                 else "at the slow and fast ends of this machine's measurements")
        text += " ({:,}–{:,} {})".format(*p.max_prompt_range, where)
    return text


def _terms(p: Any) -> Table:
    keys = list(dict.fromkeys((t.phase, t.name) for r in p.rows for t in r.terms))
    table = Table(title="the model of time, term by term (prefill: once; decode: per token)", title_justify="left")
    table.add_column("prompt", justify="right")
    for phase, name in keys:
        table.add_column(f"{phase} {name}", justify="right")
    for r in p.rows:
        cells = [r.term(phase, name) for phase, name in keys]
        table.add_row(f"{r.prompt_tokens:,}", *[_seconds(c.seconds) if c else "" for c in cells])
    return table


def _list(json_path: str | None) -> None:
    from attnlab.planner.hardware import ACCELERATORS, FIT_SOURCE, FITTED, Efficiencies
    from attnlab.planner.models import BUNDLED, load_model

    models = {k: dict(load_model(k).to_dict(), version=b.version, url=b.source) for k, b in BUNDLED.items()}
    accels = {k: vars(a) for k, a in ACCELERATORS.items()}
    fitted = {f"{k}/{e}": dict(vars(Efficiencies(**eff)), validation=list(v)) for (k, e), (eff, v) in FITTED.items()}
    if write_json(json_path, {"models": models, "accelerators": accels, "efficiencies": vars(Efficiencies()),
                              "fitted": fitted, "fitted_source": FIT_SOURCE}):
        return
    t = Table(title="bundled models (numbers transcribed from each published config.json)", title_justify="left")
    for col in ("name", "layers", "heads (k/v)", "head dim", "d", "ff", "positions", "windows", "dtype"):
        t.add_column(col, justify="left" if col in ("name", "windows", "dtype") else "right")
    for k, m in models.items():
        w = sorted({x for x in m["windows"] if x})
        t.add_row(k, str(m["num_layers"]), f"{m['num_heads']} ({m['num_kv_heads']})", str(m["head_dim"]),
                  str(m["hidden_size"]), str(m["intermediate_size"]), f"{m['max_positions']:,}",
                  (f"{w[0]} on {sum(1 for x in m['windows'] if x)} layers" if w else "none"), m["dtype"])
    console.print(t)
    for k, m in models.items():
        console.print(f"  {k}: {m['url']} ({m['version']})", highlight=False, soft_wrap=True)
    t = Table(title="bundled accelerators (dense 16-bit peaks; --hardware NAME)", title_justify="left")
    for col in ("name", "TFLOP/s", "TB/s", "GB", "link per direction"):
        t.add_column(col, justify="left" if col in ("name", "link per direction") else "right")
    for k, a in ACCELERATORS.items():
        t.add_row(f"{k} ({a.name})", f"{a.peak_flops / 1e12:g}", f"{a.bandwidth / 1e12:g}", f"{a.memory_bytes / 1e9:g}",
                  f"{a.link / 1e9:g} GB/s, {a.link_name}")
    console.print(t)
    for k, a in ACCELERATORS.items():
        console.print(f"  {k}: {a.source}", highlight=False, soft_wrap=True)
    e = vars(Efficiencies())
    console.print("assumed efficiencies (--engine ideal, and any accelerator or engine without published rows): "
                  + ", ".join(f"{k} {v:g}" for k, v in e.items()), highlight=False)
    console.print(f"fitted (--engine vllm, the default, or trt-llm), {FIT_SOURCE}:", highlight=False)
    for name, f in fitted.items():
        console.print(f"  {name}: " + ", ".join(f"{k} {v:g}" for k, v in f.items() if k != "validation")
                      + "; rows of other models: {:.2f}-{:.2f} × the measured total".format(*f["validation"]),
                      highlight=False, soft_wrap=True)
