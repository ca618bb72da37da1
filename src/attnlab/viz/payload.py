"""The viewer's data: captured maps turned into the JSON that the page draws.

One set of shapes for both ways the page gets its data, the local server's API
(:mod:`attnlab.web.server`) and the self-contained HTML file (:mod:`attnlab.viz.page`), so the two
show the same thing. Layers and heads are 0-based in the JSON, as every field (docs/design.md); the
page's script labels them 1-based ("layer 3, head 11") where people read them.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from attnlab.maps.records import Attention, Maps

# The viewer's names of a model's attentions (the head view's and the Neuron view's ``attention``):
# "encoder", the maps' own self-attention (an encoder's, a decoder-only model's, an encoder–decoder's
# encoder), and an encoder–decoder's "decoder" and "cross".
ATTENTIONS = ("encoder", "decoder", "cross")
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


def check_attention(attention: Any) -> str:
    """``attention`` if it is one of :data:`ATTENTIONS`; ValueError naming it otherwise."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(map(repr, ATTENTIONS))}, got {attention!r}")
    return attention


def attention_of(maps: Maps, attention: str) -> Attention:
    """The record of ``attention`` (one of :data:`ATTENTIONS`) in ``maps``; ValueError for an unknown
    name, or for ``"decoder"``/``"cross"`` of a model that is not an encoder–decoder."""
    if check_attention(attention) == "encoder":
        return maps.self_attention
    if not maps.is_seq2seq:
        raise ValueError(f"attention {attention!r} is an encoder–decoder's; {maps.model_id!r} is not an "
                         f"encoder–decoder model (its one attention is 'encoder')")
    return maps.decoder if attention == "decoder" else maps.cross


def sentence_text(s: str | tuple[str, str]) -> str:
    return s if isinstance(s, str) else " | ".join(s)


def check_head(sentences: int, num_layers: int, num_heads: int, i: int, layer: int, head: int, what: str = "") -> None:
    """ValueError with the range for a sentence ``i``, ``layer`` or ``head`` (all 0-based) out of
    range; ``what`` names the attention (" of the cross attention") where a model has several."""
    if not 0 <= i < sentences:
        raise ValueError(f"sentence must be 0..{sentences - 1}, got {i}")
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer{what} must be 0..{num_layers - 1} (0-based), got {layer}")
    if not 0 <= head < num_heads:
        raise ValueError(f"head{what} must be 0..{num_heads - 1} (0-based), got {head}")


def head_matrix(maps: Maps, i: int, layer: int, head: int) -> np.ndarray:
    """The [n, n] map of ``layer`` and ``head`` (0-based) of sentence ``i``, with clear errors."""
    check_head(len(maps.weights), maps.num_layers, maps.num_heads, i, layer, head)
    return maps.weights[i][layer, head]


def round_weights(w: np.ndarray) -> list:
    """Weights as JSON numbers, rounded to :data:`DIGITS` decimals."""
    return np.round(w.astype(np.float64), DIGITS).tolist()


def roles_payload(maps: Maps) -> dict:
    """Role scores per head ([L][H] per role) and the badges: heads whose score reaches the threshold."""
    from attnlab.analysis.roles import ROLES, head_roles

    roles = head_roles(maps, roles=list(BADGE_ROLES))
    badges = [
        {"role": name, **h.to_dict(), "score": round(float(roles.scores[name][h]), 4)}
        for name in BADGE_ROLES
        for h in roles.heads(name)
    ]
    unit = {"weight": "average weight", "nats": "mean entropy, nats"}
    legend = {name: f"{ROLES[name].description} ({unit[ROLES[name].unit]} ≥ {ROLES[name].threshold:g})" for name in BADGE_ROLES}
    scores = {name: np.round(s, 4).tolist() for name, s in roles.scores.items()}
    return {"scores": scores, "badges": badges, "legend": legend}


def maps_payload(maps: Maps, overview: int = DEFAULT_OVERVIEW) -> dict:
    """What the head and model views need, without the full maps (those go one head at a time).

    ``maps``: token-level AttentionMaps or word-level WordMaps. Role badges always come from the
    word-level maps (roles are defined on words).
    """
    sentences = []
    for i, s in enumerate(maps.sentences):
        small = downsample(maps.weights[i], overview)  # (L, H, s, s)
        sentences.append({
            "text": sentence_text(s),
            "labels": maps.labels(i),
            "is_mark": maps.marks(i),
            "overview": {"size": int(small.shape[-1]), "maps": np.round(small.reshape(*small.shape[:2], -1), 4).tolist()},
        })
    return {
        "model": {
            "id": maps.model_id, "revision": maps.revision,
            "num_layers": int(maps.num_layers), "num_heads": int(maps.num_heads),
        },
        "level": maps.level,
        "sentences": sentences,
        "roles": roles_payload(maps),
    }


def pack_weights(weights: np.ndarray) -> str:
    """[L, H, n, n] in [0, 1] → base64 of little-endian uint16 (w · 65535), for the embedded page.

    Resolution 1.5e-5, far below the 0.1 % the page prints; a quarter the size of JSON floats.
    """
    q = np.rint(np.clip(weights.astype(np.float64), 0.0, 1.0) * 65535).astype("<u2")
    return base64.b64encode(q.tobytes()).decode("ascii")


def find_head_payload(maps: Maps, target: str, deciders: list[str], exclude_self: bool = False,
                      exclude_marks: bool = False, occurrence: int | list[int | None] | None = None) -> dict:
    """The head search, and the target's row in each sentence for the head it shows: the best
    qualifying head, or the closest one when none qualifies (the search says so in its summary).
    ``occurrence``: which occurrence of the target, 1-based, where it occurs more than once, for every
    sentence or one per sentence (None: the first, and ``note`` says so)."""
    from attnlab.analysis.search import find_heads

    words = maps.to_words()
    res = find_heads(words, target=target, deciders=deciders, exclude_self=exclude_self, exclude_marks=exclude_marks,
                     occurrence=occurrence)
    out = {"summary": res.summary(), "result": res.to_dict(), "shown": None,
           "note": res.occurrence_note() if occurrence is None else None}
    if res.best is not None:
        shown = res.best
    elif res.closest:
        shown = res.closest[0].head
    else:
        return out
    sides = []
    for i in range(len(words)):
        t, end = res.target_spans[i]  # the occurrence the search used
        d = next(a for a, b in words.spans(i, deciders[i]) if b <= t or end <= a)
        row = words.weights[i][shown.layer, shown.head, t:end].mean(axis=0)  # (W,): the target attending (a run: its rows' mean)
        sides.append({
            "sentence": sentence_text(words.sentences[i]), "words": list(words.words[i]),
            "row": round_weights(row), "target_index": t, "decider_index": d,
        })
    out["shown"] = {**shown.to_dict(), "qualifies": res.best is not None, "sides": sides}
    return out


def seq2seq_labels(maps: Maps) -> dict | None:
    """What the head view's "encoder / decoder / cross" choice needs besides the weights: the
    decoder's ``model`` shape, the ``level`` (tokens, or words for ``to_words()`` maps, which
    aggregate the decoder's and the cross maps by the encoder's rule) and per sentence ``source``
    (the encoder's labels, the keys of cross-attention), ``source_is_mark``, ``target`` (the
    decoder's input: its start token, then the target; the queries) and ``target_is_mark``.
    None for maps without a decoder (an encoder's or a decoder's)."""
    if not maps.is_seq2seq:
        return None
    source, target = maps.source, maps.target
    return {
        "model": {"num_layers": int(maps.decoder.num_layers), "num_heads": int(maps.decoder.num_heads)},
        "level": maps.level,
        "sentences": [{"source": source.labels(i), "source_is_mark": source.marks(i),
                       "target": target.labels(i), "target_is_mark": target.marks(i)} for i in range(len(maps))],
    }


def seq2seq_payload(maps: Maps) -> dict | None:
    """:func:`seq2seq_labels` with, per sentence, the decoder's self-attention [L_dec, H, T_tgt, T_tgt]
    (``decoder``) and the cross-attention [L_dec, H, T_tgt, T_src] (``cross``) packed as
    :func:`pack_weights` packs them, row-major: the self-contained page's encoder–decoder views."""
    out = seq2seq_labels(maps)
    if out is not None:
        for i, s in enumerate(out["sentences"]):
            s.update(decoder=pack_weights(maps.decoder.weights[i]), cross=pack_weights(maps.cross.weights[i]))
    return out
