"""How a call is timed and its memory measured: probes, the interleaved rounds, thread settings.

- A *probe* runs a call once, untimed for the results, and reports its peak extra memory: the
  rise of the process's peak resident set (:func:`probe`, Linux ``/proc``; it sees NumPy's,
  torch's and BLAS's buffers alike) or what ``tracemalloc`` sees (:func:`probe_traced`, NumPy and
  Python allocations only, to the byte, on any OS).
- :func:`interleaved` times several calls against each other: one probe each, then rounds in
  which every call runs once, in a new seeded order each round; a call shorter than
  ``MIN_TIMING_S`` is timed over several in a row (timeit's autorange) and their mean is one sample.

Why the pauses and warm calls exist, and what they were measured to fix: benchmarks/README.md.
"""

from __future__ import annotations

import ctypes
import math
import sys
import time
import tracemalloc
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

# After a call, the idle workers of OpenBLAS and of torch's OpenMP keep spinning for a while; a
# method of the other library timed right then shares the cores with them. So when the library
# changes, the loop pauses, then makes one untimed call to wake this library's threads.
SWITCH_PAUSE_S = 0.3
MIN_TIMING_S = 0.05  # a call shorter than this is timed over several calls in a row
MAX_NUMBER = 50  # at most this many calls in a row per sample
WARM_CALL_S = 1.0  # a call shorter than this gets one untimed call before the first round
MEMORY = ("rss", "tracemalloc")  # how peak extra memory is measured: probe, probe_traced

Probe = Callable[[Callable[[], Any]], tuple[Any, float, int | None]]


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def probe(fn: Callable[[], Any]) -> tuple[Any, float, int | None]:
    """Run ``fn`` once: (its result, seconds, peak extra resident bytes, or None where /proc cannot say).

    Freed heap memory is first handed back to the system (``malloc_trim``), so that buffers the
    call reuses from an earlier call count too; that makes the call slower, so timed calls do not
    go through here.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident size (VmHWM) to the current one
        before = _status_kb("VmRSS")
    except OSError:
        before = None
    t0 = time.perf_counter()
    res = fn()
    dt = time.perf_counter() - t0
    peak = _status_kb("VmHWM")
    extra = None if before is None or peak is None else max(0, peak - before) * 1024
    return res, dt, extra


def probe_traced(fn: Callable[[], Any]) -> tuple[Any, float, int | None]:
    """Like :func:`probe`, but the peak is what ``tracemalloc`` sees above the start of the call.

    tracemalloc counts the buffers of NumPy arrays (NumPy reports them to it) and Python objects,
    to the byte and on any OS; it does not see torch's or BLAS's own allocations.
    """
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        res = fn()
        dt = time.perf_counter() - t0
        return res, dt, int(tracemalloc.get_traced_memory()[1] - base)
    finally:
        tracemalloc.stop()


def calls_per_sample(seconds: float) -> int:
    """How many calls in a row make one timing of a call that took ``seconds`` once."""
    return max(1, min(MAX_NUMBER, math.ceil(MIN_TIMING_S / max(seconds, 1e-6))))


def round_orders(count: int, rounds: int, seed: int = 0) -> list[list[int]]:
    """The order of the ``count`` calls in each round: a new seeded permutation per round."""
    rng = np.random.default_rng(seed)
    return [[int(i) for i in rng.permutation(count)] for _ in range(rounds)]


def interleaved(
    calls: dict[Hashable, Callable[[], Any]],
    error: Callable[[Hashable, Any], float | None],
    repeats: int,
    probe: Probe = probe,
    tick: Callable[[Hashable], None] | None = None,
    library: Callable[[Hashable], str] | None = None,
) -> tuple[dict[Hashable, list[float]], dict[Hashable, int | None], dict[Hashable, float | None]]:
    """The measuring loop: ``(times, peaks, errors)`` per key of ``calls``.

    One untimed ``probe`` call per key (its peak memory, and ``error(key, output)``), then
    ``repeats`` rounds of timed calls, every key once per round, in a new (seeded) order each
    round. Keys are methods or sizes: interleaving spreads the machine's other load over all of
    them alike, so their ratios suffer less from it, and the shuffled order keeps a disturbance
    that outlasts one call from always falling on the same neighbours. ``library(key)`` names the
    library a call runs on ("numpy", "torch"); when it changes between two timed calls the loop
    pauses and makes one untimed call first.
    """
    times: dict[Hashable, list[float]] = {key: [] for key in calls}
    peaks: dict[Hashable, int | None] = {}
    errors: dict[Hashable, float | None] = {}
    seconds: dict[Hashable, float] = {}  # of the probe call
    with no_grad():
        for key, fn in calls.items():
            out, seconds[key], peaks[key] = probe(fn)
            errors[key] = error(key, out)
            del out
        number = {key: calls_per_sample(t) for key, t in seconds.items()}
        time.sleep(SWITCH_PAUSE_S)  # the errors were computed with NumPy: its idle BLAS threads stop spinning
        for key, fn in calls.items():  # the probes handed freed memory back: fault it in again, untimed
            if seconds[key] < WARM_CALL_S:
                fn()
        items, last = list(calls.items()), None
        for order in round_orders(len(items), repeats):
            for i in order:
                key, fn = items[i]
                lib = library(key) if library else None
                if last is not None and lib != last:
                    time.sleep(SWITCH_PAUSE_S)  # the other library's idle threads stop spinning (untimed)
                    fn()  # and this one's wake up (untimed)
                last = lib
                t0 = time.perf_counter()
                for _ in range(number[key]):
                    fn()
                times[key].append((time.perf_counter() - t0) / number[key])
                if tick:
                    tick(key)
    return times, peaks, errors


class no_grad:
    """torch.no_grad() when torch is loaded (a benchmark measures inference), nothing otherwise."""

    def __enter__(self) -> None:
        self._ctx = sys.modules["torch"].no_grad() if "torch" in sys.modules else None
        if self._ctx is not None:
            self._ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


class torch_threads:
    """torch.set_num_threads(n) for the block, restored after (nothing for None)."""

    def __init__(self, n: int | None) -> None:
        self.n, self.before = n, None

    def __enter__(self) -> None:
        if self.n is not None:
            import torch

            self.before = torch.get_num_threads()
            torch.set_num_threads(self.n)

    def __exit__(self, *exc: Any) -> None:
        if self.before is not None:
            import torch

            torch.set_num_threads(self.before)
