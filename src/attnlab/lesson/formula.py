"""Sections 1 and 2 of the lesson: the formula on the scene, and where Q, K and V come from.

Section 1 runs the scene (:mod:`attnlab.lesson.scene`) unscaled and scaled by 1/√2. Section 2
projects a small X into Q = XW^Q, K = XW^K, V = XW^V through :class:`MultiHeadAttention`, for
self-attention and for cross-attention (different lengths), sets Bahdanau's additive score beside
the dot product on the same inputs, and runs the book listing of a multi-head NumPy implementation
(:mod:`attnlab.lesson.listing`).
"""

from __future__ import annotations

import math

import numpy as np

from attnlab.reference.additive import AdditiveAttention
from attnlab.reference.multihead import MultiHeadAttention
from attnlab.reference.attention import attention, softmax
from attnlab.lesson.fmt import num, pct, vec
from attnlab.lesson.listing import run_listing
from attnlab.lesson.scene import scene
from attnlab.lesson.section import Section, table

# What the lesson states for the scene.
SEED_SCENE = {
    "unscaled": {"weights_pct": [60, 20, 10, 2], "output": [0.75, 0.05]},
    "scaled": {"weights_pct": [46, 21, 13, 4], "output": [0.63, 0.06]},
    "scores": [1.8, 0.7, 0.0, -1.6],
}

# Section 2's small example: X has 4 tokens of d_model = 8, the other sequence 6 tokens of 6.
D_MODEL, HEADS, T_SELF = 8, 2, 4
T_OTHER, D_OTHER = 6, 6
D_HIDDEN = 16  # the additive scorer's hidden layer


def _distinct_weights(weights: list[float]) -> list[float]:
    """The distinct weights, largest first, the way the lesson lists them (60 %, 20 %, 10 %, 2 %)."""
    return sorted({round(w, 12) for w in weights}, reverse=True)


def formula_section() -> Section:
    data = scene()
    un, sc = data["unscaled"], data["scaled"]
    rows = [
        [tok, vec(data["keys"][i], 1), num(un["scores"][i]), pct(un["weights"][i]), num(sc["scores"][i]), pct(sc["weights"][i])]
        for i, tok in enumerate(data["tokens"])
    ]
    axes = ", ".join(data["value_axes"])
    findings = (
        f'The query of "bank", q = {vec(data["query"], 0)}, scores each key by q·k; softmax turns the scores into '
        "weights that add up to 1, and the output is the weighted blend of the values.",
        "Unscaled (the scene): " + ", ".join(pct(w) for w in _distinct_weights(un["weights"]))
        + f" → ({axes}) = {vec(un['output'])}.",
        "Scaled by 1/√2: " + ", ".join(pct(w) for w in _distinct_weights(sc["weights"]))
        + f" → {vec(sc['output'])}: the same side, less pronounced.",
    )
    tables = (
        table(
            'The query of "bank" over "I sat on the bank of the river" (d = 2)',
            ["token", "key k", "q·k", "weight", "q·k / √2", "weight (scaled)"],
            rows,
        ),
        table(
            f"Blended vector ({axes})",
            ["", "output", "the lesson states"],
            [
                ["unscaled", vec(un["output"]), vec(SEED_SCENE["unscaled"]["output"])],
                ["scaled by 1/√2", vec(sc["output"]), vec(SEED_SCENE["scaled"]["output"])],
            ],
        ),
    )
    data = dict(data, distinct_weights={"unscaled": _distinct_weights(un["weights"]), "scaled": _distinct_weights(sc["weights"])})
    return Section("formula", 1, "The formula and the scene", findings, tables, data, SEED_SCENE)


def _rows(matrix: np.ndarray, labels: list[str]) -> list[list[str]]:
    return [[label] + [pct(w) for w in row] for label, row in zip(labels, matrix)]


def qkv_section(seed: int = 0) -> Section:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T_SELF, D_MODEL))  # (4, 8): a sequence of 4 tokens
    other = rng.standard_normal((T_OTHER, D_OTHER))  # (6, 6): another sequence, other length and size
    x_names = [f"x{i + 1}" for i in range(T_SELF)]
    y_names = [f"y{j + 1}" for j in range(T_OTHER)]

    # Self-attention: Q, K, V all from X. Recompute head 1 by hand to show what the layer does.
    layer = MultiHeadAttention(D_MODEL, HEADS, seed=seed)
    self_res = layer(x)  # weights (2, 4, 4)
    d_head = layer.d_head
    q = (x @ layer.w_q + layer.b_q)[:, :d_head]  # (4, 4): head 1 is the first d_head columns
    k = (x @ layer.w_k + layer.b_k)[:, :d_head]
    by_hand = softmax(q @ k.T / math.sqrt(d_head))  # (4, 4)
    self_check = float(np.max(np.abs(by_hand - self_res.weights[0])))

    # Cross-attention: queries from X, keys and values from the other sequence.
    cross_layer = MultiHeadAttention(D_MODEL, HEADS, d_kv=D_OTHER, seed=seed)
    cross_res = cross_layer(x, other)  # weights (2, 4, 6)

    # Bahdanau: decoder states s_i (queries) against encoder states h_j (keys = values), same inputs.
    states = rng.standard_normal((T_OTHER, D_MODEL))  # (6, 8): encoder states h_j
    dot_out, dot_w = attention(x, states, states, return_weights=True)  # (4, 8), (4, 6)
    additive = AdditiveAttention(D_MODEL, D_MODEL, D_HIDDEN, seed=seed)
    add_out, add_w = additive(x, states)  # (4, 8), (4, 6)
    add_scores = additive.scores(x, states)  # (4, 6)
    dot_scores = x @ states.T / math.sqrt(D_MODEL)

    listing = run_listing(seed)
    findings = (
        f"Self-attention: Q = XW^Q, K = XW^K, V = XW^V from one X ({T_SELF} tokens × {D_MODEL}); {HEADS} heads of "
        f"{d_head} give {HEADS} maps of {T_SELF} × {T_SELF}; head 1 recomputed by hand from W^Q and W^K agrees "
        + ("exactly." if self_check == 0 else f"to {self_check:.1e}."),
        f"Cross-attention: queries from X ({T_SELF} tokens), keys and values from another sequence ({T_OTHER} tokens "
        f"× {D_OTHER}): each head's map is {T_SELF} × {T_OTHER}.",
        f"Bahdanau's additive score vᵀtanh(Ws + Uh) beside the dot product s·h/√{D_MODEL} on the same inputs: "
        f"different scores, the same softmax and the same weighted sum; for x1 the largest weight falls on "
        f"{y_names[int(np.argmax(dot_w[0]))]} (dot) and {y_names[int(np.argmax(add_w[0]))]} (additive).",
        "The book listing of a multi-head NumPy implementation, made to run (as printed it lacks a bracket and an "
        f"import and calls an undefined function): head 1's weights for token 1 are {', '.join(pct(w) for w in listing.weights[0])} and its "
        f"output (attention_input1) {vec(listing.head1[0])}; the eight heads concatenate to "
        f"{listing.multihead.heads.shape[0]} × {listing.multihead.heads.shape[-1]} per token and W^O maps them back "
        f"to {listing.multihead.output.shape[-1]}.",
    )
    tables = (
        table("Self-attention, head 1: weights (row = query)", ["query"] + x_names, _rows(self_res.weights[0], x_names)),
        table("Cross-attention, head 1: queries from X, keys from Y", ["query"] + y_names, _rows(cross_res.weights[0], x_names)),
        table(
            "Dot product vs additive score on the same inputs (query x1)",
            ["key", "s·h/√8", "weight (dot)", "additive e", "weight (additive)"],
            [
                [y, num(dot_scores[0, j]), pct(dot_w[0, j]), num(add_scores[0, j]), pct(add_w[0, j])]
                for j, y in enumerate(y_names)
            ],
        ),
        table(
            "The book's multi-head listing, head 1, k_d = 1",
            ["token", "Q = xW^Q", "K = xW^K", "V = xW^V", "QKᵀ row", "weights", "output"],
            [
                [f"{i + 1}", vec(listing.q[i], 0), vec(listing.k[i], 0), vec(listing.v[i], 0), vec(listing.scores[i], 0),
                 ", ".join(pct(w) for w in listing.weights[i]), vec(listing.head1[i])]
                for i in range(listing.q.shape[0])
            ],
        ),
    )
    data = {
        "x": x.tolist(),
        "other": other.tolist(),
        "self": {"weights": self_res.weights.tolist(), "by_hand_max_error": self_check},
        "cross": {"weights": cross_res.weights.tolist(), "shape": list(cross_res.weights.shape)},
        "dot_vs_additive": {
            "states": states.tolist(),
            "dot_scores": dot_scores.tolist(),
            "dot_weights": dot_w.tolist(),
            "dot_output": dot_out.tolist(),
            "additive_scores": add_scores.tolist(),
            "additive_weights": add_w.tolist(),
            "additive_output": add_out.tolist(),
        },
        "listing": {
            "q": listing.q.tolist(),
            "k": listing.k.tolist(),
            "v": listing.v.tolist(),
            "scores": listing.scores.tolist(),
            "weights": listing.weights.tolist(),
            "head1": listing.head1.tolist(),
            "multihead_weights": listing.multihead.weights.tolist(),
            "multihead_output": listing.multihead.output.tolist(),
            "causal_weights": listing.causal.weights.tolist(),
        },
    }
    return Section("qkv", 2, "Where Q, K and V come from", findings, tables, data)
