"""The server's encoder–decoder views: which maps a kind of attention reads, at which level.

An encoder–decoder's maps hold three attentions, each a *kind*: ``"encoder"`` (the encoder's
self-attention over the source, the maps' own weights), ``"decoder"`` (the decoder's causal
self-attention over its input: the start token, then the target) and ``"cross"`` (target rows,
source columns). The head view asks for one head of one kind; these functions answer from the
server's cached maps, token-level AttentionMaps and word-level WordMaps of the same sentences.

Word level for the decoder and cross maps comes from ``maps.to_words()`` where it keeps a decoder
(``words.decoder``, ``words.cross_weights``); where it does not, they are served at token level,
and every answer says which level it holds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.viz.payload import head_matrix, labels

KINDS = ("encoder", "decoder", "cross")


def is_seq2seq(maps: Any) -> bool:
    return getattr(maps, "decoder", None) is not None and getattr(maps, "cross_weights", None) is not None


def _level_maps(tokens: Any, words: Any, level: str) -> tuple[Any, str]:
    """The maps that hold the decoder at ``level``: the word-level ones when they keep a decoder."""
    if level == "word" and getattr(words, "decoder", None) is not None:
        return words, "word"
    return tokens, "token"


def _marks(tokens: Any, words: Any, m: Any, i: int, target: bool) -> list[bool]:
    """Sentence i's marks at ``m``'s level: the source's (the encoder's) or the target's (the decoder's)."""
    if m is words:
        return [bool(x) for x in (m.decoder if target else m).is_mark[i]]
    side = tokens.decoder if target else tokens
    wm = getattr(words, "decoder", None) if target else words
    if wm is None:  # word-level maps without a decoder: the decoder's words from its own tokens
        wm = tokens.decoder.to_words()
    return [bool(wm.is_mark[i][w]) for w in side.word_of[i]]


def pairs_payload(tokens: Any, words: Any, level: str) -> dict | None:
    """What the head view's kind choice needs for /api/maps, as :func:`attnlab.viz.payload.seq2seq_payload`
    gives it without the packed weights (those come one head at a time): the decoder's ``model``
    shape, the ``level`` served and per sentence ``source``, ``source_is_mark``, ``target`` and
    ``target_is_mark``. None for a model that is not an encoder–decoder."""
    if not is_seq2seq(tokens):
        return None
    m, lv = _level_maps(tokens, words, level)
    dec = m.decoder
    return {
        "model": {"num_layers": int(dec.num_layers), "num_heads": int(dec.num_heads)}, "level": lv,
        "sentences": [{
            "source": labels(m, i), "source_is_mark": _marks(tokens, words, m, i, target=False),
            "target": labels(dec, i), "target_is_mark": _marks(tokens, words, m, i, target=True),
        } for i in range(len(m.sentences))],
    }


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
    m, lv = _level_maps(tokens, words, level)
    dec = m.decoder
    if not 0 <= i < len(dec.weights):
        raise ValueError(f"sentence must be 0..{len(dec.weights) - 1}, got {i}")
    if not 1 <= layer <= dec.num_layers:
        raise ValueError(f"layer of the {kind} attention must be 1..{dec.num_layers} (1-based), got {layer}")
    if not 1 <= head <= dec.num_heads:
        raise ValueError(f"head of the {kind} attention must be 1..{dec.num_heads} (1-based), got {head}")
    w: np.ndarray = (dec.weights if kind == "decoder" else m.cross_weights)[i][layer - 1, head - 1]
    return {"level": lv, "labels": labels(dec, i), "key_labels": labels(dec if kind == "decoder" else m, i), "weights": w}
