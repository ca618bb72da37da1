"""The book listing of a multi-head attention implementation in NumPy, made to run and made whole.

As printed, the listing does not run: ``w_query`` is missing an opening bracket, ``scipy`` is
used but never imported, and ``masked_dot_product_self_attention`` calls an undefined
``DotProductAttention``. It also fills seven of its eight heads with random numbers. Here every
head is computed: head 1 uses the listing's own W^Q, W^K, W^V (unscaled, ``k_d = 1`` as printed),
heads 2–8 seeded projections of the same size, and the causal variant uses attnlab's mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnlab.reference.multihead import MultiHeadAttention, MultiHeadResult
from attnlab.reference.attention import attention

X = np.array([[1.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]])  # (3 tokens, 4)
W_QUERY = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]], dtype=float)  # (4, 3)
W_KEY = np.array([[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype=float)  # (4, 3)
W_VALUE = np.array([[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]], dtype=float)  # (4, 3)
NUM_HEADS = 8


@dataclass(frozen=True)
class ListingResult:
    q: np.ndarray  # (3, 3) = X W^Q
    k: np.ndarray  # (3, 3)
    v: np.ndarray  # (3, 3)
    scores: np.ndarray  # (3, 3) = Q Kᵀ / k_d, k_d = 1
    weights: np.ndarray  # (3, 3), softmax of each row
    head1: np.ndarray  # (3, 3) = weights V; row 0 is the listing's ``attention_input1``
    multihead: MultiHeadResult  # all eight heads, concatenated and projected by W^O
    causal: MultiHeadResult  # the same layer with the causal mask


def listing_layer(seed: int = 0) -> MultiHeadAttention:
    """Eight heads of size 3 over d_model = 4; head 1 is the listing's, heads 2–8 are seeded."""
    rng = np.random.default_rng(seed)
    d_model, d_head = X.shape[1], W_QUERY.shape[1]
    others = [rng.integers(0, 3, size=(3, d_model, d_head)).astype(float) for _ in range(NUM_HEADS - 1)]
    w_q, w_k, w_v = (
        np.concatenate([first] + [o[i] for o in others], axis=1)  # (4, 8·3): head h in columns 3h..3h+2
        for i, first in enumerate((W_QUERY, W_KEY, W_VALUE))
    )
    w_o = rng.normal(0, 1 / np.sqrt(NUM_HEADS * d_head), size=(NUM_HEADS * d_head, d_model))  # (24, 4)
    return MultiHeadAttention.from_weights(w_q, w_k, w_v, w_o, NUM_HEADS)


def run_listing(seed: int = 0) -> ListingResult:
    q, k, v = X @ W_QUERY, X @ W_KEY, X @ W_VALUE  # (3, 3) each
    head1, weights = attention(q, k, v, scale=1.0, return_weights=True)
    layer = listing_layer(seed)
    return ListingResult(
        q=q,
        k=k,
        v=v,
        scores=q @ k.T,
        weights=weights,
        head1=head1,
        multihead=layer(X, scale=1.0),
        causal=layer(X, scale=1.0, causal=True),
    )
