"""attnlab: attention end to end.

Compute it (a float64 NumPy specification and fast backends that agree with it), look inside real
models, teach it (``attnlab lesson``) and measure its cost. ``import attnlab`` needs NumPy only:
torch, transformers and the web server are imported inside the functions that use them.
"""

from attnlab.spec.additive import AdditiveAttention
from attnlab.spec.masks import causal_mask, combine, hide_mask, padding_mask, window_mask
from attnlab.spec.multihead import MultiHeadAttention, MultiHeadResult
from attnlab.backends.api import attention
from attnlab.spec.reference import logsumexp, softmax, softmax_jacobian

__version__ = "0.1.0"

# Real maps need torch and transformers: these names load their modules on first use (PEP 562).
_LAZY = {
    "capture": "attnlab.models.capture",
    "load_maps": "attnlab.models.maps",
    "AttentionMaps": "attnlab.models.maps",
    "WordMaps": "attnlab.models.words",
    "head_roles": "attnlab.analysis.roles",
    "HeadRoles": "attnlab.analysis.roles",
    "find_heads": "attnlab.analysis.search",
    "HeadSearch": "attnlab.analysis.search",
    "corpus_roles": "attnlab.analysis.corpus",
    "head_stats": "attnlab.analysis.stats",
    "HeadStats": "attnlab.analysis.stats",
    "rollout": "attnlab.analysis.rollout",
    "flow": "attnlab.analysis.rollout",
    "induction_scores": "attnlab.analysis.induction",
    "ablate": "attnlab.analysis.ablation",
    "head_importance": "attnlab.analysis.ablation",
    "Ablation": "attnlab.analysis.ablation",
    "Importance": "attnlab.analysis.ablation",
    "plan": "attnlab.planner.api",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnlab' has no attribute {name!r}")

__all__ = [
    "Ablation",
    "AdditiveAttention",
    "AttentionMaps",
    "HeadRoles",
    "HeadSearch",
    "Importance",
    "WordMaps",
    "ablate",
    "capture",
    "corpus_roles",
    "find_heads",
    "flow",
    "head_importance",
    "head_roles",
    "head_stats",
    "HeadStats",
    "induction_scores",
    "rollout",
    "load_maps",
    "MultiHeadAttention",
    "MultiHeadResult",
    "attention",
    "causal_mask",
    "combine",
    "hide_mask",
    "logsumexp",
    "padding_mask",
    "plan",
    "softmax",
    "softmax_jacobian",
    "window_mask",
]
