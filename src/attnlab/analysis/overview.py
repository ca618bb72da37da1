"""At a glance: where each head looks most, and one map set as plain data (what `attnlab maps` shows).

Works on token-level maps and on word-level ones (:meth:`attnlab.maps.records.AttentionMaps.to_words`)
alike: both have ``weights[i]`` of shape (L, H, T, T) and a label per position.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def where_heads_look(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For (L, H, T, T) weights: each head's most attended column and its share, both (L, H).

    A head's *mean row* is the average over the positions attending (each row sums to 1, so the
    mean row does too); its largest entry says where the head looks most across the sentence.
    """
    w = np.asarray(weights)
    if w.ndim != 4 or w.shape[-1] == 0:
        raise ValueError(f"weights must be (L, H, T, T) with T >= 1, got shape {w.shape}")
    mean = w.mean(axis=2)  # (L, H, T)
    top = mean.argmax(axis=-1)
    return top, np.take_along_axis(mean, top[..., None], axis=-1)[..., 0]


def maps_record(maps: Any, pick: tuple[int, int] | None = None, words: Any = None, decimals: int = 6) -> dict:
    """The maps as JSON-ready data: every layer and head of each sentence, or one head (0-based ``pick``).

    ``words``: the word-level maps (``maps.to_words()``) to give instead of the tokens'. Layer and
    head numbers in the result are 1-based, as the CLI takes and shows them.
    """
    view = maps if words is None else words
    unit = "tokens" if words is None else "words"
    labels = maps.tokens if words is None else words.words
    return {
        "model_id": maps.model_id, "revision": maps.revision, "num_layers": maps.num_layers,
        "num_heads": maps.num_heads, "unit": unit,
        "layer": None if pick is None else pick[0] + 1, "head": None if pick is None else pick[1] + 1,
        "sentences": [
            {"sentence": s if isinstance(s, str) else list(s), unit: labels[i],
             "weights": (view.weights[i][pick] if pick else view.weights[i]).round(decimals).tolist()}
            for i, s in enumerate(maps.sentences)
        ],
    }
