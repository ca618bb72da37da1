"""From word pieces to words (Clark et al. 2019, §4.1).

Attention *to* a word is the sum of the attention to its pieces; attention *from* a word is the
mean of its pieces' rows. So each word row still sums to 1, a sentence without split words is
unchanged, and a split word's column is the sum of its pieces' columns. (Clark et al.'s released
code takes the first piece's row instead of the mean; the paper says mean, and so does attnlab.)

Learned sinks (gpt-oss): a token row's weights add up to 1 minus its sink share. The sink is no word
and no piece of one: it stays apart, and a word row's sink share is the mean of its pieces' shares, as
its weights are the mean of their rows, so a word row's weights still add up to 1 minus its share.

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
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Iterable

import numpy as np

from attnlab.maps.records import DEFAULT_MARK_KINDS, Attention, Maps, Tokens, Words


@dataclass(frozen=True, kw_only=True)
class WordMaps(Maps):
    """Word-level maps: every record over :class:`~attnlab.maps.records.Words`, so
    ``weights[i]`` is [L, H, W, W] over the W words ``words[i]`` of sentence i.

    ``kinds[i][w]`` is ``cls`` (the special token opening the sequence), ``sep`` (other special
    tokens), ``punct`` or ``word``; ``is_mark[i][w]`` says whether word w counts as a mark (all three
    the source's, ``maps.source``). An encoder–decoder's also hold, as its token-level maps do,
    ``decoder`` (the decoder's self-attention over the target's words, ``maps.target``) and
    ``cross`` (target words attending to source words, by the same rule).
    """

    level: ClassVar[str] = "word"

    @property
    def words(self) -> list[list[str]]:
        return self.source.words

    @property
    def kinds(self) -> list[list[str]]:
        return self.source.kinds

    @property
    def is_mark(self) -> list[list[bool]]:
        return self.source.is_mark

    def to_words(self, marks: Iterable[str] | None = None) -> WordMaps:
        """These maps (``marks`` None), or the same maps with ``marks`` (case-insensitive words) as the marks."""
        if marks is None:
            return self
        chosen = _chosen(marks)
        target = None if self.target is None else _words_side(self.target, chosen)
        return _with_sides(self, _words_side(self.source, chosen), target)

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
    threads fight torch's spinning OpenMP threads for the cores, and small matrix products slow down.
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


def aggregate_share(share: np.ndarray, word_of: list[int], num_words: int) -> np.ndarray:
    """[L, H, Tq] token rows' sink shares → [L, H, Wq]: each word's is the mean of its pieces' (as its row
    of weights is the mean of theirs), so a word row's weights and its share still add up to 1."""
    tq = share.shape[-1]
    rows = _starts(word_of, tq, num_words)
    if num_words == tq:  # no split words: nothing to average
        return share.copy()
    counts = np.diff(np.r_[rows, tq])  # pieces per query word
    return (np.add.reduceat(share, rows, axis=-1, dtype=np.float64) / counts).astype(share.dtype)


def _mark_flags(words: list[str], kinds: list[str], marks: frozenset[str] | None) -> list[bool]:
    if marks is None:
        return [k in DEFAULT_MARK_KINDS for k in kinds]
    return [w.casefold() in marks for w in words]


def _chosen(marks: Iterable[str] | None) -> frozenset[str] | None:
    if isinstance(marks, str):
        raise TypeError(f"marks must be a collection of words, not the single string {marks!r}")
    return None if marks is None else frozenset(str(m).casefold() for m in marks)


def _words_side(side: Tokens | Words, marks: frozenset[str] | None) -> Words:
    """The words of a token- or word-level side, with ``marks`` (None: special tokens and punctuation)."""
    return Words(words=[list(w) for w in side.words], kinds=[list(k) for k in side.kinds],
                 is_mark=[_mark_flags(ws, ks, marks) for ws, ks in zip(side.words, side.kinds)])


def _with_sides(maps: WordMaps, source: Words, target: Words | None) -> WordMaps:
    """``maps`` with its records over ``source`` (and ``target``)."""
    own = replace(maps.self_attention, query_side=source, key_side=source)
    if target is None:
        return replace(maps, self_attention=own)
    return replace(maps, self_attention=own, decoder=replace(maps.decoder, query_side=target, key_side=target),
                   cross=replace(maps.cross, query_side=target, key_side=source))


def _word_record(rec: Attention, query_side: Words, key_side: Words) -> Attention:
    """One token-level record over words: each sentence's weights (and sink shares) aggregated (queries
    and keys, which belong to tokens, stay behind)."""
    q, k = rec.query_side, rec.key_side
    weights = [aggregate(w, q.word_of[i], len(q.words[i]), k.word_of[i], len(k.words[i]))
               for i, w in enumerate(rec.weights)]
    shares = None if rec.sink_share is None else [aggregate_share(s, q.word_of[i], len(q.words[i]))
                                                   for i, s in enumerate(rec.sink_share)]
    return Attention(weights=weights, query_side=query_side, key_side=key_side, num_layers=rec.num_layers,
                     num_heads=rec.num_heads, sink_share=shares)


def to_words(maps: Maps, marks: Iterable[str] | None = None) -> WordMaps:
    """Word-level :class:`WordMaps` from token-level maps (:class:`~attnlab.maps.tokens.AttentionMaps`):
    every record aggregated by the same rule (an encoder–decoder's three).

    ``marks``: None for special tokens + punctuation, or the words (case-insensitive, e.g.
    ``{"[CLS]", "[SEP]", "."}``) that count as marks.
    """
    if maps.level != "token":
        raise TypeError(f"to_words takes token-level maps, got {maps.level}-level {type(maps).__name__} "
                        f"(whose to_words() chooses their marks)")
    chosen = _chosen(marks)
    source = _words_side(maps.source, chosen)
    decoder = cross = None
    if maps.is_seq2seq:  # an encoder–decoder: the target's words too
        target = _words_side(maps.target, chosen)
        decoder = _word_record(maps.decoder, target, target)
        cross = _word_record(maps.cross, target, source)
    return WordMaps(sentences=list(maps.sentences), self_attention=_word_record(maps.self_attention, source, source),
                    decoder=decoder, cross=cross, model_id=maps.model_id, revision=maps.revision)
