"""Run a function on N processes of this machine joined in a gloo group: for tests, notebooks and demos.

``torchrun`` is the launcher for real jobs; :func:`run_local` is the same group in one call, from
Python: it starts the processes, gives each its rank, returns what each returned and never hangs.
A rank that raises fails the call with that rank's own traceback (and the others are stopped);
processes still running after ``timeout_s`` are killed and the call raises TimeoutError.

Processes come from a fork server that has imported torch once (where the platform has one), so
a group starts in well under a second instead of one torch import per process.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

PRELOAD = ["torch", "torch.distributed", "attnlab.distributed", "attnlab.backends.kernel"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn: Callable, world: int, port: int, timeout_s: float, threads: int, outdir: str, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        result = fn(rank, world, *args)
    except BaseException:  # noted with the time: the first failure is the cause, later ones its echo
        partial = Path(outdir) / f"{rank}.err.partial"  # renamed whole: a rank stopped while writing leaves no .err
        partial.write_text(f"{time.time()!r}\n{traceback.format_exc()}")
        os.replace(partial, Path(outdir) / f"{rank}.err")
        raise
    finally:
        dist.destroy_process_group()  # the others' collectives fail at once instead of at their timeout
    with open(Path(outdir) / f"{rank}.pkl", "wb") as f:
        pickle.dump(result, f)


class RankError(RuntimeError):
    """A rank of a local group failed; the message holds its traceback."""


def _join(ctx: Any, outdir: str, world: int) -> bool:
    """True when every process is done; on a failure, RankError with the traceback of the rank that failed first."""
    try:
        return ctx.join(timeout=0.1)  # on a failure it stops the other processes and raises
    except Exception as e:
        notes = []
        for rank in range(world):
            err = Path(outdir) / f"{rank}.err"
            if err.exists():
                when, text = err.read_text().split("\n", 1)
                notes.append((float(when), rank, text))
        if not notes:
            raise
        notes.sort()
        _, rank, text = notes[0]
        later = f" (then rank(s) {[r for _, r, _ in notes[1:]]})" if len(notes) > 1 else ""
        raise RankError(f"rank {rank} of {world} failed first{later}:\n{text}") from e


def run_local(fn: Callable, world_size: int, *args: Any, timeout_s: float = 120.0, threads: int | None = None) -> list:
    """``fn(rank, world_size, *args)`` on ``world_size`` local processes in one gloo group; each rank's result.

    A rank that raises makes the call raise :class:`RankError` with the traceback of the rank that
    failed first (the others' failures are usually its echo). In a script, call it under
    ``if __name__ == "__main__":`` (the processes import the main module). ``fn`` must be a module-level function (the processes import it by name) and its results
    picklable. Each collective in the group times out after ``timeout_s`` too. ``threads``: torch's
    threads per process, default the CPUs shared out (at least 1).
    """
    import torch.multiprocessing as mp

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world_size)
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    if method == "forkserver":
        multiprocessing.set_forkserver_preload(PRELOAD)  # no effect once the server runs
    with tempfile.TemporaryDirectory(prefix="attnlab-local-") as outdir:
        ctx = mp.start_processes(
            _entry, args=(fn, world_size, _free_port(), timeout_s, threads, outdir, args),
            nprocs=world_size, join=False, start_method=method,
        )
        deadline = time.monotonic() + timeout_s
        while not _join(ctx, outdir, world_size):
            if time.monotonic() > deadline:
                alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                        p.join()
                raise TimeoutError(f"run_local: rank(s) {alive} of {world_size} still running after {timeout_s:g} s; killed")
        results = []
        for rank in range(world_size):
            with open(Path(outdir) / f"{rank}.pkl", "rb") as f:
                results.append(pickle.load(f))
        return results
