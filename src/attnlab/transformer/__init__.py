"""A transformer built from attnlab's parts (embeddings, positions, blocks, norms, FFN), loading real weights from safetensors.

``from attnlab.transformer import Transformer, TransformerConfig``: the model (torch) loads on first
use of its name, so importing this package needs NumPy only. Its hook points
(:mod:`attnlab.transformer.hooks`: ``run_with_cache``, ``run_with_hooks``) are TransformerLens's;
it generates with a :class:`KVCache` (``Transformer.generate`` → :class:`Generation`).

``Transformer.from_pretrained(DEFAULT_DECODER)`` is the small decoder that ships with attnlab (a
Llama-style model trained on the docstrings of Python's standard library, with its tokenizer): text
in, text out, offline. ``"attnlab:decoder-long"`` is its sibling with a context of 2,048 tokens,
trained at that length on the standard library's source files.
"""

from attnlab.locate.folder import DECODER as DEFAULT_DECODER
from attnlab.transformer.config import TransformerConfig

_LAZY = {"Transformer": "attnlab.transformer.model", "KVCache": "attnlab.transformer.cache",
         "Generation": "attnlab.transformer.generate"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnlab.transformer' has no attribute {name!r}")


__all__ = ["DEFAULT_DECODER", "Generation", "KVCache", "Transformer", "TransformerConfig"]
