"""The blockwise kernel's forward pass compiled (``_tiles.c``), for float32 on the CPU.

Built at install when a C compiler with OpenMP is there (``pyproject.toml``: an optional
extension); without it, or for what it does not serve, :func:`attnlab.attention.blockwise.forward`
runs its Python loop, which computes the same thing. :func:`refusal` says which way a call goes.

It serves the canonical shapes of ``blockwise``: q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv),
float32, on the CPU, with a band (causal, sliding window) and key-padding lengths; not a dense mask
or a bias. Its tiles: ``BLOCK`` = 96 query rows × 512 keys (a 192 kB score tile, inside a core's
L2); a key block is rounded up to whole vectors of keys (16 with AVX-512).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.attention._checks import is_torch

try:
    from attnlab.attention import _tiles
except ImportError:  # built without a C compiler: the Python loop serves every call
    _tiles = None

BLOCK = (96, 512)
ENABLED = True  # the tests switch it off to run the Python loop on the same calls
# Threads: None is OpenMP's default, the one torch uses too (the process shares torch's libgomp):
# torch.set_num_threads(n) or OMP_NUM_THREADS if set, else every CPU.
THREADS: int | None = None


def isa() -> str | None:
    """The instruction set the kernel runs with here ("AVX-512", "AVX2", "128-bit vectors"), None if not built."""
    return None if _tiles is None else _tiles.isa()


def refusal(device: str, dtype: str, masked: bool) -> str | None:
    """Why the compiled kernel cannot compute a forward pass (None: it can), from the plain facts:
    the tensors' device ("cpu", "cuda:0", …), the dtype it computes in, and whether a dense mask
    or a bias comes with the call."""
    if _tiles is None:
        return "the compiled kernel was not built (it needs a C compiler with OpenMP at install)"
    if not ENABLED:
        return "switched off (attnlab.attention.tiles.ENABLED)"
    if device != "cpu" or dtype != "float32":
        return f"float32 on the CPU only, got {dtype} on {device}"
    if masked:
        return "a dense mask or a bias goes through the Python loop"
    return None


def forward(q: Any, k: Any, v: Any, tiling: Any, *, scale: float, block_q: int, block_k: int) -> tuple[Any, Any]:
    """out (B, G, Tq, Dv) and LSE (B, G, Tq) of canonical float32 q, k, v, as blockwise.forward."""
    b, g, tq, d = q.shape
    tk, dv = k.shape[1], v.shape[-1]
    torch_in = is_torch(q)
    if torch_in:
        q, k, v = (x.detach().contiguous().numpy() for x in (q, k, v))  # views of the same memory
    q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
    # one kind of output buffer for both kinds of input; tensors share it through torch.from_numpy
    out, lse = np.empty((b, g, tq, dv), np.float32), np.empty((b, g, tq), np.float32)
    klen = tiling.klen
    if klen is not None:
        klen = np.ascontiguousarray(klen.cpu().numpy() if is_torch(klen) else klen, dtype=np.int64)
    left = -1 if tiling.left is None else tiling.left
    right = -1 if tiling.right is None else tiling.right
    _tiles.forward(q, k, v, out, lse, klen, b, g, tq, tk, d, dv, scale, left, right, block_q, block_k, THREADS or 0)
    if torch_in:
        import torch

        return torch.from_numpy(out), torch.from_numpy(lse)
    return out, lse
