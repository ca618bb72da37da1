"""The viewer's data: captured maps turned into the JSON that the page draws.

One set of shapes for both ways the page gets its data, the local server's API
(:mod:`attnlab.web.server`) and the self-contained HTML file (:mod:`attnlab.viz.page`), so the two
show the same thing. Layers and heads are 1-based here, as everywhere the user reads them.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

BADGE_ROLES = ("prev", "next", "marks", "broad")  # the roles the model view marks on its heads
DEFAULT_OVERVIEW = 32  # side of the downsampled maps of the model view, in cells
DIGITS = 6  # decimals of the weights sent as JSON: finer than any display, a third of the size


def downsample(weights: np.ndarray, size: int) -> np.ndarray:
    """[..., n, n] → [..., s, s] with s = min(n, size): the mean of each block of rows and columns.

    Block edges split n as evenly as possible, so every cell averages ⌊n/s⌋ or ⌈n/s⌉ rows (and
    columns); a map no larger than ``size`` comes back unchanged.
    """
    n = weights.shape[-1]
    if size < 1:
        raise ValueError(f"size must be at least 1, got {size}")
    if n <= size:
        return weights
    edges = np.linspace(0, n, size + 1).astype(int)  # (s + 1,)
    counts = np.diff(edges).astype(np.float64)  # (s,)
    rows = np.add.reduceat(weights.astype(np.float64), edges[:-1], axis=-2)  # (..., s, n)
    cells = np.add.reduceat(rows, edges[:-1], axis=-1)  # (..., s, s)
    return cells / counts[:, None] / counts[None, :]


def is_word_level(maps: Any) -> bool:
    """WordMaps (``maps.to_words()``) rather than token-level AttentionMaps."""
    return hasattr(maps, "is_mark")


def labels(maps: Any, i: int) -> list[str]:
    return list(maps.words[i] if is_word_level(maps) else maps.tokens[i])


def sentence_text(s: Any) -> str:
    return s if isinstance(s, str) else " | ".join(s)


def check_head(sentences: int, num_layers: int, num_heads: int, i: int, layer: int, head: int, what: str = "") -> None:
    """ValueError with the range for a 0-based sentence ``i`` or a 1-based ``layer`` or ``head`` out of
    range; ``what`` names the attention (" of the cross attention") where a model has several."""
    if not 0 <= i < sentences:
        raise ValueError(f"sentence must be 0..{sentences - 1}, got {i}")
    if not 1 <= layer <= num_layers:
        raise ValueError(f"layer{what} must be 1..{num_layers} (1-based), got {layer}")
    if not 1 <= head <= num_heads:
        raise ValueError(f"head{what} must be 1..{num_heads} (1-based), got {head}")


def head_matrix(maps: Any, i: int, layer: int, head: int) -> np.ndarray:
    """The [n, n] map of 1-based ``layer`` and ``head`` of sentence ``i``, with clear errors."""
    check_head(len(maps.weights), maps.num_layers, maps.num_heads, i, layer, head)
    return maps.weights[i][layer - 1, head - 1]


def round_weights(w: np.ndarray) -> list:
    """Weights as JSON numbers, rounded to :data:`DIGITS` decimals."""
    return np.round(w.astype(np.float64), DIGITS).tolist()


def roles_payload(words: Any) -> dict:
    """Role scores per head ([L][H] per role) and the badges: heads whose score reaches the threshold."""
    from attnlab.analysis.roles import ROLES, head_roles

    roles = head_roles(words, roles=list(BADGE_ROLES))
    badges = [
        {"role": name, "layer": l + 1, "head": h + 1, "score": round(float(roles.scores[name][l, h]), 4)}
        for name in BADGE_ROLES
        for l, h in roles.heads(name)
    ]
    unit = {"weight": "average weight", "nats": "mean entropy, nats"}
    legend = {name: f"{ROLES[name].description} ({unit[ROLES[name].unit]} ≥ {ROLES[name].threshold:g})" for name in BADGE_ROLES}
    scores = {name: np.round(s, 4).tolist() for name, s in roles.scores.items()}
    return {"scores": scores, "badges": badges, "legend": legend}


def maps_payload(maps: Any, overview: int = DEFAULT_OVERVIEW) -> dict:
    """What the head and model views need, without the full maps (those go one head at a time).

    ``maps``: token-level AttentionMaps or word-level WordMaps. Role badges always come from the
    word-level maps (roles are defined on words).
    """
    words = maps if is_word_level(maps) else maps.to_words()
    sentences = []
    for i, s in enumerate(maps.sentences):
        small = downsample(maps.weights[i], overview)  # (L, H, s, s)
        sentences.append({
            "text": sentence_text(s),
            "labels": labels(maps, i),
            "is_mark": (
                [bool(m) for m in words.is_mark[i]] if maps is words
                else [bool(words.is_mark[i][w]) for w in maps.word_of[i]]
            ),
            "overview": {"size": int(small.shape[-1]), "maps": np.round(small.reshape(*small.shape[:2], -1), 4).tolist()},
        })
    return {
        "model": {
            "id": maps.model_id, "revision": maps.revision,
            "num_layers": int(maps.num_layers), "num_heads": int(maps.num_heads),
        },
        "level": "word" if maps is words else "token",
        "sentences": sentences,
        "roles": roles_payload(words),
    }


def pack_weights(weights: np.ndarray) -> str:
    """[L, H, n, n] in [0, 1] → base64 of little-endian uint16 (w · 65535), for the embedded page.

    Resolution 1.5e-5, far below the 0.1 % the page prints; a quarter the size of JSON floats.
    """
    q = np.rint(np.clip(weights.astype(np.float64), 0.0, 1.0) * 65535).astype("<u2")
    return base64.b64encode(q.tobytes()).decode("ascii")


def find_head_payload(words: Any, target: str, deciders: list[str], exclude_self: bool = False,
                      exclude_marks: bool = False, occurrence: int | list[int | None] | None = None) -> dict:
    """The head search, and the target's row in each sentence for the head it shows: the best
    qualifying head, or the closest one when none qualifies (the search says so in its summary).
    ``occurrence``: which occurrence of the target, 1-based, where it occurs more than once, for every
    sentence or one per sentence (None: the first, and ``note`` says so)."""
    from attnlab.analysis.search import find_heads

    res = find_heads(words, target=target, deciders=deciders, exclude_self=exclude_self, exclude_marks=exclude_marks,
                     occurrence=occurrence)
    out = {"summary": res.summary(), "result": res.to_dict(), "shown": None,
           "note": res.occurrence_note() if occurrence is None else None}
    if res.best is not None:
        layer0, head0 = res.best
    elif res.closest:
        layer0, head0 = res.closest[0].layer, res.closest[0].head
    else:
        return out
    sides = []
    for i in range(len(words)):
        t, end = res.target_spans[i]  # the occurrence the search used
        d = next(a for a, b in words.spans(i, deciders[i]) if b <= t or end <= a)
        row = words.weights[i][layer0, head0, t:end].mean(axis=0)  # (W,): the target attending (a run: its rows' mean)
        sides.append({
            "sentence": sentence_text(words.sentences[i]), "words": list(words.words[i]),
            "row": round_weights(row), "target_index": t, "decider_index": d,
        })
    out["shown"] = {"layer": layer0 + 1, "head": head0 + 1, "qualifies": res.best is not None, "sides": sides}
    return out


def _marks(maps: Any, i: int) -> list[bool]:
    """Sentence i's marks at ``maps``' level: word-level maps say so; a token is a mark where its word is
    (by the default rule: special tokens and punctuation)."""
    if is_word_level(maps):
        return [bool(m) for m in maps.is_mark[i]]
    from attnlab.maps.words import DEFAULT_MARK_KINDS

    kinds = maps.kinds[i]
    return [kinds[w] in DEFAULT_MARK_KINDS for w in maps.word_of[i]]


def seq2seq_labels(maps: Any) -> dict | None:
    """What the head view's "encoder / decoder / cross" choice needs besides the weights: the
    decoder's ``model`` shape, the ``level`` (tokens, or words for ``to_words()`` maps, which
    aggregate the decoder's and the cross maps by the encoder's rule) and per sentence ``source``
    (the encoder's labels, the keys of cross-attention), ``source_is_mark``, ``target`` (the
    decoder's input: its start token, then the target; the queries) and ``target_is_mark``.
    None for maps without a decoder (an encoder's or a decoder's)."""
    dec = getattr(maps, "decoder", None)
    if dec is None or getattr(maps, "cross_weights", None) is None:
        return None
    return {
        "model": {"num_layers": int(dec.num_layers), "num_heads": int(dec.num_heads)},
        "level": "word" if is_word_level(maps) else "token",
        "sentences": [{"source": labels(maps, i), "source_is_mark": _marks(maps, i),
                       "target": labels(dec, i), "target_is_mark": _marks(dec, i)} for i in range(len(maps.sentences))],
    }


def seq2seq_payload(maps: Any) -> dict | None:
    """:func:`seq2seq_labels` with, per sentence, the decoder's self-attention [L_dec, H, T_tgt, T_tgt]
    (``decoder``) and the cross-attention [L_dec, H, T_tgt, T_src] (``cross``) packed as
    :func:`pack_weights` packs them, row-major: the self-contained page's encoder–decoder views."""
    out = seq2seq_labels(maps)
    if out is not None:
        for i, s in enumerate(out["sentences"]):
            s.update(decoder=pack_weights(maps.decoder.weights[i]), cross=pack_weights(maps.cross_weights[i]))
    return out
