"""Captured attention maps: one record per attention of a model.

A model reads one sequence per sentence (an encoder–decoder two: the source, and the target its
decoder reads), and has one attention (an encoder's or a decoder-only model's self-attention) or
three (an encoder–decoder's encoder self-attention, decoder self-attention and cross-attention).

- :class:`Tokens` and :class:`Words`: one side of an attention, per sentence: what its positions
  are (tokens, or words) and which of them are marks (special tokens, punctuation).
- :class:`Attention`: one attention over its sentences: ``weights[i]`` [L, H, Tq, Tk] from the
  ``query_side``'s positions (rows) to the ``key_side``'s (columns); with ``capture(qk=True)``
  also its ``queries``, ``keys``, ``position_bias`` and the per-layer facts (:class:`LayerFacts`)
  that turn them into the weights.
- :class:`Maps`: what token-level :class:`~attnlab.maps.tokens.AttentionMaps` and word-level
  :class:`~attnlab.maps.words.WordMaps` share, and what the viewer and the analyses read:
  ``self_attention`` (the model's own: an encoder's, a decoder-only model's, an encoder–decoder's
  encoder), ``decoder`` and ``cross`` (an encoder–decoder's), the sentences, the model's id and
  revision, labels and marks.

Token-level maps and their file are :mod:`attnlab.maps.tokens` (the format: :mod:`attnlab.maps.files`),
word-level maps :mod:`attnlab.maps.words`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Iterable, Iterator

import numpy as np

from attnlab.maps.heads import Head

WORD_KINDS = ("cls", "sep", "punct", "word")  # cls: the special token that opens a sequence; sep: any other
DEFAULT_MARK_KINDS = frozenset({"cls", "sep", "punct"})  # the marks by default: special tokens and punctuation

Sentence = str | tuple[str, str]


def _per_sentence(owner: str, n: int, **lists: list) -> None:
    for name, values in lists.items():
        if len(values) != n:
            raise ValueError(f"{owner}.{name} has {len(values)} entries, expected {n} (one per sentence)")


@dataclass(frozen=True, kw_only=True)
class Tokens:
    """Token-level positions, per sentence: ``tokens[i]``, and the words they make up: token t is
    part of word ``word_of[i][t]``, words ``words[i]`` of kinds ``kinds[i]`` (one of
    :data:`WORD_KINDS`; special tokens are words of their own)."""

    tokens: list[list[str]]
    word_of: list[list[int]] = field(repr=False)
    words: list[list[str]] = field(repr=False)
    kinds: list[list[str]] = field(repr=False)
    level: ClassVar[str] = "token"

    def __post_init__(self) -> None:
        _per_sentence("Tokens", len(self.tokens), word_of=self.word_of, words=self.words, kinds=self.kinds)
        for i, (toks, of, ws, ks) in enumerate(zip(self.tokens, self.word_of, self.words, self.kinds)):
            if len(of) != len(toks) or len(ks) != len(ws):
                raise ValueError(f"Tokens of sentence {i}: {len(toks)} tokens with {len(of)} word_of entries, "
                                 f"{len(ws)} words with {len(ks)} kinds (expected one each)")

    def __len__(self) -> int:
        return len(self.tokens)

    def lengths(self) -> list[int]:
        return [len(t) for t in self.tokens]

    def labels(self, i: int) -> list[str]:
        return list(self.tokens[i])

    def marks(self, i: int) -> list[bool]:
        """Sentence i's tokens that are marks: those whose word is (by the default rule)."""
        kinds = self.kinds[i]
        return [kinds[w] in DEFAULT_MARK_KINDS for w in self.word_of[i]]


@dataclass(frozen=True, kw_only=True)
class Words:
    """Word-level positions, per sentence: ``words[i]``, their ``kinds[i]`` and whether each counts
    as a mark (``is_mark[i]``: by default the special tokens and punctuation)."""

    words: list[list[str]]
    kinds: list[list[str]] = field(repr=False)
    is_mark: list[list[bool]] = field(repr=False)
    level: ClassVar[str] = "word"

    def __post_init__(self) -> None:
        _per_sentence("Words", len(self.words), kinds=self.kinds, is_mark=self.is_mark)
        for i, (ws, ks, ms) in enumerate(zip(self.words, self.kinds, self.is_mark)):
            if not len(ws) == len(ks) == len(ms):
                raise ValueError(f"Words of sentence {i}: {len(ws)} words, {len(ks)} kinds, {len(ms)} marks "
                                 f"(expected one each)")

    def __len__(self) -> int:
        return len(self.words)

    def lengths(self) -> list[int]:
        return [len(w) for w in self.words]

    def labels(self, i: int) -> list[str]:
        return list(self.words[i])

    def marks(self, i: int) -> list[bool]:
        return [bool(m) for m in self.is_mark[i]]


Side = Tokens | Words


@dataclass(frozen=True)
class LayerFacts:
    """What turns one layer's queries and keys into its weights: softmax(softcap(q·kᵀ·scale) + bias +
    mask), ``softcap`` c meaning c·tanh(s/c) (None: none), ``causal`` bottom-right aligned and
    ``window`` (left, right) a sliding window (None: none); ``sink_logits`` one learned sink logit per
    head (gpt-oss), which takes part in each row's softmax with no value (None: none)."""

    scale: float
    softcap: float | None = None
    causal: bool = False
    window: tuple[int, int] | None = None
    sink_logits: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.window is not None:  # a JSON list when read from a file
            object.__setattr__(self, "window", (int(self.window[0]), int(self.window[1])))
        if self.sink_logits is not None:
            object.__setattr__(self, "sink_logits", tuple(float(x) for x in self.sink_logits))

    def to_dict(self) -> dict:
        """JSON-ready; ``sink_logits`` only where the layer has learned sinks (the facts of a model without
        them read as they always did)."""
        sinks = {} if self.sink_logits is None else {"sink_logits": list(self.sink_logits)}
        return {"scale": self.scale, "softcap": self.softcap, "causal": self.causal,
                "window": None if self.window is None else list(self.window), **sinks}


def _check_arrays(name: str, arrays: list[np.ndarray] | None, n: int, want: Callable[[int], tuple], axes: str,
                  ndim: int = 4) -> None:
    """Every ``arrays[i]`` has ``ndim`` dims, the leading ones ``want(i)`` (one entry per sentence)."""
    if arrays is None:
        return
    if len(arrays) != n:
        raise ValueError(f"Attention.{name} has {len(arrays)} entries, expected {n} (one per sentence)")
    for i, x in enumerate(arrays):
        lead = want(i)
        if x.ndim != ndim or x.shape[: len(lead)] != lead:
            raise ValueError(f"Attention.{name}[{i}] has shape {x.shape}, expected {lead}"
                             f"{' + (D,)' * (len(lead) < ndim)} ({axes})")


@dataclass(frozen=True, kw_only=True)
class Attention:
    """One attention of a model, per sentence.

    ``weights[i]`` [L, H, Tq, Tk]: post-softmax, row = the ``query_side`` position attending,
    column = the ``key_side`` position attended to (the same side for a self-attention). Captured
    with ``qk=True`` (token level only): ``queries[i]`` [L, H, Tq, D] and ``keys[i]`` [L, H, Tk, D]
    as the attention function received them (after RoPE, before scaling; grouped keys repeated per
    query head), ``position_bias[i]`` [L, H, Tq, Tk] where the model adds one to the scores (T5's
    relative position bias; None where it adds none) and ``layers``, one :class:`LayerFacts` per
    layer, so that softmax(softcap(q·kᵀ·scale) + bias + mask) gives ``weights[i]``.

    ``sink_share[i]`` [L, H, Tq] (None for a model without learned sinks): for a model with learned
    sinks (gpt-oss), each row's share of the softmax that the head's sink took, so that row r of
    ``weights[i]`` adds up to 1 − ``sink_share[i][..., r]`` (docs/design.md, "Maps": the sink share).
    """

    weights: list[np.ndarray] = field(repr=False)
    query_side: Side = field(repr=False)
    key_side: Side = field(repr=False)
    num_layers: int
    num_heads: int
    queries: list[np.ndarray] | None = field(default=None, repr=False)
    keys: list[np.ndarray] | None = field(default=None, repr=False)
    position_bias: list[np.ndarray] | None = field(default=None, repr=False)
    layers: tuple[LayerFacts, ...] | None = field(default=None, repr=False)
    sink_share: list[np.ndarray] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n, tq, tk = len(self.weights), self.query_side.lengths(), self.key_side.lengths()
        if len(tq) != n or len(tk) != n:
            raise ValueError(f"Attention has {n} sentences of weights, {len(tq)} of query positions and {len(tk)} "
                             f"of key positions (expected one each)")
        for i, w in enumerate(self.weights):
            if w.shape != (self.num_layers, self.num_heads, tq[i], tk[i]):
                raise ValueError(f"Attention.weights[{i}] has shape {w.shape}, expected "
                                 f"{(self.num_layers, self.num_heads, tq[i], tk[i])} (L, H, Tq, Tk)")
        qk = (self.queries is not None, self.keys is not None, self.layers is not None)
        if len(set(qk)) > 1 or (self.queries is None and self.position_bias is not None):
            raise ValueError("Attention.queries, keys and layers (their facts) come together, and position_bias "
                             "only with them")
        lh = (self.num_layers, self.num_heads)
        _check_arrays("queries", self.queries, n, lambda i: (*lh, tq[i]), "L, H, Tq, D")
        _check_arrays("keys", self.keys, n, lambda i: (*lh, tk[i]), "L, H, Tk, D")
        _check_arrays("position_bias", self.position_bias, n, lambda i: (*lh, tq[i], tk[i]), "L, H, Tq, Tk")
        _check_arrays("sink_share", self.sink_share, n, lambda i: (*lh, tq[i]), "L, H, Tq", ndim=3)
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(self.layers))
            if len(self.layers) != self.num_layers:
                raise ValueError(f"Attention.layers has {len(self.layers)} entries, expected {self.num_layers} (one per layer)")

    def __len__(self) -> int:
        return len(self.weights)

    @property
    def has_qk(self) -> bool:
        """Whether queries and keys were captured (``capture(..., qk=True)``)."""
        return self.queries is not None

    def arrays(self) -> dict[str, list[np.ndarray]]:
        """Every array list this record holds, by field name (those captured)."""
        found = {"weights": self.weights, "queries": self.queries, "keys": self.keys,
                 "position_bias": self.position_bias, "sink_share": self.sink_share}
        return {name: xs for name, xs in found.items() if xs is not None}

    @property
    def nbytes(self) -> int:
        return sum(int(x.nbytes) for xs in self.arrays().values() for x in xs)

    @property
    def has_sinks(self) -> bool:
        """Whether the model has learned sinks: ``sink_share`` holds each row's share."""
        return self.sink_share is not None

    def astype(self, dtype: Any) -> Attention:
        """The same record with its weights (and sink shares) in ``dtype``."""
        share = None if self.sink_share is None else [s.astype(dtype) for s in self.sink_share]
        return replace(self, weights=[w.astype(dtype) for w in self.weights], sink_share=share)


# The attentions of a model as the records' field names, in a model's order.
ATTENTIONS = ("self_attention", "decoder", "cross")


@dataclass(frozen=True, kw_only=True)
class Maps(ABC):
    """What token-level and word-level maps share: the sentences, the model (``model_id``,
    ``revision``), and one :class:`Attention` per attention of the model: ``self_attention`` (the
    model's own, over its input: an encoder's, a decoder-only model's, an encoder–decoder's
    encoder) and, for an encoder–decoder, ``decoder`` (its causal self-attention over the decoder's
    input: the start token, then the target) and ``cross`` (target rows, source columns).

    ``weights``, ``num_layers``, ``num_heads``, :meth:`labels` and :meth:`marks` are those of
    ``self_attention``; ``source`` and ``target`` the sides its records are over.
    """

    sentences: list[Sentence]
    self_attention: Attention = field(repr=False)
    model_id: str
    revision: str | None
    decoder: Attention | None = field(default=None, repr=False)
    cross: Attention | None = field(default=None, repr=False)
    level: ClassVar[str] = ""  # "token" or "word": the level of every side of every record

    def __post_init__(self) -> None:
        own = self.self_attention
        if len(own) != len(self.sentences):
            raise ValueError(f"{type(self).__name__} has {len(self.sentences)} sentences and {len(own)} entries "
                             f"of self_attention (expected one per sentence)")
        if (self.decoder is None) != (self.cross is None):
            raise ValueError(f"{type(self).__name__}.decoder and cross come together (an encoder–decoder) or not at all")
        for name, rec in self.attentions():
            for side in (rec.query_side, rec.key_side):
                if side.level != self.level:
                    raise ValueError(f"{type(self).__name__}.{name} is over {side.level}s; {self.level}-level maps "
                                     f"hold {self.level}s")
        _same(own.key_side, own.query_side, "self_attention's key side", "its query side")
        if self.decoder is not None:
            _same(self.decoder.key_side, self.decoder.query_side, "decoder's key side", "its query side")
            _same(self.cross.query_side, self.decoder.query_side, "cross's query side", "the decoder's (the target)")
            _same(self.cross.key_side, own.query_side, "cross's key side", "self_attention's (the source)")

    def attentions(self) -> Iterator[tuple[str, Attention]]:
        """(field name, record) of each attention these maps hold, in the model's order."""
        for name, rec in zip(ATTENTIONS, (self.self_attention, self.decoder, self.cross)):
            if rec is not None:
                yield name, rec

    @property
    def is_word_level(self) -> bool:
        return self.level == "word"

    @property
    def is_seq2seq(self) -> bool:
        """True for an encoder–decoder's maps (``decoder`` and ``cross`` are set)."""
        return self.decoder is not None

    @property
    def source(self) -> Side:
        """The model's input, per sentence (an encoder–decoder's source): the positions of ``self_attention``."""
        return self.self_attention.query_side

    @property
    def target(self) -> Side | None:
        """An encoder–decoder's decoder input (start token, then the target), or None."""
        return None if self.decoder is None else self.decoder.query_side

    @property
    def weights(self) -> list[np.ndarray]:
        """``self_attention.weights``: [L, H, T, T] per sentence."""
        return self.self_attention.weights

    @property
    def num_layers(self) -> int:
        return self.self_attention.num_layers

    @property
    def num_heads(self) -> int:
        return self.self_attention.num_heads

    @property
    def nbytes(self) -> int:
        """Bytes of every array of every record (what a cache of maps holds)."""
        return sum(rec.nbytes for _, rec in self.attentions())

    def labels(self, i: int) -> list[str]:
        """Sentence i's positions (tokens or words) of ``self_attention``."""
        return self.source.labels(i)

    def marks(self, i: int) -> list[bool]:
        """Whether each position of sentence i (``labels(i)``) is a mark."""
        return self.source.marks(i)

    def __len__(self) -> int:
        return len(self.sentences)

    def to_dict(self, pick: Any = None, decimals: int = 6) -> dict:
        """The maps as JSON-ready data (what ``attnlab maps --json`` writes): every layer and head of
        ``self_attention`` for each sentence, or one head (``pick``: a Head or a 0-based (layer, head)).
        Layer and head are 0-based, as every field (docs/design.md); the labels are under ``tokens`` or
        ``words`` (``unit``). Per sentence ``sink_share``: each row's share of the learned sinks, [L][H][T]
        (one head: [T]), so that a row of ``weights`` adds up to 1 minus it; null for a model without them."""
        if pick is not None:
            pick = Head.of(pick, self.num_layers, self.num_heads, "pick")
        unit, shares = f"{self.level}s", self.self_attention.sink_share

        def rows(x: np.ndarray) -> list:  # [L, H, ...] → every head, or the one picked
            return (x if pick is None else x[pick]).round(decimals).tolist()

        return {
            "model_id": self.model_id, "revision": self.revision, "num_layers": self.num_layers,
            "num_heads": self.num_heads, "unit": unit,
            "layer": None if pick is None else pick.layer, "head": None if pick is None else pick.head,
            "sentences": [
                {"sentence": s if isinstance(s, str) else list(s), unit: self.labels(i), "weights": rows(self.weights[i]),
                 "sink_share": None if shares is None else rows(shares[i])}
                for i, s in enumerate(self.sentences)
            ],
        }

    def _repr_html_(self) -> str | None:
        """In a notebook: the viewer (head view first) as a self-contained, offline frame
        (:mod:`attnlab.maps.display`: registered by ``import attnlab``)."""
        from attnlab.maps import display

        return display.html(self)

    @abstractmethod
    def to_words(self, marks: Iterable[str] | None = None) -> Maps:
        """Word-level maps (:class:`attnlab.maps.words.WordMaps`) of these maps, with ``marks`` (None:
        the default marks at token level; at word level, these maps' own)."""


def _same(a: Side, b: Side, what: str, other: str) -> None:
    if a is not b and a != b:
        raise ValueError(f"maps: the {what} must be {other}")
