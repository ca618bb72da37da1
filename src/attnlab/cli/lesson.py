"""`attnlab scene`, `attnlab lesson`, `attnlab cost`: the lesson, computed."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from attnlab.cli.common import console, json_option, model_option, out_folder, progress, status, write_json
from attnlab.lesson.cost import CostConfig  # its defaults are the flags' defaults
from attnlab.lesson.fmt import pct, vec  # one rounding for the lesson, its page and the CLI

DEADLINE_HELP = "Latency deadline for one attention call, in ms: the cost section finds the largest n that meets it."
MEMORY_HELP = "Memory budget for one attention call, in MB (10^6 bytes)."


def scene(json_path: str = json_option()) -> None:
    """The lesson's scene: the query of "bank" over "I sat on the bank of the river"."""
    from attnlab.lesson.scene import scene as compute

    data = compute()
    if write_json(json_path, data):
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


def rich_table(t: Any) -> Table:
    """A lesson table as `attnlab lesson` prints it: the first column left, numbers right, long cells folded."""
    table = Table(title=t.title, title_justify="left")
    for i, col in enumerate(t.columns):
        table.add_column(col, justify="left" if i == 0 else "right", overflow="fold")
    for row in t.rows:
        table.add_row(*row)
    return table


def print_section(section: Any) -> None:
    """One lesson section: its tables, then what they show."""
    console.rule(f"[bold]{section.number}. {section.title}")
    for t in section.tables:
        console.print(rich_table(t))
    for line in section.findings:
        console.print(f"• {line}", highlight=False)


def lesson(
    out: str = typer.Option("attnlab-report", "--out", help="Folder for index.html, the PNGs and lesson.json.",
                            callback=out_folder("--out")),
    model: str | None = model_option(),
    json_path: str = json_option("Also write lesson.json to PATH; '-' for stdout (then no tables are printed)."),
    deadline_ms: float = typer.Option(CostConfig.deadline_ms, "--deadline-ms", help=DEADLINE_HELP),
    memory_mb: float = typer.Option(CostConfig.memory_mb, "--memory-mb", help=MEMORY_HELP),
    seed: int = typer.Option(0, "--seed", help="Seed of the random generator for the lesson's own draws (the small X, the "
                      "saturation draws, the shuffle); the √d table always draws from np.random.default_rng(0), as "
                      "the lesson's code does, so that it reproduces the lesson's table."),
) -> None:
    """A lesson on attention, computed: eight sections, a table each, and a report folder."""
    import time
    from pathlib import Path

    from attnlab.lesson.report import lesson_json, write_report
    from attnlab.lesson.run import LessonConfig, run_lesson

    config = LessonConfig(out=Path(out), model=model, deadline_ms=deadline_ms, memory_mb=memory_mb, seed=seed)
    if config.out.exists() and not config.out.is_dir():
        raise NotADirectoryError(f"--out must be a folder, got the file {config.out}")
    bar, _ = progress("the lesson")
    task = bar.tasks[0].id
    with bar:
        result = run_lesson(config, lambda what, i, n: bar.update(task, description=what, completed=i - 1, total=n + 1))
        bar.update(task, description="drawing the figures, writing the report", completed=len(result.seconds))
        t0 = time.perf_counter()
        written = write_report(result)
        drawn = time.perf_counter() - t0
    if write_json(json_path, lesson_json(result)):
        return
    for section in result.sections:
        print_section(section)
    console.rule()
    console.print(
        f"Computed in {result.elapsed_s:.1f} s, figures and report in {drawn:.1f} s. "
        f"Report: {config.out / 'index.html'} ({len(written)} files, every number in lesson.json).",
        highlight=False,
    )


def cost(
    deadline_ms: float = typer.Option(CostConfig.deadline_ms, "--deadline-ms", help=DEADLINE_HELP),
    memory_mb: float = typer.Option(CostConfig.memory_mb, "--memory-mb", help=MEMORY_HELP),
    json_path: str = json_option(),
) -> None:
    """The cost section alone: time and memory as n doubles, and the largest n meeting the limits."""
    from attnlab.lesson.cost import cost_section

    cfg = CostConfig(deadline_ms=deadline_ms, memory_mb=memory_mb)
    with status("measuring attention as n doubles…"):
        section = cost_section(cfg)
    if write_json(json_path, section.to_dict()):
        return
    print_section(section)
