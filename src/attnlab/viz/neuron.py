"""The Neuron view's data: queries and keys, turned into the JSON the page reads.

Maps captured with ``capture(..., qk=True)`` hold the queries and keys of each of their records
(:class:`~attnlab.maps.records.Attention`), each one of the viewer's attentions
(:data:`attnlab.viz.payload.ATTENTIONS`): ``"encoder"``, the maps' own self-attention (an encoder's, a
decoder-only model's, or an encoder–decoder's encoder); and for an encoder–decoder ``"decoder"``,
the decoder's causal self-attention over the target, and ``"cross"``, the decoder's attention to
the encoder (target rows, source columns). The self-contained page's payload
(:func:`neuron_payload`, every head of every sentence) and the server's answer (:func:`head_qk`,
one head) are cut from the same records and have the same shapes.

A head's weights follow from its data as the model computes them: scores q·k · scale, softcapped
(``softcap``: c·tanh(s/c)), plus the position bias where the model adds one (T5's relative position
bias), masked (``causal``, a sliding ``window`` (left, right)), then softmax, over the head's learned
sink too where the layer has them (``sink_logits``, one per head: gpt-oss), which takes its share of the
row and blends no value.
"""

from __future__ import annotations

import numpy as np

from attnlab.maps.records import Attention, LayerFacts
from attnlab.maps.tokens import AttentionMaps
from attnlab.viz.payload import attention_of, check_head, sentence_text

NEURON_MAX_TOKENS = 128  # the page's q and k as JSON grow as L·H·T·D: longer sentences are left out of a page
NEURON_DIGITS = 5


def qk_of(maps: AttentionMaps, attention: str = "encoder") -> Attention | None:
    """The record of ``attention`` in token-level maps when it holds queries and keys, or None (captured
    without ``qk=True``). ValueError for ``"decoder"``/``"cross"`` of a model that is not an
    encoder–decoder."""
    rec = attention_of(maps, attention)
    return rec if rec.has_qk else None


def meta_table(layers: tuple[LayerFacts, ...]) -> dict:
    """The facts of every layer as the page reads them: each fact's list over the layers."""
    rows = [f.to_dict() for f in layers]
    return {name: [r.get(name) for r in rows] for name in rows[0]}


def _rounded(x: np.ndarray) -> list:
    return np.round(x.astype(np.float64), NEURON_DIGITS).tolist()


def head_qk(maps: AttentionMaps, sentence: int, layer: int, head: int, attention: str = "encoder") -> dict:
    """One head's data (``layer``, ``head`` and ``sentence``, all 0-based):
    ``labels`` (the query tokens), ``key_labels``, ``q`` [Tq][D], ``k`` [Tk][D], ``bias`` [Tq][Tk] or
    None, and that layer's ``meta``. One head is 2·T·D numbers (65,536 at 512 tokens and D = 64,
    a quarter of one head's map), so no length limit applies here."""
    v = qk_of(maps, attention)
    if v is None:
        raise ValueError("these maps hold no queries and keys; capture(..., qk=True) keeps them")
    what = "" if attention == "encoder" else f" of the {attention} attention"
    check_head(len(v), v.num_layers, v.num_heads, sentence, layer, head, what)
    l, h = layer, head
    return {
        "labels": v.query_side.labels(sentence), "key_labels": v.key_side.labels(sentence),
        "q": _rounded(v.queries[sentence][l, h]), "k": _rounded(v.keys[sentence][l, h]),
        "bias": None if v.position_bias is None else _rounded(v.position_bias[sentence][l, h]),
        "meta": v.layers[l].to_dict(),
    }


def _attention_part(v: Attention, fits: list[bool]) -> dict:
    """Every head of every sentence of one attention, as the page embeds them (``q`` None where a
    sentence is longer than :data:`NEURON_MAX_TOKENS`)."""
    return {
        "model": {"num_layers": int(v.num_layers), "num_heads": int(v.num_heads)}, "meta": meta_table(v.layers),
        "sentences": [{
            "labels": v.query_side.labels(i), "key_labels": v.key_side.labels(i),
            "q": _rounded(v.queries[i]) if ok else None, "k": _rounded(v.keys[i]) if ok else None,
            "bias": _rounded(v.position_bias[i]) if ok and v.position_bias is not None else None,
        } for i, ok in enumerate(fits)],
    }


def neuron_payload(maps: AttentionMaps) -> dict | None:
    """The self-contained page's Neuron data, or None when ``maps`` hold no queries.

    The maps' own attention at the top level: ``model`` (id, layers, heads), ``meta`` (per layer
    scale, softcap, causal, window), ``max_tokens`` and per sentence ``text``, ``labels``,
    ``key_labels``, ``q`` and ``k`` [L][H][T][D], ``bias`` [L][H][T][T] or None. An encoder–decoder
    adds ``decoder`` and ``cross``, each ``{model, meta, sentences}`` of the same shapes. A sentence
    with more than :data:`NEURON_MAX_TOKENS` tokens (source or target) gets ``q`` None.
    """
    enc = qk_of(maps, "encoder")
    if enc is None:
        return None
    lengths = [rec.query_side.lengths() for _, rec in maps.attentions()]  # the source's, the target's
    fits = [max(n) <= NEURON_MAX_TOKENS for n in zip(*lengths)]
    out = _attention_part(enc, fits)
    out["model"].update(id=maps.model_id)
    out["max_tokens"] = NEURON_MAX_TOKENS
    for s, text in zip(out["sentences"], maps.sentences):
        s["text"] = sentence_text(text)
    if maps.is_seq2seq:
        for attention in ("decoder", "cross"):
            v = qk_of(maps, attention)
            if v is not None:
                out[attention] = _attention_part(v, fits)
    return out
