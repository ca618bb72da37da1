"""Where this process stands in a torch.distributed job, and the few collectives attnlab needs.

``torchrun`` (one machine: ``--nproc-per-node N``; several: ``--nnodes``, ``--rdzv-endpoint``)
starts each process with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``MASTER_ADDR``/``MASTER_PORT``
in its environment; :func:`init_from_env` joins the group from them: NCCL where CUDA is there,
gloo otherwise. Without those variables a process is rank 0 of 1 and nothing here communicates.
Every collective has a timeout, so a rank that died makes the others fail instead of hang.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Callable, TypeVar

import numpy as np

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 600.0  # a collective waits this long for the slowest rank, then fails


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def launched() -> bool:
    """Whether a launcher (torchrun) started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def initialized() -> bool:
    """Whether torch.distributed has a process group (False where torch is missing)."""
    try:
        dist = _dist()
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized()


def rank_and_world(group: Any = None) -> tuple[int, int]:
    """(rank, world size) in ``group`` (default: the whole job); (0, 1) outside a distributed job."""
    if initialized():
        dist = _dist()
        return dist.get_rank(group), dist.get_world_size(group)
    if group is not None:
        raise ValueError("group was given but torch.distributed is not initialized (call init_from_env() or init_process_group)")
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def init_from_env(timeout_s: float = DEFAULT_TIMEOUT_S, backend: str | None = None) -> bool:
    """Join the job that torchrun started (its environment variables); True if this call joined it.

    ``backend``: "gloo" or "nccl"; default NCCL when CUDA is available, gloo otherwise. Does
    nothing (False) outside torchrun or when a group exists already.
    """
    if not launched() or initialized():
        return False
    import torch

    dist = _dist()
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return True


def join(distributed: bool | str, group: Any = None) -> tuple[int, int]:
    """(rank, world) for a job that may share its work: ``distributed`` True joins torchrun's job (from
    its environment, if no group exists yet), "auto" does so under torchrun or an existing group,
    False works alone, (0, 1)."""
    if distributed not in (True, False, "auto"):
        raise ValueError(f"distributed must be True, False or 'auto', got {distributed!r}")
    if distributed is True or (distributed == "auto" and (launched() or initialized())):
        init_from_env()
    return rank_and_world(group) if distributed and initialized() else (0, 1)


def shard_items(items: list, rank: int, world: int) -> list:
    """Rank ``rank``'s share of ``items``: consecutive, in order, the first ``len mod world`` ranks one more."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank must lie in 0..world-1 with world >= 1, got rank={rank}, world={world}")
    base, extra = divmod(len(items), world)
    start = rank * base + min(rank, extra)
    return list(items[start : start + base + (1 if rank < extra else 0)])


def _device(group: Any) -> Any:
    import torch

    if _dist().get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(arrays: list[np.ndarray], group: Any = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[np.ndarray]:
    """The element-wise sum over every rank of each array (float64; one all-reduce for all of them).

    Outside a distributed job the arrays come back as float64 copies. Every rank must pass arrays
    of the same shapes in the same order.
    """
    flat = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays]) if arrays else np.zeros(0)
    if initialized() and _dist().get_world_size(group) > 1:
        import torch

        t = torch.from_numpy(flat).to(_device(group))
        work = _dist().all_reduce(t, group=group, async_op=True)
        work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        flat = t.cpu().numpy()
    out, at = [], 0
    for a in arrays:
        size = int(np.size(a))
        out.append(flat[at : at + size].reshape(np.shape(a)).copy())
        at += size
    return out


def all_gather_rows(row: np.ndarray, group: Any = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> np.ndarray:
    """Every rank's ``row`` (a small float64 vector of one length on every rank), stacked: (world, len)."""
    row = np.asarray(row, dtype=np.float64)
    if not initialized():
        return row[None]
    import torch

    dist = _dist()
    world = dist.get_world_size(group)
    t = torch.from_numpy(row.copy()).to(_device(group))
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t, group=group, async_op=True).wait(timeout=datetime.timedelta(seconds=timeout_s))
    return np.stack([o.cpu().numpy() for o in out])


def all_gather_objects(obj: Any, group: Any = None) -> list:
    """Every rank's ``obj`` (anything picklable: ragged arrays, token lists), in rank order.

    Outside a distributed job: ``[obj]``. The wait is bounded by the process group's own timeout
    (:func:`init_from_env` sets it), as torch's object collectives take no timeout of their own.
    """
    if not initialized() or _dist().get_world_size(group) == 1:
        return [obj]
    out: list = [None] * _dist().get_world_size(group)
    _dist().all_gather_object(out, obj, group=group)
    return out


def raise_failures(failure: BaseException | None, failed: list[int], what: str) -> None:
    """After every rank has reached the collective that said which ranks ``failed``: this rank's own
    ``failure`` if it had one, else a RuntimeError naming the ranks that did, else nothing."""
    if failure is not None:
        raise failure
    if failed:
        raise RuntimeError(f"{what}: rank(s) {failed} failed (their own errors say why)")


def on_every_rank(work: Callable[[], T], what: str, group: Any = None) -> T:
    """``work()`` on this rank, then one collective in which every rank says whether its work
    failed, so that a rank whose work raised still reaches it and no other rank waits forever at
    the next collective; :func:`raise_failures` then raises on every rank if any failed."""
    failure, result = None, None
    try:
        result = work()
    except Exception as e:  # every rank must reach the gather below whatever happens here
        failure = e
    flags = all_gather_rows(np.array([failure is not None], dtype=np.float64), group)[:, 0]
    raise_failures(failure, [r for r, bad in enumerate(flags) if bad], what)
    return result
