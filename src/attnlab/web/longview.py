"""The long view served: a long text's overview, tiles, rows and columns, computed on request.

The text's :class:`~attnlab.maps.long.LongMaps` (queries, keys and row LSEs, never T × T) is captured
once on a worker and kept in the viewer's cache; every answer is then computed by
:mod:`attnlab.analysis.longview`, exactly, on the same workers and under the same overload rule
(503 with Retry-After when the queue is full) as every other model call. A request outside the map
(a tile past its edge, a row past its last token) or larger than :data:`MAX_TILE` is a 400 that says
the map's size; a long text sent to the full-map endpoints gets the bytes its map would take
(:class:`~attnlab.maps.long.MapTooLarge`) and is pointed here.

Pooled overviews travel as base64 of little-endian float32 (exact, a third of JSON's size): the
page decodes them into ``Float32Array`` s.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from attnlab.analysis import longview
from attnlab.maps.long import LongMaps, size_text

LONG_MAX_CHARS = 262_144  # per text of the long view: room for 32,768 tokens at up to 8 characters each
MAX_TILE = 512  # side of the largest tile served at full resolution (262,144 weights)
MAX_TOP = 100  # a row's top keys, at most
SERVER_LONG_BYTES = 4 * 2**30  # the long views' queries and keys the server holds, one text or several (32,768 tokens of 8 × 8 heads of 64: 0.7 GB)


def floats(x: np.ndarray) -> str:
    """A float array as base64 of its little-endian float32 bytes, row-major."""
    return base64.b64encode(np.ascontiguousarray(x, dtype="<f4").tobytes()).decode("ascii")


def long_maps(cache: Any, text: str) -> LongMaps:
    """The text's LongMaps, captured once and kept in ``cache`` (a :class:`~attnlab.web.work.MapsCache`)."""
    return cache.get_long(text, SERVER_LONG_BYTES)


def info(lm: LongMaps) -> dict:
    """What the page needs before any weight: tokens, marks, counts, and what the full map would take."""
    return {"model": {"id": lm.model_id, "revision": lm.revision, "num_layers": lm.num_layers,
                      "num_heads": lm.num_heads}, "tokens": lm.labels(), "is_mark": lm.marks(),
            "num_tokens": lm.num_tokens, "held_bytes": lm.nbytes, "full_bytes": lm.full_bytes,
            "full_size": size_text(lm.full_bytes), "max_tile": MAX_TILE}


def overview(lm: LongMaps, layer: int, head: int, cells: int) -> dict:
    """The pooled map; ``sink_share`` (learned sinks only, else null): each row of cells' mean mass on the sink."""
    ov = longview.overview(lm, layer, head, cells)
    return {"layer": layer, "head": head, "block": ov.block, "cells": ov.cells, "num_tokens": ov.tokens,
            "mean": floats(ov.mean), "max": floats(ov.max), "encoding": "base64 float32, row-major",
            "sink_share": None if ov.sink_share is None else floats(ov.sink_share)}


def tile(lm: LongMaps, layer: int, head: int, rows: list[int], cols: list[int]) -> dict:
    for name, (a, b) in (("rows", rows), ("cols", cols)):
        if b - a > MAX_TILE:
            raise ValueError(f"{name} ({a}, {b}) spans {b - a} tokens; a tile is at most {MAX_TILE} × {MAX_TILE} "
                             f"at full resolution (the overview shows the whole map of {lm.num_tokens})")
    w = longview.weights(lm, layer, head, rows, cols)
    return {"layer": layer, "head": head, "rows": list(rows), "cols": list(cols), "weights": floats(w),
            "encoding": "base64 float32, row-major"}


def row(lm: LongMaps, layer: int, head: int, query: int, top: int) -> dict:
    """The query's whole row and top keys; ``sink_share`` (learned sinks only, else null): its mass on the sink,
    so that its weights add up to 1 minus it."""
    w = longview.row(lm, layer, head, query)
    labels = lm.labels()
    share = longview.sink_share(lm, layer, head)
    return {"layer": layer, "head": head, "query": query, "weights": floats(w),
            "sink_share": None if share is None else float(share[query]),
            "top": [{"key": j, "token": labels[j], "weight": float(x)} for j, x in longview.top_keys(lm, layer, head,
                                                                                                      query, top)]}


def column(lm: LongMaps, layer: int, head: int, key: int) -> dict:
    return {"layer": layer, "head": head, "key": key, "weights": floats(longview.column(lm, layer, head, key))}
