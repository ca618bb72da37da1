"""How many threads a generation's steps run on: one where a step reads little, torch's count otherwise.

A decoding step of a small model is a few hundred tiny operations (matrix-vector products of a few
hundred kilobytes, attention over a short cache): each of torch's parallel regions, and the compiled
extensions', costs more to wake and join its threads than the work it splits. On a busy machine it
is worse: a region ends when its slowest thread does, and a thread the scheduler has parked behind
another program holds the whole step for the rest of a time slice (measured: a step of the bundled
decoder went from 4 ms to 69 ms under a competing load with two threads, 8 ms with one; see
benchmarks/README.md). So the steps of a generation that reads under :data:`SMALL_STEP_BYTES` per step
(the weights plus the KV cache's bytes) run on one thread, which is also the fastest idle; larger
ones keep ``torch.get_num_threads()``, whose threads each have a share of memory bandwidth to read.
The count is restored when the generation ends, however it ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

SMALL_STEP_BYTES = 16 << 20  # 16 MiB: a step reading less takes well under a millisecond on one core
_PINNED: list[int] = []  # counts pinned by pinned_threads, innermost last


def step_bytes(model: Any, kv: Any) -> int:
    """The bytes a decoding step reads at most: every weight and every slot of the KV cache."""
    return sum(t.numel() * t.element_size() for t in model.parameters()) + int(kv.nbytes)


def threads_for(nbytes: float) -> int:
    """The threads a generation whose step reads ``nbytes`` runs on: one under SMALL_STEP_BYTES, torch's count
    otherwise (the one rule, which the planner also applies to the model it plans for)."""
    return 1 if nbytes < SMALL_STEP_BYTES else torch.get_num_threads()


@contextmanager
def pinned_threads(n: int) -> Iterator[None]:
    """Torch, and every generation inside the block whatever its size, on ``n`` threads: the planner measures
    small stand-ins of a model at the count that model's own generation takes (:func:`threads_for`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    _PINNED.append(n)
    try:
        yield
    finally:
        _PINNED.pop()
        torch.set_num_threads(before)


@contextmanager
def step_threads(model: Any, kv: Any) -> Iterator[int]:
    """Run the block with the threads a generation's steps take (see the module's docstring); yields the count."""
    threads = torch.get_num_threads()
    if _PINNED or threads == 1 or threads_for(step_bytes(model, kv)) == threads:
        yield threads
        return
    torch.set_num_threads(1)
    try:
        yield 1
    finally:
        torch.set_num_threads(threads)
