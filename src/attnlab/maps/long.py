"""Maps of long inputs (the long view): per layer and head the queries, keys and each row's
log-sum-exp, never the T × T weights.

A full map holds L · H · T² weights: 8,192 tokens of a 4-layer, 4-head model are 4.3 GB in float32
before the model's own copies, and one 4,096-token forward of a 32 × 32 model 34 GB in 16 bits. A
:class:`LongMaps` holds what every weight is computed from instead, O(L · H · T · D):

    queries [L, H, T, D]      as the attention function received them (after rotary and norms)
    keys    [L, H_kv, T, D]   the same; grouped-query keys once per k/v head (query head h reads h // (H / H_kv))
    lse     [L, H, T]         each row's log-sum-exp of its scores (−inf: a row that sees nothing)
    layers                    per layer :class:`~attnlab.maps.records.LayerFacts`: scale, softcap, causal, window
    sink                      keys 0 .. sink − 1 are seen by every row that may see them causally (StreamingLLM)
    sink_logits [L, H]        learned sinks (gpt-oss): a logit per head in every row's softmax, with no value; the
                              LSE includes it, so a row's weights add up to 1 − exp(sink − lse) (None: none)
    length                    the real tokens: keys (and queries) at and past it are padding

so that weight_ij = exp(softcap(scale · q_i·k_j) − lse_i) where key j is visible to query i, else 0.
The computations (a tile, a row, a column, the pooled overview) are
:mod:`attnlab.analysis.longview`'s, which may call ``attnlab.attention``; this module is the data,
the memory estimates every path checks before it would hold T × T weights, and the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from attnlab.maps.records import LayerFacts, Tokens

LONG_VIEW_TOKENS = 1024  # above this many tokens `attnlab maps` and the viewer take the long view by themselves
MAX_MAP_BYTES = 2 * 2**30  # what a full capture may hold at its peak before it is refused (2 GiB)
MAX_LONG_BYTES = 8 * 2**30  # what a long view's q, k and LSEs may hold (32,768 tokens of 32 × 32 heads of 128: 34 GB)
WEIGHT_BYTES = 4  # float32


def full_capture_bytes(num_layers: int, num_heads: int, tokens: int, sentences: int = 1) -> int:
    """Bytes a full capture of ``sentences`` sequences of ``tokens`` holds at its peak: the model
    returns every layer's weights (L · H · T² floats per sequence) and the capture copies them into
    the maps (as many again), while one layer's attention builds its scores, weights and mask (about
    three more layers' worth of one layer's heads). Counted in float32, as captured."""
    per_sequence = (2 * num_layers + 3) * num_heads * tokens * tokens * WEIGHT_BYTES
    return int(per_sequence * sentences)


def long_capture_bytes(num_layers: int, num_heads: int, num_kv_heads: int, head_dim: int, tokens: int) -> int:
    """Bytes of one :class:`LongMaps`: queries, keys and the rows' LSE, float32."""
    return int((num_layers * (num_heads + num_kv_heads) * head_dim + num_layers * num_heads) * tokens * WEIGHT_BYTES)


def size_text(n: int) -> str:
    """Bytes for people: '4.3 GB', '512 MB', '12 kB' (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class MapTooLarge(ValueError):
    """A full map that would not fit: ``needed`` bytes against a limit of ``limit`` (a ValueError, so the CLI
    says it in one line and the server answers 400)."""

    def __init__(self, what: str, needed: int, limit: int, instead: str) -> None:
        super().__init__(self.said(what, needed, limit, instead))
        self.what, self.needed, self.limit = what, needed, limit

    @staticmethod
    def said(what: str, needed: int, limit: int, instead: str) -> str:
        return (f"{what} would hold about {size_text(needed)} of T × T attention weights, over the limit of "
                f"{size_text(limit)}; {instead}")


def check_full(what: str, num_layers: int, num_heads: int, tokens: int, sentences: int = 1,
               max_bytes: int | None = MAX_MAP_BYTES, instead: str = "") -> int:
    """The bytes of a full capture (:func:`full_capture_bytes`), or :class:`MapTooLarge` naming them
    when they pass ``max_bytes`` (None: no limit), before anything is allocated."""
    needed = full_capture_bytes(num_layers, num_heads, tokens, sentences)
    if max_bytes is not None and needed > max_bytes:
        raise MapTooLarge(what, needed, max_bytes, instead or "take the long view (attnlab.capture_long), which "
                          "keeps queries, keys and each row's log-sum-exp and computes any tile exactly")
    return needed


def _check(name: str, x: np.ndarray, shape: tuple, axes: str) -> None:
    if x.ndim != len(shape) or any(w is not None and g != w for g, w in zip(x.shape, shape)):
        raise ValueError(f"LongMaps.{name} has shape {x.shape}, expected {tuple('?' if w is None else w for w in shape)} "
                         f"({axes})")


@dataclass(frozen=True, kw_only=True)
class LongMaps:
    """One sequence's attention as queries, keys and row LSEs (module docstring). ``side``: its
    tokens (one sentence of :class:`Tokens`); ``sentence`` the text."""

    sentence: str
    side: Tokens = field(repr=False)
    queries: np.ndarray = field(repr=False)
    keys: np.ndarray = field(repr=False)
    lse: np.ndarray = field(repr=False)
    layers: tuple[LayerFacts, ...] = field(repr=False)
    model_id: str
    revision: str | None
    config: dict = field(default_factory=dict, repr=False)
    sink: int = 0
    length: int | None = None
    sink_logits: np.ndarray | None = field(default=None, repr=False)
    level: ClassVar[str] = "long"

    def __post_init__(self) -> None:
        lyr, h, t, d = self.queries.shape if self.queries.ndim == 4 else (None,) * 4
        _check("queries", self.queries, (None, None, None, None), "L, H, T, D")
        _check("keys", self.keys, (lyr, None, t, d), "L, H_kv, T, D")
        _check("lse", self.lse, (lyr, h, t), "L, H, T")
        if h % self.keys.shape[1]:
            raise ValueError(f"LongMaps: {h} query heads do not share {self.keys.shape[1]} k/v heads evenly")
        object.__setattr__(self, "layers", tuple(self.layers))
        if len(self.layers) != lyr:
            raise ValueError(f"LongMaps.layers has {len(self.layers)} entries, expected {lyr} (one per layer)")
        if self.length is not None and not 1 <= self.length <= t:
            raise ValueError(f"LongMaps.length must be 1..{t} (the real tokens), got {self.length}")
        if len(self.side) != 1 or len(self.side.tokens[0]) != self.num_tokens:
            raise ValueError(f"LongMaps.side must hold one sentence of {self.num_tokens} tokens")
        if self.sink < 0:
            raise ValueError(f"LongMaps.sink must be >= 0, got {self.sink}")
        if self.sink_logits is not None:
            _check("sink_logits", self.sink_logits, (lyr, h), "L, H")

    @property
    def num_layers(self) -> int:
        return int(self.queries.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.queries.shape[1])

    @property
    def num_kv_heads(self) -> int:
        return int(self.keys.shape[1])

    @property
    def num_tokens(self) -> int:
        """The map's side, T (the real tokens; the arrays may be longer, padded)."""
        return int(self.queries.shape[2] if self.length is None else self.length)

    @property
    def nbytes(self) -> int:
        sinks = 0 if self.sink_logits is None else self.sink_logits.nbytes
        return int(self.queries.nbytes + self.keys.nbytes + self.lse.nbytes + sinks)

    @property
    def full_bytes(self) -> int:
        """Bytes its full map would take as captured maps: L · H · T² float32."""
        return self.num_layers * self.num_heads * self.num_tokens ** 2 * WEIGHT_BYTES

    def __len__(self) -> int:
        return 1  # one sentence

    @property
    def sentences(self) -> list[str]:
        return [self.sentence]

    @property
    def weights(self) -> list:
        """Refused: what reads a full map (roles, the head search, rollout, flow, word level, the full
        viewer) refuses a long input's maps by this one reason."""
        raise TypeError(f"a long input's maps hold no weights (its full map would take {size_text(self.full_bytes)}); "
                        f"attnlab.analysis.longview computes a tile, a row, a column or an overview from them, and "
                        f"analyses of the full map (roles, head search, rollout, flow) need attnlab.capture of a "
                        f"shorter text")

    def to_words(self, marks: Any = None) -> Any:
        """Refused as :attr:`weights`: word-level maps sum and average whole rows of the full map."""
        return self.weights

    def labels(self, i: int = 0) -> list[str]:
        return self.side.labels(i)

    def marks(self, i: int = 0) -> list[bool]:
        return self.side.marks(i)

    def save(self, path: str | os.PathLike) -> Path:
        """Write to ``path`` (``.npz`` appended when missing): the maps file, version 3 (:mod:`attnlab.maps.files`)."""
        from attnlab.maps import files

        return files.write_long(self, path)

    def to_fields(self) -> dict[str, Any]:
        """What the file's header keeps besides the arrays."""
        return {"sentence": self.sentence, "model_id": self.model_id, "revision": self.revision,
                "config": self.config, "sink": self.sink, "length": self.length,
                "layers": [f.to_dict() for f in self.layers]}
