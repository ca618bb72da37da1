"""Section 5 of the lesson: real attention maps, on the default model (or the one given).

The two "bank" sentences go through the model once (:func:`attnlab.capture`); word-level maps
(pieces added up) feed the target-word head search (:func:`attnlab.find_heads`) and the head
roles (:func:`attnlab.head_roles`). The lesson's figures are for bert-base-uncased and are shown
beside ours, labelled as the lesson's model.
"""

from __future__ import annotations

from typing import Any

from attnlab.lesson.fmt import pct
from attnlab.lesson.section import Section, table

SENTENCES = ("I sat on the bank of the river.", "I put the money in the bank.")
TARGET = "bank"
DECIDERS = ("river", "money")
ROLE_HEADS = (("prev", "previous word"), ("next", "next word"), ("marks", "marks ([CLS], [SEP], punctuation)"))

SEED_MAPS = {
    "model": "bert-base-uncased",
    "qualifying": 6,
    "total_heads": 144,
    "best": {"layer": 3, "head": 11, "weights_pct": [93, 60]},
    "mark_heads": 113,
    "spanish": {"model": "bert-base-multilingual-cased", "qualifying": 4, "total_heads": 144,
                "best": {"layer": 1, "head": 4, "weights_pct": [44, 65]}, "mark_heads": 58},
}


def model_info(maps: Any) -> dict:
    """Layers, heads and width of the captured model, read from its config."""
    hidden = maps.config.get("hidden_size") or maps.config.get("n_embd") or maps.config.get("d_model")
    if not hidden:
        raise LookupError(f"the config of {maps.model_id} names no hidden size (hidden_size, n_embd or d_model)")
    return {"model_id": maps.model_id, "revision": maps.revision, "num_layers": maps.num_layers,
            "num_heads": maps.num_heads, "hidden_size": int(hidden)}


def capture_bank(model: str | None = None) -> Any:
    """The two sentences' maps on ``model`` (None: the bundled default); loads torch lazily."""
    from attnlab.hf.capture import capture

    return capture(list(SENTENCES), model=model)


def _heatmap(words: Any, sentence: int, layer: int, head: int, title: str) -> dict:
    return {
        "title": title, "sentence": sentence, "layer": layer + 1, "head": head + 1,
        "words": list(words.words[sentence]),
        "weights": words.weights[sentence][layer, head].astype(float).round(6).tolist(),
    }


def _heatmaps(words: Any, res: Any, tops: dict) -> list[dict]:
    """The figures: the "bank" head (the best qualifying, or the closest) in both sentences, and the
    top head of each role in the first."""
    if res.best is not None:
        layer, head = res.best
        label = "the best qualifying head"
    else:
        layer, head = res.closest[0].layer, res.closest[0].head
        label = "the closest head (none qualifies)"
    heatmaps = [_heatmap(words, s, layer, head, f'"{TARGET}" head, {label}: layer {layer + 1}, head {head + 1}')
                for s in range(len(SENTENCES))]
    for role, what in ROLE_HEADS:
        top = tops[role]  # layer and head 1-based, index 0-based
        heatmaps.append(_heatmap(words, 0, *top.index, f"{what}: layer {top.layer}, head {top.head}, average {pct(top.score)}"))
    return heatmaps


def _maps_findings(res: Any, info: dict, role_rows: list[list[str]]) -> tuple[str, ...]:
    total, seed = res.total_heads, SEED_MAPS
    if res.qualifying:
        verdict = f"{len(res.qualifying)} of {total} heads qualify; " + res.summary().split("; ", 1)[1] + "."
    else:
        verdict = (f'No head of {total} qualifies: in none does the largest weight of "{TARGET}" fall on '
                   f'"{DECIDERS[0]}" in the first sentence and on "{DECIDERS[1]}" in the second.')
    return (
        f"{info['model_id']} ({info['num_layers']} layers × {info['num_heads']} heads), word level, pieces added up. "
        + verdict,
        f'The largest weight of "{TARGET}" falls on a mark ([CLS], [SEP] or the period) in both sentences in '
        f"{res.mark_heads} of {total} heads.",
        "Heads with the largest average weight on the " + "; on the ".join(
            f"{what.split(' (')[0]}: {where} ({share})" for what, where, share in role_rows) + ".",
        f"The lesson's model, {seed['model']}: {seed['qualifying']} of {seed['total_heads']} heads qualify (layer "
        f"{seed['best']['layer']}, head {seed['best']['head']}: {seed['best']['weights_pct'][0]} % and "
        f"{seed['best']['weights_pct'][1]} %), and the largest weight of \"{TARGET}\" falls on a mark in "
        f"{seed['mark_heads']} of {seed['total_heads']}.",
    )


def _head_rows(res: Any) -> list[list[str]]:
    """The qualifying heads, or where none qualifies the closest, with their weights on the deciders."""
    if res.best is not None:
        return [[f"layer {lh[0] + 1}, head {lh[1] + 1}", f"{len(SENTENCES)} of {len(SENTENCES)}"]
                + [pct(w) for w in res.decider_weights[lh]] for lh in res.qualifying]
    return [
        [f"layer {c.layer + 1}, head {c.head + 1}", f"{c.sentences_won} of {len(SENTENCES)}"]
        + [pct(w) + ("" if win.casefold() == d.casefold() else f" ({win} {pct(ww)})")
           for d, w, win, ww in zip(DECIDERS, c.weights, c.winners, c.winner_weights)]
        for c in res.closest
    ]


def _maps_tables(res: Any, info: dict, role_rows: list[list[str]]) -> tuple:
    total, seed = res.total_heads, SEED_MAPS
    return (
        table(
            f'The "{TARGET}" head search (largest weight of "{TARGET}" on the decider in both sentences; '
            "on a mark: heads where it falls on [CLS], [SEP] or the period in both): ours beside the lesson's model's",
            ["model", "heads", "qualify", "best head", "river / money", "on a mark"],
            [
                [info["model_id"].rsplit("/", 1)[-1], total, len(res.qualifying),
                 f"layer {res.best[0] + 1}, head {res.best[1] + 1}" if res.best else "none",
                 " / ".join(pct(w) for w in res.decider_weights[res.best]) if res.best else "—", res.mark_heads],
                [f"{seed['model']} (the lesson)", seed["total_heads"], seed["qualifying"],
                 f"layer {seed['best']['layer']}, head {seed['best']['head']}",
                 " / ".join(f"{w} %" for w in seed["best"]["weights_pct"]), seed["mark_heads"]],
            ],
        ),
        table(
            "Qualifying heads" if res.best is not None else "Closest heads (weight on the decider; the winner when it is not)",
            ["head", "sentences won", f"on {DECIDERS[0]}", f"on {DECIDERS[1]}"],
            _head_rows(res),
        ),
        table("Heads by role (average weight, every word of both sentences)", ["role", "top head", "average weight"], role_rows),
    )


def maps_section(maps: Any) -> Section:
    from attnlab.analysis.roles import head_roles
    from attnlab.analysis.search import find_heads

    words = maps.to_words()
    res = find_heads(words, target=TARGET, deciders=list(DECIDERS))
    roles = head_roles(words)
    info = model_info(maps)
    tops = {role: roles.top(role) for role, _ in ROLE_HEADS}
    role_rows = [[what, f"layer {tops[role].layer}, head {tops[role].head}", pct(tops[role].score)]
                 for role, what in ROLE_HEADS]  # layer and head 1-based, index 0-based
    data = {
        "model": info,
        "sentences": list(SENTENCES),
        "target": TARGET,
        "deciders": list(DECIDERS),
        "words": [list(w) for w in words.words],
        "search": res.to_dict(),
        "roles": {role: {"layer": t.layer, "head": t.head, "score": t.score} for role, t in tops.items()},
        "heatmaps": _heatmaps(words, res, tops),
    }
    return Section("maps", 5, "The real maps", _maps_findings(res, info, role_rows), _maps_tables(res, info, role_rows),
                   data, SEED_MAPS)
