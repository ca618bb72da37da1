"""Heads by role: a registry of named scores per layer and head (Clark et al. 2019, §3).

Each role is a small function of one sentence's word maps that returns the sum of a per-row
quantity over the rows where it is defined, and how many rows that was; a role's score for a head
is that total over all sentences divided by the row count, so scores over a corpus can be
accumulated batch by batch (:mod:`attnlab.analysis.corpus`). Each role has a threshold, a named
constant: a head "has" the role when its score passes it.

    prev    weight on the previous word           next   weight on the next word
    self    weight on the word itself              cls    weight on the opening special token
    sep     weight on the other special tokens     punct  weight on punctuation
    marks   weight on all marks                    broad  mean row entropy, nats
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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
ENTROPY_EPS = 1e-10  # Clark et al.'s smoothing: −Σ p log(p + ε), so p = 0 adds nothing

# One sentence: (weights [L, H, W, W], word kinds, mark flags) → (row total [L, H], number of rows)
Scorer = Callable[[np.ndarray, list[str], list[bool]], tuple[np.ndarray, int]]


@dataclass(frozen=True)
class Role:
    name: str
    description: str
    score: Scorer
    threshold: float
    unit: str = "weight"  # "weight" (0..1) or "nats"


def _diagonal(w: np.ndarray, offset: int) -> tuple[np.ndarray, int]:
    d = np.diagonal(w, offset=offset, axis1=-2, axis2=-1)  # (L, H, W − |offset|)
    return d.sum(axis=-1), d.shape[-1]


def _to_columns(w: np.ndarray, columns: list[bool]) -> tuple[np.ndarray, int]:
    return w[..., np.asarray(columns, dtype=bool)].sum(axis=(-1, -2)), w.shape[-2]


def _prev(w, kinds, marks):
    return _diagonal(w, -1)  # row i, column i − 1


def _next(w, kinds, marks):
    return _diagonal(w, 1)


def _self(w, kinds, marks):
    return _diagonal(w, 0)


def _cls(w, kinds, marks):
    return _to_columns(w, [k == "cls" for k in kinds])


def _sep(w, kinds, marks):
    return _to_columns(w, [k == "sep" for k in kinds])


def _punct(w, kinds, marks):
    return _to_columns(w, [k == "punct" for k in kinds])


def _marks(w, kinds, marks):
    return _to_columns(w, marks)


def _broad(w, kinds, marks):
    entropy = -(w * np.log(w + ENTROPY_EPS)).sum(axis=-1)  # (L, H, W)
    return entropy.sum(axis=-1), w.shape[-2]


ROLES: dict[str, Role] = {
    r.name: r
    for r in (
        Role("prev", "previous word", _prev, PREV_THRESHOLD),
        Role("next", "next word", _next, NEXT_THRESHOLD),
        Role("self", "the word itself", _self, SELF_THRESHOLD),
        Role("cls", "[CLS] / <s>", _cls, CLS_THRESHOLD),
        Role("sep", "[SEP] / </s>", _sep, SEP_THRESHOLD),
        Role("punct", "punctuation", _punct, PUNCT_THRESHOLD),
        Role("marks", "marks (special + punct.)", _marks, MARKS_THRESHOLD),
        Role("broad", "everything: row entropy", _broad, BROAD_THRESHOLD_NATS, unit="nats"),
    )
}


@dataclass(frozen=True)
class HeadRoles:
    """Role scores per head: ``scores[role]`` is [L, H], averaged over every row of every sentence."""

    scores: dict[str, np.ndarray]
    num_sentences: int
    model_id: str
    revision: str | None

    @property
    def num_layers(self) -> int:
        return next(iter(self.scores.values())).shape[0]

    @property
    def num_heads(self) -> int:
        return next(iter(self.scores.values())).shape[1]

    def _role(self, role: str) -> Role:
        if role not in self.scores:
            raise LookupError(f"role {role!r} is unknown; roles: {', '.join(self.scores)}")
        return ROLES[role]

    def top(self, role: str) -> tuple[int, int, float]:
        """The head with the largest score for ``role``: (layer0, head0, score), 0-based."""
        self._role(role)
        s = self.scores[role]
        layer, head = np.unravel_index(int(np.argmax(s)), s.shape)
        return int(layer), int(head), float(s[layer, head])

    def heads(self, role: str) -> list[tuple[int, int]]:
        """Heads (layer0, head0) whose score reaches the role's threshold, best first."""
        r = self._role(role)
        s = self.scores[role]
        found = [(int(l), int(h)) for l, h in zip(*np.nonzero(s >= r.threshold))]
        return sorted(found, key=lambda lh: -s[lh])

    def to_dict(self) -> dict:
        """JSON-ready; layers and heads in ``top`` are 1-based, as printed."""
        roles = {}
        for name, s in self.scores.items():
            layer, head, score = self.top(name)
            r = ROLES[name]
            roles[name] = {
                "description": r.description, "unit": r.unit, "threshold": r.threshold,
                "top": {"layer": layer + 1, "head": head + 1, "score": score},
                "heads_over_threshold": len(self.heads(name)),
                "scores": np.round(s, 6).tolist(),
            }
        return {
            "model_id": self.model_id, "revision": self.revision, "num_sentences": self.num_sentences,
            "num_layers": self.num_layers, "num_heads": self.num_heads, "roles": roles,
        }


class RoleAccumulator:
    """Running totals of every role over sentences, for corpora streamed batch by batch."""

    def __init__(self, num_layers: int, num_heads: int, roles: list[str] | None = None) -> None:
        names = list(ROLES) if roles is None else roles
        for name in names:
            if name not in ROLES:
                raise LookupError(f"role {name!r} is unknown; roles: {', '.join(ROLES)}")
        self.totals = {n: np.zeros((num_layers, num_heads)) for n in names}
        self.rows = {n: 0 for n in names}
        self.sentences = 0

    def add(self, words) -> None:
        """Add every sentence of a :class:`~attnlab.models.words.WordMaps`."""
        for w, kinds, marks in zip(words.weights, words.kinds, words.is_mark):
            w = w.astype(np.float64)
            for name in self.totals:
                total, rows = ROLES[name].score(w, kinds, marks)
                self.totals[name] += total
                self.rows[name] += rows
            self.sentences += 1

    def result(self, model_id: str, revision: str | None) -> HeadRoles:
        scores = {n: self.totals[n] / max(self.rows[n], 1) for n in self.totals}
        return HeadRoles(scores=scores, num_sentences=self.sentences, model_id=model_id, revision=revision)


def head_roles(words, roles: list[str] | None = None) -> HeadRoles:
    """Score every head of ``words`` (:class:`~attnlab.models.words.WordMaps`) for each role."""
    if not len(words):
        raise ValueError("words has no sentences; capture at least one")
    acc = RoleAccumulator(words.num_layers, words.num_heads, roles)
    acc.add(words)
    return acc.result(words.model_id, words.revision)
