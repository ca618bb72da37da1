"""Heads by role: a registry of named scores per layer and head (Clark et al. 2019, §3).

Each role is a small function of one sentence's word maps that returns the sum of a per-row
quantity over the rows where it is defined, and how many rows that was; a role's score for a head
is that total over all sentences divided by the row count, so scores over a corpus can be
accumulated batch by batch (:mod:`attnlab.interventions.corpus`). Each role has a threshold, a named
constant: a head "has" the role when its score passes it.

    prev    weight on the previous word           next   weight on the next word
    self    weight on the word itself              cls    weight on the opening special token
    sep     weight on the other special tokens     punct  weight on punctuation
    marks   weight on all marks                    broad  mean row entropy, nats
    spread  row entropy / log(number of words the row may attend to): 0 on one word, 1 uniform
    sink    weight on the first position (the attention sink of StreamingLLM, Xiao et al. 2023)

Roles are named for what a head does; the quantities behind three of them have the names that
:func:`attnlab.head_stats` gives them on long inputs: ``sink`` is the mean of ``first`` (the weight
on position 0), ``broad`` the mean ``entropy`` and ``spread`` the mean ``entropy_norm``. The entropy
is exact, −Σ p log p with 0 · log 0 = 0 (:func:`entropy`), the same quantity head_stats computes.
    duplicate   weight on earlier copies of the word itself      } TransformerLens's detect_head
    induction   weight on the word after an earlier copy of it   } patterns, "mul" measure

``prev``, ``duplicate`` and ``induction`` are TransformerLens's ``previous_token_head``,
``duplicate_token_head`` and ``induction_head`` detection patterns (``detect_head`` with its
default "mul" measure: the share of a row's weight that falls on the pattern, averaged over all
rows), on words; on token maps of a repeated random sequence, :mod:`attnlab.interventions.induction` is
the standard probe. Both score induction by :func:`attnlab.analysis.induction.induction_weight`. A role that cannot apply to the maps at hand (a causal decoder cannot look at
the next word; marks-based roles are for encoders, whose special tokens collect attention; no word
repeats) is not scored: :attr:`HeadRoles.not_applicable` says why.

Learned sinks (gpt-oss: a row's weights add up to 1 minus its sink share): ``broad`` and ``spread`` count
the sink as one more outcome of every row (its entropy is −Σ p log p − s log s over the words and the
share s, and ``spread`` divides by log(words + 1), so a row spread evenly over the words and the sink
scores 1); every other role is scored on the weights as they are, the share not given to any word (a head
that parks 70 % on the sink and 30 % on the previous word scores 0.3 for ``prev``). The ``sink`` role is
the first position's weight, not the learned sink's share.

Two averages (``average=``): ``"row"`` (the default) pools every query row of every sentence, as
Clark et al. do, so the numbers match theirs and the lesson's; a long sentence then weighs as much
as its row count. ``"sentence"`` first averages each sentence's rows, then the sentences, so each
sentence weighs the same: use it for a corpus that mixes a few long texts with short sentences.
``broad`` is in nats and grows with the row's length (a uniform row over n words has log n); its
threshold means "as spread as a uniform row over 7.4 words" at any length. ``spread`` divides each
row's entropy by log of the number of words it may attend to (all words in an encoder, those up
to itself in a causal decoder; rows with one such word are left out), so its threshold means the
same share of "uniform" at every length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from attnlab.maps.records import Maps
from attnlab.analysis.induction import duplicate_pattern, induction_pattern, induction_weight
from attnlab.maps.heads import Head, ScoredHead, ranked

# A head has a role when its average score reaches the role's threshold.
PREV_THRESHOLD = 0.5
NEXT_THRESHOLD = 0.5
SELF_THRESHOLD = 0.5
CLS_THRESHOLD = 0.5
SEP_THRESHOLD = 0.5
PUNCT_THRESHOLD = 0.5
MARKS_THRESHOLD = 0.5
BROAD_THRESHOLD_NATS = 2.0  # as spread as a uniform row over e^2 ≈ 7.4 words
SPREAD_THRESHOLD = 0.75  # entropy at least three quarters of a uniform row's over the same words
SINK_THRESHOLD = 0.5
DUPLICATE_THRESHOLD = 0.4
INDUCTION_THRESHOLD = 0.4  # the role's; the lesson's "an induction head has formed" is INDUCTION_FORMED_THRESHOLD

# One sentence: (weights [L, H, W, W], word kinds, mark flags, word texts, sink share [L, H, W] or None)
# → (row total [L, H], number of rows)
Scorer = Callable[[np.ndarray, list[str], list[bool], list[str], np.ndarray | None], tuple[np.ndarray, int]]


@dataclass(frozen=True)
class Role:
    name: str
    description: str
    score: Scorer
    threshold: float
    unit: str = "weight"  # "weight" (0..1), "nats", or "ratio" (0..1, not a weight)
    encoders_only: bool = False  # marks-based: not scored on causal decoders


def _diagonal(w: np.ndarray, offset: int) -> tuple[np.ndarray, int]:
    d = np.diagonal(w, offset=offset, axis1=-2, axis2=-1)  # (L, H, W − |offset|)
    return d.sum(axis=-1), d.shape[-1]


def _to_columns(w: np.ndarray, columns: list[bool]) -> tuple[np.ndarray, int]:
    return w[..., np.asarray(columns, dtype=bool)].sum(axis=(-1, -2)), w.shape[-2]


def _prev(w, kinds, marks, texts, share):
    return _diagonal(w, -1)  # row i, column i − 1


def _next(w, kinds, marks, texts, share):
    return _diagonal(w, 1)


def _self(w, kinds, marks, texts, share):
    return _diagonal(w, 0)


def _cls(w, kinds, marks, texts, share):
    return _to_columns(w, [k == "cls" for k in kinds])


def _sep(w, kinds, marks, texts, share):
    return _to_columns(w, [k == "sep" for k in kinds])


def _punct(w, kinds, marks, texts, share):
    return _to_columns(w, [k == "punct" for k in kinds])


def _marks(w, kinds, marks, texts, share):
    return _to_columns(w, marks)


def _plogp(p: np.ndarray) -> np.ndarray:
    return p * np.log(np.where(p > 0, p, 1.0))  # 0 · log 0 = 0


def entropy(w: np.ndarray, share: np.ndarray | None = None) -> np.ndarray:
    """Each row's entropy in nats, exact: −Σ_j p_j log p_j with 0 · log 0 = 0 (as head_stats
    computes its ``entropy``), [..., Tq, Tk] → [..., Tq]. With learned sinks, ``share`` [..., Tq] (each
    row's sink share) is one more outcome of the row: −Σ_j p_j log p_j − s log s."""
    out = -_plogp(w).sum(axis=-1)
    return out if share is None else out - _plogp(share)


def _broad(w, kinds, marks, texts, share):
    return entropy(w, share).sum(axis=-1), w.shape[-2]  # the mean of head_stats' "entropy"


def _spread(w, kinds, marks, texts, share):  # the mean of head_stats' "entropy_norm"
    entropy_ = entropy(w, share)  # (L, H, W)
    n = w.shape[-1]
    causal = not np.triu(w, k=1).any()
    attendable = np.arange(1, n + 1) if causal else np.full(n, n)  # words row i may attend to
    attendable = attendable + (share is not None)  # learned sinks: the sink is one more outcome of every row
    rows = attendable > 1  # log 1 = 0: a row with one choice has no spread to measure
    return (entropy_[..., rows] / np.log(attendable[rows])).sum(axis=-1), int(rows.sum())


def _sink(w, kinds, marks, texts, share):
    return w[..., 0].sum(axis=-1), w.shape[-2]  # column 0, whatever token sits there: head_stats' "first"


def _duplicate(w, kinds, marks, texts, share):
    return (w * duplicate_pattern(texts)).sum(axis=(-1, -2)), w.shape[-2]


def _induction(w, kinds, marks, texts, share):
    total, rows = induction_weight(w, induction_pattern(texts))  # every row counts, as in detect_head
    return total, int(rows.flat[0])


ROLES: dict[str, Role] = {
    r.name: r
    for r in (
        Role("prev", "previous word", _prev, PREV_THRESHOLD),
        Role("next", "next word", _next, NEXT_THRESHOLD),
        Role("self", "the word itself", _self, SELF_THRESHOLD),
        Role("cls", "[CLS] / <s>", _cls, CLS_THRESHOLD, encoders_only=True),
        Role("sep", "[SEP] / </s>", _sep, SEP_THRESHOLD, encoders_only=True),
        Role("punct", "punctuation", _punct, PUNCT_THRESHOLD),
        Role("marks", "marks (special + punct.)", _marks, MARKS_THRESHOLD, encoders_only=True),
        Role("broad", "everything: row entropy", _broad, BROAD_THRESHOLD_NATS, unit="nats"),
        Role("spread", "everything: entropy / log(words)", _spread, SPREAD_THRESHOLD, unit="ratio"),
        Role("sink", "first token (attention sink)", _sink, SINK_THRESHOLD),
        Role("duplicate", "earlier copies of the word", _duplicate, DUPLICATE_THRESHOLD),
        Role("induction", "word after an earlier copy", _induction, INDUCTION_THRESHOLD),
    )
}


def is_causal(weights: list[np.ndarray]) -> bool:
    """True when no row of any head puts weight on a later position: a causal decoder's maps."""
    return all(w.shape[-1] < 2 or not np.triu(w, k=1).any() for w in weights)


def not_applicable(names: list[str], causal: bool, kinds: set[str], repeats: bool) -> dict[str, str]:
    """Why each role of ``names`` does not apply to maps that are ``causal`` (or not), have words of
    ``kinds`` and (or not) a word that ``repeats`` within a sentence."""
    why = {}
    for name in names:
        role = ROLES[name]
        if causal and name == "next":
            why[name] = "a causal decoder never attends to the next word"
        elif causal and role.encoders_only:
            why[name] = "marks-based, for encoders; a causal decoder's first token is scored by 'sink'"
        elif name in ("cls", "sep") and name not in kinds:
            why[name] = f"no sentence has {'an opening' if name == 'cls' else 'a closing'} special token"
        elif name in ("duplicate", "induction") and not repeats:
            why[name] = "no word repeats in these sentences (the induction probe, heads --induction, makes repeats)"
    return why


AVERAGES = ("row", "sentence")


@dataclass(frozen=True)
class HeadRoles:
    """Role scores per head: ``scores[role]`` is [L, H], averaged over every row of every sentence
    (``average="row"``) or over each sentence's rows, then the sentences (``average="sentence"``).

    ``not_applicable[role]`` says why a role asked for was not scored (it has no entry in ``scores``).
    """

    scores: dict[str, np.ndarray]
    num_sentences: int
    model_id: str
    revision: str | None
    not_applicable: dict[str, str] = field(default_factory=dict)
    average: str = "row"

    @property
    def num_layers(self) -> int:
        return next(iter(self.scores.values())).shape[0]

    @property
    def num_heads(self) -> int:
        return next(iter(self.scores.values())).shape[1]

    def _role(self, role: str) -> Role:
        if role in self.not_applicable:
            raise LookupError(f"role {role!r} does not apply here: {self.not_applicable[role]}")
        if role not in self.scores:
            raise LookupError(f"role {role!r} is unknown; roles: {', '.join(self.scores)}")
        return ROLES[role]

    def top(self, role: str) -> ScoredHead:
        """The head with the largest score for ``role`` (the first in (layer, head) order on a tie),
        and its score."""
        self._role(role)
        return ranked(self.scores[role], n=1)[0]

    def heads(self, role: str) -> list[Head]:
        """Heads whose score reaches the role's threshold, best first (none for a role that does not apply)."""
        if role in self.not_applicable:
            return []
        r = self._role(role)
        return [found.head for found in ranked(self.scores[role], at_least=r.threshold)]

    def to_dict(self) -> dict:
        """JSON-ready; layers and heads 0-based, as every field (docs/design.md)."""
        roles = {}
        for name, s in self.scores.items():
            r = ROLES[name]
            roles[name] = {
                "description": r.description, "unit": r.unit, "threshold": r.threshold,
                "top": self.top(name).to_dict(),
                "heads_over_threshold": len(self.heads(name)),
                "scores": np.round(s, 6).tolist(),
            }
        return {
            "model_id": self.model_id, "revision": self.revision, "num_sentences": self.num_sentences,
            "average": self.average,
            "num_layers": self.num_layers, "num_heads": self.num_heads, "roles": roles,
            "not_applicable": dict(self.not_applicable),
        }


def check_average(average: str) -> str:
    if average not in AVERAGES:
        raise ValueError(f"average must be 'row' or 'sentence', got {average!r}")
    return average


class RoleAccumulator:
    """Running totals of every role over sentences, for corpora streamed batch by batch.

    Both averages are accumulated (row totals and row counts; sums of per-sentence means and the
    number of sentences that had rows); ``average`` picks the one :meth:`result` returns.
    """

    def __init__(self, num_layers: int, num_heads: int, roles: list[str] | None = None, average: str = "row") -> None:
        names = list(ROLES) if roles is None else roles
        for name in names:
            if name not in ROLES:
                raise LookupError(f"role {name!r} is unknown; roles: {', '.join(ROLES)}")
        self.average = check_average(average)
        self.totals = {n: np.zeros((num_layers, num_heads)) for n in names}
        self.rows = {n: 0 for n in names}
        self.sentence_means = {n: np.zeros((num_layers, num_heads)) for n in names}  # Σ over sentences of their mean
        self.sentence_counts = {n: 0 for n in names}  # sentences with at least one row for the role
        self.sentences = 0
        self.causal, self.kinds, self.repeats = True, set(), False  # what decides which roles apply

    def add(self, maps: Maps) -> None:
        """Add every sentence of ``maps``, at word level (token-level maps are turned into words first)."""
        words = maps.to_words()
        self.causal = self.causal and is_causal(words.weights)
        shares = words.self_attention.sink_share
        for i, (w, kinds, marks, texts) in enumerate(zip(words.weights, words.kinds, words.is_mark, words.words)):
            self.kinds.update(kinds)
            self.repeats = self.repeats or len({t.casefold() for t in texts}) < len(texts)
            w = w.astype(np.float64)
            share = None if shares is None else shares[i].astype(np.float64)  # (L, H, W): learned sinks
            for name in self.totals:
                total, rows = ROLES[name].score(w, kinds, marks, texts, share)
                self.totals[name] += total
                self.rows[name] += rows
                if rows:
                    self.sentence_means[name] += total / rows
                    self.sentence_counts[name] += 1
            self.sentences += 1

    def result(self, model_id: str, revision: str | None) -> HeadRoles:
        skip = not_applicable(list(self.totals), self.causal, self.kinds, self.repeats)
        if self.average == "row":
            scores = {n: self.totals[n] / max(self.rows[n], 1) for n in self.totals if n not in skip}
        else:
            scores = {n: self.sentence_means[n] / max(self.sentence_counts[n], 1) for n in self.totals if n not in skip}
        return HeadRoles(scores=scores, num_sentences=self.sentences, model_id=model_id, revision=revision,
                         not_applicable=skip, average=self.average)


def head_roles(maps: Maps, roles: list[str] | None = None, average: str = "row") -> HeadRoles:
    """Score every head of ``maps`` for each role, at word level: :class:`~attnlab.maps.words.WordMaps`,
    or token-level maps, turned into words (``maps.to_words()``) first.

    ``average``: ``"row"`` (default: every row of every sentence weighs the same, as in Clark et
    al.) or ``"sentence"`` (every sentence weighs the same, whatever its length).
    """
    if not len(maps):
        raise ValueError("maps has no sentences; capture at least one")
    acc = RoleAccumulator(maps.num_layers, maps.num_heads, roles, average)
    acc.add(maps)
    return acc.result(maps.model_id, maps.revision)
