"""Captured attention maps, and their one file format.

A file is a NumPy ``.npz`` archive read with ``allow_pickle=False``: one array ``weights_<i>`` of
shape [L, H, T, T] per sentence (float32 or float16, exactly as captured or converted) and one
``header`` array holding UTF-8 JSON with everything else (format name and version, model id,
revision, config, sentences, tokens, token-to-word index, words and their kinds). Saving and
loading are lossless: the arrays come back bit for bit, the rest equal.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

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

    def __len__(self) -> int:
        return len(self.sentences)

    def _repr_html_(self) -> str:
        """In a notebook: the viewer (head view first) as a self-contained, offline frame."""
        from attnlab.viz.page import notebook_html

        return notebook_html(self)

    def to_words(self, marks: Iterable[str] | None = None):
        """Word-level maps (:class:`attnlab.models.words.WordMaps`): to = sum, from = mean over pieces."""
        from attnlab.models.words import to_words

        return to_words(self, marks=marks)

    def astype(self, dtype: Any) -> AttentionMaps:
        """The same maps with weights in ``dtype`` (float32 or float16), e.g. to halve a file."""
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float16):
            raise ValueError(f"dtype must be float32 or float16, got {dtype}")
        return replace(self, weights=[w.astype(dtype) for w in self.weights])

    def save(self, path: str | os.PathLike) -> Path:
        """Write the maps to ``path`` (``.npz`` is appended when missing); returns the path written."""
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        header = {
            "format": FORMAT, "version": FORMAT_VERSION, "model_id": self.model_id, "revision": self.revision,
            "num_layers": self.num_layers, "num_heads": self.num_heads, "config": self.config,
            "sentences": [s if isinstance(s, str) else list(s) for s in self.sentences],
            "tokens": self.tokens, "word_of": self.word_of, "words": self.words, "kinds": self.kinds,
        }
        arrays = {f"weights_{i}": w for i, w in enumerate(self.weights)}
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
        n = len(header["sentences"])
        weights = [archive[f"weights_{i}"] for i in range(n)]
    return AttentionMaps(
        sentences=[s if isinstance(s, str) else tuple(s) for s in header["sentences"]],
        tokens=header["tokens"], weights=weights, word_of=header["word_of"], words=header["words"],
        kinds=header["kinds"], model_id=header["model_id"], revision=header["revision"],
        num_layers=header["num_layers"], num_heads=header["num_heads"], config=header["config"],
    )
