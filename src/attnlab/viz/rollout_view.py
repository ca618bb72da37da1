"""The viewer's Rollout view: attention rollout and attention flow (:mod:`attnlab.analysis.rollout`)
of the sentences on show, for the local server's answer (one layer at a time, any residual) and the
self-contained page's data (every sentence, at :data:`PAGE_RESIDUAL`).

Rows are the position whose rolled-out attention is read (the word or token attending), columns
where it comes from, as in the head view; ``layer`` is 0-based, as every field: layer l is rollout
(or flow) through layers 0..l (the page labels it l + 1, "through layers 1..l + 1"). An
encoder–decoder's rollout is that of its encoder (the maps' own weights).

Flow costs T² maximum-flow problems per layer over a graph of (l + 1)·T nodes and l·T² edges, so
its time grows faster than T⁴: the viewer offers it up to :data:`FLOW_MAX_POSITIONS` positions,
well below the library's own :data:`attnlab.analysis.rollout.MAX_FLOW_TOKENS`, so that a request
never holds the server's worker for long.
A page embeds flow through all layers only (the library's default, ``attnlab rollout --flow``), so
that writing one costs one flow per sentence; the server computes it at any layer, on request.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.analysis.rollout import DEFAULT_RESIDUAL, flow_one, rollout_one
from attnlab.maps.records import Maps
from attnlab.viz.payload import pack_weights

METHODS = ("rollout", "flow")
PAGE_RESIDUAL = DEFAULT_RESIDUAL  # what a page embeds; the server takes any residual in [0, 1)
FLOW_MAX_POSITIONS = 32  # the viewer's flow limit: flow in well under a second (see the module's docstring)
NO_SOLVER = "attention flow needs scipy, which is not installed (pip install 'attnlab[models]')"


@dataclass(frozen=True)
class Rolled:
    """One sentence's rollout at one residual, ``weights[0]`` [L, T, T] (or one layer of its flow,
    [T, T]), as the server's MapsCache keeps it: the cache counts the bytes of ``weights``."""

    weights: list[np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(int(w.nbytes) for w in self.weights)


def flow_refusal(positions: int, sentence: int, unit: str) -> str | None:
    """Why flow is not offered for a sentence of ``positions`` ``unit``s (0-based ``sentence``), or None."""
    if importlib.util.find_spec("scipy") is None:  # flow's solver, in the extra `models`
        return NO_SOLVER
    if positions <= FLOW_MAX_POSITIONS:
        return None
    return (f"attention flow solves {positions}² maximum-flow problems per layer; the viewer offers it up to "
            f"{FLOW_MAX_POSITIONS} positions and sentence {sentence + 1} has {positions} {unit}s "
            f"(rollout serves any length; `attnlab rollout --flow` takes up to the library's limit)")


def check_request(maps: Maps, sentence: int, layer: int, residual: float, method: str) -> None:
    """ValueError, naming the argument, for a sentence or layer out of range, a residual outside
    [0, 1), an unknown method, or flow of a sentence longer than :data:`FLOW_MAX_POSITIONS`."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    if isinstance(residual, bool) or not isinstance(residual, (int, float)) or not 0 <= residual < 1:
        raise ValueError(f"residual must be a number in [0, 1), got {residual!r}")
    if not 0 <= sentence < len(maps.weights):
        raise ValueError(f"sentence must be 0..{len(maps.weights) - 1}, got {sentence}")
    if not 0 <= layer < maps.num_layers:
        raise ValueError(f"layer must be 0..{maps.num_layers - 1} (0-based: rollout through layers 0..layer), got {layer}")
    if method == "flow":
        why = flow_refusal(maps.weights[sentence].shape[-1], sentence, maps.level)
        if why is not None:
            raise ValueError(why)


def _answer(maps: Maps, sentence: int, weights: np.ndarray) -> dict:
    t = maps.weights[sentence].shape[-1]
    return {"labels": maps.labels(sentence), "weights": weights, "num_layers": int(maps.num_layers),
            "flow_max_positions": FLOW_MAX_POSITIONS, "flow_refusal": flow_refusal(t, sentence, maps.level)}


def rollout_layer(maps: Maps, sentence: int, layer: int, residual: float = DEFAULT_RESIDUAL,
                  method: str = "rollout") -> dict:
    """One layer of the rollout or flow of one sentence: ``labels`` (rows and columns alike),
    ``weights`` [T, T] (row i: where position i's input comes from after layers 0..``layer``,
    0-based), ``num_layers``, ``flow_max_positions`` and ``flow_refusal`` (why flow is not offered for
    this sentence, or None). ValueError as :func:`check_request` says."""
    check_request(maps, sentence, layer, residual, method)
    w = maps.weights[sentence]
    return _answer(maps, sentence, flow_one(w, residual, layer) if method == "flow"
                   else rollout_one(w, residual)[layer])


def served_rollout(cache: Any, maps: Maps, key: tuple, sentence: int, layer: int, residual: float,
                   method: str) -> dict:
    """:func:`rollout_layer` for the server: the sentence's rollout [L, T, T] at ``residual``, and
    each layer of flow, kept in ``cache`` (the server's :class:`~attnlab.web.work.MapsCache`) under
    ``key`` (what names the maps: sentences and level), so that moving the layer or coming back to
    a flow recomputes nothing. ValueError as :func:`check_request` says."""
    check_request(maps, sentence, layer, residual, method)
    w, residual = maps.weights[sentence], float(residual)
    if method == "flow":
        flowed = cache.computed(("flow", *key, sentence, residual, layer),
                                lambda: Rolled([flow_one(w, residual, layer)]))  # [T, T]
        return _answer(maps, sentence, flowed.weights[0])
    rolled = cache.computed(("rollout", *key, sentence, residual), lambda: Rolled([rollout_one(w, residual)]))  # [L, T, T]
    return _answer(maps, sentence, rolled.weights[0][layer])


def page_rollout(maps: Maps) -> dict:
    """The self-contained page's Rollout data: per sentence the rollout through every layer at
    :data:`PAGE_RESIDUAL` ([L, T, T], packed as :func:`attnlab.viz.payload.pack_weights` packs maps),
    and the flow through all layers ([T, T], packed) where the sentence has at most
    :data:`FLOW_MAX_POSITIONS` positions, else None and ``flow_refusal`` says why."""
    unit = maps.level
    sentences = []
    for i, w in enumerate(maps.weights):
        why = flow_refusal(w.shape[-1], i, unit)
        sentences.append({
            "positions": int(w.shape[-1]),
            "rollout": pack_weights(rollout_one(w, PAGE_RESIDUAL)),
            "flow": None if why else pack_weights(flow_one(w, PAGE_RESIDUAL)),
            "flow_refusal": why,
        })
    return {"residual": PAGE_RESIDUAL, "num_layers": int(maps.num_layers), "flow_max_positions": FLOW_MAX_POSITIONS,
            "flow_layer": int(maps.num_layers) - 1, "sentences": sentences}  # 0-based: flow through every layer
