"""`attnlab ablate SENTENCE…`: knock heads out and measure the effect, or rank every head by importance."""

from __future__ import annotations

import typer
from rich.table import Table

from attnlab.cli.common import console, err, json_option, model_option, out_file, status, write_json


def _pairs(text: str) -> list:
    """"1.1,3.11" → [Head(0, 0), Head(2, 10)]: layer.head, 1-based as printed, made 0-based here."""
    from attnlab.maps.heads import Head

    out: list = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        head = Head.parse(item, "--heads")
        if head in out:
            raise ValueError(f"--heads names {item} twice; name each head once")
        out.append(head)
    return out


def ablate(
    sentences: list[str] = typer.Argument(..., help="One or more sentences."),
    heads: str = typer.Option(None, "--heads", help="Heads to knock out together, layer.head 1-based: 1.1,3.11. "
                              "Without it, every head is ranked by importance."),
    how: str = typer.Option("zero", "--how", help="zero: the heads' outputs are zeroed; mean: replaced by their "
                            "mean over the input."),
    model: str = model_option(),
    backend: str = typer.Option("auto", "--backend", help="The attention backend of every layer."),
    top: int = typer.Option(10, "--top", min=1, help="How many heads the importance table lists."),
    probes: int = typer.Option(64, "--probes", min=0, help="Random directions estimating an encoder's gradient "
                               "score (0: all, exact and slower)."),
    png: str = typer.Option(None, "--png", metavar="PATH", help="Write the importance of every head as a heat map.",
                            callback=out_file("--png")),
    json_path: str = json_option(),
) -> None:
    """Heads as causes: run the model without some heads (the embedding's cosine for the default model, the
    loss change for a language model), or rank every head alone next to Michel et al.'s gradient importance."""
    from attnlab.interventions.ablation import ablate as run_ablation
    from attnlab.interventions.ablation import HOWS, head_importance

    if how not in HOWS:  # before the status line and the model
        raise ValueError(f"--how must be one of {', '.join(HOWS)}, got {how!r}")
    if heads:
        picked = _pairs(heads)
        with status("ablating"):
            found = run_ablation(sentences, picked, model=model, how=how, backend=backend)
        if not write_json(json_path, found.to_dict()):
            console.print(_ablation_table(found, how))
        return
    with status("ablating every head, then the gradients"):
        imp = head_importance(sentences, model=model, how=how, backend=backend, probes=probes or None)
    if png:
        from attnlab.viz.importance import importance_figure

        importance_figure(imp.ablation, imp.gradient, f"{imp.model_id}: head importance ({how})",
                          imp.metric).savefig(png, dpi=130)
        err.print(f"wrote {png}", highlight=False)
    if write_json(json_path, imp.to_dict()):
        return
    console.print(_importance_table(imp, top, how))
    how_found = ("the exact gradient" if imp.metric != "cosine" or not probes else
                 f"gradient scores estimated from {probes} seeded random directions; --probes 0: exact")
    console.print(f"rank correlation of the two scores over all heads (Spearman): {imp.spearman:.2f} ({how_found})",
                  highlight=False)


def _ablation_table(found, how: str) -> Table:  # noqa: ANN001 (an Ablation)
    """Each sentence's cosine with and without the heads, or its loss and the change."""
    named = ", ".join(h.label() for h in found.heads)
    table = Table(title=f"{found.model_id}: {named} out ({how})")
    table.add_column("sentence")
    if found.metric == "cosine":
        table.add_column("cosine with / without", justify="right")
        for s, c in zip(found.sentences, found.cosine):
            table.add_row(s, f"{c:.5f}")
    else:
        for col in ("loss (nats)", "without the heads", "change"):
            table.add_column(col, justify="right")
        for s, a, b in zip(found.sentences, found.loss, found.ablated_loss):
            table.add_row(s, f"{a:.3f}", f"{b:.3f}", f"{b - a:+.3f}")
    return table


def _importance_table(imp, top: int, how: str) -> Table:  # noqa: ANN001 (an Importance)
    """The ``top`` heads whose removal alone matters most, with their gradient score and rank."""
    effect = "1 − cosine" if imp.metric == "cosine" else "loss change"
    table = Table(title=f"{imp.model_id}: the {top} heads whose removal alone matters most ({how})")
    for col in ("head", f"{effect}, alone", "gradient score", "gradient rank"):
        table.add_column(col, justify="right")
    order = {found.head: r for r, found in enumerate(imp.top(imp.ablation.size, by="gradient"), 1)}
    for head, score in imp.top(top):
        table.add_row(str(head), f"{score:.4g}", f"{imp.gradient[head]:.4g}", str(order[head]))
    return table
