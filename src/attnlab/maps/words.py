"""From word pieces to words (Clark et al. 2019, §4.1).

Attention *to* a word is the sum of the attention to its pieces; attention *from* a word is the
mean of its pieces' rows. So each word row still sums to 1, a sentence without split words is
unchanged, and a split word's column is the sum of its pieces' columns. (Clark et al.'s released
code takes the first piece's row instead of the mean; the paper says mean, and so does attnlab.)

Marks are what a head may "park" attention on: by default the special tokens ([CLS], [SEP], <s>,
</s>, …) and words made only of punctuation; pass ``marks`` (a set of words) to choose others.

What a *word* is: the tokenizer's pre-tokenizer decides (:mod:`attnlab.hf.encoding`). BERT-style
tokenizers cut at white space, around every punctuation character and around ASCII symbols, so
"don't" is three words (don ' t), "state-of-the-art" seven, "sea-shells" three, "$5" two ($ 5), but
"5€" one. A word is a mark (by default) when it is all punctuation, Unicode category P*: "'", "-",
"@", "," and "." are; "$", "€", "+" and "=" are symbols (category S*): words, not marks.

Finding a word (:meth:`WordMaps.spans`, used by :func:`attnlab.find_heads`): the text asked for
matches a run of consecutive words whose texts, joined without spaces, equal it case-insensitively,
so "sea-shells" and "don't" are found although each is several words. Where nothing matches
exactly, accents are ignored too ("cafe" finds "café"), as uncased tokenizers such as BERT's and
MiniLM's strip accents before they cut words.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

DEFAULT_MARK_KINDS = frozenset({"cls", "sep", "punct"})


@dataclass(frozen=True)
class WordMaps:
    """Word-level maps: ``weights[i]`` is [L, H, W, W] over the W words ``words[i]`` of sentence i.

    ``kinds[i][w]`` is ``cls`` (the special token opening the sequence), ``sep`` (other special
    tokens), ``punct`` or ``word``; ``is_mark[i][w]`` says whether word w counts as a mark.
    An encoder–decoder's also hold, as its token-level maps do, ``decoder`` (the decoder's
    self-attention over the target's words, a WordMaps) and ``cross_weights[i]``
    [L_dec, H, W_target, W_source] (target words attending to source words, by the same rule).
    """

    sentences: list[Any]
    words: list[list[str]]
    weights: list[np.ndarray] = field(repr=False)
    kinds: list[list[str]] = field(repr=False)
    is_mark: list[list[bool]] = field(repr=False)
    model_id: str
    revision: str | None
    num_layers: int
    num_heads: int
    decoder: WordMaps | None = field(default=None, repr=False)
    cross_weights: list[np.ndarray] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.words)

    def _repr_html_(self) -> str | None:
        """In a notebook: the viewer (head view first) as a self-contained, offline frame
        (:mod:`attnlab.maps.display`: registered by ``import attnlab``)."""
        from attnlab.maps import display

        return display.html(self)

    def spans(self, i: int, text: str) -> list[tuple[int, int]]:
        """Every place ``text`` occurs in sentence i, as word spans [start, end) in order: runs of
        consecutive words whose texts joined without spaces equal ``text`` (case-insensitive; where
        nothing matches, accent-insensitive too). Empty when it does not occur."""
        for accents in (False, True):
            want = _fold(text, accents)
            found = _find_runs([_fold(t, accents) for t in self.words[i]], want) if want else []
            if found:
                return found
        return []

    def span(self, i: int, text: str, occurrence: int | None = None) -> tuple[int, int]:
        """The word span [start, end) of ``text`` in sentence i: its ``occurrence``-th place (1-based;
        None: the first), or LookupError saying what the sentence holds."""
        found = self.spans(i, text)
        if not found:
            raise LookupError(f"word {text!r} is not in sentence {i + 1} (its words: {' '.join(self.words[i])})")
        if occurrence is None:
            return found[0]
        if isinstance(occurrence, bool) or not isinstance(occurrence, int) or occurrence < 1:
            raise ValueError(f"occurrence must be a positive int (1-based), got {occurrence!r}")
        if occurrence > len(found):
            raise LookupError(f"occurrence {occurrence} of {text!r} was asked for, but sentence {i + 1} has it "
                              f"{len(found)} time{'s' if len(found) > 1 else ''}")
        return found[occurrence - 1]

    def index(self, i: int, word: str) -> int:
        """Position of the first word where ``word`` first occurs in sentence i (see :meth:`spans`), or LookupError."""
        return self.span(i, word)[0]


def _fold(text: str, accents: bool) -> str:
    """``text`` as words are compared: case folded, without white space, without accents if ``accents``."""
    folded = "".join(text.split()).casefold()
    if accents:
        folded = "".join(c for c in unicodedata.normalize("NFKD", folded) if not unicodedata.combining(c))
    return folded


def _find_runs(words: list[str], want: str) -> list[tuple[int, int]]:
    """Spans [start, end) of consecutive ``words`` whose concatenation is ``want``, left to right, not overlapping."""
    found, start = [], 0
    while start < len(words):
        joined, end = "", start
        while end < len(words) and len(joined) < len(want) and want.startswith(joined + words[end]):
            joined += words[end]
            end += 1
        if joined == want and end > start:
            found.append((start, end))
            start = end
        else:
            start += 1
    return found


def _starts(word_of: Any, t: int, num_words: int) -> np.ndarray:
    """The first token of each word, checking that ``word_of`` numbers words 0..W−1 over consecutive tokens."""
    word_of = np.asarray(word_of)
    if word_of.shape != (t,):
        raise ValueError(f"word_of has {word_of.size} entries for maps over {t} tokens")
    starts = np.flatnonzero(np.r_[True, word_of[1:] != word_of[:-1]])
    if not np.array_equal(word_of[starts], np.arange(num_words)):
        raise ValueError(f"word_of must number words 0..{num_words - 1} in order, each over consecutive tokens; "
                         f"got {word_of.tolist()}")
    return starts


def aggregate(weights: np.ndarray, word_of: list[int], num_words: int, key_word_of: list[int] | None = None,
              num_key_words: int | None = None) -> np.ndarray:
    """[L, H, Tq, Tk] token weights → [L, H, Wq, Wk] word weights: columns summed, rows averaged.

    Self-attention: the rows' and columns' words are the same (``word_of``, ``num_words``);
    cross-attention: ``key_word_of`` and ``num_key_words`` give the keys' (the source's) words.
    A word's pieces are consecutive tokens (tokenizers never interleave words), so both steps are
    segment sums (``np.add.reduceat``). No BLAS on purpose: after a torch forward pass, OpenBLAS's
    threads fight torch's spinning OpenMP threads for the cores and small matrix products run
    40× slower than single-threaded.
    """
    tq, tk = weights.shape[-2:]
    if key_word_of is None:
        key_word_of, num_key_words = word_of, num_words
        if tq != tk:
            raise ValueError(f"maps over {tq} queries and {tk} keys need the keys' words (key_word_of)")
    rows, cols = _starts(word_of, tq, num_words), _starts(key_word_of, tk, num_key_words)
    if num_words == tq and num_key_words == tk:  # no split words: nothing to add up
        return weights.copy()
    counts = np.diff(np.r_[rows, tq])  # pieces per query word
    to_words = np.add.reduceat(weights, cols, axis=-1, dtype=np.float64)  # (L, H, Tq, Wk): sum of pieces
    out = np.add.reduceat(to_words, rows, axis=-2) / counts[:, None]  # (L, H, Wq, Wk): mean of rows
    return out.astype(weights.dtype)


def _mark_flags(words: list[str], kinds: list[str], marks: frozenset[str] | None) -> list[bool]:
    if marks is None:
        return [k in DEFAULT_MARK_KINDS for k in kinds]
    return [w.casefold() in marks for w in words]


def to_words(maps: Any, marks: Iterable[str] | None = None) -> WordMaps:
    """Word-level :class:`WordMaps` from :class:`attnlab.maps.records.AttentionMaps`.

    ``marks``: None for special tokens + punctuation, or the words (case-insensitive, e.g.
    ``{"[CLS]", "[SEP]", "."}``) that count as marks.
    """
    if isinstance(marks, str):
        raise TypeError(f"marks must be a collection of words, not the single string {marks!r}")
    chosen = None if marks is None else frozenset(str(m).casefold() for m in marks)
    weights = [aggregate(w, wo, len(ws)) for w, wo, ws in zip(maps.weights, maps.word_of, maps.words)]
    decoder = cross = None
    if getattr(maps, "decoder", None) is not None:  # an encoder–decoder: the target's words too
        dec = maps.decoder
        decoder = to_words(dec, marks)
        cross = [aggregate(c, dec.word_of[i], len(dec.words[i]), maps.word_of[i], len(maps.words[i]))
                 for i, c in enumerate(maps.cross_weights)]
    return WordMaps(
        sentences=list(maps.sentences), words=[list(w) for w in maps.words], weights=weights,
        kinds=[list(k) for k in maps.kinds],
        is_mark=[_mark_flags(ws, ks, chosen) for ws, ks in zip(maps.words, maps.kinds)],
        model_id=maps.model_id, revision=maps.revision, num_layers=maps.num_layers, num_heads=maps.num_heads,
        decoder=decoder, cross_weights=cross,
    )
