"""The local group: a failing rank fails the call with its own error, a hung one is killed, sums are sums."""

from __future__ import annotations

import time

import numpy as np
import pytest

import dist_workers
from attnlab.distributed import all_reduce_sum, rank_and_world, run_local, shard_items
from attnlab.distributed.launch import RankError

pytestmark = [pytest.mark.needs("torch"), pytest.mark.gloo]


def test_a_failing_rank_fails_the_call_with_its_own_error():
    with pytest.raises(RankError, match="rank 1 was told to fail") as info:
        run_local(dist_workers.fails_on, 2, 1, timeout_s=60)
    assert str(info.value).startswith("rank 1 of 2 failed first") and "ValueError" in str(info.value)


def test_a_hung_group_is_killed_at_the_timeout():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rank\(s\) \[0, 1\] of 2 still running"):
        run_local(dist_workers.sleeps, 2, 60.0, timeout_s=3)
    assert time.monotonic() - start < 30


def test_all_reduce_sums_over_ranks():
    results = run_local(dist_workers.reduce_ranks, 3, timeout_s=60)
    for table, world in results:
        np.testing.assert_array_equal(table, np.full((2, 3), 1.0 + 2.0 + 3.0))
        assert world.tolist() == [9.0]  # each of 3 ranks contributed its world size, 3


def test_outside_a_job_everything_is_local(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert rank_and_world() == (0, 1)
    a, b = all_reduce_sum([np.arange(3), np.ones((2, 2), np.float32)])
    assert a.dtype == np.float64 and a.tolist() == [0, 1, 2] and b.shape == (2, 2)


def test_shard_items_splits_in_order():
    items = list(range(10))
    parts = [shard_items(items, r, 3) for r in range(3)]
    assert parts == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert shard_items([1], 1, 2) == []
    with pytest.raises(ValueError, match="rank must lie"):
        shard_items(items, 3, 3)
