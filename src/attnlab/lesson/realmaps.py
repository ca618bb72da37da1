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
from attnlab.maps.heads import Head
from attnlab.maps.tokens import AttentionMaps
from attnlab.maps.words import WordMaps

SENTENCES = ("I sat on the bank of the river.", "I put the money in the bank.")
TARGET = "bank"
DECIDERS = ("river", "money")
ROLE_HEADS = (("prev", "previous word"), ("next", "next word"), ("marks", "marks ([CLS], [SEP], punctuation)"))

SEED_MAPS = {
    "model": "bert-base-uncased",
    "qualifying": 6,
    "total_heads": 144,
    "best": {"layer": 2, "head": 10, "weights_pct": [93, 60]},  # 0-based: the lesson's "layer 3, head 11"
    "mark_heads": 113,
    "spanish": {"model": "bert-base-multilingual-cased", "qualifying": 4, "total_heads": 144,
                "best": {"layer": 0, "head": 3, "weights_pct": [44, 65]}, "mark_heads": 58},  # "layer 1, head 4"
}


def model_info(maps: AttentionMaps) -> dict:
    """Layers, heads and width of the captured model, read from its config."""
    hidden = maps.config.get("hidden_size") or maps.config.get("n_embd") or maps.config.get("d_model")
    if not hidden:
        raise LookupError(f"the config of {maps.model_id} names no hidden size (hidden_size, n_embd or d_model)")
    return {"model_id": maps.model_id, "revision": maps.revision, "num_layers": maps.num_layers,
            "num_heads": maps.num_heads, "hidden_size": int(hidden)}


def capture_bank(model: str | None = None) -> AttentionMaps:
    """The two sentences' maps on ``model`` (None: the bundled default); loads torch lazily."""
    from attnlab.hf.capture import capture

    return capture(list(SENTENCES), model=model)


def _heatmap(words: WordMaps, sentence: int, head: Head, title: str) -> dict:
    return {
        "title": title, "sentence": sentence, **head.to_dict(),
        "words": words.labels(sentence),
        "weights": words.weights[sentence][head].astype(float).round(6).tolist(),
    }


def _heatmaps(words: WordMaps, res: Any, tops: dict) -> list[dict]:
    """The figures: the "bank" head (the best qualifying, or the closest) in both sentences, and the
    top head of each role in the first."""
    if res.best is not None:
        shown, label = res.best, "the best qualifying head"
    else:
        shown, label = res.closest[0].head, "the closest head (none qualifies)"
    heatmaps = [_heatmap(words, s, shown, f'"{TARGET}" head, {label}: {shown.label()}') for s in range(len(SENTENCES))]
    for role, what in ROLE_HEADS:
        top = tops[role]
        heatmaps.append(_heatmap(words, 0, top.head, f"{what}: {top.head.label()}, average {pct(top.score)}"))
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
        f"The lesson's model, {seed['model']}: {seed['qualifying']} of {seed['total_heads']} heads qualify "
        f"({_seed_best().label()}: {seed['best']['weights_pct'][0]} % and "
        f"{seed['best']['weights_pct'][1]} %), and the largest weight of \"{TARGET}\" falls on a mark in "
        f"{seed['mark_heads']} of {seed['total_heads']}.",
    )


def _seed_best() -> Head:
    return Head(SEED_MAPS["best"]["layer"], SEED_MAPS["best"]["head"])


def _head_rows(res: Any) -> list[list[str]]:
    """The qualifying heads, or where none qualifies the closest, with their weights on the deciders."""
    if res.best is not None:
        return [[str(found), f"{len(SENTENCES)} of {len(SENTENCES)}"]
                + [pct(w) for w in res.decider_weights[found]] for found in res.qualifying]
    return [
        [str(c.head), f"{c.sentences_won} of {len(SENTENCES)}"]
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
                 str(res.best) if res.best else "none",
                 " / ".join(pct(w) for w in res.decider_weights[res.best]) if res.best else "—", res.mark_heads],
                [f"{seed['model']} (the lesson)", seed["total_heads"], seed["qualifying"],
                 str(_seed_best()),
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


def maps_section(maps: AttentionMaps) -> Section:
    from attnlab.analysis.roles import head_roles
    from attnlab.analysis.search import find_heads

    words = maps.to_words()
    res = find_heads(words, target=TARGET, deciders=list(DECIDERS))
    roles = head_roles(words)
    info = model_info(maps)
    tops = {role: roles.top(role) for role, _ in ROLE_HEADS}
    role_rows = [[what, str(tops[role].head), pct(tops[role].score)] for role, what in ROLE_HEADS]
    data = {
        "model": info,
        "sentences": list(SENTENCES),
        "target": TARGET,
        "deciders": list(DECIDERS),
        "words": [list(w) for w in words.words],
        "search": res.to_dict(),
        "roles": {role: t.to_dict() for role, t in tops.items()},
        "heatmaps": _heatmaps(words, res, tops),
    }
    return Section("maps", 5, "The real maps", _maps_findings(res, info, role_rows), _maps_tables(res, info, role_rows),
                   data, SEED_MAPS)
