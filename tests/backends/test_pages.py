"""A decoding step's cache on huge pages: pages.zeros asks Linux for them before the memory is first touched."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from attnlab.backends import pages

linux = pytest.mark.skipif(not sys.platform.startswith("linux") or not Path("/proc/self/smaps").exists(),
                           reason="madvise and /proc/self/smaps are Linux's")


def _vm_flags(address: int) -> list[str]:
    """The flags of the mapping that holds ``address`` (``hg``: advised for huge pages)."""
    span = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            span = (int(m[1], 16), int(m[2], 16))
        elif line.startswith("VmFlags:") and span and span[0] <= address < span[1]:
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def _inside(x: torch.Tensor) -> int:
    """The first whole huge page inside x's memory."""
    return -(-x.data_ptr() // pages.HUGE_PAGE) * pages.HUGE_PAGE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_zeros_are_zeros_of_the_shape_and_dtype(dtype):
    x = pages.zeros((1, 2, 3000, 128), dtype)
    assert x.shape == (1, 2, 3000, 128) and x.dtype == dtype and x.is_contiguous()
    assert not x.any()


@linux
def test_a_large_buffer_is_advised_and_a_small_one_left_alone():
    big = pages.zeros((1, 8, 4096, 128), torch.float32)  # 16 MiB
    assert pages.advise(big)
    assert "hg" in _vm_flags(_inside(big))
    small = torch.zeros(1000)
    assert not pages.advise(small)  # no whole huge page inside: nothing to ask for


@linux
def test_the_model_caches_ask_for_huge_pages():
    from attnlab.transformer.layer_cache import DenseCache
    from attnlab.transformer.quantize import Store

    dense = DenseCache(1, 8, 128, 8192, torch.bfloat16, "cpu")  # 16 MiB each of k and v
    codes = Store("int8", 1, 8, 128, 16384, torch.float32, "cpu").codes  # 16 MiB
    for x in (dense.k, dense.v, codes):
        assert "hg" in _vm_flags(_inside(x))
