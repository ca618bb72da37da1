"""attnlab's attention, registered with transformers so every head's weights come out.

In transformers 5.x the default ``sdpa`` attention returns no weights for ``output_attentions=True``.
Instead of copying any model code, attnlab registers its own attention function under the name
:data:`ATTN_IMPLEMENTATION` through ``AttentionInterface``; the model's own attention module calls it
with the projected queries, keys and values, and the weights it returns are what
``output_attentions=True`` collects.

A newly registered name also needs a mask function under the same name in
``AttentionMaskInterface``: without one, transformers hands the attention function
``attention_mask=None`` and padding silently leaks into every map of a padded batch. We register
transformers' own ``eager_mask`` (0 where a key may be attended, the dtype's minimum where not, with
causality for decoders). The function below hands the projected q, k, v to
:func:`attnlab.attention` itself: the maps are the spec in action (the backends' agreement tests
cover them), not a second implementation of attention.
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
    """The model's attention computed by :func:`attnlab.attention` (the torch backend), weights kept.

    query (B, H, Tq, D), key (B, Hkv, Tk, D), value (B, Hkv, Tk, Dv) (grouped-query attention when
    Hkv < H), attention_mask additive (B, 1, Tq, Tk) or None → output (B, Tq, H, Dv), weights
    (B, H, Tq, Tk). The mask transformers builds (0 where a key may be attended, the dtype's minimum
    where not) becomes attnlab's boolean mask, so a padded query row gets zero weights, not a
    uniform row (capture drops those rows).
    """
    from attnlab.backends.api import attention

    if kwargs.get("softcap") is not None or kwargs.get("sliding_window") is not None:
        raise RuntimeError("attnlab's capturing attention supports neither softcap nor sliding windows yet")
    if module.training and dropout > 0:
        raise RuntimeError("capture needs the model in eval mode (attention dropout would change the maps)")
    mask = None
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : key.shape[-2]] == 0  # (B, 1, Tq, Tk): True = may attend
    output, weights = attention(query, key, value, mask=mask, scale=scaling, return_weights=True, backend="torch")
    return output.transpose(1, 2).contiguous(), weights  # (B, H, Tq, Dv) → (B, Tq, H, Dv)


def register() -> None:
    """Register the attention function and its mask function with transformers (idempotent)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, capture_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)
