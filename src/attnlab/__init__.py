"""attnlab: attention end to end.

Compute it (a float64 NumPy specification and fast backends that agree with it), look inside real
models, teach it (``attnlab lesson``) and measure its cost. ``import attnlab`` needs NumPy only:
torch, transformers and the web server are imported inside the functions that use them.
"""

from attnlab import masks
from attnlab.reference.additive import AdditiveAttention
from attnlab.reference.masks import causal_mask, combine, hide_mask, padding_mask, window_mask
from attnlab.reference.multihead import MultiHeadAttention, MultiHeadResult
from attnlab.backends.api import attention
from attnlab.reference.attention import logsumexp, softmax, softmax_jacobian
from attnlab.maps.heads import Head, ScoredHead

__version__ = "0.1.0"


def _notebook_html(maps) -> str:
    from attnlab.viz.page import notebook_html

    return notebook_html(maps)


# Captured maps show themselves in a notebook as the viewer: registered here, from above, so that
# the maps data never import the viewer (attnlab.maps.display).
from attnlab.maps import display as _display  # noqa: E402

_display.register_html(_notebook_html)

# Real maps need torch and transformers: these names load their modules on first use (PEP 562).
_LAZY = {
    "capture": "attnlab.hf.capture",
    "capture_long": "attnlab.hf.capture_long",
    "LongMaps": "attnlab.maps.long",
    "load_maps": "attnlab.maps.tokens",
    "AttentionMaps": "attnlab.maps.tokens",
    "WordMaps": "attnlab.maps.words",
    "head_roles": "attnlab.analysis.roles",
    "HeadRoles": "attnlab.analysis.roles",
    "find_heads": "attnlab.analysis.search",
    "HeadSearch": "attnlab.analysis.search",
    "corpus_roles": "attnlab.interventions.corpus",
    "head_stats": "attnlab.interventions.stats",
    "HeadStats": "attnlab.interventions.stats",
    "rollout": "attnlab.analysis.rollout",
    "flow": "attnlab.analysis.rollout",
    "induction_scores": "attnlab.interventions.induction",
    "ablate": "attnlab.interventions.ablation",
    "head_importance": "attnlab.interventions.ablation",
    "Ablation": "attnlab.interventions.ablation",
    "Importance": "attnlab.interventions.ablation",
    "patch": "attnlab.interventions.patching",
    "attribution_patch": "attnlab.interventions.patching",
    "Patching": "attnlab.interventions.patching",
    "path_patch": "attnlab.interventions.paths",
    "PathPatching": "attnlab.interventions.paths",
    "logit_attribution": "attnlab.interventions.attribution",
    "logit_lens": "attnlab.interventions.attribution",
    "Attribution": "attnlab.interventions.attribution",
    "plan": "attnlab.planner.api",
    "kv_report": "attnlab.interventions.kv_report",
    "KVReport": "attnlab.interventions.kv_report",
    "QuantizedKV": "attnlab.reference.quantized",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnlab' has no attribute {name!r}")

__all__ = [
    "Ablation",
    "AdditiveAttention",
    "Attribution",
    "AttentionMaps",
    "Head",
    "HeadRoles",
    "HeadSearch",
    "Importance",
    "KVReport",
    "WordMaps",
    "ablate",
    "capture",
    "capture_long",
    "corpus_roles",
    "find_heads",
    "flow",
    "head_importance",
    "head_roles",
    "head_stats",
    "HeadStats",
    "LongMaps",
    "induction_scores",
    "kv_report",
    "rollout",
    "load_maps",
    "logit_attribution",
    "logit_lens",
    "MultiHeadAttention",
    "MultiHeadResult",
    "PathPatching",
    "Patching",
    "QuantizedKV",
    "ScoredHead",
    "attention",
    "attribution_patch",
    "causal_mask",
    "combine",
    "hide_mask",
    "logsumexp",
    "masks",
    "padding_mask",
    "patch",
    "path_patch",
    "plan",
    "softmax",
    "softmax_jacobian",
    "window_mask",
]
