"""`attnlab check` and `attnlab bench`: do the backends agree with the reference here, and what do they cost."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.table import Table

from attnlab.bench.methods import METHODS
from attnlab.bench.sweep import BenchConfig
from attnlab.cli.common import console, counter, err, ints, json_option, names, out_file, progress, status, write_json

CAUSAL = {"both": (False, True), "yes": (True,), "no": (False,)}
DECODE_HELP = ("Decoding instead: one query row per head (B = 1, H = 32, H_kv = 8, D = 128) against caches of --sizes "
               "keys (default 4096 … 131072) in float32, bfloat16 and float16: time, GB/s of k and v, % of the read "
               "bandwidth measured in the same run, ratios to SDPA and to the kernel's tiles path (--methods, "
               "--repeats, --threads, --json apply).")
CALIBRATE_HELP = ("Forget auto's cached timings and measure them again (float32 torch tensors (1, 1, 4096, 64) and "
                  "(1, 12, 1024, 64), full and causal); print the cache file and the backends auto chooses.")


def _kernel_text(info: Any) -> str:
    """kernel_info() in one line: the instruction set in use, and the build where it is known."""
    if not isinstance(info, dict):
        return str(info)
    variants = ", ".join(v["name"] + ("" if v.get("runs_here", True) else " (not on this CPU)") for v in info.get("variants", []))
    openmp = "no OpenMP (one thread)" if info.get("openmp") is None else f"OpenMP {info['openmp']}"
    return f"{info.get('chosen')} (compiled for {variants}; {info.get('compiler')}, {openmp})"


def check(
    json_path: str = json_option(),
    calibrate: bool = typer.Option(False, "--calibrate", help=CALIBRATE_HELP),
) -> None:
    """Every backend against the float64 reference, here: max errors and pass/fail; the compiled kernel's build."""
    from attnlab.backends.agreement import run_check
    from attnlab.bench.checkup import recalibrate, summary
    from attnlab.bench.sweep import kernel_info

    kernel = kernel_info()
    bar, update = progress("checking backends")
    with bar:
        rows = run_check(counter(update))
    calibration = None
    if calibrate:
        with status("measuring the backends for auto on this machine…"):
            calibration = recalibrate()
    told = summary(rows)
    data = {"passed": told["failed"] == 0, "kernel": kernel, "summary": told,
            "rows": [r.to_dict() for r in rows], "calibration": calibration}
    if not write_json(json_path, data):
        _print_check(rows, told, kernel, calibration)
    if told["failed"]:
        raise typer.Exit(1)


def _print_check(rows: list, told: dict, kernel: Any, calibration: dict | None) -> None:
    console.print(f"compiled kernel: {_kernel_text(kernel)}", highlight=False)
    table = Table(title="attnlab check: every backend against the float64 reference")
    for col in ("case", "input", "dtype", "backend", "max error", "tolerance", "result"):
        table.add_column(col, justify="right" if col in ("max error", "tolerance") else "left", no_wrap=col != "case")
    for r in rows:
        if r.passed is not None:  # refusals are listed once below, not once per case
            table.add_row(r.case, r.library, r.dtype, r.backend, f"{r.max_error:.1e}", f"{r.tolerance:.1e}",
                          "[green]pass[/]" if r.passed else "[red]FAIL[/]")
    console.print(table)
    for r in told["refused"]:
        console.print(f"{r['backend']} refused {r['runs']} runs: {r['reason']}", highlight=False)
    failed = told["failed"]
    console.print(f"{told['ran'] - failed} of {told['ran']} passed" + (f", [red]{failed} failed[/]" if failed else ""))
    if calibration is not None:
        state = "" if calibration["enabled"] else " (ATTNLAB_CALIBRATE turns measuring off: auto uses the priors)"
        console.print(f"auto's timings: {calibration['cache']}{state}", highlight=False)
        for c in calibration["choices"]:
            console.print(f"  {tuple(c['shape'])} {'causal' if c['causal'] else 'full'}: {c['reason']}", highlight=False)


def bench(
    sizes: str | None = typer.Option(None, "--sizes", help=f"Context lengths n, comma-separated (up to 65536; default "
                                     f"{','.join(map(str, BenchConfig.sizes))}); with --decode the cache lengths."),
    heads: str = typer.Option(",".join(map(str, BenchConfig.heads)), "--heads", help="Head counts, comma-separated."),
    causal: str = typer.Option("both", "--causal", help="both, yes or no."),
    methods: str = typer.Option(",".join(METHODS), "--methods", help="Methods, comma-separated (benchmarks/README.md says what each is)."),
    d: int = typer.Option(BenchConfig.d, "--d", min=1, help="Head dimension."),
    repeats: int = typer.Option(BenchConfig.repeats, "--repeats", min=1, help="Timed rounds per method and size (median reported)."),
    memory_mb: float = typer.Option(BenchConfig.memory_mb, "--memory-mb",
                                    help="Skip a method whose estimated extra memory exceeds this."),
    max_seconds: float = typer.Option(BenchConfig.max_seconds, "--max-seconds",
                                      help="Skip a method whose estimated time per call exceeds this."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch threads while measuring (default: torch's)."),
    json_path: str | None = json_option(),
    png_path: str | None = typer.Option(None, "--png", metavar="PATH", help="Write the time and memory plot to this PNG.",
                                        callback=out_file("--png")),
    decode: bool = typer.Option(False, "--decode", help=DECODE_HELP),
) -> None:
    """Time, GFLOP/s, % of GEMM, peak extra memory and error of each way to compute attention; auto's choice and why."""
    from attnlab.bench.sweep import run

    if decode:
        given = {"--heads": heads != ",".join(map(str, BenchConfig.heads)), "--causal": causal != "both",
                 "--d": d != BenchConfig.d, "--memory-mb": memory_mb != BenchConfig.memory_mb,
                 "--max-seconds": max_seconds != BenchConfig.max_seconds, "--png": png_path is not None}
        if stray := [flag for flag, was_given in given.items() if was_given]:
            raise ValueError(f"{', '.join(stray)} do{'es' if len(stray) == 1 else ''} not apply to --decode, which "
                             f"measures B = 1, H = 32, H_kv = 8, D = 128, one query row (--sizes, --methods, "
                             f"--repeats, --threads and --json do)")
        _bench_decode(sizes, None if methods == ",".join(METHODS) else names(methods), repeats, threads, json_path)
        return
    sizes = sizes or ",".join(map(str, BenchConfig.sizes))
    if causal not in CAUSAL:
        raise ValueError(f"--causal must be both, yes or no, got {causal!r}")
    cfg = BenchConfig(sizes=ints("--sizes", sizes), heads=ints("--heads", heads), causal=CAUSAL[causal],
                      d=d, methods=names(methods), repeats=repeats, memory_mb=memory_mb,
                      max_seconds=max_seconds, threads=threads)
    bar, update = progress("benchmarking")
    tick = counter(update)
    tick.total = len(cfg.sizes) * len(cfg.heads) * len(cfg.causal) * len(cfg.methods) * cfg.repeats
    with bar:
        result = run(cfg, tick).to_dict()
    if png_path:
        from attnlab.viz.benchplot import bench_figure

        bench_figure(result).savefig(png_path, dpi=110)
        err.print(f"wrote {png_path}", highlight=False)
    if write_json(json_path, result):
        return
    _print_bench(result)


def _bench_decode(sizes: str | None, methods: tuple[str, ...] | None, repeats: int, threads: int | None,
                  json_path: str | None) -> None:
    from attnlab.bench.decode import DECODE_METHODS, DecodeConfig, run

    if methods is not None and (not methods or set(methods) - set(DECODE_METHODS)):
        raise ValueError(f"--methods with --decode takes some of {','.join(DECODE_METHODS)}, got {','.join(methods)!r}")
    chosen = {"lengths": ints("--sizes", sizes)} if sizes else {}
    cfg = DecodeConfig(repeats=repeats, threads=threads, **chosen, **({"methods": methods} if methods else {}))
    bar, update = progress("benchmarking decoding")
    tick = counter(update)
    tick.total = len(cfg.lengths) * len(cfg.dtypes) * len(cfg.methods) * cfg.repeats
    with bar:
        result = run(cfg, tick).to_dict()
    if write_json(json_path, result):
        return
    console.print(f"{result['machine']['cpu']}: reads memory at {result['bandwidth_gbs']:.1f} GB/s (a sum over "
                  f"{8 * result['llc_bytes'] / 2**20:,.0f} MB, 8 times the last-level cache)", highlight=False)
    for dtype in cfg.dtypes:  # one table per cache dtype: its eight columns fit a terminal of 80
        table = Table(title=f"decoding over {dtype} caches: B = 1, H = {cfg.heads}, H_kv = {cfg.kv_heads}, "
                            f"D = {cfg.d}, one query row", box=box.SIMPLE_HEAD)
        for col in ("keys", "method", "ms", "GB/s", "% read", "×SDPA", "×tiles", "auto"):
            table.add_column(col, justify="left" if col in ("method", "auto") else "right", no_wrap=True)
        for m in (m for m in result["measurements"] if m["dtype"] == dtype):
            table.add_row(*_decode_row(m))
        console.print(table)


def _decode_row(m: dict) -> list[str]:
    if m["time_s"] is None:
        return [f"{m['n']:,}", m["method"], "", "", "", "", "", f"skipped: {m['skipped']}"]
    ratio = lambda x: "" if x is None else f"{x:.2f}"  # noqa: E731
    return [f"{m['n']:,}", m["method"], f"{m['time_s'] * 1e3:,.3f}", f"{m['gbs']:.1f}", f"{m['pct_of_bandwidth']:.0f} %",
            ratio(m["vs_sdpa"]), ratio(m["vs_tiles"]), m["backend"] or ""]


def _print_bench(result: dict) -> None:
    mach = result["machine"]
    console.print(f"{mach['cpu']}, {mach['cores']} cores, torch threads {mach.get('torch_threads', '–')}, "
                  f"compiled kernel: {_kernel_text(mach['kernel'])}", highlight=False)
    ms = result["measurements"]
    for key in sorted({(m["n"], m["heads"], m["causal"]) for m in ms}):
        n, h, c = key
        rows = [m for m in ms if (m["n"], m["heads"], m["causal"]) == key]
        table = Table(title=f"n = {n}, {h} head{'s' if h > 1 else ''}, d = {rows[0]['d']}, {'causal' if c else 'full'}")
        for col in ("method", "ms", "GFLOP/s", "% GEMM", "peak MB", "error", "note"):
            table.add_column(col, justify="left" if col in ("method", "note") else "right", no_wrap=col != "note")
        for m in rows:
            if m["time_s"] is None:
                table.add_row(m["method"], "", "", "", "", "", f"skipped: {m['skipped']}")
                continue
            table.add_row(
                m["method"], f"{m['time_s'] * 1e3:,.2f}", f"{m['gflops']:.1f}",
                "" if m["pct_of_gemm"] is None else f"{m['pct_of_gemm']:.0f} %",
                "" if m["peak_bytes"] is None else f"{m['peak_bytes'] / 2**20:,.1f}",
                "" if m["max_error"] is None else f"{m['max_error']:.1e}",
                f"chose {m['backend']}" if m["backend"] else "",
            )
        console.print(table)
        for m in rows:
            if m["reason"]:
                console.print(f"auto chose {m['reason']}", highlight=False)
