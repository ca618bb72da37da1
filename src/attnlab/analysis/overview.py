"""At a glance: where each head looks most, and one map set as plain data (what `attnlab maps` shows).

Works on token-level maps and on word-level ones (:meth:`attnlab.maps.records.AttentionMaps.to_words`)
alike: both have ``weights[i]`` of shape (L, H, T, T) and a label per position.
"""

from __future__ import annotations

import numpy as np

from attnlab.maps.records import Maps


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


def maps_record(maps: Maps, pick: tuple[int, int] | None = None, decimals: int = 6) -> dict:
    """The maps (token or word level) as JSON-ready data: :meth:`attnlab.maps.records.Maps.to_dict`
    (every layer and head of each sentence, or one head ``pick``; 0-based; with the sink share of
    models with learned sinks)."""
    return maps.to_dict(pick, decimals)
