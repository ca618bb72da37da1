"""Ring attention (context parallelism): attention over a sequence spread over the ranks of a group.

Each rank holds its shard of the queries and of the keys/values (:mod:`attnlab.distributed.layout`
says which rows). The key/value blocks travel around the ring, rank r sending to r + 1 and
receiving from r − 1 (``batch_isend_irecv``), so at step t rank r holds the block of rank
r − t; the transfer of the next block runs while this one is computed. Each block's partial
result merges into the running one by its log-sum-exp (:func:`attnlab.backends.online.merge`),
exactly. Under a causal mask each block is cut into the rectangles its queries see
(:func:`~attnlab.distributed.layout.plan_block`); blocks that the mask empties cost no compute.

The backward pass (FlashAttention-2's: the compiled kernel's, or the loop of
:func:`attnlab.backends.online.backward`) needs the *global* output and LSE, which the forward
leaves on every rank for its own rows. The key/value
blocks go around the ring again, and with each block its dK/dV accumulator: every rank adds the
gradient its queries give that block and passes it on, so after p steps the sums reach their owner.
Memory per rank is O((Tq + Tk)/p · D): its shards, the block in hand and the block in flight.
"""

from __future__ import annotations

import datetime
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlab.backends import online
from attnlab.backends.blockwise import work_dtype
from attnlab import masks
from attnlab.backends.tiling import Tiling
from attnlab.distributed import env
from attnlab.distributed.layout import LAYOUTS, Rect, check_layout, plan_block, positions
from attnlab.reference import validate

BACKENDS = ("auto", "kernel", "blockwise")
TAG_KV, TAG_DKV = 0, 1  # the blocks and their gradient accumulators travel side by side in the backward
_FIELDS = ("batch (leading dims x key/value heads)", "query heads per key/value head", "D", "Dv", "dtype", "causal", "layout", "scale")


@dataclass(frozen=True)
class Ring:
    """This rank's place in the ring, every rank's key/value rows and the plan of each step."""

    group: Any
    rank: int
    world: int
    send_to: int  # global ranks (what point-to-point calls take)
    recv_from: int
    key_rows: tuple[int, ...]  # keys held by each rank of the group
    plans: tuple[tuple[Rect, ...], ...]  # plans[t]: what this rank's queries see of the block of rank − t
    timeout_s: float

    def source(self, t: int) -> int:
        """The rank whose block this rank holds at step t."""
        return (self.rank - t) % self.world

    def pass_on(self, tensors: list, recv: list, tag: int) -> _Transfer:
        """Send ``tensors`` (B, T, ·) to the next rank; receive into ``recv`` from the previous."""
        import torch.distributed as dist

        ops = [dist.P2POp(dist.isend, t.contiguous(), self.send_to, self.group, tag) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self.recv_from, self.group, tag) for r in recv]
        return _Transfer(dist.batch_isend_irecv(ops), recv, self.timeout_s)


class _Buffers:
    """Two sets of receive buffers used in turn, each sized for the largest block and allocated on first use.

    At step t a block arrives in set t mod 2 while the block in hand (set t − 1 mod 2) is computed
    and sent on; the set written at step t was last read at step t − 1, whose transfers had finished.
    Reusing them keeps a rank's memory at two blocks in flight, whatever the allocator does with freed ones.
    """

    def __init__(self, like: list, max_rows: int) -> None:
        self.like, self.max_rows, self.sets = like, max_rows, [None, None]

    def get(self, step: int, rows: int, zero: bool = False) -> list:
        i = step % 2
        if self.sets[i] is None:
            self.sets[i] = [t.new_empty(t.shape[0] * self.max_rows * t.shape[-1]) for t in self.like]
        views = [buf[: t.shape[0] * rows * t.shape[-1]].view(t.shape[0], rows, t.shape[-1])  # (B, rows, ·), contiguous
                 for buf, t in zip(self.sets[i], self.like)]
        return [v.zero_() for v in views] if zero else views


class _Transfer:
    def __init__(self, works: list, recv: list, timeout_s: float) -> None:
        self.works, self.recv, self.timeout_s = works, recv, timeout_s

    def wait(self) -> list:
        for w in self.works:
            w.wait(timeout=datetime.timedelta(seconds=self.timeout_s))
        return self.recv


def _block_passes(backend: str, q: Any) -> tuple[Any, Any]:
    """The forward and backward of one rectangle (canonical shapes, as online's): compiled when they can be."""
    from attnlab.backends import kernel

    fits = q.device.type == "cpu" and str(q.dtype) == "torch.float32" and kernel.isa() is not None
    if backend == "kernel" and not fits:
        raise ValueError(f"backend 'kernel' computes float32 on the CPU (and must be built); got {q.dtype} on {q.device}")
    if backend == "kernel" or (backend == "auto" and fits):
        return kernel.forward, kernel.backward
    return online.forward, online.backward


def _tiling(r: Rect) -> Tiling:
    return Tiling.of(r.q1 - r.q0, r.keys, masks.causal() if r.causal else None)


def _merge_into(out: Any, lse: Any, o: Any, l: Any) -> None:
    """out, lse (views of the running result) ← merged with a block's o, l, in place (:func:`online.merge`'s formula)."""
    import torch

    l = l.to(lse)
    new = torch.logaddexp(lse, l)
    safe = torch.where(torch.isfinite(new), new, 0.0)  # rows that see nothing yet: both weights 0
    out.mul_(torch.exp(lse - safe).to(out)[..., None]).addcmul_(o, torch.exp(l - safe).to(out)[..., None])
    lse.copy_(new)


def _forward(q: Any, k: Any, v: Any, ring: Ring, scale: float, block: Any) -> tuple[Any, Any]:
    """out (B, G, Tq, Dv), LSE (B, G, Tq) of this rank's queries over every rank's keys."""
    import torch

    b, g, tq, _ = q.shape
    plan = ring.plans[0]
    if ring.world == 1 and len(plan) == 1 and (plan[0].q0, plan[0].q1, plan[0].keys) == (0, tq, k.shape[1]):
        return block(q, k, v, _tiling(plan[0]), scale=scale)  # one process, one call: plain attention
    # The running LSE is kept in float64 (Tq numbers; the merge weights exp(lse_part − lse) come from
    # it); the output accumulates in the work dtype: memory per rank is what ring attention is for.
    out = q.new_zeros((b, g, tq, v.shape[-1]))
    lse = q.new_full((b, g, tq), -math.inf, dtype=torch.float64)
    kb, vb = k, v
    blocks = _Buffers([k, v], max(ring.key_rows))
    for t in range(ring.world):
        ahead = None
        if t < ring.world - 1:
            ahead = ring.pass_on([kb, vb], blocks.get(t, ring.key_rows[ring.source(t + 1)]), TAG_KV)
        for r in ring.plans[t]:
            rows = slice(r.q0, r.q1)
            o, l = block(q[:, :, rows], kb[:, : r.keys], vb[:, : r.keys], _tiling(r), scale=scale)
            _merge_into(out[:, :, rows], lse[:, :, rows], o, l)
        if ahead is not None:
            kb, vb = ahead.wait()
    return out.to(q.dtype), lse.to(q.dtype)


def _backward(q, k, v, out, lse, dout, dlse, ring: Ring, scale: float, block: Any) -> tuple[Any, Any, Any]:  # noqa: ANN001
    """dq of this rank's queries, dk and dv of its keys; the accumulators of dk/dv travel with the blocks."""

    plan = ring.plans[0]
    if ring.world == 1 and len(plan) == 1 and (plan[0].q0, plan[0].q1, plan[0].keys) == (0, q.shape[2], k.shape[1]):
        return block(q, k, v, out, lse, dout, dlse, _tiling(plan[0]), scale=scale)  # plain attention's backward
    dq = q.new_zeros(q.shape)
    kb, vb = k, v
    rows = ring.key_rows
    # k/v in turn; the dk/dv sums made here in turn (one is in flight while the next is made); the
    # sums received: one set, read before the next transfer starts
    blocks, sums, arriving = (_Buffers([k, v], max(rows)) for _ in range(3))
    back = None  # the accumulator for the block in hand, coming from the previous rank
    for t in range(ring.world):
        nxt = rows[ring.source(t + 1)]
        ahead = ring.pass_on([kb, vb], blocks.get(t, nxt), TAG_KV) if t < ring.world - 1 else None
        dk, dv = sums.get(t, rows[ring.source(t)], zero=True)  # these travel: the work dtype
        for r in ring.plans[t]:
            qr, n = slice(r.q0, r.q1), r.keys
            gq, gk, gv = block(
                q[:, :, qr], kb[:, :n], vb[:, :n], out[:, :, qr], lse[:, :, qr], dout[:, :, qr],
                None if dlse is None else dlse[:, :, qr], _tiling(r), scale=scale,
            )
            dq[:, :, qr] += gq
            dk[:, :n] += gk
            dv[:, :n] += gv
        if back is not None:
            dk_in, dv_in = back.wait()
            dk += dk_in
            dv += dv_in
        if ring.world > 1:  # on to the next rank; at the last step that is the block's owner
            back = ring.pass_on([dk, dv], arriving.get(0, nxt), TAG_DKV)
        if ahead is not None:
            kb, vb = ahead.wait()
    if back is not None:
        dk, dv = back.wait()
    return dq.to(q.dtype), dk, dv


@functools.cache
def _function() -> type:
    """``RingAttention``, defined on first use so that importing attnlab does not import torch."""
    import torch

    class RingAttention(torch.autograd.Function):
        """out, LSE of canonical q (B, G, Tq, D), k (B, Tk, D), v (B, Tk, Dv) over the whole ring."""

        @staticmethod
        def forward(ctx, q, k, v, ring, scale, passes):  # noqa: ANN001, ANN205
            out, lse = _forward(q, k, v, ring, scale, passes[0])
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.args = (ring, scale, passes[1])
            return out, lse

        @staticmethod
        def backward(ctx, dout, dlse):  # noqa: ANN001, ANN205
            q, k, v, out, lse = ctx.saved_tensors
            ring, scale, block = ctx.args
            dq, dk, dv = _backward(q, k, v, out, lse, dout, dlse, ring, scale, block)
            return dq, dk, dv, None, None, None

    return RingAttention


def _shown(field: str, value: float) -> str:
    """A field of the ranks' exchanged description as the user wrote it."""
    if field == "dtype":
        return validate.FLOAT_DTYPES[int(value)]
    if field == "layout":
        return repr(LAYOUTS[int(value)])
    return str(bool(value)) if field == "causal" else f"{value:g}"


def _describe(q: Any, k: Any, v: Any, scale: Any) -> tuple[validate.Problem, tuple, int, int]:
    """Check this rank's shards; (problem, lead dims, key/value heads, query heads per key/value head)."""
    if not all(validate.is_torch(x) for x in (q, k, v)):
        raise TypeError(f"ring_attention takes torch tensors, got q, k, v of types {', '.join(type(x).__name__ for x in (q, k, v))}")
    p = validate.check_qkv(q, k, v, scale, gqa=True)
    if not (q.ndim == k.ndim == v.ndim) or q.shape[:-3] != k.shape[:-3] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(
            "ring_attention needs q (..., Hq, Tq, D), k (..., Hkv, Tk, D) and v (..., Hkv, Tk, Dv) with the same "
            f"leading dims (no broadcasting), got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if p.tq == 0:
        raise ValueError(f"every rank needs at least one query row, got Tq=0 (q shape {tuple(q.shape)})")
    if q.ndim == 2:
        return p, (), 1, 1
    hq, hkv = q.shape[-3], k.shape[-3]
    if hq % hkv:
        raise ValueError(f"the key/value heads (dim -3) must divide the query heads: q has {hq}, k has {hkv}")
    return p, tuple(q.shape[:-3]), hkv, hq // hkv


def ring_attention(
    q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None, group: Any = None,
    layout: str = "contiguous", return_lse: bool = False, backend: str = "auto",
    timeout_s: float = env.DEFAULT_TIMEOUT_S,
) -> Any:
    """Attention over the whole sequence, of which each rank of ``group`` holds a shard; this rank's output rows.

    Shapes on each rank: q (..., Hq, Tq_r, D), k (..., Hkv, Tk_r, D), v (..., Hkv, Tk_r, Dv), torch
    tensors with the same leading dims on every rank; Hkv divides Hq (grouped-query attention: only
    the Hkv heads travel). Returns out (..., Hq, Tq_r, Dv) for this rank's query rows, and their LSE
    (..., Hq, Tq_r) with ``return_lse``; differentiable (gradients as single-process attention's).

    layout: which rows each rank holds, for q and for k/v alike (:mod:`attnlab.distributed.layout`;
        :func:`~attnlab.distributed.layout.shard` cuts a whole tensor so): "contiguous" (rank r holds
        the r-th run of rows; shards may differ in length) or "zigzag" (rank r holds chunk r then
        chunk 2p − 1 − r of 2p, even shard lengths; balances causal work).
    causal: over global positions, bottom-right aligned when the whole Tq ≠ Tk (docs/design.md).
    backend: "kernel" (compiled, float32 CPU), "blockwise" (the loop, any dtype and device) or
        "auto" (the kernel where it fits). float16/bfloat16 are computed and sent in float32.
    Outside a distributed job (or with one rank) this is plain attention. A collective that waits
    longer than ``timeout_s`` fails; a rank whose input is wrong raises its own error and the others
    raise a RuntimeError that names it.
    """
    import torch

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if env.initialized():
        rank, world = env.rank_and_world(group)
    elif group is not None or env.launched():
        raise RuntimeError("ring_attention: this process is one of a torchrun job (or was given a group) but "
                           "torch.distributed is not initialized; call attnlab.distributed.init_from_env() first")
    else:
        rank, world = 0, 1
    failure, row = None, np.zeros(3 + len(_FIELDS))
    try:
        check_layout(layout)
        if not isinstance(causal, (bool, np.bool_)):
            raise TypeError(f"causal must be True or False, got {causal!r}")
        p, lead, hkv, groups = _describe(q, k, v, scale)
        b = int(np.prod(lead, dtype=np.int64)) * hkv
        dtype = validate.FLOAT_DTYPES.index(p.dtype)
        row = np.array([1, p.tq, p.tk, b, groups, p.d, p.dv, dtype, bool(causal), LAYOUTS.index(layout), p.scale])
    except (TypeError, ValueError) as e:
        failure = e
    # One gather says both whether every rank's input was valid (column 0) and what each rank holds.
    rows = env.all_gather_rows(row, group, timeout_s) if world > 1 else row[None]
    env.raise_failures(failure, [r for r in range(world) if rows[r, 0] != 1], "ring_attention: checking the input")
    for i, name in enumerate(_FIELDS):
        if len(set(rows[:, 3 + i].tolist())) > 1:
            raise ValueError(f"ring_attention: every rank must have the same {name}, got " +
                             ", ".join(f"rank {r}: {_shown(name, rows[r, 3 + i])}" for r in range(world)))
    qrows, krows = rows[:, 1].astype(int).tolist(), rows[:, 2].astype(int).tolist()
    qpos, kpos = positions(qrows, layout), positions(krows, layout)
    shift = sum(krows) - sum(qrows)  # bottom-right alignment of the whole sequence
    plans = tuple(tuple(plan_block(qpos[rank] + shift, kpos[(rank - t) % world], bool(causal))) for t in range(world))
    peer = (lambda r: r) if group is None else (lambda r: torch.distributed.get_global_rank(group, r))
    ring = Ring(group, rank, world, peer((rank + 1) % world) if world > 1 else 0, peer((rank - 1) % world) if world > 1 else 0,
                tuple(krows), plans, timeout_s)

    work = getattr(torch, work_dtype(p.dtype))
    tq, tk = q.shape[-2], k.shape[-2]
    q4 = q.to(work).reshape(b, groups, tq, p.d)  # (B, G, Tq, D): query heads h = kv·G + g
    k3 = k.to(work).reshape(b, tk, p.d)  # (B, Tk, D), B = leading dims × Hkv
    v3 = v.to(work).reshape(b, tk, p.dv)  # (B, Tk, Dv)
    out, lse = _function().apply(q4, k3, v3, ring, p.scale, _block_passes(backend, q4))
    hq = hkv * groups
    heads = (*lead, hq) if q.ndim > 2 else ()
    out = out.reshape(*heads, tq, p.dv).to(q.dtype)  # (..., Hq, Tq, Dv)
    if not return_lse:
        return out
    lse = lse.reshape(*heads, tq)  # (..., Hq, Tq)
    return out, lse.to(q.dtype)
