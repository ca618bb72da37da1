"""The lesson's target-word search: which heads send the target's attention to the word that decides it.

Given a target word ("bank") and, per sentence, its decider ("river" in one, "money" in the other),
a head *qualifies* when the largest weight in the target's row (the target attending) falls on the
decider in every sentence; the *best* head is the qualifying one with the largest sum of those
decider weights. Options drop the target itself and/or the marks from that argmax, since models
differ in where they park attention.

``mark_heads`` counts, with the rule written in :data:`MARK_RULE`, the heads where the target's
largest weight (over all words, no exclusions) falls on a mark in every sentence.

The target and the deciders are found as :meth:`~attnlab.maps.words.WordMaps.spans` finds them:
one word, or a run of words such as "sea-shells" (sea - shells) or "don't" (don ' t). A run is
taken as one word for the search, as word pieces are: its row is the mean of its words' rows, its
column the sum of their columns. Where the target occurs more than once in a sentence, its first
occurrence is searched unless ``occurrence`` chooses another; :attr:`HeadSearch.target_counts` and
:meth:`HeadSearch.occurrence_note` say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnlab.maps.records import Maps
from attnlab.maps.words import WordMaps, aggregate
from attnlab.maps.heads import Head

CLOSEST_COUNT = 5  # how many near misses to show when no head qualifies
MARK_RULE = "the target's largest weight, over all words, falls on a mark in every sentence"


@dataclass(frozen=True)
class HeadStanding:
    """How close one ``head`` comes to qualifying."""

    head: Head
    sentences_won: int  # sentences where the decider takes the largest eligible weight
    weights: tuple[float, ...]  # the decider's weight, per sentence
    winners: tuple[str, ...]  # the word that takes the largest eligible weight, per sentence
    winner_weights: tuple[float, ...]
    margin: float  # min over sentences of (decider weight − largest other eligible weight)

    def to_dict(self) -> dict:
        return {
            **self.head.to_dict(), "sentences_won": self.sentences_won,
            "decider_weights": list(self.weights), "winners": list(self.winners),
            "winner_weights": list(self.winner_weights), "margin": self.margin,
        }


@dataclass(frozen=True)
class HeadSearch:
    target: str
    deciders: list[str]
    exclude_self: bool
    exclude_marks: bool
    qualifying: list[Head]
    best: Head | None
    decider_weights: np.ndarray = field(repr=False)  # [L, H, S]
    mark_heads: int
    mark_heads_per_sentence: list[int]  # heads where the target's largest weight falls on a mark, per sentence
    total_heads: int
    closest: list[HeadStanding]
    model_id: str = ""
    target_spans: list[tuple[int, int]] = field(default_factory=list)  # per sentence: words [start, end) searched
    target_counts: list[int] = field(default_factory=list)  # per sentence: how often the target occurs
    target_occurrences: list[int] = field(default_factory=list)  # per sentence: which one was searched, 1-based

    def occurrence_note(self) -> str | None:
        """A sentence naming the occurrence searched where the target occurs more than once, else None."""
        parts = [f"sentence {s + 1} has it {n} times; occurrence {o} (word {self.target_spans[s][0] + 1}) was used"
                 for s, (n, o) in enumerate(zip(self.target_counts, self.target_occurrences)) if n > 1]
        return f'"{self.target}" occurs more than once: ' + "; ".join(parts) + "." if parts else None

    def summary(self) -> str:
        """One line the way the lesson prints it, or a plain statement that no head qualifies."""
        n = len(self.qualifying)
        if self.best is not None:
            ws = [f"{round(100 * float(x))} %" for x in self.decider_weights[self.best]]
            return f"{n} of {self.total_heads} heads; {self.best.label()}: {_join(ws)}"
        rule = f'the largest weight of "{self.target}" fall on {_join(self.deciders)}'
        lines = [f"No head of {self.total_heads} qualifies: in none of them does {rule} in every sentence."]
        if self.closest:
            lines.append("Closest:")
            for c in self.closest:
                parts = []
                for d, w, win, ww in zip(self.deciders, c.weights, c.winners, c.winner_weights):
                    won = win.casefold() == d.casefold()
                    parts.append(f"{d} {round(100 * w)} %" + ("" if won else f" ({win} {round(100 * ww)} %)"))
                lines.append(f"  {c.head.label()}: {_join(parts)}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-ready; layers and heads 0-based, as every field (``summary`` labels them 1-based)."""
        return {
            "model_id": self.model_id, "target": self.target, "deciders": self.deciders,
            "exclude_self": self.exclude_self, "exclude_marks": self.exclude_marks,
            "total_heads": self.total_heads,
            "qualifying": [h.to_dict() for h in self.qualifying],
            "best": None if self.best is None else {
                **self.best.to_dict(), "decider_weights": self.decider_weights[self.best].tolist(),
            },
            "mark_heads": self.mark_heads, "mark_rule": MARK_RULE,
            "mark_heads_per_sentence": self.mark_heads_per_sentence,
            "closest": [c.to_dict() for c in self.closest], "summary": self.summary(),
            "target_occurrence": [{"occurrence": o, "of": n, "words": [a + 1, b]} for (a, b), n, o
                                  in zip(self.target_spans, self.target_counts, self.target_occurrences)],
            "occurrence_note": self.occurrence_note(),
        }


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _merged(words: WordMaps, s: int, spans: list[tuple[int, int]]) -> tuple[np.ndarray, list[str], np.ndarray, list[int]]:
    """Sentence s's word maps with each span of ``spans`` made one word (rows mean, columns sum):
    (weights [L, H, W', W'], word texts, mark flags, the new position of each span)."""
    n = len(words.words[s])
    group, texts, marks, w = [], [], [], 0
    starts = {a: b for a, b in spans}
    while w < n:
        end = starts.get(w, w + 1)
        group += [len(texts)] * (end - w)
        texts.append("".join(words.words[s][w:end]))
        marks.append(end - w == 1 and bool(words.is_mark[s][w]))  # a run of words is not a mark
        w = end
    pos = [group[a] for a, _ in spans]
    return aggregate(words.weights[s], group, len(texts)), texts, np.asarray(marks, dtype=bool), pos


def _occurrence(occurrence, count: int) -> list:
    if occurrence is None or isinstance(occurrence, int):
        return [occurrence] * count
    occurrence = list(occurrence)
    if len(occurrence) != count:
        raise ValueError(f"occurrence has {len(occurrence)} entries for {count} sentences; give one per sentence or one int")
    return occurrence


def find_heads(maps: Maps, target: str, deciders: list[str], exclude_self: bool = False,
               exclude_marks: bool = False, occurrence: int | list[int | None] | None = None) -> HeadSearch:
    """Search every head of ``maps`` for the target's decider, at word level: word-level
    :class:`~attnlab.maps.words.WordMaps`, or token-level maps turned into words (``maps.to_words()``) first.

    ``deciders[i]`` is the deciding word of sentence i. Words match case-insensitively, and may be
    runs of words ("sea-shells"; see the module's text). ``occurrence``: which occurrence of the
    target to search where it occurs more than once, 1-based, one int for every sentence or one
    per sentence; None: the first (the result says which, see :meth:`HeadSearch.occurrence_note`).
    The decider's first occurrence outside the target is used ("sea" in "sea-shells by the sea" is the last word).
    """
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"target must be a non-empty word, got {target!r}")
    if isinstance(deciders, str):
        deciders = [deciders]
    deciders = list(deciders)
    words = maps.to_words()
    if len(deciders) != len(words):
        raise ValueError(f"deciders has {len(deciders)} words for {len(words)} sentences; give one per sentence")
    L, H, S = words.num_layers, words.num_heads, len(words)
    occurrences = _occurrence(occurrence, S)
    dec_w = np.zeros((L, H, S))
    won = np.zeros((L, H, S), dtype=bool)
    on_mark = np.zeros((L, H, S), dtype=bool)
    winner = np.zeros((L, H, S), dtype=int)
    winner_w = np.zeros((L, H, S))
    margin = np.full((L, H), np.inf)
    t_spans, t_counts, texts = [], [], []
    for s in range(S):
        t_span = words.span(s, target, occurrences[s])
        apart = [d for d in words.spans(s, deciders[s]) if d[1] <= t_span[0] or t_span[1] <= d[0]]
        if not apart:
            words.span(s, deciders[s])  # a decider that is not there says so
            raise ValueError(f"decider {deciders[s]!r} of sentence {s + 1} is the target itself")
        d_span = apart[0]
        t_spans.append(t_span)
        t_counts.append(len(words.spans(s, target)))
        weights, text, marks, (t, d) = _merged(words, s, [t_span, d_span])
        texts.append(text)
        row = weights[:, :, t, :].astype(np.float64)  # (L, H, W): the target attending
        on_mark[:, :, s] = marks[row.argmax(axis=-1)]
        eligible = np.ones(row.shape[-1], dtype=bool)
        if exclude_self:
            eligible[t] = False
        if exclude_marks:
            eligible &= ~marks
        if not eligible[d]:
            raise ValueError(f"decider {deciders[s]!r} of sentence {s + 1} is a mark, but exclude_marks is set")
        masked = np.where(eligible, row, -np.inf)
        winner[:, :, s] = masked.argmax(axis=-1)
        winner_w[:, :, s] = masked.max(axis=-1)
        dec_w[:, :, s] = row[:, :, d]
        won[:, :, s] = winner[:, :, s] == d
        others = np.delete(masked, d, axis=-1).max(axis=-1, initial=-np.inf)  # best rival of the decider
        margin = np.minimum(margin, row[:, :, d] - others)
    qualifies = won.all(axis=-1)
    qualifying = [Head(int(l), int(h)) for l, h in zip(*np.nonzero(qualifies))]
    best = max(qualifying, key=lambda lh: dec_w[lh].sum()) if qualifying else None
    standing = sorted(
        (Head(l, h) for l in range(L) for h in range(H) if not qualifies[l, h]),
        key=lambda lh: (-won[lh].sum(), -margin[lh]),
    )
    closest = [] if qualifying else [
        HeadStanding(
            head=lh, sentences_won=int(won[lh].sum()), weights=tuple(float(x) for x in dec_w[lh]),
            winners=tuple(texts[s][winner[lh][s]] for s in range(S)),
            winner_weights=tuple(float(x) for x in winner_w[lh]), margin=float(margin[lh]),
        )
        for lh in standing[:CLOSEST_COUNT]
    ]
    return HeadSearch(
        target=target, deciders=deciders, exclude_self=exclude_self, exclude_marks=exclude_marks,
        qualifying=qualifying, best=best, decider_weights=dec_w,
        mark_heads=int(on_mark.all(axis=-1).sum()),
        mark_heads_per_sentence=[int(x) for x in on_mark.sum(axis=(0, 1))], total_heads=L * H, closest=closest,
        model_id=words.model_id, target_spans=t_spans, target_counts=t_counts,
        target_occurrences=[1 if o is None else o for o in occurrences],
    )
