"""The cost section's search for the largest context: the planner's search, a stated cap, and a memory
model that agrees with its own measurements (issue 20's `cost --deadline-ms 1e9 --memory-mb 1e9`)."""

from __future__ import annotations

import pytest

from attnlab.bench import Measurement
from attnlab.lesson import cost as cost_mod
from attnlab.lesson.cost import MAX_RUN_S, CostConfig, largest_context


def _fake(n: int) -> Measurement:
    # time n² · 10 ns (2 s, the cap on one run, at n ≈ 14,142); memory a fixed 20 MB tile buffer + 300 B per token
    return Measurement("blockwise-numpy", n, 64, 1, False, n * n * 1e-8, peak_bytes=20_000_000 + 300 * n)


@pytest.fixture
def fake_path(monkeypatch):
    monkeypatch.setattr(cost_mod, "_measure", lambda method, sizes, cfg: [_fake(n) for n in sizes])
    cfg = CostConfig(deadline_ms=1e9, memory_mb=1e9, sizes=(512, 1024, 2048, 4096))
    return cfg, largest_context("blockwise-numpy", cfg, [_fake(n) for n in cfg.sizes])


def test_the_largest_n_is_the_largest_the_table_marks_as_meeting_both(fake_path):
    cfg, best = fake_path
    path = {"points": [_fake(n).to_dict() for n in cfg.sizes], "largest_context": best}
    rows = cost_mod._measured_table("blockwise (NumPy)", path, cfg).rows
    yes = [int(r[0]) for r in rows if r[-1] == "yes"]
    assert best["n"] == max(yes)
    assert not any("yes" in r[-1] and "predicted" in r[-1] for r in rows)  # nothing unmeasured is called a fit
    # the sizes past it were not run because of the stated cap, and the result says the limit may lie beyond
    assert best["capped"] and best["max_run_s"] == MAX_RUN_S
    assert all(r["not_run"] == "cap" for r in best["tried"] if not r["measured"])
    assert any("cap of 2 s per run" in r[-1] for r in rows)


def test_memory_predictions_follow_the_nearest_measurements(fake_path):
    _, best = fake_path
    for r in best["tried"]:
        if not r["measured"]:  # a fixed buffer dominates the sweep: a power law fitted there overshoots
            true = _fake(r["n"]).peak_bytes
            assert 0.9 * true <= r["peak_bytes"] <= 1.1 * true
