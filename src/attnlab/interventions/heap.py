"""Handing the C heap's free pages back to the system between the layers of a long input (head_stats)."""

from __future__ import annotations

import ctypes
import functools
from typing import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc
    except (OSError, AttributeError, TypeError):  # another C library, or Windows
        return None


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    glibc keeps freed chunks below its mmap threshold (which rises to 32 MiB as large blocks are
    freed) in the heap, so a long input's per-layer tensors of 16–32 MiB, freed after one layer,
    stay resident under the next layer's: the process's peak then depends on the order of frees
    and differs between identical runs. Trimmed after each layer, the peak is what one layer needs.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
