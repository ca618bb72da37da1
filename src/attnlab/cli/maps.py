"""`attnlab maps`, `attnlab heads`, `attnlab find-head`: real attention maps of a pretrained model."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from attnlab.cli.common import console, err, json_option, model_option, out_file, progress, revision_option, write_json
from attnlab.lesson.fmt import pct

if TYPE_CHECKING:
    from attnlab.maps.heads import Head

LESSON_SENTENCES = ("I sat on the bank of the river.", "I put the money in the bank.")


def _as_items(sentences: list[str]) -> list[str | tuple[str, str]]:
    """CLI sentences: a tab inside one makes it a pair (segments A and B), as in a corpus file and in
    attnlab.capture (the library's rule, :func:`attnlab.hf.encoding.check_sentences`)."""
    from attnlab.hf.encoding import check_sentences

    return check_sentences(sentences)


def _head(layer: int | None, head: int | None, num_layers: int, num_heads: int) -> Head | None:
    """1-based --layer/--head from the user → a (0-based) Head, checked against the model's counts."""
    from attnlab.maps.heads import Head

    if layer is None and head is None:
        return None
    if layer is None or head is None:
        raise ValueError("--layer and --head go together; give both (1-based) or neither")
    if not 1 <= layer <= num_layers:
        raise ValueError(f"--layer {layer} is out of range; this model has layers 1 to {num_layers}")
    if not 1 <= head <= num_heads:
        raise ValueError(f"--head {head} is out of range; this model has heads 1 to {num_heads}")
    return Head(layer - 1, head - 1)


def maps(
    sentences: list[str] = typer.Argument(..., help="Sentences (a tab inside one makes a sentence pair)."),
    model: str = model_option(),
    revision: str = revision_option(),
    layer: int = typer.Option(None, "--layer", help="Layer to show, 1-based (with --head)."),
    head: int = typer.Option(None, "--head", help="Head to show, 1-based (with --layer)."),
    words: bool = typer.Option(False, "--words", help="Add word pieces up into words (to: sum, from: mean)."),
    png: str = typer.Option(None, "--png", help="Write a heatmap of the chosen head to this PNG file.",
                            callback=out_file("--png")),
    json_path: str = json_option(),
    save: str = typer.Option(None, "--save", help="Write every captured map to this .npz file (attnlab.load_maps).",
                             callback=out_file("--save")),
    html: str = typer.Option(None, "--html", help="Write the viewer (head, model, scene and neuron views) as one self-contained HTML file.",
                             callback=out_file("--html")),
    target: str = typer.Option(None, "--target", help="With --html: the ambiguous word for the page's Compare tab "
                               "(with one --decider per sentence)."),
    decider: list[str] = typer.Option(None, "--decider", help="With --html and --target: the deciding word of each "
                                      "sentence, in order."),
) -> None:
    """Capture every head's attention map; show one head's map, or where each head looks most.

    Above 1,024 tokens (or where the full maps would pass 2 GiB) it takes the long view by itself and says
    so: queries, keys and each row's log-sum-exp, every weight computed exactly on request."""
    from attnlab.analysis.overview import maps_record
    from attnlab.hf.capture import capture
    from attnlab.hf.loading import load_model

    from attnlab.cli.longview import long_maps, needs_long_view

    _check_compare(sentences, target, decider, html)
    lm = load_model(model, revision)
    items = _as_items(sentences)
    why = needs_long_view(lm, items)  # counted before anything of T × T is allocated
    if why is not None:
        return long_maps(lm, items, why, pick=_head(layer, head, lm.num_layers, lm.num_heads), words=words, png=png,
                         save=save, html=html, json_path=json_path, compare=bool(target))
    found = capture(items, lm, qk=bool(html))  # the page's Neuron view needs q and k
    pick = _head(layer, head, found.num_layers, found.num_heads)
    if png and pick is None:
        raise ValueError("--png draws one head; give --layer and --head (1-based)")
    view = found.to_words() if words else found
    _write_maps(found, view, pick, save=save, html=html, png=png, target=target, deciders=decider or None)
    if write_json(json_path, maps_record(view, pick)):
        return
    console.print(f"{found.model_id} ({found.revision}): {found.num_layers} layers × {found.num_heads} heads")
    for i in range(len(view.weights)):
        console.print(_maps_table(found, view, i, pick))


def _check_compare(sentences: list[str], target: str | None, decider: list[str] | None, html: str | None) -> None:
    """--target and --decider set up the page's Compare tab: with --html, together, one decider per sentence."""
    if (target or decider) and not html:
        raise ValueError("--target and --decider set up the page's Compare tab; give them with --html FILE")
    if bool(target) != bool(decider):
        raise ValueError("--target and --decider go together: the ambiguous word and one deciding word per sentence")
    if decider and len(decider) != len(sentences):
        raise ValueError(f"--decider was given {len(decider)} times for {len(sentences)} sentences; give one per sentence")


def _labels(found, view) -> list[list[str]]:  # noqa: ANN001 (AttentionMaps, and it or its WordMaps)
    return [view.labels(i) for i in range(len(found))]


def _write_maps(found, view, pick, *, save, html, png, target, deciders) -> None:  # noqa: ANN001
    """The files asked for: every map (--save), the page (--html), one head's heat map (--png)."""
    if save:
        err.print(f"wrote {found.save(save)}", highlight=False)
    if html:
        from attnlab.lesson.scene import scene
        from attnlab.viz.page import write_maps_html

        page = write_maps_html(view, html, scene=scene(), neuron=found, target=target, deciders=deciders)
        err.print(f"wrote {page}", highlight=False)
    if png:
        from attnlab.viz.heatmap import plot_maps

        plot_maps([view.weights[i][pick] for i in range(len(found))], _labels(found, view),
                  title=f"{found.model_id}: {pick.label()}").savefig(png, dpi=150)
        err.print(f"wrote {png}", highlight=False)


def _maps_table(found, view, i: int, pick) -> Table:  # pick: a Head or None  # noqa: ANN001
    """Sentence i: the chosen head's map in %, or where each head looks most."""
    from attnlab.analysis.overview import where_heads_look

    labels, w = _labels(found, view)[i], view.weights[i]
    if pick is not None:
        table = Table(title=f"sentence {i + 1}, {pick.label()}: "
                            f"% of each row's attention per column")
        table.add_column("", no_wrap=True)
        for lab in labels:
            table.add_column(lab, justify="right", no_wrap=True)
        shares = view.self_attention.sink_share  # learned sinks: the rest of each row, in a column of its own
        if shares is not None:
            table.add_column("(sink)", justify="right", no_wrap=True)
        for r, lab in enumerate(labels):
            sink = () if shares is None else (str(round(100 * float(shares[i][pick][r]))),)
            table.add_row(lab, *(str(round(100 * x)) for x in w[pick][r]), *sink)
        return table
    table = Table(title=f"sentence {i + 1}: where each head looks most (mean row, %)")
    table.add_column("", no_wrap=True)
    for l in range(found.num_layers):
        table.add_column(f"layer {l + 1}", no_wrap=True)
    top, share = where_heads_look(w)
    for h in range(found.num_heads):
        table.add_row(f"head {h + 1}", *(f"{labels[top[l, h]]} {round(100 * share[l, h])}"
                                         for l in range(found.num_layers)))
    return table


def heads(
    sentences: list[str] = typer.Argument(None, help="Sentences to score (default: the lesson's two 'bank' sentences)."),
    model: str = model_option(),
    revision: str = revision_option(),
    corpus: str = typer.Option(None, "--corpus", help="A text file: one sentence, or a tab-separated pair, per line "
                               "(under torchrun the ranks share it out; rank 0 prints and writes)."),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="Sentences per forward pass."),
    average: str = typer.Option("row", "--average", help="row: every row of every sentence weighs the same (Clark "
                                "et al.'s average, the default); sentence: every sentence weighs the same."),
    induction: bool = typer.Option(False, "--induction", help="Run the induction probe (a seeded random token "
                                   "sequence repeated once) and print each head's induction score instead."),
    length: int = typer.Option(50, "--length", min=2, help="With --induction: random tokens per copy."),
    seed: int = typer.Option(0, "--seed", help="With --induction: the random sequence's seed."),
    json_path: str = json_option(),
) -> None:
    """Heads by role: each head's average attention to [CLS], [SEP], punctuation, self, previous, next word, and entropy."""
    from attnlab.interventions.corpus import corpus_roles, read_corpus
    from attnlab.analysis.roles import check_average
    from attnlab.distributed import rank_and_world

    check_average(average)
    if induction:
        if corpus or sentences:
            raise ValueError("--induction makes its own token sequence; give no sentences or --corpus with it")
        from attnlab.cli.induction import show_induction

        return show_induction(model, revision, length, seed, json_path)

    if corpus and sentences:
        raise ValueError("give sentences or --corpus FILE, not both")
    items = read_corpus(corpus) if corpus else _as_items(sentences or list(LESSON_SENTENCES))
    main_rank = rank_and_world()[0] == 0  # under torchrun the ranks share the sentences; rank 0 alone speaks
    bar, tick = progress("capturing") if main_rank else (contextlib.nullcontext(), None)
    with bar:
        roles = corpus_roles(items, model, revision, batch_size=batch_size, progress=tick, average=average)
    if not main_rank:
        return
    if write_json(json_path, roles.to_dict()):
        return
    console.print(_roles_table(roles, average))


def _roles_table(roles, average: str) -> Table:  # noqa: ANN001 (a HeadRoles)
    """Each role: what it attends to, its top head and score, and how many heads pass its threshold."""
    from attnlab.analysis.roles import ROLES

    table = Table(title=f"{roles.model_id}: head roles over {roles.num_sentences} sentences, {average} average "
                        f"(layer, head 1-based)")
    for col in ("role", "attention to", "top head", "score", "heads ≥ threshold"):
        table.add_column(col, justify="right" if col in ("score", "heads ≥ threshold") else "left")
    for name, role in ROLES.items():
        if name in roles.not_applicable:
            table.add_row(name, role.description, "—", "does not apply", roles.not_applicable[name])
            continue
        top = roles.top(name)
        unit = {"nats": " nats", "ratio": ""}.get(role.unit)
        shown = pct(top.score) if unit is None else f"{top.score:.2f}{unit}"
        over = f"{len(roles.heads(name))} (≥ {role.threshold:g}{unit or ''})"
        table.add_row(name, role.description, str(top.head), shown, over)
    return table


def find_head(
    sentences: list[str] = typer.Argument(..., help="One sentence per decider."),
    target: str = typer.Option(..., "--target", help="The ambiguous word, e.g. bank."),
    decider: list[str] = typer.Option(..., "--decider", help="The deciding word of each sentence, in order."),
    exclude_self: bool = typer.Option(False, "--exclude-self", help="Leave the target itself out of the argmax."),
    exclude_marks: bool = typer.Option(False, "--exclude-marks", help="Leave the marks out of the argmax."),
    occurrence: int = typer.Option(None, "--occurrence", min=1, help="Where the target occurs more than once in a "
                                   "sentence: which occurrence to search, 1-based (default: the first)."),
    model: str = model_option(),
    revision: str = revision_option(),
    json_path: str = json_option(),
) -> None:
    """The heads whose largest weight of the target falls on its decider in every sentence."""
    from attnlab.analysis.search import MARK_RULE, find_heads
    from attnlab.hf.capture import capture

    found = find_heads(capture(_as_items(sentences), model, revision).to_words(), target, decider,
                       exclude_self=exclude_self, exclude_marks=exclude_marks, occurrence=occurrence)
    note = found.occurrence_note()
    if note and occurrence is None:
        err.print(f"note: {note} Choose another with --occurrence N.", highlight=False, markup=False, soft_wrap=True)
    if write_json(json_path, found.to_dict()):
        return
    console.print(found.summary(), highlight=False)
    console.print(f"marks: in {found.mark_heads} of {found.total_heads} heads {MARK_RULE} "
                  f"(per sentence: {', '.join(map(str, found.mark_heads_per_sentence))}).", highlight=False)
