"""Buffers that a decoding step reads from end to end (a KV cache's keys and values) on huge pages.

A step's work is reading its cache, once, at the memory's rate. On 4 KiB pages that read crosses a page
every 4 KiB of keys and of values (a block of 16 bfloat16 keys of 128 channels is one page): each
crossing a TLB miss, and the hardware prefetcher starts again. Linux lends 2 MiB pages to memory that
asks for them (transparent huge pages, ``madvise`` mode, the default of most distributions), so
:func:`zeros` asks before the buffer is first touched. Measured on a 2-core AVX-512 Xeon (generate's
call, 32 query heads over 8 k/v heads of 128 channels, 8,192 to 131,072 keys, 1 GB of caches cycled,
medians of three interleaved runs): float32 steps 1.03-1.07x faster, bfloat16 1.03-1.07x, float16
1.03-1.08x. Where the OS does not lend them (another OS, ``never``), nothing changes.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

HUGE_PAGE = 2 << 20  # bytes (x86-64 and most arm64 kernels)
MADV_HUGEPAGE = 14  # Linux's <sys/mman.h>


def zeros(shape: tuple[int, ...], dtype: Any, device: Any = "cpu") -> Any:
    """``torch.zeros(shape, dtype=dtype, device=device)``, its memory asked for as huge pages first (:func:`advise`)."""
    import torch

    x = torch.empty(shape, dtype=dtype, device=device)
    advise(x)
    return x.zero_()


def advise(x: Any) -> bool:
    """Ask Linux for huge pages under the whole 2 MiB pages inside tensor ``x``'s memory (before it is first
    written: pages already touched stay as they are until the kernel's khugepaged merges them). True where
    the advice was taken; False elsewhere (not Linux, not the CPU, no whole huge page inside)."""
    if not sys.platform.startswith("linux") or x.device.type != "cpu":
        return False
    start = x.untyped_storage().data_ptr()
    lo = -(-start // HUGE_PAGE) * HUGE_PAGE
    hi = (start + x.untyped_storage().nbytes()) // HUGE_PAGE * HUGE_PAGE
    if hi - lo < HUGE_PAGE:
        return False
    libc = _libc()
    return libc is not None and libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), MADV_HUGEPAGE) == 0


@functools.cache
def _libc() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None
