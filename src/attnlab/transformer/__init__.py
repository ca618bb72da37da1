"""A transformer built from attnlab's parts (embeddings, positions, blocks, norms, FFN), loading real weights from safetensors.

``from attnlab.transformer import Transformer, TransformerConfig``: the model (torch) loads on first
use of its name, so importing this package needs NumPy only.
"""

from attnlab.transformer.config import TransformerConfig

_LAZY = {"Transformer": "attnlab.transformer.model", "Trace": "attnlab.transformer.model"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnlab.transformer' has no attribute {name!r}")


__all__ = ["DEFAULT_DECODER", "Trace", "Transformer", "TransformerConfig"]
