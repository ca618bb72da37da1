"""The Neuron view's data: queries and keys, turned into the JSON the page reads.

Maps captured with ``capture(..., qk=True)`` hold the queries and keys of up to three attentions
(:data:`attnlab.viz.payload.ATTENTIONS`): ``"encoder"``, the maps' own self-attention (an encoder's, a decoder-only model's, or
an encoder–decoder's encoder); and for an encoder–decoder ``"decoder"``, the decoder's causal
self-attention over the target, and ``"cross"``, the decoder's attention to the encoder (target rows,
source columns). :func:`qk_of` gives each attention the same face (:class:`QK`), so the self-contained
page's payload (:func:`neuron_payload`, every head of every sentence) and the server's answer
(:func:`head_qk`, one head) are cut from the same arrays and have the same shapes.

A head's weights follow from its data as the model computes them: scores q·k · scale, softcapped
(``softcap``: c·tanh(s/c)), plus the position bias where the model adds one (T5's relative position
bias), masked (``causal``, a sliding ``window`` (left, right)), then softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.viz.payload import check_attention, check_head, is_seq2seq, sentence_text

NEURON_MAX_TOKENS = 128  # the page's q and k as JSON grow as L·H·T·D: longer sentences are left out of a page
NEURON_DIGITS = 5
META_KEYS = ("scale", "softcap", "causal", "window")


@dataclass(frozen=True)
class QK:
    """One attention's queries and keys, per sentence: ``queries[i]`` [L, H, Tq, D],
    ``keys[i]`` [L, H, Tk, D], ``bias[i]`` [L, H, Tq, Tk] (None: the model adds none), ``meta`` (per
    layer scale, softcap, causal, window), the query tokens ``rows[i]`` and key tokens ``cols[i]``."""

    queries: list[np.ndarray]
    keys: list[np.ndarray]
    bias: list[np.ndarray] | None
    meta: dict
    rows: list[list[str]]
    cols: list[list[str]]
    num_layers: int
    num_heads: int


def qk_of(maps: Any, attention: str = "encoder") -> QK | None:
    """The queries and keys of ``attention`` in token-level AttentionMaps, or None when the maps hold
    none (captured without ``qk=True``). ValueError for ``"decoder"``/``"cross"`` of a model that is
    not an encoder–decoder."""
    check_attention(attention)
    if attention == "encoder":
        if getattr(maps, "queries", None) is None:
            return None
        return QK(maps.queries, maps.keys, getattr(maps, "position_bias", None), maps.qk_meta, maps.tokens,
                  maps.tokens, maps.num_layers, maps.num_heads)
    dec = getattr(maps, "decoder", None)
    if dec is None:
        raise ValueError(f"attention {attention!r} is an encoder–decoder's; {maps.model_id!r} is not an "
                         f"encoder–decoder model (its one attention is 'encoder')")
    if attention == "decoder":
        if getattr(dec, "queries", None) is None:
            return None
        return QK(dec.queries, dec.keys, getattr(dec, "position_bias", None), dec.qk_meta, dec.tokens, dec.tokens,
                  dec.num_layers, dec.num_heads)
    if getattr(maps, "cross_queries", None) is None:
        return None
    return QK(maps.cross_queries, maps.cross_keys, maps.cross_position_bias, maps.cross_qk_meta, dec.tokens,
              maps.tokens, dec.num_layers, dec.num_heads)


def _rounded(x: np.ndarray) -> list:
    return np.round(x.astype(np.float64), NEURON_DIGITS).tolist()


def layer_meta(meta: dict, layer0: int) -> dict:
    """One layer's scale, softcap, causal and window (0-based ``layer0``)."""
    return {name: meta[name][layer0] for name in META_KEYS}


def head_qk(maps: Any, sentence: int, layer: int, head: int, attention: str = "encoder") -> dict:
    """One head's data (``layer``, ``head`` and ``sentence``, all 0-based):
    ``labels`` (the query tokens), ``key_labels``, ``q`` [Tq][D], ``k`` [Tk][D], ``bias`` [Tq][Tk] or
    None, and that layer's ``meta``. One head is 2·T·D numbers (65,536 at 512 tokens and D = 64,
    a quarter of one head's map), so no length limit applies here."""
    v = qk_of(maps, attention)
    if v is None:
        raise ValueError("these maps hold no queries and keys; capture(..., qk=True) keeps them")
    what = "" if attention == "encoder" else f" of the {attention} attention"
    check_head(len(v.queries), v.num_layers, v.num_heads, sentence, layer, head, what)
    l, h = layer, head
    return {
        "labels": list(v.rows[sentence]), "key_labels": list(v.cols[sentence]),
        "q": _rounded(v.queries[sentence][l, h]), "k": _rounded(v.keys[sentence][l, h]),
        "bias": None if v.bias is None else _rounded(v.bias[sentence][l, h]),
        "meta": layer_meta(v.meta, l),
    }


def _attention_part(v: QK, fits: list[bool]) -> dict:
    """Every head of every sentence of one attention, as the page embeds them (``q`` None where a
    sentence is longer than :data:`NEURON_MAX_TOKENS`)."""
    return {
        "model": {"num_layers": int(v.num_layers), "num_heads": int(v.num_heads)}, "meta": v.meta,
        "sentences": [{
            "labels": list(v.rows[i]), "key_labels": list(v.cols[i]),
            "q": _rounded(v.queries[i]) if ok else None, "k": _rounded(v.keys[i]) if ok else None,
            "bias": _rounded(v.bias[i]) if ok and v.bias is not None else None,
        } for i, ok in enumerate(fits)],
    }


def neuron_payload(maps: Any) -> dict | None:
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
    seq2seq = is_seq2seq(maps)
    lengths = [[len(t)] + ([len(maps.decoder.tokens[i])] if seq2seq else []) for i, t in enumerate(maps.tokens)]
    fits = [max(n) <= NEURON_MAX_TOKENS for n in lengths]
    out = _attention_part(enc, fits)
    out["model"].update(id=maps.model_id)
    out["max_tokens"] = NEURON_MAX_TOKENS
    for s, text in zip(out["sentences"], maps.sentences):
        s["text"] = sentence_text(text)
    if seq2seq:
        for attention in ("decoder", "cross"):
            v = qk_of(maps, attention)
            if v is not None:
                out[attention] = _attention_part(v, fits)
    return out
