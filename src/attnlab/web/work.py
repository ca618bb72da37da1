"""The viewer's heavy work: captured maps (and long views) in a cache bounded in bytes, and a bounded worker pool.

A 512-token capture holds 2 × L·H·T² float32 weights (token and word level: 150 MB for 6 × 12
heads), so the cache is bounded in MB, not in entries. The model's work runs in a small thread pool
off the event loop, so the page and ``/api/info`` answer at once while a capture runs; when more
requests wait than the queue allows, :meth:`WorkerPool.run` raises :class:`Busy` at once, and the
server answers 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from attnlab.maps.records import Maps
from attnlab.maps.tokens import AttentionMaps

SERVER_MAP_BYTES = 2**30  # a full capture the server runs at most (its T × T at the peak); above it: the long view
CACHE_MB = 512  # captures and payloads kept, in MB: three 512-token captures at both levels
WORKERS = 1  # torch already spreads one capture over every core; two at once only share them
QUEUE = 4  # heavy requests that may wait for a worker; more get 503 at once


def nbytes(value: Any) -> int:
    """Memory held by a cached value: a bytes payload's length, or the ``nbytes`` its type states
    (maps: every array of every record; a rollout: its arrays)."""
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    return int(value.nbytes)


class MapsCache:
    """Captured maps (both levels, and with queries and keys) and serialized payloads by request, least recently used out first,
    at most ``max_mb`` in all (the newest entry is kept even when it alone is larger). One lock
    around every model call."""

    def __init__(self, model: Any, revision: str | None, max_mb: float = CACHE_MB) -> None:
        if not max_mb > 0:
            raise ValueError(f"max_mb must be > 0, got {max_mb!r}")
        self.model, self.revision, self.max_bytes = model, revision, int(max_mb * 1e6)
        self.lock = threading.RLock()
        self.entries: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()  # key -> (value, bytes)
        self.total = 0
        self.long: OrderedDict[str, Any] = OrderedDict()  # text -> its long view (LongMaps), apart: see get_long
        self._loaded: Any = None

    @property
    def is_loaded(self) -> bool:
        return self._loaded is not None

    def loaded(self) -> Any:
        """The LoadedModel, loaded on first use."""
        from attnlab.hf.loading import LoadedModel, load_model

        if self._loaded is None:
            with self.lock:
                if self._loaded is None:
                    m = self.model
                    self._loaded = m if isinstance(m, LoadedModel) else load_model(m, self.revision)
        return self._loaded

    def _lookup(self, key: tuple) -> Any:
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key][0]
        return None

    def put(self, key: tuple, value: Any) -> None:
        """Keep ``value`` under ``key``, dropping the least recently used entries past ``max_mb``."""
        with self.lock:
            if key in self.entries:
                self.total -= self.entries.pop(key)[1]
            size = nbytes(value)
            self.entries[key] = (value, size)
            self.total += size
            while self.total > self.max_bytes and len(self.entries) > 1:
                self.total -= self.entries.popitem(last=False)[1][1]

    def get(self, sentences: list[str], level: str) -> Maps:
        """Token-level AttentionMaps (``level="token"``) or word-level WordMaps of the sentences."""
        from attnlab.hf.capture import capture

        key = ("maps", tuple(sentences), level)
        with self.lock:
            found = self._lookup(key)
            if found is not None:
                return found
            maps = capture(sentences, self.loaded(), max_bytes=SERVER_MAP_BYTES)
            words = maps.to_words()
            self.put(("maps", tuple(sentences), "token"), maps)
            self.put(("maps", tuple(sentences), "word"), words)
            return maps if level == "token" else words

    def get_qk(self, sentences: list[str]) -> AttentionMaps:
        """Token-level AttentionMaps with queries and keys (``capture(..., qk=True)``), for the Neuron
        view; kept apart from :meth:`get`'s, as they hold L·H·T·D more per attention."""
        from attnlab.hf.capture import capture

        key = ("qk", tuple(sentences))
        with self.lock:
            found = self._lookup(key)
            if found is None:
                found = capture(sentences, self.loaded(), qk=True, max_bytes=SERVER_MAP_BYTES)
                self.put(key, found)
            return found

    def get_long(self, text: str, max_bytes: int) -> Any:
        """The long view of one text (:func:`attnlab.hf.capture_long.capture_long`: queries, keys and row
        LSEs, refused past ``max_bytes``), captured once. Long views are kept apart from the maps and payloads,
        at most ``max_bytes`` of them in all, least recently used out first (the newest always kept): 32,768
        tokens of a 64-head model hold 0.7 GB, more than the whole maps cache, so in it each overview's
        payload pushed its own text out and the next request captured it again (80 s instead of 20 ms)."""
        from attnlab.hf.capture_long import capture_long

        with self.lock:
            found = self.long.get(text)
            if found is None:
                found = capture_long(text, self.loaded(), max_bytes=max_bytes)
                self.long[text] = found
                while sum(nbytes(v) for v in self.long.values()) > max_bytes and len(self.long) > 1:
                    self.long.popitem(last=False)
            self.long.move_to_end(text)
            return found

    def computed(self, key: tuple, make: Callable[[], bytes]) -> bytes:
        """A serialized answer kept under ``key`` (roles and downsampling of 512 tokens take a second)."""
        with self.lock:
            found = self._lookup(("payload", *key))
            if found is None:
                found = make()
                self.put(("payload", *key), found)
            return found


class Busy(Exception):
    """Every worker is busy and the queue is full; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: int, waiting: int) -> None:
        super().__init__(f"the viewer is busy with {waiting} requests; try again in {retry_after} s")
        self.retry_after = retry_after


class WorkerPool:
    """``workers`` threads for the model's work and at most ``queue`` requests waiting for them."""

    def __init__(self, workers: int = WORKERS, queue: int = QUEUE) -> None:
        if workers < 1 or queue < 0:
            raise ValueError(f"workers must be >= 1 and queue >= 0, got workers={workers}, queue={queue}")
        self.workers, self.limit = workers, workers + queue
        self.executor: ThreadPoolExecutor | None = None  # made on first use, again after a shutdown
        self.pending = 0  # running + waiting
        self.seconds = 1.0  # running mean of one job's duration, for Retry-After
        self.lock = threading.Lock()

    def _done(self, _future: Any) -> None:
        with self.lock:
            self.pending -= 1

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            with self.lock:
                self.seconds = 0.7 * self.seconds + 0.3 * (time.perf_counter() - t)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on a worker thread; :class:`Busy` at once when the queue is full. A request
        that goes away still holds its place until its job ends, so the bound is on work, not sockets."""
        with self.lock:
            if self.pending >= self.limit:
                raise Busy(max(1, math.ceil(self.seconds * self.pending / self.workers)), self.pending)
            self.pending += 1
            if self.executor is None:
                self.executor = ThreadPoolExecutor(self.workers, thread_name_prefix="attnlab-viewer")
            future = self.executor.submit(self._timed, fn, *args)
        future.add_done_callback(self._done)
        return await asyncio.wrap_future(future)

    def shutdown(self) -> None:
        """Stop the threads (the app's lifespan ends); a later :meth:`run` starts new ones."""
        with self.lock:
            executor, self.executor = self.executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
