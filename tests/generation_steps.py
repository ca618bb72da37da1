"""What ``Transformer.generate(..., maps=True)`` must give, computed without a cache: greedy ids by
recomputing the whole sequence at each step, and step t's rows as row P − 1 + t of the full map of
the sequence (``hook_pattern``). The viewer's and the maps file's tests build their steps from it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


def full_map(model, ids: list[int]) -> np.ndarray:
    """[L, H, T, T] float64: the attention of every layer and head over ``ids``, from a forward without a cache."""
    import torch

    L = model.config.num_layers
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(L)]
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids]), names=names, backend="torch")
    return np.stack([cache[n][0].double().numpy() for n in names])


def recomputed(model, prompt: list[int], n: int) -> SimpleNamespace:
    """A Generation-like result of ``n`` greedy steps after ``prompt``, every step recomputed from scratch."""
    import torch

    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model.run_with_hooks(torch.tensor([seq]), backend="torch")
            seq.append(int(logits[0, -1].argmax()))
    P, full = len(prompt), full_map(model, seq[:-1])
    rows = [full[:, :, P - 1 + t, : P + t] for t in range(n)]
    text = model.tokenizer.decode(seq[P:]) if model.tokenizer is not None else None
    return SimpleNamespace(attention=[rows], sequences=[seq], prompt_lengths=[P], positions=[[P - 1 + t for t in range(n)]],
                           text=[text], full=full)
