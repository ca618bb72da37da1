"""From sentences to token ids and words: checking the input, tokenizing, grouping pieces into words.

Word boundaries come from the fast tokenizer's ``word_ids()`` and ``sequence_ids()``, so WordPiece
(``##``), byte-level BPE (``Ġ``) and SentencePiece (``▁``) all give whole words; a word's text is
the span of the original sentence its pieces cover.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

from attnlab.maps.records import Sentence


def is_punctuation(text: str) -> bool:
    """True for a non-empty word made only of punctuation characters (Unicode category P*)."""
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def check_sentences(sentences: Any) -> list[Sentence]:
    """A list of non-empty sentences or (A, B) pairs, or a ValueError/TypeError that says what is wrong.

    A pair is an (A, B) tuple; a string with one tab is the same pair ("A\tB" → ("A", "B")), the
    rule the CLI's arguments and corpus files follow, so one text means one thing everywhere.
    """
    if isinstance(sentences, (str, tuple)):
        sentences = [sentences]
    try:
        items = list(sentences)
    except TypeError:
        raise TypeError(f"sentences must be a list of str or (str, str) pairs, got {type(sentences).__name__}") from None
    if not items:
        raise ValueError("sentences is empty; give at least one sentence")
    out: list[Sentence] = []
    for i, s in enumerate(items):
        parts = tuple(s.split("\t")) if isinstance(s, str) else tuple(s) if isinstance(s, (tuple, list)) else None
        if isinstance(s, str) and len(parts) > 2:
            raise ValueError(f"sentences[{i}] has {len(parts) - 1} tabs; a tab separates the two sentences of a pair, "
                             f"so give at most one (or an (A, B) tuple): {s!r}")
        if parts is None or len(parts) not in (1, 2) or not all(isinstance(p, str) for p in parts):
            raise TypeError(f"sentences[{i}] must be a str or a (str, str) pair, got {s!r}")
        for p in parts:
            if not p.strip():
                raise ValueError(f"sentences[{i}] is empty; every sentence needs at least one word")
        out.append(parts[0] if len(parts) == 1 else (parts[0], parts[1]))
    return out


@dataclass(frozen=True)
class Encoded:
    """One tokenized sequence: ids, tokens, and the words its tokens form (see AttentionMaps)."""

    ids: list[int]
    tokens: list[str]
    type_ids: list[int] | None
    word_of: list[int]
    words: list[str]
    kinds: list[str]


def words_of(enc: Any, texts: tuple[str, ...]) -> tuple[list[int], list[str], list[str]]:
    """Group one sentence's tokens into words: (word_of per token, word texts, word kinds).

    ``enc`` is the tokenizer's output for the sentence (a fast ``BatchEncoding`` with offsets). A
    token starts a new word when the tokenizer's ``word_ids()`` says so, when white space lies
    before it in the text (SentencePiece tokenizers such as Llama's do not split words before
    tokenizing, so their ``word_ids()`` are one word per sentence; their ``▁`` pieces carry the
    space), or where a run of punctuation begins or ends ("bank" "," of ``▁bank ,``), so that every
    tokenizer cuts "the bank, slowly!" into the same words.
    """
    toks, offsets = enc.tokens(), enc["offset_mapping"]
    word_of: list[int] = []
    spans: list[list[int]] = []  # per word: [segment, start, end] or [-1, token index, 0] for a special token
    prev: tuple | None = None  # (segment, word id, end, punctuation) of the previous token of a word
    for t, (wid, sid) in enumerate(zip(enc.word_ids(), enc.sequence_ids())):
        start, end = offsets[t]
        if wid is None or sid is None:
            spans.append([-1, t, 0])
            word_of.append(len(spans) - 1)
            prev = None
            continue
        text = texts[sid]
        punct = is_punctuation(text[start:end].strip())
        new = (prev is None or prev[:2] != (sid, wid) or prev[3] != punct
               or text[prev[2]:start].strip() != text[prev[2]:start] or text[start:end][:1].isspace())
        if new:
            spans.append([sid, start, end])
        w = len(spans) - 1
        spans[w][1], spans[w][2] = min(spans[w][1], start), max(spans[w][2], end)
        word_of.append(w)
        prev = (sid, wid, end, punct)
    words, kinds = [], []
    for w, (sid, start, end) in enumerate(spans):
        if sid < 0:
            words.append(toks[start])
            kinds.append("cls" if start == 0 else "sep")
            continue
        text = texts[sid][start:end].strip() or toks[word_of.index(w)]
        words.append(text)
        kinds.append("punct" if is_punctuation(text) else "word")
    return word_of, words, kinds


def encode(tokenizer: Any, texts: tuple[str, ...], limit: int, what: str, model: str, target: bool = False) -> Encoded:
    """Tokenize one sentence or pair (``target``: as a decoder's target text), refusing more than ``limit`` tokens."""
    kw = {"text_target": texts[0]} if target else {}
    # verbose=False: the length is checked just below, with attnlab's error; transformers would first log
    # its own "indexing errors" warning for the same thing
    enc = tokenizer(*(() if target else texts), add_special_tokens=True, return_offsets_mapping=True, verbose=False, **kw)
    n = len(enc["input_ids"])
    if n > limit:
        raise ValueError(f"{what} has {n} tokens; model {model!r} takes at most {limit} (the positions it embeds): "
                         f"cut the text to {limit} tokens, or use a model with at least {n} positions")
    word_of, words, kinds = words_of(enc, texts)
    return Encoded(list(enc["input_ids"]), enc.tokens(), enc.get("token_type_ids"), word_of, words, kinds)


def decoder_input(target: Encoded, start_id: int, start_token: str) -> Encoded:
    """The decoder's input for teacher forcing: its start token, then the whole target (closing
    token included), so the decoder's row t predicts the target's token t. The start token is a word
    of its own, of kind ``cls``."""
    return Encoded(
        ids=[start_id, *target.ids], tokens=[start_token, *target.tokens], type_ids=None,
        word_of=[0, *(w + 1 for w in target.word_of)], words=[start_token, *target.words],
        kinds=["cls", *("sep" if k == "cls" else k for k in target.kinds)],
    )
