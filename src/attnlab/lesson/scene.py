"""The lesson's scene: "I sat on the bank of the river", d = 2, the query of "bank".

The numbers are the lesson's, written by hand so the arithmetic can be followed in one's head:
the two value dimensions are (riverbank, money). Unscaled, "bank" gives 60 % of its weight to
"river" and blends to (0.75, 0.05); divided by √2, 46 % and (0.63, 0.06).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from attnlab.reference.attention import attention

TOKENS = ("I", "sat", "on", "the", "bank", "of", "the", "river")
QUERY_TOKEN = "bank"
QUERY = np.array([[1.0, 1.0]])  # (1, 2): the query of "bank"
KEYS = np.array(
    [[-1.6, 0], [-0.3, 1], [-0.8, -0.8], [-0.8, -0.8], [0.5, -0.5], [-0.8, -0.8], [-0.8, -0.8], [1, 0.8]]
)  # (8, 2)
VALUES = np.array(
    [[0, 0], [0.5, 0], [0, 0], [0, 0], [0.5, 0.5], [0, 0], [0, 0], [1, 0]]
)  # (8, 2): (riverbank, money)
VALUE_AXES = ("riverbank", "money")


@dataclass(frozen=True)
class SceneResult:
    """One pass of the scene; lists, so that it goes to JSON as it is."""

    scaled: bool
    scale: float
    scores: list[float]  # q·k_j · scale, one per token
    weights: list[float]  # softmax of the scores
    output: list[float]  # Σ_j α_j v_j, in (riverbank, money)

    def to_dict(self) -> dict:
        return asdict(self)


def compute_scene(scaled: bool) -> SceneResult:
    """The scene with the division by √d (``scaled=True``) or without it (the lesson's arithmetic)."""
    scale = 1 / math.sqrt(KEYS.shape[1]) if scaled else 1.0
    out, w = attention(QUERY, KEYS, VALUES, scale=scale, return_weights=True)
    scores = (QUERY @ KEYS.T)[0] * scale
    return SceneResult(scaled, scale, scores.tolist(), w[0].tolist(), out[0].tolist())


def scene() -> dict:
    """Everything `attnlab scene` shows, as plain data (the JSON schema of ``--json``)."""
    return {
        "tokens": list(TOKENS),
        "query_token": QUERY_TOKEN,
        "query": QUERY[0].tolist(),
        "keys": KEYS.tolist(),
        "values": VALUES.tolist(),
        "value_axes": list(VALUE_AXES),
        "unscaled": compute_scene(False).to_dict(),
        "scaled": compute_scene(True).to_dict(),
    }
