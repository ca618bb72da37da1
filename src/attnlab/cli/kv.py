"""`attnlab kv`: every smaller KV cache scored by one measure (attnlab.kv_report): a table, --json, --png.

The flags and the text file are checked before the model loads; the report's own checks (the text long
enough for --prompt-tokens + --scored-tokens, within the model's positions) before any run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from attnlab.cli.common import (
    console,
    counter,
    err,
    json_option,
    load_decoder,
    out_file,
    print_table,
    progress,
    write_json,
)


def kv(
    model: str = typer.Argument(..., help="A decoder's folder or hub id, or attnlab:decoder (the bundled one)."),
    text: Path = typer.Option(..., "--text", help="A UTF-8 text file: its first P tokens are the prompt, the next N "
                                                 "are fed one at a time and scored."),
    prompt_tokens: int = typer.Option(1536, "--prompt-tokens", min=1, help="P: the prompt's tokens (one prefill)."),
    scored_tokens: int = typer.Option(512, "--scored-tokens", min=1, help="N: the tokens fed one at a time, each scored."),
    png_path: str = typer.Option(None, "--png", metavar="PATH", callback=out_file("--png"),
                                 help="Write KL divergence against bytes per token, the Pareto front marked."),
    json_path: str = json_option(),
) -> None:
    """Score each KV cache setting (dense bfloat16, the quantized dtypes, h2o/snapkv/knorm/random at 25 % and
    50 % of the text) in float32 against the same model in float64 with a dense cache: bytes per token, KL
    divergence of the next token (mean, p99), top-1 agreement, each layer's attention-output error, time per step."""
    from dataclasses import replace

    from attnlab.interventions.corpus import read_text
    from attnlab.interventions.kv_report import kv_report

    words = read_text(text)
    if not words.strip():
        raise ValueError(f"--text {str(text)!r} is empty (or only white space); give it some text")
    net, name = load_decoder(model, "kv", "attnlab.kv_report")
    bar, update = progress("scoring cache settings")
    tick = counter(update)
    with bar:
        report = kv_report(net, words, prompt_tokens=prompt_tokens, scored_tokens=scored_tokens,
                           on_setting=lambda i, n, _: (setattr(tick, "total", n), tick()))
    report = replace(report, model=name)
    if png_path:
        from attnlab.viz.kvplot import kv_figure

        kv_figure(report.to_dict()).savefig(png_path, dpi=110)
        err.print(f"wrote {png_path}", highlight=False)
    if write_json(json_path, report.to_dict()):
        return
    print_table(_table(report))
    for line in report.skipped:
        console.print(f"skipped {line}", highlight=False, markup=False, soft_wrap=True)


def _table(report: Any) -> Table:
    ctx = report.prompt_tokens + report.scored_tokens
    table = Table(title=f"{report.model}: {report.prompt_tokens} prompt + {report.scored_tokens} scored tokens, "
                        "float32 settings against float64 dense (KL in nats; * Pareto front)", title_justify="left")
    for col in ("setting", "bytes/token", f"bytes at {ctx}", "KL mean", "KL p99", "top-1", "attn-out error by layer",
                "ms/step"):
        table.add_column(col, justify="left" if col in ("setting", "attn-out error by layer") else "right")
    for r in report.rows:
        table.add_row(("* " if r.pareto else "  ") + r.name, f"{r.bytes_per_token:,.0f}", f"{r.cache_bytes:,}",
                      f"{r.kl_mean:.2e}", f"{r.kl_p99:.2e}", f"{r.top1:.3f}", " ".join(f"{e:.1e}" for e in r.layer_error),
                      f"{r.step_ms:.2f}")
    return table
