"""`attnlab stats FILE` (per-head statistics of long inputs, no T × T) and `attnlab rollout SENTENCE`
(attention rollout and flow through the layers)."""

from __future__ import annotations

import contextlib

from pathlib import Path

import typer
from rich.table import Table

from attnlab.cli.common import console, err, json_option, model_option, out_file, revision_option, write_json

STAT_TITLES = {
    "prev": "previous", "self": "itself", "next": "next", "first": "first token", "distance": "mean distance",
    "entropy": "entropy (nats)", "entropy_norm": "entropy / log n", "sink_share": "sink share",
}


def stats(
    file: Path = typer.Argument(..., help="A text file; its whole text is one input (or one per line with --lines)."),
    model: str = model_option(),
    revision: str = revision_option(),
    lines: bool = typer.Option(False, "--lines", help="Each non-empty line is an input of its own."),
    max_tokens: int = typer.Option(None, "--max-tokens", min=2, help="Cut each input to this many tokens."),
    top: int = typer.Option(10, "--top", min=1, help="How many most-attended tokens to name."),
    json_path: str = json_option(),
) -> None:
    """Per-head statistics of the full attention of long inputs, without T × T memory: weight on the
    previous token, itself, the next and the first token, mean distance, entropy, attention received."""
    from attnlab.interventions.stats import ROW_STATS, head_stats
    from attnlab.distributed import rank_and_world
    from attnlab.cli.common import progress

    from attnlab.interventions.corpus import read_text

    text = read_text(file)
    texts = [line for line in text.splitlines() if line.strip()] if lines else [text]
    if not any(t.strip() for t in texts):  # before the model loads
        raise ValueError(f"text file {str(file)!r} is empty (or only white space); give it some text")
    main_rank = rank_and_world()[0] == 0  # under torchrun the ranks share the texts; rank 0 alone speaks
    bar, tick = progress("attending") if main_rank else (contextlib.nullcontext(), None)
    with bar:
        found = head_stats(texts, model, revision, max_tokens=max_tokens, progress=tick)
    if not main_rank:
        return
    if write_json(json_path, found.to_dict(top=top)):
        return
    layers, heads = found.means["prev"].shape
    console.print(f"{found.model_id}: {len(found.tokens)} input(s), {found.num_tokens} tokens, "
                  f"{layers} layers × {heads} heads{' (causal)' if found.causal else ''}", highlight=False)
    table = Table(title="mean over rows, per head (layer, head 1-based)")
    table.add_column("head")
    names = ROW_STATS + (("sink_share",) if found.sink_share is not None else ())  # learned sinks: their share
    for name in names:
        table.add_column(STAT_TITLES[name], justify="right")
    for l in range(layers):
        for h in range(heads):
            table.add_row(f"{l + 1}.{h + 1}", *(
                f"{found.means[n][l, h]:.3f}" if n.startswith("entropy") or n == "distance"
                else f"{100 * found.means[n][l, h]:.0f} %" for n in names))
    console.print(table)
    for i in range(len(found.tokens)):
        named = ", ".join(f"{tok!r} @{j} ({r:.1f})" for j, tok, r in found.top_received(i, top))
        console.print(f"input {i + 1}: most attended (attention received, mean over heads): {named}", highlight=False)


def rollout(
    sentence: str = typer.Argument(..., help="One sentence (a tab makes a pair)."),
    model: str = model_option(),
    revision: str = revision_option(),
    residual: float = typer.Option(0.5, "--residual", help="Weight of the residual (identity) mixed into each "
                                   "layer's head mean, in [0, 1)."),
    tokens: bool = typer.Option(False, "--tokens", help="Token level (default: words)."),
    with_flow: bool = typer.Option(False, "--flow", help="Also attention flow (max-flow; short inputs only)."),
    png: Path = typer.Option(None, "--png", help="Write the last layer's rollout (and flow) as a PNG here.",
                             callback=out_file("--png")),
    json_path: str = json_option(),
) -> None:
    """Attention rollout (Abnar & Zuidema 2020) of a sentence through every layer, and attention flow
    with --flow: how much of each input word reaches each position."""
    from attnlab.analysis.rollout import check_residual, flow, rollout as roll
    from attnlab.cli.maps import _as_items
    from attnlab.hf.capture import capture

    check_residual(residual)  # before the model loads
    maps = capture(_as_items([sentence]), model, revision)
    view = maps if tokens else maps.to_words()
    rolled = roll(view, residual)
    flowed = flow(view, residual) if with_flow else None
    if png is not None:
        _rollout_png(rolled, flowed, png)
    if write_json(json_path, {"rollout": rolled.to_dict(), "flow": None if flowed is None else flowed.to_dict()}):
        return
    labels = rolled.labels[0]
    for name, m in (("rollout", rolled[0][-1]), ("flow", None if flowed is None else flowed[0])):
        if m is None:
            continue
        table = Table(title=f"{name} through all {len(rolled[0])} layers: where each position's input comes from")
        table.add_column("position")
        table.add_column("top sources", justify="left")
        for i, label in enumerate(labels):
            order = m[i].argsort()[::-1][:3]
            table.add_row(label, ", ".join(f"{labels[j]} {100 * m[i, j]:.0f} %" for j in order))
        console.print(table)


def _rollout_png(rolled, flowed, png: Path) -> None:  # noqa: ANN001 (Rolled results)
    """The last layer's rollout of the sentence, and its flow, side by side."""
    from attnlab.viz.heatmap import heatmap_grid

    labels, layers = rolled.labels[0], len(rolled[0])
    panels = [{"weights": rolled[0][-1], "rows": labels, "cols": labels, "title": f"rollout, layers 1-{layers}"}]
    if flowed is not None:
        panels.append({"weights": flowed[0], "rows": labels, "cols": labels, "title": "attention flow"})
    heatmap_grid(panels, title=f"{rolled.model_id}, residual {rolled.residual:g}").savefig(png, dpi=110)
    err.print(f"wrote {png}", highlight=False)
