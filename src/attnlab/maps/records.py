"""Captured attention maps, and their one file format.

A file is a NumPy ``.npz`` archive read with ``allow_pickle=False``: one array ``weights_<i>`` of
shape [L, H, T, T] per sentence (float32 or float16, exactly as captured or converted) and one
``header`` array holding UTF-8 JSON with everything else (format name and version, model id,
revision, config, sentences, tokens, token-to-word index, words and their kinds). Optional parts
add arrays of their own: ``queries_<i>`` and ``keys_<i>`` [L, H, T, D] (``qk=True``, with
``position_bias_<i>`` [L, H, T, T] where the model adds one), and for an encoder–decoder
``cross_<i>`` [L_dec, H, T_target, T_source], the decoder's maps under the prefix ``decoder.``
(its header under the header's ``decoder`` key) and with ``qk=True`` ``cross_queries_<i>``,
``cross_keys_<i>`` and ``cross_position_bias_<i>`` (their meta under ``cross_qk_meta``). Saving and
loading are lossless: the arrays come back bit for bit, the rest equal.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

FORMAT = "attnlab.maps"
FORMAT_VERSION = 1
WORD_KINDS = ("cls", "sep", "punct", "word")  # cls: the special token that opens a sequence; sep: any other


Sentence = str | tuple[str, str]


@dataclass(frozen=True)
class AttentionMaps:
    """Post-softmax attention of every layer and head, one entry per sentence.

    ``weights[i]`` is [L, H, T, T] for the T tokens of sentence i (no padding); row = the token
    attending, column = the token attended to. ``word_of[i][t]`` is the word that token t belongs to;
    ``words[i]`` and ``kinds[i]`` describe those words (special tokens are words of their own, of
    kind ``cls`` or ``sep``; ``punct`` words are punctuation only).

    With ``capture(..., qk=True)``: ``queries[i]`` and ``keys[i]`` [L, H, T, D], ``qk_meta`` (per
    layer ``scale``, ``softcap``, ``causal``, ``window``) and ``position_bias[i]`` [L, H, T, T], the
    bias the model adds to the scores (T5's relative position bias; None where it adds none), so
    that softmax(softcap(q·kᵀ·scale) + bias + mask) gives ``weights[i]``. An encoder–decoder's
    ``decoder`` holds the same for its self-attention, and ``cross_queries[i]`` [L_dec, H, T_target, D],
    ``cross_keys[i]`` [L_dec, H, T_source, D], ``cross_position_bias`` and ``cross_qk_meta`` those
    of its cross-attention.
    """

    sentences: list[Sentence]
    tokens: list[list[str]]
    weights: list[np.ndarray] = field(repr=False)
    word_of: list[list[int]] = field(repr=False)
    words: list[list[str]] = field(repr=False)
    kinds: list[list[str]] = field(repr=False)
    model_id: str
    revision: str | None
    num_layers: int
    num_heads: int
    config: dict = field(default_factory=dict, repr=False)
    decoder: AttentionMaps | None = field(default=None, repr=False)
    cross_weights: list[np.ndarray] | None = field(default=None, repr=False)
    queries: list[np.ndarray] | None = field(default=None, repr=False)
    keys: list[np.ndarray] | None = field(default=None, repr=False)
    qk_meta: dict | None = field(default=None, repr=False)
    position_bias: list[np.ndarray] | None = field(default=None, repr=False)
    cross_queries: list[np.ndarray] | None = field(default=None, repr=False)
    cross_keys: list[np.ndarray] | None = field(default=None, repr=False)
    cross_position_bias: list[np.ndarray] | None = field(default=None, repr=False)
    cross_qk_meta: dict | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = len(self.sentences)
        for name in ("tokens", "weights", "word_of", "words", "kinds"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"AttentionMaps.{name} has {len(getattr(self, name))} entries, expected {n} (one per sentence)")
        for i, (toks, w) in enumerate(zip(self.tokens, self.weights)):
            t = len(toks)
            if w.shape != (self.num_layers, self.num_heads, t, t):
                raise ValueError(
                    f"AttentionMaps.weights[{i}] has shape {w.shape}, expected "
                    f"{(self.num_layers, self.num_heads, t, t)} (L, H, T, T)"
                )
        if (self.decoder is None) != (self.cross_weights is None):
            raise ValueError("AttentionMaps.decoder and cross_weights come together (an encoder–decoder) or not at all")
        if self.decoder is not None:
            for i, c in enumerate(self.cross_weights):
                want = (self.decoder.num_layers, self.decoder.num_heads, len(self.decoder.tokens[i]), len(self.tokens[i]))
                if c.shape != want:
                    raise ValueError(f"AttentionMaps.cross_weights[{i}] has shape {c.shape}, expected {want} "
                                     f"(L_dec, H, T_target, T_source)")
        rows = [len(t) for t in self.tokens]
        self._check_qk("", self.num_layers, self.num_heads, rows, rows)
        if (self.cross_queries is not None) and self.decoder is None:
            raise ValueError("AttentionMaps.cross_queries needs an encoder–decoder's maps (decoder and cross_weights)")
        if self.decoder is not None:
            self._check_qk("cross_", self.decoder.num_layers, self.decoder.num_heads,
                           [len(t) for t in self.decoder.tokens], rows)

    def _check_qk(self, prefix: str, num_layers: int, num_heads: int, tq: list[int], tk: list[int]) -> None:
        """queries [L, H, Tq, D], keys [L, H, Tk, D], position_bias [L, H, Tq, Tk] under ``prefix``, or none."""
        queries, keys, bias = (getattr(self, f"{prefix}{n}") for n in ("queries", "keys", "position_bias"))
        if (queries is None) != (keys is None) or (queries is None and bias is not None):
            raise ValueError(f"AttentionMaps.{prefix}queries and {prefix}keys come together, and "
                             f"{prefix}position_bias only with them")
        for name, lengths in (("queries", tq), ("keys", tk), ("position_bias", tq)):
            for i, x in enumerate(getattr(self, f"{prefix}{name}") or ()):
                want, last = (num_layers, num_heads, lengths[i]), tk[i] if name == "position_bias" else "D"
                if x.ndim != 4 or x.shape[:3] != want or (name == "position_bias" and x.shape[3] != tk[i]):
                    raise ValueError(f"AttentionMaps.{prefix}{name}[{i}] has shape {x.shape}, expected {want} + "
                                     f"({last},) (L, H, {'Tq, Tk' if name == 'position_bias' else 'T, D'})")

    @property
    def is_seq2seq(self) -> bool:
        """True for an encoder–decoder's maps (``decoder`` and ``cross_weights`` are set)."""
        return self.decoder is not None

    def __len__(self) -> int:
        return len(self.sentences)

    def _repr_html_(self) -> str | None:
        """In a notebook: the viewer (head view first) as a self-contained, offline frame
        (:mod:`attnlab.maps.display`: registered by ``import attnlab``)."""
        from attnlab.maps import display

        return display.html(self)

    def to_words(self, marks: Iterable[str] | None = None):
        """Word-level maps (:class:`attnlab.maps.words.WordMaps`): to = sum, from = mean over pieces."""
        from attnlab.maps.words import to_words

        return to_words(self, marks=marks)

    def astype(self, dtype: Any) -> AttentionMaps:
        """The same maps with weights in ``dtype`` (float32 or float16), e.g. to halve a file."""
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float16):
            raise ValueError(f"dtype must be float32 or float16, got {dtype}")
        decoder = None if self.decoder is None else self.decoder.astype(dtype)
        cross = None if self.cross_weights is None else [c.astype(dtype) for c in self.cross_weights]
        return replace(self, weights=[w.astype(dtype) for w in self.weights], decoder=decoder, cross_weights=cross)

    def _parts(self, prefix: str = "") -> tuple[dict, dict]:
        """(header, arrays) of the file format, array names under ``prefix``."""
        header = {
            "format": FORMAT, "version": FORMAT_VERSION, "model_id": self.model_id, "revision": self.revision,
            "num_layers": self.num_layers, "num_heads": self.num_heads, "config": self.config,
            "sentences": [s if isinstance(s, str) else list(s) for s in self.sentences],
            "tokens": self.tokens, "word_of": self.word_of, "words": self.words, "kinds": self.kinds,
        }
        arrays = {f"{prefix}weights_{i}": w for i, w in enumerate(self.weights)}
        for part in ("", "cross_"):
            if getattr(self, f"{part}queries") is not None:
                header[f"{part}qk_meta"] = getattr(self, f"{part}qk_meta")
                for name in ("queries", "keys", "position_bias"):
                    arrays.update({f"{prefix}{part}{name}_{i}": x for i, x in enumerate(getattr(self, f"{part}{name}") or ())})
        if self.decoder is not None:
            header["decoder"], more = self.decoder._parts("decoder.")
            arrays.update(more)
            arrays.update({f"{prefix}cross_{i}": c for i, c in enumerate(self.cross_weights)})
        return header, arrays

    def save(self, path: str | os.PathLike) -> Path:
        """Write the maps to ``path`` (``.npz`` is appended when missing); returns the path written."""
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        header, arrays = self._parts()
        arrays["header"] = np.frombuffer(json.dumps(header, ensure_ascii=False).encode(), dtype=np.uint8)
        with open(path, "wb") as f:
            np.savez(f, **arrays)
        return path


def load_maps(path: str | os.PathLike) -> AttentionMaps:
    """Read maps written by :meth:`AttentionMaps.save`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"maps file {str(path)!r} does not exist")
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise ValueError(f"maps file {str(path)!r} is not an attnlab .npz maps file ({e})") from None
    with archive:
        if "header" not in archive.files:
            raise ValueError(f"maps file {str(path)!r} has no header; it was not written by attnlab")
        header = json.loads(archive["header"].tobytes().decode())
        if header.get("format") != FORMAT or header.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"maps file {str(path)!r} is format {header.get('format')!r} version {header.get('version')!r}; "
                f"expected {FORMAT!r} version {FORMAT_VERSION}"
            )
        return _from_parts(header, archive, "")


def _from_parts(header: dict, archive: Any, prefix: str) -> AttentionMaps:
    n = len(header["sentences"])

    def arrays(name: str) -> list[np.ndarray] | None:
        found = f"{prefix}{name}_0" in archive.files
        return [archive[f"{prefix}{name}_{i}"] for i in range(n)] if found else None

    qk = "qk_meta" in header
    cross = {f"cross_{name}": arrays(f"cross_{name}") for name in ("queries", "keys", "position_bias")}
    decoder = _from_parts(header["decoder"], archive, "decoder.") if "decoder" in header else None
    return AttentionMaps(
        sentences=[s if isinstance(s, str) else tuple(s) for s in header["sentences"]],
        tokens=header["tokens"], weights=arrays("weights"), word_of=header["word_of"], words=header["words"],
        kinds=header["kinds"], model_id=header["model_id"], revision=header["revision"],
        num_layers=header["num_layers"], num_heads=header["num_heads"], config=header["config"],
        decoder=decoder, cross_weights=arrays("cross") if decoder is not None else None,
        queries=arrays("queries") if qk else None, keys=arrays("keys") if qk else None,
        qk_meta=header.get("qk_meta"), position_bias=arrays("position_bias") if qk else None,
        cross_qk_meta=header.get("cross_qk_meta"), **cross,
    )


def gather(parts: list[AttentionMaps], slots: list[tuple[int, int]]) -> AttentionMaps:
    """One AttentionMaps from batches: entry i of the result is entry ``slots[i] = (part, row)``."""

    def pick(get: Callable[[AttentionMaps], list | None]) -> list | None:
        if get(parts[0]) is None:
            return None
        return [get(parts[p])[r] for p, r in slots]

    first = parts[0]
    decoder = None
    if first.decoder is not None:
        decoder = gather([p.decoder for p in parts], slots)
    return replace(
        first, sentences=pick(lambda m: m.sentences), tokens=pick(lambda m: m.tokens),
        weights=pick(lambda m: m.weights), word_of=pick(lambda m: m.word_of), words=pick(lambda m: m.words),
        kinds=pick(lambda m: m.kinds), decoder=decoder, cross_weights=pick(lambda m: m.cross_weights),
        queries=pick(lambda m: m.queries), keys=pick(lambda m: m.keys), position_bias=_biases(parts, slots, ""),
        cross_queries=pick(lambda m: m.cross_queries), cross_keys=pick(lambda m: m.cross_keys),
        cross_position_bias=_biases(parts, slots, "cross_"),
    )


def _biases(parts: list[AttentionMaps], slots: list[tuple[int, int]], prefix: str) -> list[np.ndarray] | None:
    """The gathered position biases under ``prefix``: capture leaves out a batch's bias where it is all
    zero, so a batch without one gets zeros beside batches with one."""
    got = [getattr(p, f"{prefix}position_bias") for p in parts]
    if all(b is None for b in got):
        return None
    out = []
    for p, r in slots:
        if got[p] is not None:
            out.append(got[p][r])
        else:  # [L, H, Tq, Tk] of zeros, shaped by this part's queries and keys
            q, k = getattr(parts[p], f"{prefix}queries")[r], getattr(parts[p], f"{prefix}keys")[r]
            out.append(np.zeros((*q.shape[:3], k.shape[2]), dtype=q.dtype))
    return out
