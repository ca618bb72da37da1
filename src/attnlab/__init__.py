"""attnlab: attention end to end.

Compute it (a float64 NumPy specification and fast backends that agree with it), look inside real
models, teach it (``attnlab lesson``) and measure its cost. ``import attnlab`` needs NumPy only:
torch, transformers and the web server are imported inside the functions that use them.
"""

from attnlab.attention.additive import AdditiveAttention
from attnlab.attention.masks import causal_mask, combine, hide_mask, padding_mask, window_mask
from attnlab.attention.multihead import MultiHeadAttention, MultiHeadResult
from attnlab.attention.reference import attention, logsumexp, softmax, softmax_jacobian

__version__ = "0.1.0"

__all__ = [
    "AdditiveAttention",
    "MultiHeadAttention",
    "MultiHeadResult",
    "attention",
    "causal_mask",
    "combine",
    "hide_mask",
    "logsumexp",
    "padding_mask",
    "softmax",
    "softmax_jacobian",
    "window_mask",
]
