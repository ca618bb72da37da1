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
    duplicate   weight on earlier copies of the word itself      } TransformerLens's detect_head
    induction   weight on the word after an earlier copy of it   } patterns, "mul" measure

``prev``, ``duplicate`` and ``induction`` are TransformerLens's ``previous_token_head``,
``duplicate_token_head`` and ``induction_head`` detection patterns (``detect_head`` with its
default "mul" measure: the share of a row's weight that falls on the pattern, averaged over all
rows), on words; on token maps of a repeated random sequence, :mod:`attnlab.interventions.induction` is
the standard probe. A role that cannot apply to the maps at hand (a causal decoder cannot look at
the next word; marks-based roles are for encoders, whose special tokens collect attention; no word
repeats) is not scored: :attr:`HeadRoles.not_applicable` says why.

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
from typing import Callable, NamedTuple

import numpy as np

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
INDUCTION_THRESHOLD = 0.4
ENTROPY_EPS = 1e-10  # Clark et al.'s smoothing: −Σ p log(p + ε), so p = 0 adds nothing

# One sentence: (weights [L, H, W, W], word kinds, mark flags, word texts) → (row total [L, H], number of rows)
Scorer = Callable[[np.ndarray, list[str], list[bool], list[str]], tuple[np.ndarray, int]]


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


def _prev(w, kinds, marks, texts):
    return _diagonal(w, -1)  # row i, column i − 1


def _next(w, kinds, marks, texts):
    return _diagonal(w, 1)


def _self(w, kinds, marks, texts):
    return _diagonal(w, 0)


def _cls(w, kinds, marks, texts):
    return _to_columns(w, [k == "cls" for k in kinds])


def _sep(w, kinds, marks, texts):
    return _to_columns(w, [k == "sep" for k in kinds])


def _punct(w, kinds, marks, texts):
    return _to_columns(w, [k == "punct" for k in kinds])


def _marks(w, kinds, marks, texts):
    return _to_columns(w, marks)


def _broad(w, kinds, marks, texts):
    entropy = -(w * np.log(w + ENTROPY_EPS)).sum(axis=-1)  # (L, H, W)
    return entropy.sum(axis=-1), w.shape[-2]


def _spread(w, kinds, marks, texts):
    entropy = -(w * np.log(w + ENTROPY_EPS)).sum(axis=-1)  # (L, H, W)
    n = w.shape[-1]
    causal = not np.triu(w, k=1).any()
    attendable = np.arange(1, n + 1) if causal else np.full(n, n)  # words row i may attend to
    rows = attendable > 1  # log 1 = 0: a row with one choice has no spread to measure
    return (entropy[..., rows] / np.log(attendable[rows])).sum(axis=-1), int(rows.sum())


def _sink(w, kinds, marks, texts):
    return w[..., 0].sum(axis=-1), w.shape[-2]  # column 0, whatever token sits there


def duplicate_pattern(texts: list[str]) -> np.ndarray:
    """[W, W] 1 where word j < i is the same word as i (case-insensitive): TransformerLens's duplicate pattern."""
    folded = np.array([t.casefold() for t in texts], dtype=object)
    same = folded[:, None] == folded[None, :]
    return np.tril(same, k=-1).astype(np.float64)


def induction_pattern(texts: list[str]) -> np.ndarray:
    """[W, W] 1 where word j − 1 is an earlier copy of word i (j < i): the duplicate pattern shifted one right."""
    shifted = np.zeros((len(texts), len(texts)))
    shifted[:, 1:] = duplicate_pattern(texts)[:, :-1]
    return np.tril(shifted, k=-1)


def _duplicate(w, kinds, marks, texts):
    return (w * duplicate_pattern(texts)).sum(axis=(-1, -2)), w.shape[-2]


def _induction(w, kinds, marks, texts):
    return (w * induction_pattern(texts)).sum(axis=(-1, -2)), w.shape[-2]


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


class TopHead(NamedTuple):
    """One head and its score: ``layer`` and ``head`` 1-based, as printed; ``index`` the 0-based
    (layer, head) for indexing arrays such as ``scores[role][index]`` or ``maps.weights[i][index]``."""

    layer: int
    head: int
    score: float
    index: tuple[int, int]


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

    def top(self, role: str) -> TopHead:
        """The head with the largest score for ``role``: layer and head 1-based, its score, and its
        0-based ``index``."""
        self._role(role)
        s = self.scores[role]
        layer, head = (int(i) for i in np.unravel_index(int(np.argmax(s)), s.shape))
        return TopHead(layer + 1, head + 1, float(s[layer, head]), (layer, head))

    def heads(self, role: str) -> list[tuple[int, int]]:
        """Heads (layer0, head0) whose score reaches the role's threshold, best first (none for a role
        that does not apply)."""
        if role in self.not_applicable:
            return []
        r = self._role(role)
        s = self.scores[role]
        found = [(int(l), int(h)) for l, h in zip(*np.nonzero(s >= r.threshold))]
        return sorted(found, key=lambda lh: -s[lh])

    def to_dict(self) -> dict:
        """JSON-ready; layers and heads in ``top`` are 1-based, as printed."""
        roles = {}
        for name, s in self.scores.items():
            top = self.top(name)
            r = ROLES[name]
            roles[name] = {
                "description": r.description, "unit": r.unit, "threshold": r.threshold,
                "top": {"layer": top.layer, "head": top.head, "score": top.score},
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

    def add(self, words) -> None:
        """Add every sentence of a :class:`~attnlab.maps.words.WordMaps`."""
        self.causal = self.causal and is_causal(words.weights)
        for w, kinds, marks, texts in zip(words.weights, words.kinds, words.is_mark, words.words):
            self.kinds.update(kinds)
            self.repeats = self.repeats or len({t.casefold() for t in texts}) < len(texts)
            w = w.astype(np.float64)
            for name in self.totals:
                total, rows = ROLES[name].score(w, kinds, marks, texts)
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


def head_roles(words, roles: list[str] | None = None, average: str = "row") -> HeadRoles:
    """Score every head of ``words`` (:class:`~attnlab.maps.words.WordMaps`) for each role.

    ``average``: ``"row"`` (default: every row of every sentence weighs the same, as in Clark et
    al.) or ``"sentence"`` (every sentence weighs the same, whatever its length).
    """
    if not len(words):
        raise ValueError("words has no sentences; capture at least one")
    acc = RoleAccumulator(words.num_layers, words.num_heads, roles, average)
    acc.add(words)
    return acc.result(words.model_id, words.revision)
