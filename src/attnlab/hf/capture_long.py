"""The long view's capture: a text's queries, keys and row LSEs per layer and head, never a T × T array.

The model runs with attnlab's attention observed (:func:`attnlab.hf.capture_attention.observing`):
transformers builds no mask, each layer's attention goes through the compiled kernel (causal and
sliding windows as bands), which keeps each row's log-sum-exp, and hands its queries and keys
(after rotary and norms) to the callback here, which keeps float32 copies. Memory is
L · (H + H_kv) · T · D floats, as :func:`attnlab.maps.long.long_capture_bytes` counts them.

Encoders and decoders (causal, sliding windows, Gemma-2's softcapped scores: the kernel caps them in its
tiles; gpt-oss's learned sinks, which the LSE includes and the maps keep as ``sink_logits``), one unpadded
text per call; not encoder–decoders: the long view is one sequence's self-attention, while an
encoder–decoder has two sequences, its decoder's cross-attention between them, and (T5) a relative
position bias that is itself T × T; :func:`attnlab.capture` serves them.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from attnlab.hf.encoding import encode
from attnlab.hf.loading import LoadedModel, load_model
from attnlab.maps.long import MAX_LONG_BYTES, LongMaps, long_capture_bytes, size_text
from attnlab.maps.records import LayerFacts, Tokens


class _Keep:
    """The observing callback: each layer's q, k, LSE and facts, as float32 NumPy, copied once into arrays of
    every layer, [L, H, T, D], [L, H_kv, T, D] and [L, H, T], made at the first layer's call (a list of
    per-layer copies stacked at the end copied everything twice and held it twice at the peak)."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.arrays: dict[str, np.ndarray] = {}
        self.facts: list[LayerFacts] = []
        self.sinks: list[np.ndarray | None] = []  # per layer the learned sink logits (H,), or None

    def __call__(self, query: Any, key: Any, lse: Any, *, scale: float, causal: bool, window: tuple | None,
                 softcap: float | None, sinks: Any = None) -> None:
        layer = len(self.facts)
        if layer >= self.num_layers:
            raise RuntimeError(f"the model made more attention calls than its {self.num_layers} layers")
        for name, x in (("queries", query[0]), ("keys", key[0]), ("lse", lse[0])):  # (H, T, D), (H_kv, T, D), (H, T)
            if name not in self.arrays:
                self.arrays[name] = np.empty((self.num_layers, *x.shape), dtype=np.float32)
            self.arrays[name][layer] = x.float().numpy()
        self.facts.append(LayerFacts(scale=scale, softcap=softcap, causal=causal,
                                     window=None if window is None else tuple(window)))
        self.sinks.append(None if sinks is None else sinks.float().numpy())

    def sink_logits(self) -> np.ndarray | None:
        """[L, H] learned sink logits, or None for a model without them (every layer has them or none does)."""
        if all(s is None for s in self.sinks):
            return None
        if any(s is None for s in self.sinks):
            raise RuntimeError("the model has learned sinks on some layers only; the long view reads them on every layer")
        return np.stack(self.sinks)


def _check_memory(lm: LoadedModel, tokens: int, max_bytes: int | None) -> None:
    """Refuse, before the model runs, queries and keys that would pass ``max_bytes`` (None: any size)."""
    c = lm.config
    kv = c.get("num_key_value_heads") or lm.num_heads
    d = c.get("head_dim") or (c.get("hidden_size") or 0) // lm.num_heads
    needed = long_capture_bytes(lm.num_layers, lm.num_heads, kv, d, tokens)
    if max_bytes is not None and needed > max_bytes:
        raise ValueError(f"the long view of {tokens} tokens of {lm.model_id!r} would keep {size_text(needed)} of queries "
                         f"and keys ({lm.num_layers} layers × {lm.num_heads} heads of {d}), over the limit of "
                         f"{size_text(max_bytes)}; cut the text, or pass a larger max_bytes")


def capture_long(text: str, model: str | os.PathLike | LoadedModel | None = None, revision: str | None = None, *,
                 max_bytes: int | None = MAX_LONG_BYTES) -> LongMaps:
    """The long view of ``text`` (one sentence, or an "A\\tB" pair) through ``model`` (as
    :func:`attnlab.capture` takes it): a :class:`~attnlab.maps.long.LongMaps` whose weights
    :mod:`attnlab.analysis.longview` computes a tile, a row, a column or an overview at a time.
    ``max_bytes``: what its queries, keys and LSEs may hold (checked before the model runs; None: any)."""
    import torch

    from attnlab.hf.capture_attention import observing

    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text must be a non-empty string, got {text!r}")
    lm = model if isinstance(model, LoadedModel) else load_model(model, revision)
    if lm.config.get("is_encoder_decoder"):
        raise ValueError(f"the long view serves encoders and decoders; {lm.model_id!r} is an encoder–decoder (two "
                         f"sequences joined by cross-attention; T5's relative position bias is itself T × T): use "
                         f"attnlab.capture, within its memory limit")
    enc = encode(lm.tokenizer, tuple(text.split("\t")), lm.max_tokens, "text", lm.model_id)
    _check_memory(lm, len(enc.ids), max_bytes)
    keep = _Keep(lm.num_layers)
    ids = torch.tensor([enc.ids])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if enc.type_ids is not None:
        inputs["token_type_ids"] = torch.tensor([enc.type_ids])
    with torch.inference_mode(), observing(keep):
        lm.model(**inputs)
    if len(keep.facts) != lm.num_layers:
        raise RuntimeError(f"model {lm.model_id!r} made {len(keep.facts)} attention calls for {lm.num_layers} layers")
    side = Tokens(tokens=[enc.tokens], word_of=[enc.word_of], words=[enc.words], kinds=[enc.kinds])
    return LongMaps(sentence=text, side=side, queries=keep.arrays["queries"], keys=keep.arrays["keys"],
                    lse=keep.arrays["lse"], layers=tuple(keep.facts), model_id=lm.model_id, revision=lm.revision,
                    config=lm.config, sink_logits=keep.sink_logits())
