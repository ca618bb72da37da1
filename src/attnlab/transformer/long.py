"""The long view of attnlab's own transformer: per layer the queries and keys the attention reads
(after rotary) and each row's log-sum-exp, never T × T (:class:`attnlab.maps.long.LongMaps`).

One forward with ``hook_rot_q``/``hook_rot_k`` (``hook_q``/``hook_k`` without rotary positions) cached,
through the model's own backend; then per layer one ``attnlab.attention`` call over those q and k
with ``return_lse=True`` and a one-wide value (the compiled kernel, which softcaps inside its tiles, so no
layer's T × T scores are held), whose LSE is what every weight is computed from. Learned sinks (gpt-oss)
join that softmax as they do the model's and are kept (``sink_logits``): a row's weights add up to less
than 1, the rest being the sink's share.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnlab.maps.long import LongMaps
from attnlab.maps.records import LayerFacts, Tokens


def _names(model: Any) -> tuple[str, str]:
    rot = model.config.positions == "rotary"
    return ("attn.hook_rot_q", "attn.hook_rot_k") if rot else ("attn.hook_q", "attn.hook_k")


def _lse(q: Any, k: Any, facts: LayerFacts, sinks: Any = None) -> Any:
    """Each row's log-sum-exp (H, T) of one sequence's q (H, T, D) and k (H_kv, T, D), with the learned
    ``sinks`` (H,) in every row's softmax where the layer has them."""
    import torch

    from attnlab.backends.api import attention

    v = torch.zeros(k.shape[0], k.shape[1], 1, dtype=q.dtype)  # the LSE does not read the values
    # the kernel softcaps in its tiles: no layer's T × T scores are ever held, softcapped or not
    _, lse = attention(q.contiguous(), k.contiguous(), v, causal=facts.causal, window=facts.window, scale=facts.scale,
                       softcap=facts.softcap, sink_logits=sinks, return_lse=True, backend="kernel")
    return lse


def capture_long(model: Any, input_ids: Any, tokens: list[str] | None = None, sentence: str = "") -> LongMaps:
    """The long view of one sequence ``input_ids`` ([T] or [1, T] ints) through ``model`` (a
    :class:`~attnlab.transformer.model.Transformer`): a LongMaps whose weights
    :mod:`attnlab.analysis.longview` computes. ``tokens``: the positions' labels (default the ids)."""
    import torch

    ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long).reshape(1, -1)  # (1, T)
    t, c = ids.shape[1], model.config
    if t > c.max_positions:
        raise ValueError(f"input_ids has {t} tokens; the model takes at most {c.max_positions} (its positions): cut "
                         f"them to {c.max_positions}, or use a model with at least {t} positions")
    labels = [str(int(i)) for i in ids[0]] if tokens is None else list(tokens)
    if len(labels) != t:
        raise ValueError(f"tokens has {len(labels)} labels for {t} ids; give one per id")
    q_name, k_name = _names(model)
    wanted = [f"blocks.{l}.{n}" for l in range(c.num_layers) for n in (q_name, k_name)]
    with torch.inference_mode():
        _, cache = model.run_with_cache(ids, names=wanted)
    queries, keys, lses, facts, sinks = [], [], [], [], []
    for layer in range(c.num_layers):
        q = cache[f"blocks.{layer}.{q_name}"][0].float()  # (H, T, D)
        k = cache[f"blocks.{layer}.{k_name}"][0].float()  # (H_kv, T, D)
        w = c.attention_window(layer)  # masks.sliding_window(W): the facts keep its (left, right) reaches
        f = LayerFacts(scale=c.attn_scale if c.attn_scale is not None else 1.0 / math.sqrt(q.shape[-1]),
                       softcap=c.attn_softcap, causal=bool(c.causal), window=None if w is None else (w.left, w.right))
        s = model.blocks[layer].attn.sinks  # gpt-oss's learned sinks (H,), or None
        s = None if s is None else s.detach().float()
        with torch.inference_mode():
            lses.append(_lse(q, k, f, s).numpy())
        sinks.append(s)
        queries.append(q.numpy())
        keys.append(k.numpy())
        facts.append(f)
    side = Tokens(tokens=[labels], word_of=[list(range(t))], words=[labels], kinds=[["word"] * t])
    return LongMaps(sentence=sentence or " ".join(labels), side=side, queries=np.stack(queries), keys=np.stack(keys),
                    lse=np.stack(lses), layers=tuple(facts), model_id="attnlab.transformer", revision=None,
                    sink_logits=None if sinks[0] is None else np.stack([x.numpy() for x in sinks]),
                    config={"num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads})
