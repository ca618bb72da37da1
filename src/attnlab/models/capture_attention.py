"""attnlab's attention implementation, registered with transformers so every head's weights come out.

In transformers 5.x the default ``sdpa`` attention returns no weights for ``output_attentions=True``.
Instead of copying any model code, attnlab registers its own attention function under the name
:data:`ATTN_IMPLEMENTATION` through ``AttentionInterface``; the model's own attention module calls it
with the projected queries, keys and values, and the weights it returns are what
``output_attentions=True`` collects.

A newly registered name also needs a mask function under the same name in
``AttentionMaskInterface``: without one, transformers hands the attention function
``attention_mask=None`` and padding silently leaks into every map of a padded batch. We register
transformers' own ``eager_mask`` (0 where a key may be attended, the dtype's minimum where not, with
causality for decoders), so the function below is the eager computation, step for step.
"""

from __future__ import annotations

from typing import Any

ATTN_IMPLEMENTATION = "attnlab_capture"


def capture_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """Scaled dot-product attention that returns its weights.

    query (B, H, Tq, D), key (B, Hkv, Tk, D), value (B, Hkv, Tk, Dv), attention_mask additive
    (B, 1, Tq, Tk) or None → output (B, Tq, H, Dv), weights (B, H, Tq, Tk) in float32 softmax.
    """
    import torch

    if kwargs.get("softcap") is not None or kwargs.get("sliding_window") is not None:
        raise RuntimeError("attnlab's capturing attention supports neither softcap nor sliding windows")
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)  # (B, H, Tk, D)
        value = value.repeat_interleave(groups, dim=1)  # (B, H, Tk, Dv)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (B, H, Tq, Tk)
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, H, Tq, Dv) → (B, Tq, H, Dv)
    return output, weights


def register() -> None:
    """Register the attention function and its mask function with transformers (idempotent)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, capture_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)
