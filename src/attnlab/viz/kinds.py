"""The server's encoder–decoder views: which maps a kind of attention reads, at which level.

An encoder–decoder's maps hold three attentions, each a *kind*: ``"encoder"`` (the encoder's
self-attention over the source, the maps' own weights), ``"decoder"`` (the decoder's causal
self-attention over its input: the start token, then the target) and ``"cross"`` (target rows,
source columns). The head view asks for one head of one kind; these functions answer from the
server's cached maps, token-level AttentionMaps and word-level WordMaps of the same sentences.

At word level the decoder's and the cross maps come from ``maps.to_words()`` (``words.decoder``,
``words.cross_weights``: the encoder's word rule), and every answer says which level it holds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.viz.payload import check_head, head_matrix, labels, seq2seq_labels

KINDS = ("encoder", "decoder", "cross")


def is_seq2seq(maps: Any) -> bool:
    return getattr(maps, "decoder", None) is not None and getattr(maps, "cross_weights", None) is not None


def pairs_payload(tokens: Any, words: Any, level: str) -> dict | None:
    """What the head view's kind choice needs for /api/maps (:func:`attnlab.viz.payload.seq2seq_labels`
    of the maps at ``level``; the weights come one head at a time). None for a model that is not an
    encoder–decoder."""
    return seq2seq_labels(words if level == "word" else tokens)


def kind_head(tokens: Any, words: Any, level: str, kind: str, i: int, layer: int, head: int) -> dict:
    """One head (1-based ``layer``, ``head``) of sentence ``i`` of ``kind``: ``level`` (the level
    served), ``labels`` (rows), ``key_labels`` (columns) and ``weights`` [rows, columns]. ValueError
    with the range for a layer, head or sentence out of range, or a decoder/cross kind of a model
    that has none."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    if kind == "encoder":
        m = words if level == "word" else tokens
        w = head_matrix(m, i, layer, head)  # checks the sentence, layer and head first
        return {"level": level, "labels": labels(m, i), "key_labels": labels(m, i), "weights": w}
    if not is_seq2seq(tokens):
        raise ValueError(f"kind {kind!r} is an encoder–decoder's attention; {tokens.model_id!r} is not an "
                         f"encoder–decoder model (its one attention is kind 'encoder')")
    m, lv = (words, "word") if level == "word" else (tokens, "token")
    dec = m.decoder
    check_head(len(dec.weights), dec.num_layers, dec.num_heads, i, layer, head, f" of the {kind} attention")
    w: np.ndarray = (dec.weights if kind == "decoder" else m.cross_weights)[i][layer - 1, head - 1]
    return {"level": lv, "labels": labels(dec, i), "key_labels": labels(dec if kind == "decoder" else m, i), "weights": w}
