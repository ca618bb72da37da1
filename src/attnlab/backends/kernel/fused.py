"""Self-attention and head_stats' statistics of its weights in one compiled pass (``_tiles.forward_stats``).

The statistics pass (:func:`attnlab.backends.kernel.stats`) runs after the forward and recomputes every score
from q and the rows' LSE: q·kᵀ a second time and an exponential per score, about two thirds of the forward's own
work. Here the forward keeps, per thread, its query block's tiles of weights (the block's rows × every key, in
float32) until the rows' LSE is known, then sweeps them once for the column sums (the attention each key
receives) and the row statistics; the entropy's sum is kept online beside the softmax's. The forward's part is
the kernel's forward (the same out and LSE, bit for bit); the statistics agree with the two passes' to float32
rounding. The kept tiles take :func:`kept_bytes`: where that exceeds :data:`KEPT_BYTES`, callers use the two passes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.backends import kernel
from attnlab.backends.kernel import BLOCK, STATS, _buffers, vis_args
from attnlab.backends.tiling import Tiling, block_sizes

KEPT_BYTES = 2**29  # the most the kept tiles may take, every thread's together (512 MiB)
ROWS_MULTIPLE = 24  # query blocks are padded to a multiple of the widest variant's register rows


def kept_bytes(t: int, block_q: int | None = None, threads: int | None = None) -> int:
    """Bytes of the tiles :func:`forward_stats` keeps for ``t`` keys: per thread, its query block's rows (padded)
    × every key (padded), float32."""
    bq = -(-(BLOCK[0] if block_q is None else block_q) // ROWS_MULTIPLE) * ROWS_MULTIPLE
    n = threads or (kernel._tiles.default_threads() if kernel._tiles is not None else 1)
    return n * bq * (-(-t // 16) * 16 + 16) * 4


def forward_stats(q: Any, k: Any, v: Any, tiling: Tiling, *, scale: float, sinks: Any = None, block_size: Any = None,
                  threads: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """out (B, G, T, Dv), LSE (B, G, T) as :func:`attnlab.backends.kernel.forward` gives them, and ``(sums,
    received)`` as :func:`attnlab.backends.kernel.stats` gives them (float64 (B, G, 7) and (B, G, T)), of canonical
    float32 self-attention q (B, G, T, D), k (B, T, D), v (B, T, Dv) in one pass. NumPy outputs."""
    if kernel._tiles is None:
        raise ValueError("the compiled kernel was not built (it needs a C compiler with OpenMP at install)")
    if tiling.mask is not None or tiling.bias is not None:
        raise ValueError("the compiled kernel takes no dense mask or bias (the blockwise backend does)")
    b, g, t, _ = q.shape
    if tuple(k.shape[:2]) != (b, t):
        raise ValueError(f"k: expected shape (B={b}, T={t}, D) (self-attention: one length), got {tuple(k.shape)}")
    block_q, block_k = BLOCK if block_size is None else block_sizes(1, t, block_size)
    q, k, v = _buffers(q, k, v)
    out, lse = np.empty((b, g, t, v.shape[-1]), np.float32), np.empty((b, g, t), np.float32)
    sums, received = np.zeros((b, g, len(STATS))), np.empty((b, g, t))  # T = 0: no rows, sums 0
    kw = vis_args(tiling.visible, sinks)
    kw.pop("qpos", None)
    if kw.pop("slopes", None) is not None:
        raise ValueError("forward_stats takes no ALiBi (its distances are positions); the forward and stats do")
    kernel._tiles.forward_stats(q, k, v, out, lse, sums, received, scale, block_q, block_k, threads or 0, **kw)
    return out, lse, sums, received


def attention_stats(query: Any, key: Any, value: Any, **options: Any) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    """``attnlab.attention(query, key, value, backend="kernel", return_lse=True, **options)`` of self-attention (its
    checks, its refusals, its result: out (..., T, Dv) and LSE (..., T) in the call's dtype and library) and
    :func:`forward_stats`' sums (B_kv, G, 7) and received (B_kv, G, T) of its weights, in one pass."""
    from attnlab.backends.blockwise import as_result, canonical
    from attnlab.backends.dispatch import choose
    from attnlab.backends.options import Options
    from attnlab.backends.request import prepare

    call = prepare(query, key, value, Options.of(options))
    choose(call.request, "kernel")  # raises, saying why, where the kernel cannot serve the call
    c, p = canonical(call), call.problem
    out, lse, sums, received = forward_stats(c.q, c.k, c.v, c.tiling, scale=p.scale, sinks=c.sinks,
                                             block_size=call.options.block_size)
    if c.torch:
        import torch

        out, lse = torch.from_numpy(out), torch.from_numpy(lse)
    return (as_result(out.reshape(*p.batch, p.tq, p.dv), p.dtype, c.torch),
            as_result(lse.reshape(*p.batch, p.tq), p.dtype, c.torch), sums, received)
