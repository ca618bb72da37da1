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

Learned sinks (gpt-oss's attention hands them over as ``s_aux``, one logit per query head) take part
in the softmax as ``sink_logits=``: the weights a model with sinks returns add up to less than 1, and
each row's **sink share**, exp(sink − LSE) over the same softmax, is handed to :func:`sink_shares`.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator

ATTN_IMPLEMENTATION = "attnlab_capture"

# Where the attention calls of one forward pass leave their queries and keys (capture(qk=True));
# None outside :func:`recording`, so an ordinary forward keeps nothing.
_RECORD: contextvars.ContextVar[list | None] = contextvars.ContextVar("attnlab_capture_record", default=None)
# Inside :func:`observing`: the callback each attention call hands its q, k and LSE to, instead of
# keeping weights (long inputs: no mask and no weights of T × T are ever built).
_OBSERVE: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("attnlab_capture_observe", default=None)
# Inside :func:`sink_shares`: per attention call its rows' sink shares (B, H, Tq), or None (no learned sinks).
_SHARES: contextvars.ContextVar[list | None] = contextvars.ContextVar("attnlab_capture_shares", default=None)


@contextlib.contextmanager
def _collecting(var: contextvars.ContextVar) -> Iterator[list]:
    """A list that ``var`` holds inside the block (what the attention calls append to), then none."""
    items: list = []
    token = var.set(items)
    try:
        yield items
    finally:
        var.reset(token)


def recording() -> contextlib.AbstractContextManager[list]:
    """Collect, call by call, a dict per attention call of the forward run inside the block:
    ``query`` (B, H, Tq, D) and ``key`` (B, H, Tk, D) as the attention function received them (after
    RoPE, before scaling; grouped keys repeated per query head), ``scale``, ``softcap``, ``causal``,
    ``window`` and ``bias`` (the additive position bias, (1 or B, H, Tq, Tk), or None). An
    encoder–decoder's calls come in the forward's order: the encoder's layers, then per decoder layer
    its self-attention and its cross-attention."""
    return _collecting(_RECORD)


def sink_shares() -> contextlib.AbstractContextManager[list]:
    """Collect, call by call in the forward's order, each attention call's sink shares (B, H, Tq): the
    share of each row's softmax that the learned sinks take (the weights add up to 1 minus it), or None
    for a call without learned sinks."""
    return _collecting(_SHARES)


@contextlib.contextmanager
def observing(callback: Callable[..., None]) -> Iterator[None]:
    """Run the model's attention without any T × T array: inside the block, transformers builds no
    mask, each attention call goes through attnlab's compiled blockwise kernel (causal and sliding
    windows as bands, the LSE kept) and then calls ``callback(query (B, H, T, D), key (B, H_kv, T, D),
    lse (B, H, T), scale=, causal=, window=, softcap=, sinks=)``, ``sinks`` the learned sink logits (H,) that the
    LSE includes, or None; no weights come out. One unpadded sequence per call. A callback with a method
    ``attend(query, key, value, scale=, causal=, window=, softcap=, sinks=)`` is asked first: the output
    (B, H, T, Dv) it returns (the attention and what it observes computed together) is the layer's; where it
    returns None, the kernel's forward runs and the callback is called as above."""
    token = _OBSERVE.set(callback)
    try:
        yield
    finally:
        _OBSERVE.reset(token)


def _observed(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None,
              softcap: float | None, sliding_window: int | None, position_bias: Any, callback: Callable,
              sinks: Any) -> tuple:
    from attnlab.backends.api import attention

    if attention_mask is not None or position_bias is not None:
        raise ValueError("long-input statistics take one unpadded sequence of a model without position biases "
                         "(T5's relative bias is T × T); this call came with a mask or a bias")
    causal = bool(getattr(module, "is_causal", False))
    window = None if sliding_window is None else (int(sliding_window) - 1, 0)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    # One contiguous copy of q and k (the model hands them over as transposed views), which the kernel's
    # forward and the callback's pass both read as they are, instead of each making its own.
    query, key = query.contiguous(), key.contiguous()
    softcap = None if softcap is None else float(softcap)  # Gemma-2's cap: the kernel applies it in its tiles
    attend = getattr(callback, "attend", None)  # the callback may compute the attention itself (None: it leaves it)
    out = None if attend is None else attend(query, key, value, scale=scale, causal=causal, window=window,
                                             softcap=softcap, sinks=sinks)
    if out is None:
        out, lse = attention(query, key, value, causal=causal, window=window, scale=scale, softcap=softcap,
                             return_lse=True, sink_logits=sinks, backend="kernel")
        callback(query, key, lse, scale=scale, causal=causal, window=window, softcap=softcap, sinks=sinks)
    return out.transpose(1, 2).contiguous(), None


def capture_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    position_bias: Any = None,
    s_aux: Any = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """The model's attention computed by :func:`attnlab.attention` (the torch backend), weights kept.

    query (B, H, Tq, D), key (B, Hkv, Tk, D), value (B, Hkv, Tk, Dv) (grouped-query attention when
    Hkv < H), attention_mask additive (B, 1, Tq, Tk) or None → output (B, Tq, H, Dv), weights
    (B, H, Tq, Tk). The mask transformers builds (0 where a key may be attended, the dtype's minimum
    where not) becomes attnlab's boolean mask, so a padded query row gets zero weights, not a
    uniform row (capture drops those rows). A sliding window (Mistral, Gemma-2) is already in that
    mask: transformers builds it with the window's mask function. ``softcap`` (Gemma-2) goes to
    attnlab.attention; T5's relative ``position_bias`` (1 or B, H, Tq, Tk) is attnlab's ``bias``;
    gpt-oss's learned sinks ``s_aux`` (H,) its ``sink_logits`` (the rows' shares go to :func:`sink_shares`).
    """
    from attnlab.backends.api import attention

    if module.training and dropout > 0:
        raise RuntimeError("capture needs the model in eval mode (attention dropout would change the maps)")
    observer = _OBSERVE.get()
    sinks = None if s_aux is None else s_aux.detach().to(query.dtype)  # (H,): gpt-oss's learned sinks
    if observer is not None:
        return _observed(module, query, key, value, attention_mask, scaling, softcap, sliding_window, position_bias,
                         observer, sinks)
    if sliding_window is not None and attention_mask is None:
        raise RuntimeError("a sliding-window layer was called without its mask; attnlab cannot apply the window")
    mask = None
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : key.shape[-2]] == 0  # (B, 1, Tq, Tk): True = may attend
    bias = None if position_bias is None else position_bias[..., : key.shape[-2]].to(query.dtype)
    got = attention(query, key, value, mask=mask, bias=bias, scale=scaling, softcap=softcap, sink_logits=sinks,
                    return_weights=True, return_lse=sinks is not None, backend="torch")
    output, weights = got[:2]
    shares = _SHARES.get()
    if shares is not None:  # each row's share of the sink: exp(sink − LSE), the LSE over the sink too
        shares.append(None if sinks is None else (sinks[:, None] - got[2]).exp())  # (B, H, Tq)
    calls = _RECORD.get()
    if calls is not None:
        groups = query.shape[1] // key.shape[1]
        calls.append({
            "query": query.detach(), "key": key.detach().repeat_interleave(groups, dim=1),  # (B, H, T, D)
            "scale": float(scaling) if scaling is not None else query.shape[-1] ** -0.5,
            "softcap": None if softcap is None else float(softcap),
            "bias": None if bias is None else bias.detach(),  # (1 or B, H, Tq, Tk): T5's relative position bias
            "sinks": None if sinks is None else [float(x) for x in sinks],  # (H,): learned sink logits
            "causal": bool(getattr(module, "is_causal", False)),
            # transformers' window: key j is seen by query i when i − window < j ≤ i
            "window": None if sliding_window is None else [int(sliding_window) - 1, 0],
        })
    return output.transpose(1, 2).contiguous(), weights  # (B, H, Tq, Dv) → (B, Tq, H, Dv)


def register() -> None:
    """Register the attention function and its mask function with transformers (idempotent)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    def mask(*args: Any, **kwargs: Any) -> Any:  # no (T, T) mask while observing a long input
        return None if _OBSERVE.get() is not None else eager_mask(*args, **kwargs)

    AttentionInterface.register(ATTN_IMPLEMENTATION, capture_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, mask)
