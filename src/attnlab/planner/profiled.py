"""A measured profile of this machine (:mod:`attnlab.planner.machine`) as the planner's :class:`Hardware`, at the
median of its measurements or at either end of their spread, with the memory this process could use."""

from __future__ import annotations

import os
from dataclasses import replace

from attnlab.backends.calibrate import machine_facts
from attnlab.planner import noise
from attnlab.planner.hardware import Hardware, Rate


def memory_budget() -> float:
    """Bytes a server of the model could use here: what is available plus what this process already holds
    (its resident memory), so that a plan asked from a process that has loaded models (the lesson) sees the
    same budget as one from a fresh ``attnlab plan``."""
    from attnlab.bench.sweep import memory_available

    try:
        with open("/proc/self/statm") as f:
            held = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        held = 0
    return float((memory_available() or 0) + held)


def worst_percent(profile: dict) -> tuple[float, str]:
    """The profile's widest spread in percent, and the measurement it is in."""
    worst, what = noise.worst_spread(profile)
    return 100 * worst, what


def hardware_of(m: dict, key: str, where: str, end: int = 0) -> Hardware:
    """The :class:`Hardware` of profile ``m`` (cached under ``key``, ``where`` saying where) at one end of its
    measurements: 0 the median, 1 the low (fast), 2 the high (slow); the median's carries the other two as its
    ``bounds``."""
    facts, col = machine_facts(), 1 + end
    pts = lambda name: tuple((p[0], p[col]) for p in m[name])  # noqa: E731
    one = lambda name: m[name][end]  # noqa: E731
    bandwidth = Rate(m["bandwidth"][0] / m["bandwidth"][col])
    decode, notes = Rate(points=tuple((p[0], p[col]) for p in m["decode_attention"]["points"])), []
    if not decode.points:
        decode = bandwidth
        notes.append("the decode steps did not grow with the cache beyond their noise in "
                     f"{m['decode_attention']['attempts']} measurements (a busy machine?): the KV read is costed "
                     "at the weights' read rate, not measured")
    if m["busy"]:
        notes.append("measured on a busy machine (spread up to {:.0f} % in {}): the ranges are wide; "
                     "attnlab plan --calibrate measures again".format(*worst_percent(m)))
    hw = Hardware(
        f"this machine ({facts['cpu']}, {(n := m['torch_threads'])} thread{'s' if n > 1 else ''})", Rate(points=pts("matmul")), bandwidth,
        Rate(points=pts("attention")), decode, Rate(points=pts("elementwise")), memory_budget(),
        one("layer_overhead_s"), True, where if not m["busy"] else "measured, busy",
        step_overhead_s=one("step_overhead_s"),
        prefill_overhead_s=(one("prefill_layer_overhead_s"), one("prefill_step_overhead_s")),
        details={"profile": key, "backend": m["backend"], "measured_at": m["measured_at"], "busy": m["busy"],
                 "spread": noise.worst_spread(m)[0]}, notes=tuple(notes))
    if end == 0:
        hw = replace(hw, bounds=(hardware_of(m, key, where, 1), hardware_of(m, key, where, 2)))
    return hw
