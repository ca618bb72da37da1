"""The server's encoder–decoder views: one head of one kind of attention.

An encoder–decoder's maps hold three attentions, each a *kind*: ``"encoder"`` (the encoder's
self-attention over the source, the maps' own weights), ``"decoder"`` (the decoder's causal
self-attention over its input: the start token, then the target) and ``"cross"`` (target rows,
source columns). The head view asks for one head of one kind, from the server's cached maps at the
level it shows: token-level AttentionMaps, or word-level WordMaps (``maps.to_words()``, which
aggregates the decoder's and the cross maps by the encoder's word rule). What /api/maps adds for
the kind choice is :func:`attnlab.viz.payload.seq2seq_labels`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.viz.payload import check_head, head_matrix, is_word_level, labels

KINDS = ("encoder", "decoder", "cross")


def is_seq2seq(maps: Any) -> bool:
    return getattr(maps, "decoder", None) is not None and getattr(maps, "cross_weights", None) is not None


def kind_head(m: Any, kind: str, i: int, layer: int, head: int) -> dict:
    """One head (1-based ``layer``, ``head``) of sentence ``i`` of ``kind`` of the maps ``m``: ``level``
    (of ``m``), ``labels`` (rows), ``key_labels`` (columns) and ``weights`` [rows, columns]. ValueError
    with the range for a layer, head or sentence out of range, or a decoder/cross kind of a model
    that has none."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    level = "word" if is_word_level(m) else "token"
    if kind == "encoder":
        w = head_matrix(m, i, layer, head)  # checks the sentence, layer and head first
        return {"level": level, "labels": labels(m, i), "key_labels": labels(m, i), "weights": w}
    if not is_seq2seq(m):
        raise ValueError(f"kind {kind!r} is an encoder–decoder's attention; {m.model_id!r} is not an "
                         f"encoder–decoder model (its one attention is kind 'encoder')")
    dec = m.decoder
    check_head(len(dec.weights), dec.num_layers, dec.num_heads, i, layer, head, f" of the {kind} attention")
    w: np.ndarray = (dec.weights if kind == "decoder" else m.cross_weights)[i][layer - 1, head - 1]
    return {"level": level, "labels": labels(dec, i), "key_labels": labels(dec if kind == "decoder" else m, i), "weights": w}
