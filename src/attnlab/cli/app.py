"""`attnlab …`: the command line. Thin wrappers: the work happens in the library, the printing here.

Every command that computes something can also hand it over as JSON (``--json``). Bad input
ends in one line, ``error: …``, and exit status 2, never a traceback (set ATTNLAB_DEBUG=1 to see
one).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from attnlab.lesson.fmt import pct, vec  # one rounding for the lesson, its page and the CLI
from attnlab.lesson.cost import CostConfig  # NumPy only: its defaults are the flags' defaults

app = typer.Typer(
    name="attnlab",
    help="Attention end to end: compute it, look inside real models, learn it, measure its cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err = Console(stderr=True)


def emit_json(data: Any) -> None:
    """JSON to stdout, nothing else, so that `attnlab … --json | jq` works."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


@app.callback()
def _root() -> None:
    """Attention end to end: compute it, look inside real models, learn it, measure its cost."""


# ---------------------------------------------------------------- scene


@app.command()
def scene(as_json: bool = typer.Option(False, "--json", help="Print the scene as JSON instead of tables.")) -> None:
    """The lesson's scene: the query of "bank" over "I sat on the bank of the river"."""
    from attnlab.lesson.scene import scene as compute

    data = compute()
    if as_json:
        emit_json(data)
        return
    un, sc = data["unscaled"], data["scaled"]
    table = Table(title='The query of "bank" q = (1, 1) over "I sat on the bank of the river" (d = 2)')
    for col in ("token", "key k", "q·k", "weight", "q·k / √2", "weight (scaled)"):
        table.add_column(col, justify="left" if col == "token" else "right")
    for i, tok in enumerate(data["tokens"]):
        table.add_row(
            tok, vec(data["keys"][i], 1), f"{un['scores'][i]:.2f}", pct(un["weights"][i]),
            f"{sc['scores'][i]:.2f}", pct(sc["weights"][i]),
        )
    console.print(table)
    axes = ", ".join(data["value_axes"])
    console.print(f"blended vector ({axes}):")
    console.print(f"  unscaled         {vec(un['output'])}")
    console.print(f"  scaled by 1/√2   {vec(sc['output'])}")


# ---------------------------------------------------------------- real maps: maps, heads, find-head

MODEL_HELP = "A model folder or a hub id (BERT/RoBERTa/GPT-2-style); default: the bundled all-MiniLM-L6-v2."
REVISION_HELP = "The hub revision (commit) to pin, for a hub id."
JSON_FILE_HELP = "Also write the result as JSON to this file ('-' for stdout, instead of tables)."


def _as_items(sentences: list[str]) -> list[str | tuple[str, str]]:
    """CLI sentences: a tab inside one makes it a pair (segments A and B), as in a corpus file."""
    return [tuple(s.split("\t", 1)) if "\t" in s else s for s in sentences]  # type: ignore[misc]


def _write_json(path: str | None, data: Any) -> bool:
    """Write JSON to a file or, for '-', to stdout; True when stdout took it (then print nothing else)."""
    if path is None:
        return False
    if path == "-":
        emit_json(data)
        return True
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
    err.print(f"wrote {path}")
    return False


def _head(layer: int | None, head: int | None, num_layers: int, num_heads: int) -> tuple[int, int] | None:
    """1-based --layer/--head from the user → 0-based, checked against the model's counts."""
    if layer is None and head is None:
        return None
    if layer is None or head is None:
        raise ValueError("--layer and --head go together; give both (1-based) or neither")
    if not 1 <= layer <= num_layers:
        raise ValueError(f"--layer {layer} is out of range; this model has layers 1 to {num_layers}")
    if not 1 <= head <= num_heads:
        raise ValueError(f"--head {head} is out of range; this model has heads 1 to {num_heads}")
    return layer - 1, head - 1


def _progress(description: str):
    """A rich progress bar on stderr and the (done, total) callback that drives it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=err, transient=True)
    task = bar.add_task(description, total=None)
    return bar, lambda done, total: bar.update(task, completed=done, total=total)


@app.command("maps")
def maps_cmd(
    sentences: list[str] = typer.Argument(..., help="Sentences (a tab inside one makes a sentence pair)."),
    model: str = typer.Option(None, "--model", help=MODEL_HELP),
    revision: str = typer.Option(None, "--revision", help=REVISION_HELP),
    layer: int = typer.Option(None, "--layer", help="Layer to show, 1-based (with --head)."),
    head: int = typer.Option(None, "--head", help="Head to show, 1-based (with --layer)."),
    words: bool = typer.Option(False, "--words", help="Add word pieces up into words (to: sum, from: mean)."),
    png: str = typer.Option(None, "--png", help="Write a heatmap of the chosen head to this PNG file."),
    json_path: str = typer.Option(None, "--json", help=JSON_FILE_HELP),
    save: str = typer.Option(None, "--save", help="Write every captured map to this .npz file (attnlab.load_maps)."),
    html: str = typer.Option(None, "--html", help="Write the viewer (head, model and scene views) as one self-contained HTML file."),
) -> None:
    """Capture every head's attention map; show one head's map, or where each head looks most."""
    from attnlab.models.capture import capture

    maps = capture(_as_items(sentences), model, revision)
    if save:
        err.print(f"wrote {maps.save(save)}")
    view = maps.to_words() if words else maps
    if html:
        from attnlab.viz.page import write_maps_html

        from attnlab.lesson.scene import scene

        err.print(f"wrote {write_maps_html(view, html, scene=scene())}")
    labels = view.words if words else maps.tokens
    pick = _head(layer, head, maps.num_layers, maps.num_heads)
    if png and pick is None:
        raise ValueError("--png draws one head; give --layer and --head (1-based)")
    unit = "words" if words else "tokens"
    data = {
        "model_id": maps.model_id, "revision": maps.revision, "num_layers": maps.num_layers,
        "num_heads": maps.num_heads, "unit": unit,
        "layer": None if pick is None else pick[0] + 1, "head": None if pick is None else pick[1] + 1,
        "sentences": [
            {"sentence": s if isinstance(s, str) else list(s), unit: labels[i],
             "weights": (view.weights[i][pick] if pick else view.weights[i]).round(6).tolist()}
            for i, s in enumerate(maps.sentences)
        ],
    }
    if png:
        from attnlab.viz.heatmap import plot_maps

        plot_maps([view.weights[i][pick] for i in range(len(maps))], labels,
                  title=f"{maps.model_id}: layer {pick[0] + 1}, head {pick[1] + 1}").savefig(png, dpi=150)
        err.print(f"wrote {png}")
    if _write_json(json_path, data):
        return
    console.print(f"{maps.model_id} ({maps.revision}): {maps.num_layers} layers × {maps.num_heads} heads")
    for i, w in enumerate(view.weights):
        if pick is not None:
            table = Table(title=f"sentence {i + 1}, layer {pick[0] + 1}, head {pick[1] + 1}: "
                                f"% of each row's attention per column")
            table.add_column("", no_wrap=True)
            for lab in labels[i]:
                table.add_column(lab, justify="right", no_wrap=True)
            for r, lab in enumerate(labels[i]):
                table.add_row(lab, *(str(round(100 * x)) for x in w[pick][r]))
        else:
            table = Table(title=f"sentence {i + 1}: where each head looks most (mean row, %)")
            table.add_column("", no_wrap=True)
            for l in range(maps.num_layers):
                table.add_column(f"layer {l + 1}", no_wrap=True)
            mean = w.mean(axis=2)  # (L, H, T): each head's average row
            top = mean.argmax(axis=-1)  # (L, H)
            for h in range(maps.num_heads):
                table.add_row(f"head {h + 1}", *(f"{labels[i][top[l, h]]} {round(100 * mean[l, h, top[l, h]])}"
                                                 for l in range(maps.num_layers)))
        console.print(table)


@app.command("heads")
def heads_cmd(
    sentences: list[str] = typer.Argument(None, help="Sentences to score (default: the lesson's two 'bank' sentences)."),
    model: str = typer.Option(None, "--model", help=MODEL_HELP),
    revision: str = typer.Option(None, "--revision", help=REVISION_HELP),
    corpus: str = typer.Option(None, "--corpus", help="A text file: one sentence, or a tab-separated pair, per line."),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="Sentences per forward pass."),
    json_path: str = typer.Option(None, "--json", help=JSON_FILE_HELP),
) -> None:
    """Heads by role: each head's average attention to [CLS], [SEP], punctuation, self, previous, next word, and entropy."""
    from attnlab.analysis.corpus import corpus_roles, read_corpus
    from attnlab.analysis.roles import ROLES

    if corpus and sentences:
        raise ValueError("give sentences or --corpus FILE, not both")
    items = read_corpus(corpus) if corpus else _as_items(sentences or ["I sat on the bank of the river.",
                                                                        "I put the money in the bank."])
    bar, tick = _progress("capturing")
    with bar:
        roles = corpus_roles(items, model, revision, batch_size=batch_size, progress=tick)
    if _write_json(json_path, roles.to_dict()):
        return
    table = Table(title=f"{roles.model_id}: head roles over {roles.num_sentences} sentences (layer, head 1-based)")
    for col in ("role", "attention to", "top head", "score", "heads ≥ threshold"):
        table.add_column(col, justify="right" if col in ("score", "heads ≥ threshold") else "left")
    for name, role in ROLES.items():
        layer, head, score = roles.top(name)
        shown = f"{score:.2f} nats" if role.unit == "nats" else pct(score)
        over = f"{len(roles.heads(name))} (≥ {role.threshold:g}{' nats' if role.unit == 'nats' else ''})"
        table.add_row(name, role.description, f"layer {layer + 1}, head {head + 1}", shown, over)
    console.print(table)


@app.command("find-head")
def find_head_cmd(
    sentences: list[str] = typer.Argument(..., help="One sentence per decider."),
    target: str = typer.Option(..., "--target", help="The ambiguous word, e.g. bank."),
    decider: list[str] = typer.Option(..., "--decider", help="The deciding word of each sentence, in order."),
    exclude_self: bool = typer.Option(False, "--exclude-self", help="Leave the target itself out of the argmax."),
    exclude_marks: bool = typer.Option(False, "--exclude-marks", help="Leave the marks out of the argmax."),
    model: str = typer.Option(None, "--model", help=MODEL_HELP),
    revision: str = typer.Option(None, "--revision", help=REVISION_HELP),
    json_path: str = typer.Option(None, "--json", help=JSON_FILE_HELP),
) -> None:
    """The heads whose largest weight of the target falls on its decider in every sentence."""
    from attnlab.analysis.search import MARK_RULE, find_heads
    from attnlab.models.capture import capture

    found = find_heads(capture(_as_items(sentences), model, revision).to_words(), target, decider,
                       exclude_self=exclude_self, exclude_marks=exclude_marks)
    if _write_json(json_path, found.to_dict()):
        return
    console.print(found.summary(), highlight=False)
    console.print(f"marks: in {found.mark_heads} of {found.total_heads} heads {MARK_RULE} "
                  f"(per sentence: {', '.join(map(str, found.mark_heads_per_sentence))}).", highlight=False)


# ---------------------------------------------------------------- the viewer: serve


@app.command()
def serve(
    model: str = typer.Option(None, "--model", help=MODEL_HELP),
    revision: str = typer.Option(None, "--revision", help=REVISION_HELP),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; the default serves this machine only."),
    port: int = typer.Option(8765, "--port", min=1, max=65535, help="Port to listen on."),
) -> None:
    """The web viewer: type one or two sentences and explore every head in the browser, offline."""
    from attnlab.lesson.scene import scene
    from attnlab.viz.server import serve as run_server

    run_server(model, revision, host, port, announce=lambda line: err.print(line, highlight=False), scene=scene())


# ---------------------------------------------------------------- the lesson: lesson, cost


def _print_section(section: Any) -> None:
    """One lesson section: its tables, then what they show."""
    console.rule(f"[bold]{section.number}. {section.title}")
    for t in section.tables:
        table = Table(title=t.title, title_justify="left")
        for i, col in enumerate(t.columns):
            table.add_column(col, justify="left" if i == 0 else "right", overflow="fold")
        for row in t.rows:
            table.add_row(*row)
        console.print(table)
    for line in section.findings:
        console.print(f"• {line}", highlight=False)


_DEADLINE_HELP = "Latency deadline for one attention call, in ms: the cost section finds the largest n that meets it."
_MEMORY_HELP = "Memory budget for one attention call, in MB (10^6 bytes)."


@app.command()
def lesson(
    out: str = typer.Option("attnlab-report", "--out", help="Folder for index.html, the PNGs and lesson.json."),
    model: str | None = typer.Option(None, "--model", help="Model folder or hub id (default: the bundled all-MiniLM-L6-v2)."),
    as_json: bool = typer.Option(False, "--json", help="Print lesson.json to stdout instead of tables."),
    deadline_ms: float = typer.Option(CostConfig.deadline_ms, "--deadline-ms", help=_DEADLINE_HELP),
    memory_mb: float = typer.Option(CostConfig.memory_mb, "--memory-mb", help=_MEMORY_HELP),
    seed: int = typer.Option(0, "--seed", help="Seed of the lesson's random draws (the √d table always uses the seed's rng(0))."),
) -> None:
    """The lesson of the seeds, computed: seven sections, a table each, and a report folder."""
    import time
    from pathlib import Path

    from attnlab.lesson.report import lesson_json, write_report
    from attnlab.lesson.run import LessonConfig, run_lesson

    config = LessonConfig(out=Path(out), model=model, deadline_ms=deadline_ms, memory_mb=memory_mb, seed=seed)
    if config.out.exists() and not config.out.is_dir():
        raise NotADirectoryError(f"--out must be a folder, got the file {config.out}")
    bar, _ = _progress("the lesson")
    task = bar.tasks[0].id
    with bar:
        result = run_lesson(config, lambda what, i, n: bar.update(task, description=what, completed=i - 1, total=n + 1))
        bar.update(task, description="drawing the figures, writing the report", completed=len(result.seconds))
        t0 = time.perf_counter()
        written = write_report(result)
        drawn = time.perf_counter() - t0
    if as_json:
        emit_json(lesson_json(result))
        return
    for section in result.sections:
        _print_section(section)
    console.rule()
    console.print(
        f"Computed in {result.elapsed_s:.1f} s, figures and report in {drawn:.1f} s. "
        f"Report: {config.out / 'index.html'} ({len(written)} files, every number in lesson.json).",
        highlight=False,
    )


@app.command()
def cost(
    deadline_ms: float = typer.Option(CostConfig.deadline_ms, "--deadline-ms", help=_DEADLINE_HELP),
    memory_mb: float = typer.Option(CostConfig.memory_mb, "--memory-mb", help=_MEMORY_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the section as JSON instead of tables."),
) -> None:
    """The cost section alone: time and memory as n doubles, and the largest n meeting the limits."""
    from attnlab.lesson.cost import cost_section

    cfg = CostConfig(deadline_ms=deadline_ms, memory_mb=memory_mb)
    with err.status("measuring attention as n doubles…"):
        section = cost_section(cfg)
    if as_json:
        emit_json(section.to_dict())
        return
    _print_section(section)


# ---------------------------------------------------------------- fast attention: check, bench


def _ints(flag: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None


@app.command()
def check(as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON instead of a table.")) -> None:
    """Every available backend against the float64 reference, here: max errors and pass/fail."""
    from attnlab.backends.agreement import run_check

    bar, update = _progress("checking backends")
    done = [0]

    def tick(_: str) -> None:
        done[0] += 1
        update(done[0], None)

    with bar:
        rows = run_check(tick)
    failed = [r for r in rows if r.passed is False]
    if as_json:
        emit_json({"passed": not failed, "rows": [r.to_dict() for r in rows]})
    else:
        table = Table(title="attnlab check: every backend against the float64 reference")
        for col in ("case", "input", "dtype", "backend", "max error", "tolerance", "result"):
            table.add_column(col, justify="right" if col in ("max error", "tolerance") else "left", no_wrap=col != "case")
        refused: dict[tuple[str, str], int] = {}
        for r in rows:
            if r.passed is None:  # listed once below, not once per case
                refused[r.backend, r.note] = refused.get((r.backend, r.note), 0) + 1
                continue
            table.add_row(r.case, r.kind, r.dtype, r.backend, f"{r.max_error:.1e}", f"{r.tolerance:.1e}",
                          "[green]pass[/]" if r.passed else "[red]FAIL[/]")
        console.print(table)
        for (name, why), count in refused.items():
            console.print(f"{name} refused {count} runs: {why}", highlight=False)
        ran = sum(r.passed is not None for r in rows)
        console.print(f"{ran - len(failed)} of {ran} passed" + (f", [red]{len(failed)} failed[/]" if failed else ""))
    if failed:
        raise typer.Exit(1)


@app.command()
def bench(
    sizes: str = typer.Option("512,1024,2048,4096,8192", "--sizes", help="Context lengths n, comma-separated (up to 65536)."),
    heads: str = typer.Option("1,12", "--heads", help="Head counts, comma-separated."),
    causal: str = typer.Option("both", "--causal", help="both, yes or no."),
    methods: str = typer.Option(",".join(("naive", "numpy", "torch", "sdpa", "blockwise-numpy", "blockwise-torch", "auto", "gemm")),
                                "--methods", help="Methods, comma-separated."),
    d: int = typer.Option(64, "--d", help="Head dimension."),
    repeats: int = typer.Option(3, "--repeats", help="Timed calls per method and size (median reported)."),
    memory_mb: float = typer.Option(4096.0, "--memory-mb", help="Skip a method whose estimated extra memory exceeds this."),
    max_seconds: float = typer.Option(30.0, "--max-seconds", help="Skip a method whose estimated time per call exceeds this."),
    threads: int | None = typer.Option(None, "--threads", help="torch threads while measuring (default: torch's)."),
    json_path: str | None = typer.Option(None, "--json", help="Write the results as JSON to this file ('-': stdout)."),
    png_path: str | None = typer.Option(None, "--png", help="Write the time and memory plot to this PNG."),
) -> None:
    """Time, GFLOP/s, % of GEMM, peak extra memory and error of each way to compute attention."""
    from attnlab.bench.harness import BenchConfig, run

    modes = {"both": (False, True), "yes": (True,), "no": (False,)}
    if causal not in modes:
        raise ValueError(f"--causal must be both, yes or no, got {causal!r}")
    cfg = BenchConfig(sizes=_ints("--sizes", sizes), heads=_ints("--heads", heads), causal=modes[causal],
                      d=d, methods=tuple(m.strip() for m in methods.split(",") if m.strip()), repeats=repeats,
                      memory_mb=memory_mb, max_seconds=max_seconds, threads=threads)
    bar, update = _progress("benchmarking")
    total = len(cfg.sizes) * len(cfg.heads) * len(cfg.causal) * len(cfg.methods) * cfg.repeats
    done = [0]

    def tick(_: str) -> None:
        done[0] += 1
        update(done[0], total)

    with bar:
        result = run(cfg, tick).to_dict()
    if png_path:
        from attnlab.viz.benchplot import bench_figure

        bench_figure(result).savefig(png_path, dpi=110)
        err.print(f"wrote {png_path}")
    if _write_json(json_path, result):
        return
    _print_bench(result)


def _print_bench(result: dict) -> None:
    ms = result["measurements"]
    for key in sorted({(m["n"], m["heads"], m["causal"]) for m in ms}):
        n, h, c = key
        table = Table(title=f"n = {n}, {h} head{'s' if h > 1 else ''}, d = {ms[0]['d']}, {'causal' if c else 'full'}")
        for col in ("method", "ms", "GFLOP/s", "% GEMM", "peak MB", "error", "note"):
            table.add_column(col, justify="left" if col in ("method", "note") else "right", no_wrap=col != "note")
        for m in ms:
            if (m["n"], m["heads"], m["causal"]) != key:
                continue
            if m["time_s"] is None:
                table.add_row(m["method"], "", "", "", "", "", f"skipped: {m['skipped']}")
                continue
            table.add_row(
                m["method"], f"{m['time_s'] * 1e3:,.1f}", f"{m['gflops']:.1f}",
                "" if m["pct_of_gemm"] is None else f"{m['pct_of_gemm']:.0f} %",
                "" if m["peak_bytes"] is None else f"{m['peak_bytes'] / 2**20:,.1f}",
                "" if m["max_error"] is None else f"{m['max_error']:.1e}",
                f"chose {m['backend']}" if m["backend"] else "",
            )
        console.print(table)
    t = result["targets"]
    lines = [f"blockwise / sdpa, n = {r['n']}, {r['heads']} h: {r['ratio']:.2f}x (target <= 1.3x) {'met' if r['met'] else 'MISSED'}"
             for r in t["blockwise_vs_sdpa"]]
    lines += [f"blockwise causal saving, n = {r['n']}, {r['heads']} h: {100 * r['saving']:.0f} % (target >= 45 %) "
              f"{'met' if r['met'] else 'MISSED'}" + ("" if r["vs_sdpa_causal"] is None else f"; {r['vs_sdpa_causal']:.2f}x causal sdpa")
              for r in t["causal_saving"]]
    lines += [f"blockwise memory, n = 65536, 1 head, {'causal' if r['causal'] else 'full'}: {r['peak_mb']:.1f} MB (target < 64 MB) "
              f"{'met' if r['met'] else 'MISSED'}" for r in t["memory_65536"]]
    lines += [f"auto ({r['chose']}) / fastest, n = {r['n']}, {r['heads']} h, {'causal' if r['causal'] else 'full'}: {r['ratio']:.2f}x "
              f"(target <= 1.1x) {'met' if r['met'] else 'MISSED'}" for r in t["auto_vs_fastest"]]
    if lines:
        console.print("Targets (ratios from this run):\n  " + "\n  ".join(lines), highlight=False)


# ---------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit status; errors become one readable line."""
    try:
        app(args=argv, prog_name="attnlab")  # usage errors: typer prints them and exits 2
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        err.print("aborted")
        return 130
    except (ValueError, TypeError, OSError, LookupError, RuntimeError) as e:
        if os.environ.get("ATTNLAB_DEBUG"):
            raise
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        return 2
    return 0


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
