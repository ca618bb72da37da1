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

from attnlab.maps.records import Maps
from attnlab.viz.payload import attention_of, check_head


def attention_head(m: Maps, attention: str, i: int, layer: int, head: int) -> dict:
    """One head (0-based ``layer``, ``head``) of sentence ``i`` of ``attention`` of the maps ``m``:
    ``level`` (of ``m``), ``labels`` (rows), ``key_labels`` (columns), ``weights`` [rows, columns] and
    ``sink_share`` [rows] (learned sinks: each row's share of the sink; None for a model without).
    ValueError with the range for a layer, head or sentence out of range, or a decoder or cross
    attention of a model that has none."""
    rec = attention_of(m, attention)
    what = "" if attention == "encoder" else f" of the {attention} attention"
    check_head(len(rec), rec.num_layers, rec.num_heads, i, layer, head, what)
    return {"level": m.level, "labels": rec.query_side.labels(i), "key_labels": rec.key_side.labels(i),
            "weights": rec.weights[i][layer, head],
            "sink_share": None if rec.sink_share is None else rec.sink_share[i][layer, head]}
