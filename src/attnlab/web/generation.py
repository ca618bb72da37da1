"""The served Generation view: attnlab's own transformer, loaded from the viewer model's folder on the first
``/api/generate``, generating with ``maps=True``.

The viewer's maps come from transformers (:mod:`attnlab.hf`); generation is attnlab's
``Transformer.generate`` with its KV cache, on the same weights. A model it cannot generate with (an
encoder, a family attnlab's transformer does not build) is told once, from its ``config.json``, without
loading anything: ``/api/info`` says why, and the page shows the view disabled with that reason.
"""

from __future__ import annotations

import json
import threading
from typing import Any

MAX_NEW_TOKENS = 128  # per request: 128 steps of rows for every layer and head stay a few MB of JSON


class Generator:
    """Generation for the viewer's model; ``cache`` is the viewer's MapsCache (its model and its lock)."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self._net: Any = None
        self._config: Any = None  # the model's TransformerConfig, or why attnlab's transformer cannot build it
        self.lock = threading.Lock()

    def refusal(self, cannot: str = "does not generate") -> str | None:
        """Why attnlab's transformer cannot run this model as a decoder, or None; an encoder's reason
        ends in what it ``cannot`` do (the circuits say their own)."""
        if self._config is None:
            from attnlab.transformer.config import TransformerConfig

            lm = self.cache.loaded()
            try:
                self._config = TransformerConfig.from_hf(json.loads((lm.path / "config.json").read_text()))
            except (ValueError, KeyError, OSError) as e:
                self._config = f"attnlab's transformer cannot build {lm.model_id!r}: {e}"
        if isinstance(self._config, str):
            return self._config
        return None if self._config.causal else (
            f"{self.cache.loaded().model_id!r} is a {self._config.family} encoder: it reads a whole text at once and "
            f"{cannot}; serve a decoder (attnlab serve --model attnlab:decoder) for this view")

    def info(self) -> dict:
        return {"refusal": self.refusal(), "max_new_tokens": MAX_NEW_TOKENS}

    def model(self) -> Any:
        from attnlab.transformer import Transformer

        with self.lock:
            if self._net is None:
                lm = self.cache.loaded()
                self._net = Transformer.from_pretrained(lm.path)
        return self._net

    def run(self, prompt: str, max_new_tokens: int, temperature: float | None = None, top_k: int | None = None,
            top_p: float | None = None, seed: int | None = None, cache: str = "dense", window: int | None = None,
            sink: int | None = None) -> dict:
        """The steps payload of one generation (greedy unless a sampling option is given; stopping at the model's
        end-of-text; with the KV cache ``cache`` of the library's ``generate``); ValueError: the client's to fix."""
        from attnlab.viz.generation import steps_payload

        why = self.refusal()
        if why is not None:
            raise ValueError(why)
        net, lm = self.model(), self.cache.loaded()
        sample = any(x is not None for x in (temperature, top_k, top_p))
        if seed is not None and not sample:
            raise ValueError("seed takes effect only when sampling: give temperature, top_k or top_p")
        with self.cache.lock:  # one model call at a time, as the captures
            gen = net.generate(prompt, max_new_tokens, sample=sample, temperature=1.0 if temperature is None else temperature,
                               top_k=top_k, top_p=top_p, seed=seed, cache=cache, window=window, sink=sink, maps=True)
        return steps_payload(net, gen, lm.model_id)
