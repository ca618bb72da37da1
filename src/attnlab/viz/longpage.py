"""The long view as one self-contained page: every head's pooled overview and every row's top keys,
precomputed, for inputs of up to :data:`MAX_PAGE_TOKENS` tokens.

The page (``static/long.html`` and ``long.js``, the same files ``attnlab serve`` serves at ``/long``)
shows the grid of every head's overview, one head's overview large, a token's top keys and a reading
view shaded by them. Served, it asks the server for exact tiles, whole rows and columns; offline
those need every weight and are not in the file (the page says so).

Sizes: the overviews are :data:`PAGE_CELLS` cells a side (mean and max), each row keeps its
:data:`PAGE_TOP` largest weights, all as float16 (keys as uint16), base64: about
L·H·(4·cells² + 4·T·k)·4/3 bytes, 11 MB for 16 heads at 8,192 tokens, 45 MB for 64 heads.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from attnlab.maps.long import LongMaps
from attnlab.viz.page import render_page, write_page

MAX_PAGE_TOKENS = 8192
PAGE_CELLS = 256
PAGE_TOP = 8


def _b64(x: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(x, dtype=dtype).tobytes()).decode("ascii")


def page_bytes(num_layers: int, num_heads: int, tokens: int, cells: int = PAGE_CELLS, top: int = PAGE_TOP) -> int:
    """About what the page's data take: float16 overviews (mean, max) and top keys, base64."""
    n = min(cells, tokens)
    return int(num_layers * num_heads * (2 * 2 * n * n + tokens * top * 4) * 4 / 3)


def long_page_data(lm: LongMaps, cells: int = PAGE_CELLS, top: int = PAGE_TOP,
                   progress: Callable[[int, int], None] | None = None) -> dict:
    """What the offline page embeds: tokens, marks, and per head [layer][head] its overview (``mean``,
    ``max``: float16 [cells, cells]) and its rows' top keys (``keys``: uint16 [T, top], ``weights``:
    float16 [T, top]), each base64, little-endian, row-major."""
    from attnlab.analysis.longview import overview

    if lm.num_tokens > MAX_PAGE_TOKENS:
        raise ValueError(f"the self-contained long page takes up to {MAX_PAGE_TOKENS} tokens, got {lm.num_tokens}: "
                         f"serve it instead (attnlab serve, then /long), where tiles and rows are computed on request")
    heads: list[list[dict]] = []
    done, total = 0, lm.num_layers * lm.num_heads
    for layer in range(lm.num_layers):
        heads.append([])
        for head in range(lm.num_heads):
            ov = overview(lm, layer, head, cells, top=top)
            heads[-1].append({"mean": _b64(ov.mean, "<f2"), "max": _b64(ov.max, "<f2"),
                              "keys": _b64(ov.top_keys, "<u2"), "weights": _b64(ov.top_weights, "<f2")})
            done += 1
            if progress is not None:
                progress(done, total)
    return {"mode": "offline", "model": {"id": lm.model_id, "revision": lm.revision, "num_layers": lm.num_layers,
                                         "num_heads": lm.num_heads},
            "tokens": lm.labels(), "is_mark": lm.marks(), "num_tokens": lm.num_tokens, "held_bytes": lm.nbytes,
            "full_bytes": lm.full_bytes, "block": ov.block, "cells": ov.cells, "top": min(top, lm.num_tokens),
            "encoding": "base64 little-endian: mean, max, weights float16; keys uint16", "heads": heads}


def long_html(lm: LongMaps, **kw: Any) -> str:
    """The self-contained long page of ``lm`` (:func:`long_page_data`'s keywords)."""
    return render_page(long_page_data(lm, **kw), title=f"attnlab · {lm.model_id} · long view of {lm.num_tokens} tokens",
                       page_file="long.html")


def write_long_html(lm: LongMaps, path: str | os.PathLike, **kw: Any) -> Path:
    """Write :func:`long_html` to ``path`` (``.html`` appended when it has no suffix); returns the path."""
    return write_page(long_html(lm, **kw), path)
