"""Section 5 of the lesson: real attention maps, on the default model (or the one given).

The two "bank" sentences go through the model once (:func:`attnlab.capture`); word-level maps
(pieces added up) feed the target-word head search (:func:`attnlab.find_heads`) and the head
roles (:func:`attnlab.head_roles`). The lesson's figures are for bert-base-uncased and are shown
beside ours, labelled as the lesson's model.
"""

from __future__ import annotations

from attnlab.lesson.fmt import pct
from attnlab.lesson.section import Section, table
from attnlab.maps.tokens import AttentionMaps
from attnlab.maps.words import WordMaps
from attnlab.maps.heads import Head

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


def maps_section(maps: AttentionMaps) -> Section:
    from attnlab.analysis.roles import head_roles
    from attnlab.analysis.search import find_heads

    words = maps.to_words()
    res = find_heads(words, target=TARGET, deciders=list(DECIDERS))
    roles = head_roles(words)
    info = model_info(maps)
    total = res.total_heads
    seed = SEED_MAPS

    heatmaps = []
    if res.best is not None:
        shown, label = res.best, "the best qualifying head"
    else:
        shown, label = res.closest[0].head, "the closest head (none qualifies)"
    for s in range(len(SENTENCES)):
        heatmaps.append(_heatmap(words, s, shown, f'"{TARGET}" head, {label}: {shown.label()}'))
    tops = {role: roles.top(role) for role, _ in ROLE_HEADS}
    role_rows = []
    for role, what in ROLE_HEADS:
        top = tops[role]
        role_rows.append([what, top.head.label(), pct(top.score)])
        heatmaps.append(_heatmap(words, 0, top.head, f"{what}: {top.head.label()}, average {pct(top.score)}"))
    seed_best = Head(seed["best"]["layer"], seed["best"]["head"])

    if res.qualifying:
        verdict = f"{len(res.qualifying)} of {total} heads qualify; " + res.summary().split("; ", 1)[1] + "."
    else:
        verdict = (f'No head of {total} qualifies: in none does the largest weight of "{TARGET}" fall on '
                   f'"{DECIDERS[0]}" in the first sentence and on "{DECIDERS[1]}" in the second.')
    findings = (
        f"{info['model_id']} ({info['num_layers']} layers × {info['num_heads']} heads), word level, pieces added up. "
        + verdict,
        f'The largest weight of "{TARGET}" falls on a mark ([CLS], [SEP] or the period) in both sentences in '
        f"{res.mark_heads} of {total} heads.",
        "Heads with the largest average weight on the " + "; on the ".join(
            f"{what.split(' (')[0]}: {where} ({share})" for what, where, share in role_rows) + ".",
        f"The lesson's model, {seed['model']}: {seed['qualifying']} of {seed['total_heads']} heads qualify "
        f"({seed_best.label()}: {seed['best']['weights_pct'][0]} % and "
        f"{seed['best']['weights_pct'][1]} %), and the largest weight of \"{TARGET}\" falls on a mark in "
        f"{seed['mark_heads']} of {seed['total_heads']}.",
    )
    closest_rows = [
        [c.head.label(), f"{c.sentences_won} of {len(SENTENCES)}"]
        + [pct(w) + ("" if win.casefold() == d.casefold() else f" ({win} {pct(ww)})")
           for d, w, win, ww in zip(DECIDERS, c.weights, c.winners, c.winner_weights)]
        for c in res.closest
    ]
    if res.best is not None:
        closest_rows = [[found.label(), f"{len(SENTENCES)} of {len(SENTENCES)}"]
                        + [pct(w) for w in res.decider_weights[found]] for found in res.qualifying]
    tables = (
        table(
            f'The "{TARGET}" head search (largest weight of "{TARGET}" on the decider in both sentences; '
            "on a mark: heads where it falls on [CLS], [SEP] or the period in both): ours beside the lesson's model's",
            ["model", "heads", "qualify", "best head", "river / money", "on a mark"],
            [
                [info["model_id"].rsplit("/", 1)[-1], total, len(res.qualifying),
                 res.best.label() if res.best else "none",
                 " / ".join(pct(w) for w in res.decider_weights[res.best]) if res.best else "—", res.mark_heads],
                [f"{seed['model']} (the lesson)", seed["total_heads"], seed["qualifying"],
                 seed_best.label(),
                 " / ".join(f"{w} %" for w in seed["best"]["weights_pct"]), seed["mark_heads"]],
            ],
        ),
        table(
            "Qualifying heads" if res.best is not None else "Closest heads (weight on the decider; the winner when it is not)",
            ["head", "sentences won", f"on {DECIDERS[0]}", f"on {DECIDERS[1]}"],
            closest_rows,
        ),
        table("Heads by role (average weight, every word of both sentences)", ["role", "top head", "average weight"], role_rows),
    )
    data = {
        "model": info,
        "sentences": list(SENTENCES),
        "target": TARGET,
        "deciders": list(DECIDERS),
        "words": [list(w) for w in words.words],
        "search": res.to_dict(),
        "roles": {role: t.to_dict() for role, t in tops.items()},
        "heatmaps": heatmaps,
    }
    return Section("maps", 5, "The real maps", findings, tables, data, SEED_MAPS)
