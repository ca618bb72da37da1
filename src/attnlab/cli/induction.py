"""`attnlab heads --induction`: each head's score on the induction probe (a repeated random sequence)."""

from __future__ import annotations

from rich.table import Table

from attnlab.cli.common import console, status, write_json


def show_induction(model: str | None, revision: str | None, length: int, seed: int, json_path: str | None) -> None:
    """Run the probe and print every head's induction score (layers as columns, heads as rows)."""
    from attnlab.interventions.induction import INDUCTION_PROBE_THRESHOLD, induction_scores

    with status("running the induction probe"):
        found = induction_scores(model, revision, length=length, seed=seed)
    if write_json(json_path, found.to_dict()):
        return
    layers, heads = found.scores.shape
    table = Table(title=f"{found.model_id}: induction scores, {found.batch} × ({found.prefix or 'no prefix'} + "
                        f"{found.length} random tokens, twice), seed {found.seed}")
    table.add_column("")
    for l in range(layers):
        table.add_column(f"layer {l + 1}", justify="right")
    for h in range(heads):
        table.add_row(f"head {h + 1}", *(
            f"[bold]{found.scores[l, h]:.2f}[/]" if found.scores[l, h] >= INDUCTION_PROBE_THRESHOLD
            else f"{found.scores[l, h]:.2f}" for l in range(layers)))
    console.print(table)
    best = found.heads()
    console.print(f"induction heads (score ≥ {INDUCTION_PROBE_THRESHOLD:g}): "
                  + (", ".join(head.label() for head in best) or "none"), highlight=False)
