"""One head of a model, named one way everywhere: :class:`Head`, a 0-based (layer, head) pair.

The index rule (docs/design.md, "Conventions → Layers and heads"): every Python argument, result
field, array, ``to_dict()``/JSON output and file that names a layer or head is 0-based, as NumPy
and TransformerLens index them; 1-based labels ("layer 3, head 11", "L3H11") appear only in text
for people: the CLI's flags and tables, the page's labels, and ``str()`` of a head. A ``Head`` is a
tuple, so it indexes an [L, H] array directly (``scores[head]``) and compares equal to the plain
(layer, head) tuple it stands for.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, NamedTuple

import numpy as np

_TEXT = re.compile(r"\s*L?(\d+)\s*[.H,:]\s*(\d+)\s*", re.IGNORECASE)


class Head(NamedTuple):
    """Head ``head`` of layer ``layer``, both 0-based. ``str()`` is the 1-based label "L3H11"."""

    layer: int
    head: int

    def __str__(self) -> str:
        return f"L{self.layer + 1}H{self.head + 1}"

    def label(self) -> str:
        """The 1-based label for a sentence: "layer 3, head 11"."""
        return f"layer {self.layer + 1}, head {self.head + 1}"

    def to_dict(self) -> dict:
        return {"layer": int(self.layer), "head": int(self.head)}

    def check(self, num_layers: int, num_heads: int, argument: str = "head") -> Head:
        """This head, if the model has it; ValueError naming ``argument`` otherwise."""
        if not 0 <= self.layer < num_layers or not 0 <= self.head < num_heads:
            raise ValueError(f"{argument} must be a 0-based (layer, head) with layer 0..{num_layers - 1} and head "
                             f"0..{num_heads - 1}, got {tuple(self)} ({self} in 1-based labels)")
        return self

    @classmethod
    def of(cls, value: Any, num_layers: int, num_heads: int, argument: str = "head") -> Head:
        """A Head from a Head or a 0-based (layer, head) pair of ints, checked against the model's
        ``num_layers`` and ``num_heads``; TypeError or ValueError naming ``argument`` otherwise."""
        if (not isinstance(value, (tuple, list)) or len(value) != 2
                or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in value)):
            raise TypeError(f"{argument} must be a Head or a 0-based (layer, head) pair of ints, got {value!r}")
        return cls(int(value[0]), int(value[1])).check(num_layers, num_heads, argument)

    @classmethod
    def parse(cls, text: str, argument: str = "head") -> Head:
        """A Head from a label for people, 1-based: "L3H11", "3.11" or "3,11" → Head(2, 10)."""
        m = _TEXT.fullmatch(text)
        if m is None or int(m[1]) < 1 or int(m[2]) < 1:
            raise ValueError(f"{argument} takes a 1-based layer.head like 3.11 or L3H11, got {text!r}")
        return cls(int(m[1]) - 1, int(m[2]) - 1)


def heads_of(values: Iterable[Any], num_layers: int, num_heads: int, argument: str = "heads") -> tuple[Head, ...]:
    """Heads from Heads or 0-based (layer, head) pairs, each checked as :meth:`Head.of` checks it
    (the message names ``argument[i]``); a head named twice is refused."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{argument} must be a list of Heads or 0-based (layer, head) pairs, got {values!r}")
    values = list(values)
    if len(values) == 2 and all(isinstance(x, (int, np.integer)) for x in values):
        raise TypeError(f"{argument} must be a list of heads; for one head give [{tuple(values)}], got {values!r}")
    heads = tuple(Head.of(v, num_layers, num_heads, f"{argument}[{i}]") for i, v in enumerate(values))
    for i, h in enumerate(heads):
        if h in heads[:i]:
            raise ValueError(f"{argument} names {h} ({tuple(h)}, 0-based) twice; name each head once")
    return heads


def check_layer(layer: Any, num_layers: int, argument: str = "layer") -> int:
    """A 0-based layer index of a model with ``num_layers`` layers; TypeError/ValueError naming ``argument``."""
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
        raise TypeError(f"{argument} must be a 0-based layer index (an int), got {layer!r}")
    if not 0 <= layer < num_layers:
        raise ValueError(f"{argument} must be a 0-based layer index in 0..{num_layers - 1}, got {layer}")
    return int(layer)


class ScoredHead(NamedTuple):
    """A head and its score: what a ranking of heads returns."""

    head: Head
    score: float

    def __str__(self) -> str:
        return f"{self.head} {self.score:.3g}"

    def to_dict(self, digits: int | None = None) -> dict:
        score = float(self.score) if digits is None else round(float(self.score), digits)
        return {**self.head.to_dict(), "score": score}


def ranked(scores: np.ndarray, at_least: float | None = None, n: int | None = None,
           by_size: bool = False) -> list[ScoredHead]:
    """The heads of ``scores`` [L, H], best first (ties in (layer, head) order): those scoring at
    least ``at_least`` when given, at most ``n`` of them when given. ``by_size``: largest |score|
    first, the sign kept (an effect that hurts as much as another helps ranks as high)."""
    scores = np.asarray(scores)
    order = np.argsort(-(np.abs(scores) if by_size else scores), axis=None, kind="stable")
    if at_least is not None:
        order = order[scores.flat[order] >= at_least]
    out = []
    for i in order[:n]:
        layer, head = divmod(int(i), scores.shape[1])
        out.append(ScoredHead(Head(layer, head), float(scores[layer, head])))
    return out
