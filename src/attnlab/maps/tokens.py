"""Token-level maps, as :func:`attnlab.capture` gives them, and their file (:mod:`attnlab.maps.files`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Iterable

import numpy as np

from attnlab.maps import files
from attnlab.maps.long import LongMaps
from attnlab.maps.records import Attention, Maps, Tokens
from attnlab.maps.words import WordMaps, to_words


@dataclass(frozen=True, kw_only=True)
class AttentionMaps(Maps):
    """Token-level maps, as :func:`attnlab.capture` gives them: every record over :class:`Tokens`,
    and the model's ``config``. ``tokens``, ``word_of``, ``words`` and ``kinds`` are the source's
    (``maps.source``); an encoder–decoder's target is ``maps.target``."""

    config: dict = field(default_factory=dict, repr=False)
    level: ClassVar[str] = "token"

    @property
    def tokens(self) -> list[list[str]]:
        return self.source.tokens

    @property
    def word_of(self) -> list[list[int]]:
        return self.source.word_of

    @property
    def words(self) -> list[list[str]]:
        return self.source.words

    @property
    def kinds(self) -> list[list[str]]:
        return self.source.kinds

    def to_words(self, marks: Iterable[str] | None = None) -> WordMaps:
        """Word-level maps (:class:`attnlab.maps.words.WordMaps`): to = sum, from = mean over pieces.
        ``marks``: None for special tokens + punctuation, or the words that count as marks."""
        return to_words(self, marks=marks)

    def astype(self, dtype: Any) -> AttentionMaps:
        """The same maps with every record's weights in ``dtype`` (float32 or float16), e.g. to halve a file."""
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float16):
            raise ValueError(f"dtype must be float32 or float16, got {dtype}")

        def cast(rec: Attention | None) -> Attention | None:
            return None if rec is None else rec.astype(dtype)

        return replace(self, self_attention=cast(self.self_attention), decoder=cast(self.decoder), cross=cast(self.cross))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the maps to ``path`` (``.npz`` is appended when missing); returns the path written
        (:mod:`attnlab.maps.files`). Saving and loading are lossless."""
        return files.write(self, self.config, path)


def load_maps(path: str | os.PathLike) -> AttentionMaps | LongMaps:
    """Read maps written by :meth:`AttentionMaps.save` (this version's format, or an older one's), or a
    long input's :class:`~attnlab.maps.long.LongMaps` (:meth:`LongMaps.save`, version 3)."""
    fields = files.read(path)
    if fields.pop("level", None) == "long":
        return LongMaps(**fields)
    return AttentionMaps(**fields)


def _pick(lists: list[list], slots: list[tuple[int, int]]) -> list:
    return [lists[p][r] for p, r in slots]


def _gather_tokens(parts: list[Tokens], slots: list[tuple[int, int]]) -> Tokens:
    return Tokens(tokens=_pick([p.tokens for p in parts], slots), word_of=_pick([p.word_of for p in parts], slots),
                  words=_pick([p.words for p in parts], slots), kinds=_pick([p.kinds for p in parts], slots))


def _gather_attention(parts: list[Attention], slots: list[tuple[int, int]], query_side: Tokens,
                      key_side: Tokens) -> Attention:
    """One record from batches' records; capture leaves out a batch's position bias where it is all
    zero, so a batch without one gets zeros beside batches with one."""
    first = parts[0]

    def pick(lists: list[list | None]) -> list | None:
        return None if lists[0] is None else _pick(lists, slots)

    bias = None
    if any(p.position_bias is not None for p in parts):
        bias = []
        for p, r in slots:
            got, q, k = parts[p].position_bias, parts[p].queries[r], parts[p].keys[r]
            bias.append(got[r] if got is not None else np.zeros((*q.shape[:3], k.shape[2]), dtype=q.dtype))
    return replace(first, weights=_pick([p.weights for p in parts], slots), query_side=query_side, key_side=key_side,
                   queries=pick([p.queries for p in parts]), keys=pick([p.keys for p in parts]), position_bias=bias,
                   sink_share=pick([p.sink_share for p in parts]))


def gather(parts: list[AttentionMaps], slots: list[tuple[int, int]]) -> AttentionMaps:
    """One AttentionMaps from batches: entry i of the result is entry ``slots[i] = (part, row)``."""
    first = parts[0]
    source = _gather_tokens([p.source for p in parts], slots)
    own = _gather_attention([p.self_attention for p in parts], slots, source, source)
    decoder = cross = None
    if first.is_seq2seq:
        target = _gather_tokens([p.target for p in parts], slots)
        decoder = _gather_attention([p.decoder for p in parts], slots, target, target)
        cross = _gather_attention([p.cross for p in parts], slots, target, source)
    return replace(first, sentences=_pick([p.sentences for p in parts], slots), self_attention=own, decoder=decoder,
                   cross=cross)
