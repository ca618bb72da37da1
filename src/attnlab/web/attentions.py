"""The server's encoder–decoder views: one head of one attention.

An encoder–decoder's maps hold three attentions (:data:`attnlab.viz.payload.ATTENTIONS`):
``"encoder"`` (the encoder's self-attention over the source, the maps' own weights), ``"decoder"``
(the decoder's causal self-attention over its input: the start token, then the target) and
``"cross"`` (target rows, source columns). The head view asks for one head of one attention, from
the server's cached maps at the level it shows: token-level AttentionMaps, or word-level WordMaps
(``maps.to_words()``, which aggregates the decoder's and the cross maps by the encoder's word
rule). What /api/maps adds for the choice of attention is :func:`attnlab.viz.payload.seq2seq_labels`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.viz.payload import check_attention, check_head, head_matrix, is_seq2seq, is_word_level, labels


def attention_head(m: Any, attention: str, i: int, layer: int, head: int) -> dict:
    """One head (0-based ``layer``, ``head``) of sentence ``i`` of ``attention`` of the maps ``m``:
    ``level`` (of ``m``), ``labels`` (rows), ``key_labels`` (columns) and ``weights`` [rows, columns].
    ValueError with the range for a layer, head or sentence out of range, or a decoder or cross
    attention of a model that has none."""
    check_attention(attention)
    level = "word" if is_word_level(m) else "token"
    if attention == "encoder":
        w = head_matrix(m, i, layer, head)  # checks the sentence, layer and head first
        return {"level": level, "labels": labels(m, i), "key_labels": labels(m, i), "weights": w}
    if not is_seq2seq(m):
        raise ValueError(f"attention {attention!r} is an encoder–decoder's; {m.model_id!r} is not an "
                         f"encoder–decoder model (its one attention is 'encoder')")
    dec = m.decoder
    check_head(len(dec.weights), dec.num_layers, dec.num_heads, i, layer, head, f" of the {attention} attention")
    w: np.ndarray = (dec.weights if attention == "decoder" else m.cross_weights)[i][layer, head]
    return {"level": level, "labels": labels(dec, i), "key_labels": labels(dec if attention == "decoder" else m, i),
            "weights": w}
