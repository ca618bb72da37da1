"""The cache of a multi-head latent attention layer (DeepSeek-V3's MLA): per token only the latent c
(``kv_rank``) and the rotary key (``rope_dim``), one row of ``kv_rank + rope_dim`` shared by every head
(:class:`LatentCache`, kind "latent"), never per-head keys and values.

Decoding attends in the latent space (:mod:`attnlab.transformer.latent`): the rows are the keys of one
k/v head, and the values are **the same rows**: ``v`` is ``k`` itself, not a copy, and the attention's
output keeps its first ``kv_rank`` columns (the rotary columns' share is dropped). A view of the first
``kv_rank`` columns would be the exact values, but its rows are ``kv_rank + rope_dim`` apart, which the
compiled decode pass does not read in place (it takes rows of v contiguous, else the call goes to a
path that copies the cache); reading the whole rows costs rope_dim / kv_rank more (64 / 512 in
DeepSeek-V3) of the value arithmetic and copies nothing. Slot = position, as the dense kind.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.transformer.layer_cache import DenseCache, LayerCache


class LatentCache(DenseCache):
    """One layer's latent rows [B, 1, capacity, kv_rank + rope_dim]; ``v`` is ``k`` (the same tensor)."""

    kind = "latent"

    def __init__(self, batch: int, width: int, capacity: int, dtype: torch.dtype, device: Any):
        LayerCache.__init__(self, batch, 1, width, capacity, dtype, device)
        self.v = self.k  # the values are the latent rows themselves (see the module)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes  # one tensor, read as keys and as values

    def _grow(self, needed: int) -> None:
        super()._grow(needed)
        self.v = self.k
