"""`attnlab patch` and `attnlab attribute`: which heads cause a next-token prediction, on attnlab's transformer.

Both measure one number at the text's last position: the logit of ``--target`` (a token, given as
its text), or its difference from ``--baseline``'s. ``patch`` runs the corrupted text with each
head's output taken from the clean run (:func:`attnlab.patch`) and prints how much of the clean
value each brings back; ``attribute`` splits the logit of one text into what each component writes
into it directly (:func:`attnlab.logit_attribution`) and prints the check that the parts add up.
Every flag is checked before the model loads; the texts and tokens once its tokenizer is there.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from attnlab.cli.common import console, decoder_option, err, json_option, load_decoder, out_file, status, write_json

OVERS = ("head", "head_pos")
TARGET_HELP = ("The token whose logit is measured at the last position, written as it reads in running text, with "
               "its leading space: ' Paris'.")
BASELINE_HELP = "A second token: the metric becomes the target's logit minus this one's."


def _ids(net: Any, *texts: list[int]) -> list[Any]:
    import torch

    return [torch.tensor([ids], device=net.device) for ids in texts]  # [1, T] each


def patch(
    clean: str = typer.Option(..., "--clean", help="The text where the model does the thing (it predicts --target)."),
    corrupted: str = typer.Option(..., "--corrupted", help="The same text with what matters changed: as many tokens."),
    target: str = typer.Option(..., "--target", help=TARGET_HELP),
    baseline: str = typer.Option(None, "--baseline", help=BASELINE_HELP),
    model: str = decoder_option(),
    over: str = typer.Option("head", "--over", help="head: one patch per head, an [L, H] grid; head_pos: per head "
                             "and position, [L, H, T]."),
    top: int = typer.Option(10, "--top", min=1, help="How many heads the table lists."),
    png: str = typer.Option(None, "--png", metavar="PATH", help="Write the effect of every patch as a heat map.",
                            callback=out_file("--png")),
    json_path: str = json_option(),
) -> None:
    """Activation patching: run the corrupted text with one head's output put back from the clean run, for
    every head, and print how much of the clean logit (difference) each restores: 1 all, 0 none."""
    from attnlab.interventions.patching import patch as run_patch
    from attnlab.interventions.targets import check_texts, describe, encode_pair, logit_metric, pieces, target_ids

    check_texts({"--clean": clean, "--corrupted": corrupted})
    if over not in OVERS:
        raise ValueError(f"--over must be one of {', '.join(OVERS)}, got {over!r}")
    net, model_id = load_decoder(model, "patch", "attnlab.patch")
    tok = net.tokenizer
    a, b = encode_pair(tok, clean, corrupted, _max_tokens(net), ("--clean", "--corrupted"))
    t, base = target_ids(net, target, baseline, ("--target", "--baseline"))
    with status(f"patching every head{' at every position' if over == 'head_pos' else ''}"):
        found = run_patch(net, *_ids(net, a, b), logit_metric(t, base), site="z", over=over)
    what, tokens = describe(tok, t, base), pieces(tok, b)
    if png:
        from attnlab.viz.patching import patching_figure

        patching_figure(found.effect, f"{model_id}: each head{' at each position' if over == 'head_pos' else ''} "
                        f"patched\n{what}", tokens if over == "head_pos" else None
                        ).savefig(png, dpi=130)
        err.print(f"wrote {png}", highlight=False)
    data = {**found.to_dict(), "model": model_id, "clean_text": clean, "corrupted_text": corrupted,
            "target": {"text": target, "id": t}, "baseline": None if base is None else {"text": baseline, "id": base},
            "metric": what, "tokens": {"clean": pieces(tok, a), "corrupted": tokens}}
    if write_json(json_path, data):
        return
    console.print(f"{what} at the last token: clean {float(found.clean[0]):.4f}, corrupted "
                  f"{float(found.corrupted[0]):.4f}", highlight=False)
    best = "; each head at its best position" if over == "head_pos" else ""
    console.print("each head's output put back from the clean run: effect = (patched − corrupted) / (clean − "
                  f"corrupted), 1 restores the clean value, 0 nothing{best}", highlight=False)
    console.print(_patch_table(found, model_id, top, tokens))


def _max_tokens(net: Any) -> int:
    return net.config.max_positions - net.config.position_offset


def _patch_table(found: Any, model_id: str, top: int, tokens: list[str]) -> Table:
    """The ``top`` heads whose patch changes most, by size with the sign shown (per position: each at its
    position of largest effect in size), with the metric of the patched run ("patched"); 1-based as people read them."""
    per_pos = found.over == "head_pos"
    table = Table(title=f"{model_id}: the top {top} heads by size of effect (sign shown)")
    for col in ("head", *(("position",) if per_pos else ()), "effect", "patched"):
        table.add_column(col, justify="right")
    for head, effect in found.top(top):
        where = (int(abs(found.effect[head]).argmax()),) if per_pos else ()
        shown = (f"{where[0] + 1} {tokens[where[0]]!r}",) if per_pos else ()
        table.add_row(str(head), *shown, f"{effect:.4f}", f"{float(found.raw[head][where][0]):.4f}")
    return table


def attribute(
    text: str = typer.Argument(..., help="The text; the logit is read at its last token, for the token after it."),
    target: str = typer.Option(..., "--target", help=TARGET_HELP),
    baseline: str = typer.Option(None, "--baseline", help=BASELINE_HELP),
    model: str = decoder_option(),
    top: int = typer.Option(10, "--top", min=0, help="How many components the table lists, largest first (0: all)."),
    json_path: str = json_option(),
) -> None:
    """Direct logit attribution: what the embeddings, each head, each MLP and the biases write straight into
    the logit (difference) of --target at the last position, and the check that they add up to the model's."""
    from attnlab.interventions.attribution import logit_attribution
    from attnlab.interventions.targets import check_texts, describe, encode, target_ids

    check_texts({"TEXT": text})
    net, model_id = load_decoder(model, "attribute", "attnlab.logit_attribution")
    tok = net.tokenizer
    ids = encode(tok, text, _max_tokens(net), "TEXT")
    t, base = target_ids(net, target, baseline, ("--target", "--baseline"))
    with status("attributing the logit"):
        found = logit_attribution(net, *_ids(net, ids), t, baseline=base, position=-1)
    what = describe(tok, t, base)
    data = {**found.to_dict(), "model": model_id, "text": text, "target": {"text": target, "id": t},
            "baseline": None if base is None else {"text": baseline, "id": base}, "metric": what}
    if write_json(json_path, data):
        return
    ranked = found.ranked()
    shown = ranked if top == 0 else ranked[:top]
    console.print(f"{what} at the last token, split into what each component writes into it directly", highlight=False)
    table = Table(title=f"{model_id}: the largest first")
    for col in ("component", "contribution"):
        table.add_column(col, justify="right")
    for name, value in shown:
        table.add_row(str(name), f"{value:+.4f}")
    console.print(table)
    if len(shown) < len(ranked):
        console.print(f"… and {len(ranked) - len(shown)} more (--top 0 lists them all)", highlight=False)
    softcap = " (before its final softcap)" if found.softcap else ""
    console.print(f"sum of the {len(ranked)} components {found.total:.6f} · the model's {found.logit:.6f}{softcap} · "
                  f"error {found.error:.1e}", highlight=False)
