"""The ``kernel`` backend: the blockwise online softmax compiled (``_tiles.c``), float32 on the CPU.

Built at install when a C compiler with OpenMP is there (``pyproject.toml``: an optional
extension); without it the backend refuses every call and says so, and ``blockwise`` (the same
algorithm as a Python loop) serves them. Float16/bfloat16 inputs are computed in float32 (the decode pass reads them as stored).

What it serves: q, k, v on the CPU (NumPy or torch) with a band (causal, sliding window,
bottom-right aligned, or at each sequence's own length with causal and lengths) and key-padding lengths; not a dense mask or a bias. Its tiles: ``BLOCK`` =
96 query rows × 512 keys (a 192 kB score tile, inside a core's L2); a key block is rounded up to
whole vectors of keys (16 with AVX-512). With AVX2 (16 vector registers) the query block goes
through scores, softmax and P·v 6 rows at a time (their scores stay in L1) and v is packed in
panels of 16 columns. Gradients: FlashAttention-2's backward compiled beside
the forward (:func:`backward`, the twin of :func:`attnlab.backends.online.backward`), tiles of
``BACKWARD_BLOCK``, deterministic for any thread count; below 8 key/value heads a head's key blocks
are split into groups, so that one head feeds every thread (their dQ sums take up to 16 MB). Decoding: calls of at most
:data:`DECODE_MAX_TQ` query rows go to :func:`decode`, which splits the cache into chunks over the
threads, reads each k/v head once for its whole GQA group and reads 16-bit caches as stored. Threads: OpenMP's default, which torch shares
(the process has one libgomp): ``torch.set_num_threads(n)`` or ``OMP_NUM_THREADS``, else every CPU.
The best instruction-set variant this CPU runs is used; ``ATTNLAB_KERNEL_ISA`` (e.g. ``AVX2``) picks
another one at import, to measure how a machine without the better one would fare. Where the CPU and Linux
allow AMX (Sapphire Rapids on), the AVX-512 variant computes int4 keys' scores on its tiles, exactly (integer
products: ``_tiles_decode_amx.h``); ``ATTNLAB_KERNEL_AMX=0`` turns that off.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from attnlab import masks
from attnlab.backends.base import OVERFLOW_LIMIT, Backend, Supports, read_seconds
from attnlab.backends.blockwise import as_result, run_blockwise, work_dtype
from attnlab.backends.kernel.buffers import buffers as _buffers
from attnlab.backends.kernel.buffers import f32 as _f32
from attnlab.backends.kernel.buffers import quantized as _quantized
from attnlab.backends.kernel.buffers import rows_weights
from attnlab.backends.kernel.buffers import scales as _scales
from attnlab.backends.kernel.buffers import stored as _stored
from attnlab.backends.kernel.buffers import vis_args
from attnlab.backends.quantized import rotated_q
from attnlab.backends.request import Call, Request, Unchecked
from attnlab.backends.tiling import Tiling, block_sizes
from attnlab.backends.visible import Visible, describe
from attnlab.masks import Mask
from attnlab.reference.quantized import QuantizedKV
from attnlab.reference.validate import FLOAT_DTYPES, dtype_name, is_torch

try:
    from attnlab.backends.kernel import _tiles
except ImportError:  # built without a C compiler: the backend refuses, blockwise serves
    _tiles = None

ENV_ISA = "ATTNLAB_KERNEL_ISA"  # run another compiled variant than the best this CPU runs (to measure it)


def _isa_from_env() -> None:
    want = os.environ.get(ENV_ISA, "").strip()
    if want and _tiles is not None:
        if want in _tiles.isas():
            _tiles.isa(want)
        else:  # a warning, not an error: a stray variable must not stop the package from importing
            warnings.warn(f"{ENV_ISA} must name an instruction set compiled in that this CPU runs "
                          f"({', '.join(_tiles.isas())}), got {want!r}; using {_tiles.isa()}", RuntimeWarning, 2)


_isa_from_env()
if os.environ.get("ATTNLAB_KERNEL_AMX", "").strip() == "0" and _tiles is not None:
    _tiles.amx(False)  # int4 keys' scores in vector registers, to measure what AMX gives

BLOCK = (96, 512)
BACKWARD_BLOCK = (96, 256)  # P and dS tiles of 96 x 256 (192 kB together), the key block's dK, dV beside them
PRIOR_NS_PER_SCORE = 1.5  # a rough prior for auto where nothing was measured, per visited score
PRIOR_OVERHEAD_S = 5e-5


def isa() -> str | None:
    """The instruction set the kernel runs with here ("AVX-512", "AVX2", "128-bit vectors"), None if not built."""
    return None if _tiles is None else _tiles.isa()


def build_info() -> dict[str, Any] | None:
    """How the kernel was built and what runs here, None if it was not built.

    ``{"variants": [{"name": "AVX-512", "target": "avx512f,avx512vl,fma", "runs_here": True}, ...],
    "chosen": "AVX-512", "compiler": "gcc 12.2.0", "openmp": 201511, "amx_here": True, "amx": True}``: the
    instruction-set variants compiled in (best first; ``target`` the features their functions are compiled for,
    "" for the compiler's baseline), whether this CPU runs each, the one in use, the compiler, OpenMP's version
    date (None: built without OpenMP, one thread), whether this CPU, kernel and build allow AMX and whether int4
    decoding uses it.
    """
    return None if _tiles is None else _tiles.build_info()


def forward(q: Any, k: Any, v: Any, tiling: Tiling, *, scale: float, block_size: Any = None,
            threads: int | None = None, sinks: Any = None) -> tuple[Any, Any]:
    """out (B, G, Tq, Dv) and LSE (B, G, Tq) of canonical float32 q, k, v (as :func:`attnlab.backends.online.forward`).

    The tiling's visibility is read as stored (each row's key intervals, ALiBi); ``sinks`` (B, G) learned sink
    logits. ``threads``: None for OpenMP's default. Outputs are NumPy buffers, shared with torch through
    ``torch.from_numpy`` for tensor inputs: one path for both array libraries.
    """
    if tiling.mask is not None or tiling.bias is not None:
        raise ValueError("the compiled kernel takes no dense mask or bias (the blockwise backend does)")
    block_q, block_k = BLOCK if block_size is None else block_sizes(1, q.shape[2], block_size)
    b, g, tq, d = q.shape
    dv = v.shape[-1]
    torch_in = is_torch(q)
    q, k, v = _buffers(q, k, v)
    out, lse = np.empty((b, g, tq, dv), np.float32), np.empty((b, g, tq), np.float32)
    _tiles.forward(q, k, v, out, lse, scale, block_q, block_k, threads or 0, **vis_args(tiling.visible, sinks))
    if torch_in:
        import torch

        return torch.from_numpy(out), torch.from_numpy(lse)
    return out, lse


def backward(q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, dlse: Any, tiling: Tiling, *, scale: float,
             block_size: Any = None, threads: int | None = None) -> tuple[Any, Any, Any]:
    """dq, dk, dv of :func:`forward`, compiled (as :func:`attnlab.backends.online.backward`, the loop).

    FlashAttention-2's backward recomputed tile by tile from q, k, v, ``out`` and ``lse`` (as
    forward gave them) and the gradients ``dout`` (like out) and ``dlse`` (like lse, or None): no
    (Tq, Tk) buffer. Key/value heads collect the gradients of their G query heads. Deterministic:
    the same bits for any ``threads``. ``block_size``: as forward's; default :data:`BACKWARD_BLOCK`.
    Learned sinks need nothing here (the LSE holds them; their own gradient is :func:`online.sink_grad`).
    """
    if tiling.mask is not None or tiling.bias is not None:
        raise ValueError("the compiled kernel takes no dense mask or bias (the blockwise backend does)")
    block_q, block_k = BACKWARD_BLOCK if block_size is None else block_sizes(1, q.shape[2], block_size)
    torch_in = is_torch(q)
    q, k, v, out, lse, dout = _buffers(q, k, v, out, lse, dout)
    dlse = None if dlse is None else _buffers(dlse)[0]
    dq, dk, dv = np.empty(q.shape, np.float32), np.empty(k.shape, np.float32), np.empty(v.shape, np.float32)
    _tiles.backward(q, k, v, out, lse, dout, dlse, dq, dk, dv, scale, block_q, block_k, threads or 0,
                    **vis_args(tiling.visible, None))
    if torch_in:
        import torch

        return torch.from_numpy(dq), torch.from_numpy(dk), torch.from_numpy(dv)
    return dq, dk, dv


STATS = ("prev", "self", "next", "first", "distance", "entropy", "entropy_norm")  # the sums stats() gives, in order


def stats(q: Any, k: Any, lse: Any, *, scale: float, mask: Mask | None = None, softcap: float | None = None,
          block_size: Any = None, threads: int | None = None, sinks: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Statistics of self-attention's weights, compiled: ``(sums, received)``, float64.

    q (B, G, T, D), k (B, T, D) and the rows' LSE (B, G, T) as :func:`forward` gave it; ``mask`` which keys
    each row sees (an attnlab.masks description, structured; None: every key), read as stored (each row's
    key intervals); ``softcap`` the scores' cap (None: none). Each tile's weights exp(s − LSE), s =
    softcap(scale q·k), are recomputed from the forward's own scores and, in the cache, summed into ``sums`` (B, G, 7): per head, over its rows, each of :data:`STATS` (the
    weight on key i − 1, i, i + 1 and 0; Σ_j w |i − j|; the entropy −Σ_j w ln w in nats; that entropy over
    ln(keys the row sees), for rows that see more than one), and ``received`` (B, G, T), the column sums.
    ``sinks`` (B, G) learned sink logits, which the LSE includes: the sink is one more outcome of a row's
    entropy, −s ln s with its share s = exp(sink − LSE), and of the count the entropy is normalised by
    (ln(keys seen + 1), rows that see at least one key), as docs/design.md's sink share rule says.
    No T × T buffer; the same bits for any ``threads``. Raises ValueError where the kernel was not built.
    """
    if _tiles is None:
        raise ValueError("the compiled kernel was not built (it needs a C compiler with OpenMP at install)")
    b, g, t, _ = q.shape
    block_q, block_k = BLOCK if block_size is None else block_sizes(1, t, block_size)
    q, k, lse = _buffers(q, k, lse)
    sums, received = np.empty((b, g, len(STATS))), np.empty((b, g, t))
    kw = vis_args(describe(mask, t, t, (b, g)), None if sinks is None else np.broadcast_to(_f32(sinks), (b, g)))
    if softcap is not None:
        kw["softcap"] = softcap
    _tiles.stats(q, k, lse, sums, received, scale, block_q, block_k, threads or 0, **kw)
    return sums, received


POOL_TOP_MAX = 1024  # the most largest weights a row pool keeps (top=); more: sort the row (analysis.longview)


def pool(q: Any, k: Any, lse: Any, *, scale: float, block: int, mask: Mask | None = None, softcap: float | None = None,
         block_size: Any = None, threads: int | None = None, top: int = 0) -> tuple[np.ndarray, ...]:
    """The pooled map of self-attention's weights, compiled: ``(sums, maxes)`` (B, G, N, N), N = ⌈T / block⌉,
    and with ``top`` = K ≥ 1 also ``(keys, weights)`` (B, G, T, K): every row's K largest weights from the
    same sweep, largest first (ties: the earlier key; a row with fewer than K positive weights ends with its
    first keys of weight 0, as a stable sort of the row would), int64 and float32.

    q (B, G, T, D), k (B, T, D) and the rows' LSE (B, G, T) as :func:`forward` gave it; ``mask`` which keys
    each row sees (attnlab.masks, structured; None: every key), ``softcap`` the scores' cap (None: none).
    Each tile's weights exp(s − LSE), s the forward's own scores, are recomputed and pooled in the cache:
    cell (r, c) of a head covers queries r·block .. and keys c·block .. (the last cells narrower), ``sums``
    float64 the sum of its weights and ``maxes`` float32 the largest (a pair a row does not see weighs 0).
    Work goes to the threads by rows of cells; tiles no row sees are skipped. No T × T buffer, nor a row of
    T weights; the same bits for any ``threads``. Raises ValueError where the kernel was not built.
    """
    if _tiles is None:
        raise ValueError("the compiled kernel was not built (it needs a C compiler with OpenMP at install)")
    b, g, t, _ = q.shape
    block_q, block_k = BLOCK if block_size is None else block_sizes(1, t, block_size)
    q, k, lse = _buffers(q, k, lse)
    n = -(-t // block) if isinstance(block, int) and block >= 1 else 0  # a bad block: the kernel's error names it
    sums, maxes = np.empty((b, g, n, n)), np.empty((b, g, n, n), np.float32)
    kw = vis_args(describe(mask, t, t, (b, g)), None)
    if softcap is not None:
        kw["softcap"] = softcap
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 0:
        raise ValueError(f"top must be an int >= 0 (every row's largest weights; 0: none), got {top!r}")
    if top:  # a K past T or POOL_TOP_MAX: the kernel's error names it
        kw["top_keys"], kw["top_weights"] = np.empty((b, g, t, top), np.int64), np.empty((b, g, t, top), np.float32)
    _tiles.pool(q, k, lse, sums, maxes, scale, block, block_q, block_k, threads or 0, **kw)
    return (sums, maxes, kw["top_keys"], kw["top_weights"]) if top else (sums, maxes)


DECODE_MAX_TQ = 32  # the kernel backend serves calls of at most this many query rows by the decode pass
STORED = ("float32", "float16", "bfloat16")  # the dtypes decode reads k and v in, as stored
CODED = ("int8", "float8_e4m3fn")  # ... and quantized codes with their scales (k_scale, v_scale)
QUANTIZED = ("int8", "fp8", "int4")  # the QuantizedKV kinds it reads (int4: given as QuantizedKV, buffers.quantized)


def decode(q: Any, k: Any, v: Any, lengths: Any = None, *, scale: float, window: Any = None, causal: bool = False,
           threads: int | None = None, mask: Mask | None = None, visible: Visible | None = None,
           sinks: Any = None, check: bool = False, k_scale: Any = None, v_scale: Any = None,
           scores: np.ndarray | None = None) -> tuple[Any, Any]:
    """Attention of a few query rows against a cache, compiled: out (B, H, Tq, Dv) and LSE (B, H, Tq), float32.

    q (B, H, Tq, D) float32 (or k's dtype); k (B, H_kv, Tk, D) and v (B, H_kv, Tk, Dv) float32, float16 or
    bfloat16, read as stored, each head's (Tk, ·) rows contiguous (a slice ``[:, :, :T]`` of a longer
    cache is read in place); H a multiple of H_kv (query head h reads k/v head h // (H / H_kv), once
    for all of its group). Which keys each row sees: ``mask`` (attnlab.masks, structured), ANDed with
    ``causal``, ``window`` and ``lengths`` (B,) (masks.cache_lengths: query i of sequence b at
    lengths[b] − Tq + i), or ``visible`` (an attention call's, as built); ``sinks`` (H,) or (B, H) learned
    sink logits. A row that sees nothing gives zeros and LSE −inf (the sink's logit with sinks). The
    cache is split into chunks of keys spread over the threads (None: OpenMP's default) and merged by
    their LSE; the chunks follow the shapes and the visibility only, so any thread count gives the same
    bits. NumPy or CPU torch in, the same out (torch: views of NumPy buffers, float32).

    ``k_scale``, ``v_scale``: a quantized cache's codes, dequantized in registers (never into a float copy),
    q float32. int8 (symmetric): k and v int8 codes, each key's and value row's float32 scale (B, H_kv, Tk),
    contiguous; key j is k[..., j, :] · k_scale[..., j]. float8_e4m3fn (torch tensors): one float32 scale
    per sequence and k/v head (B, H_kv); key j is float(k[..., j, :]) · k_scale. Or k and v are a quantized
    cache's :class:`QuantizedKV` (int8, fp8 or int4, torch; no k_scale, v_scale): its format as
    attnlab.reference.quantized defines it, int4's residual (its newest positions, in the model's dtype)
    read in the same pass. int4: keys as code·scale + zero by groups of 32 tokens per channel (the query is
    scaled once per group, one constant added), values by groups of 32 channels per token (the weights
    scaled, the zero points' share summed apart); Tk keys; D and Dv multiples of 32.

    ``check``: q, k and v are checked as the pass reads them, not before: a NaN or Inf in q, a score that is
    not finite (a NaN or Inf in a key read), one beyond float32's safe range (base.OVERFLOW_LIMIT) or an
    output that is not finite (a NaN or Inf in a value read) raises request.Unchecked, for the caller to
    check them itself (attention() does: the error names q, k or v). Keys no row sees are not read, so not
    checked.

    ``scores``: a float32 NumPy array (B, H, Tq, Tk) the pass writes each row's scores into as it computes them,
    in base 2 (scale · log2 e · q·k, softcap and ALiBi applied; −inf for a key of a block it reads that the row
    does not see); keys of blocks it skips are left as they were (fill it with −inf). A row's weights are then
    exp2(s − LSE · log2 e): the kernel's ``weights_rows=``, without a second pass.
    """
    if _tiles is None:
        raise ValueError("the compiled kernel was not built (it needs a C compiler with OpenMP at install)")
    torch_in = is_torch(q)
    kw4: dict[str, Any] = {}
    if isinstance(k, QuantizedKV) and isinstance(v, QuantizedKV) and k_scale is None and v_scale is None:
        k, v, kw4 = _quantized(k, v)
        k_scale, v_scale = kw4.pop("k_scale"), kw4.pop("v_scale")
    stored = "int4" if kw4 else dtype_name(k)  # int4: uint8 codes, two per byte
    coded = stored in (*CODED, "int4") and (k_scale is not None or v_scale is not None)
    if (dtype_name(v) != stored and not kw4) or (stored not in STORED and not coded):
        raise TypeError(f"k and v must share one dtype of {', '.join(STORED)} (or {' or '.join(CODED)} with k_scale and "
                        f"v_scale), got k {stored} and v {dtype_name(v)}")
    if dtype_name(q) not in ("float32", stored) or (coded and dtype_name(q) != "float32"):
        raise TypeError(f"q must be float32 or k's dtype ({stored}), got {dtype_name(q)}")
    scales = {"k_scale": _scales(k_scale), "v_scale": _scales(v_scale)} if coded else {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        if torch_in and x.device.type != "cpu":
            raise ValueError(f"{name} must be on the CPU, got a tensor on {x.device}")
    if q.ndim != 4:
        raise ValueError(f"q must have shape (B, H, Tq, D), got {tuple(q.shape)}")
    b, h, tq, _ = q.shape
    if visible is None:
        n = None if lengths is None else lengths.cpu().numpy() if is_torch(lengths) else np.asarray(lengths)
        visible = describe(masks.from_keywords(mask, causal, window, n), tq, k.shape[2], (b, h))
    extra = {} if scores is None else {"scores": scores}
    return _pass(q, k, v, stored, scale, visible, sinks, threads, check, v.shape[-1] * (2 if kw4 else 1),
                 {**scales, **kw4, **extra})


def decode_into(q32: np.ndarray, k: Any, v: Any, stored: str, scale: float, threads: int | None, dv: int,
                kw: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, float]:
    """``_tiles.decode`` itself: q32 float32 C-contiguous, k and v as stored, ``kw`` its visibility and codes
    keywords; new float32 out (B, H, Tq, dv) and LSE, and the largest score it computed (NaN where a score, q or
    the output is not finite)."""
    b, h, tq, _ = q32.shape
    out, lse = np.empty((b, h, tq, dv), np.float32), np.empty((b, h, tq), np.float32)
    return out, lse, _tiles.decode(q32, _stored(k), _stored(v), out, lse, stored, scale, threads or 0, **kw)


def _pass(q: Any, k: Any, v: Any, stored: str, scale: float, visible: Visible, sinks: Any, threads: int | None,
          check: bool, dv: int, codes: dict[str, Any], lse_wanted: bool = True) -> tuple[Any, Any]:
    """``_tiles.decode`` on arguments :func:`decode` checked (or a prepared call's): out, LSE (None where not
    wanted) as q's library."""
    b, h, _, _ = q.shape
    if sinks is None and visible.spans is None and visible.score_mod is None and visible.softcap is None:
        kw = {}  # every key seen, scores as they are: nothing to say (the common decoding step)
    else:
        kw = vis_args(visible, None if sinks is None else np.broadcast_to(_f32(sinks), (b, h)))
        kw.pop("heads", None)
    out, lse, largest = decode_into(_buffers(q)[0], k, v, stored, scale, threads, dv, {**kw, **codes})
    if check and not largest <= OVERFLOW_LIMIT["float32"]:  # NaN: a score, q or the output not finite
        raise Unchecked
    if is_torch(q):
        import torch

        return torch.from_numpy(out), torch.from_numpy(lse) if lse_wanted else None
    return out, lse if lse_wanted else None


def _rows_contiguous(x: Any) -> bool:
    """Each head's (T, ·) rows of x (..., T, ·) contiguous, the leading strides >= 0: decode reads it in place."""
    strides = x.stride() if is_torch(x) else tuple(s // x.itemsize for s in x.strides)
    t, d = x.shape[-2:]
    lead_ok = all(s >= 0 or n <= 1 for s, n in zip(strides[:-2], x.shape[:-2]))
    return (d <= 1 or strides[-1] == 1) and (t <= 1 or strides[-2] == d) and lead_ok


def _decodes(call: Call) -> bool:
    """The call fits the decode pass: few rows, (B, H, T, ·) inputs, k/v stored as it reads them, no gradients
    (nor a block size: that is the tiles' parameter)."""
    p, r = call.problem, call.request
    q, k, v = call.q, call.k, call.v
    if p.tq > DECODE_MAX_TQ or r.grad or r.block_size or q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        return False
    if r.quantized:  # the cache's own codes (B, H_kv, C, D) and scales, sliced to the keys read, as stored
        return r.quantized in QUANTIZED and dtype_name(q) == "float32"
    if not (q.shape[0] == k.shape[0] == v.shape[0] and q.shape[1] % k.shape[1] == 0):
        return False  # a broadcast batch: the tiles path
    if dtype_name(k) != dtype_name(v) or dtype_name(k) not in STORED or dtype_name(q) not in ("float32", dtype_name(k)):
        return False
    return _rows_contiguous(k) and _rows_contiguous(v)


def _run_decode(call: Call) -> tuple[Any, Any, Any]:
    p = call.problem  # a quantized cache's codes and scales are read in place; q turned as the keys were stored
    b, h, tq = call.q.shape[:3]
    scores = None if call.rows is None else np.full((b, h, tq, p.tk), -np.inf, np.float32)  # the pass writes what it sees
    if call.request.quantized:
        out, lse = decode(rotated_q(call.q, call.k), call.k, call.v, scale=p.scale, visible=call.visible,
                          sinks=call.visible.sinks, check=call.kv_pending, scores=scores)
    else:  # what decode() would check, prepare() did (_decodes: the layout it reads)
        out, lse = _pass(call.q, call.k, call.v, p.kv_dtype, p.scale, call.visible, call.visible.sinks, None,
                         call.kv_pending, p.dv, {} if scores is None else {"scores": scores},
                         call.request.lse or call.rows is not None)
    torch_in, weights = call.request.library == "torch", None
    if scores is not None:  # the chosen rows' weights (h2o's, a generation's maps): no second pass
        weights = rows_weights(scores, lse.numpy() if is_torch(lse) else lse, call.rows, torch_in)
        weights = as_result(weights.reshape(*p.batch, -1, p.tk), p.dtype, torch_in)
    return as_result(out, p.dtype, torch_in), weights, (as_result(lse, p.dtype, torch_in) if call.request.lse else None)


class KernelBackend(Backend):
    name = "kernel"
    summary = ("the blockwise online softmax compiled (C, OpenMP, SIMD): float32 on the CPU, band, padding, LSE, "
               "gradients; a decode pass for few query rows")
    supports = Supports(
        libraries=frozenset({"numpy", "torch"}),
        devices="cpu",
        dtypes=frozenset(FLOAT_DTYPES) - {"float64"},
        features=frozenset({"band", "structure", "lengths", "alibi", "sinks", "softcap", "gqa", "weights_rows", "lse",
                            "grad", "block_size", "kv_dtype", "quantized"}),
        instead={"mask_mod": "instead: blockwise (it evaluates the rule tile by tile)", "score_mod": "instead: blockwise",
                 "mask": "instead: blockwise, or say it as attnlab.masks objects"},
    )

    quantized_kinds = frozenset(QUANTIZED)

    def more_refusals(self, r: Request) -> list[str]:
        if _tiles is None:
            return ["was not built (it needs a C compiler with OpenMP at install); blockwise computes the same"]
        if r.quantized and (r.problem.tq > DECODE_MAX_TQ or r.grad or r.block_size or r.dtype != "float32"):
            return [f"reads a quantized cache in its decode pass only (a float32 query of at most {DECODE_MAX_TQ} rows, "
                    "no gradients or block_size); blockwise reads it a block of keys at a time"]
        return []

    def compute_dtype(self, dtype: str) -> str:
        return work_dtype(dtype)

    def checks_kv(self, call: Call) -> bool:
        return _decodes(call)  # the decode pass notes what it reads; the tiles path's reads are O(T²) anyway

    def estimate(self, r: Request) -> float:
        p = r.problem
        if p.tq <= DECODE_MAX_TQ and not r.grad:  # the decode pass: a read of the keys and values
            item = 1 if r.quantized else 2 if p.kv_dtype in ("float16", "bfloat16") else 4
            return PRIOR_OVERHEAD_S + read_seconds(r, item, per_query_head=False)
        return PRIOR_OVERHEAD_S + PRIOR_NS_PER_SCORE * 1e-9 * r.scores * r.visible

    def run(self, call: Call) -> tuple[Any, Any, Any]:
        if call.kv_pending or _decodes(call):  # a pending call comes here only where checks_kv said it decodes
            return _run_decode(call)
        return run_blockwise(call, forward, backward)
