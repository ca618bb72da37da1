"""What a measurement of this machine knows of its own noise: its spread, whether a line through it is
supported, and whether the machine was busy while it was taken. Pure arithmetic on sample timings, so that
the tests feed it fixed samples and every rule here is decided the same way on every machine.

A measurement is a triple ``[median, low, high]`` of seconds over its samples: the median is what the
planner predicts with (the typical run), the low and high ends are the range it shows beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

# A measurement whose samples spread more than this (max − min over the median) was taken while another
# program ran: on a quiet machine this harness's samples stay within a few percent of each other, and a
# competing process on two cores spreads them by a half to several times.
BUSY_SPREAD = 0.35


def summary(samples: Sequence[float]) -> list[float]:
    """[median, min, max] of the samples, in seconds."""
    if not samples:
        raise ValueError("samples must hold at least one timing, got none")
    return [statistics.median(samples), min(samples), max(samples)]


def spread(m: Sequence[float]) -> float:
    """(high − low) / median of a measurement ``[median, low, high]``: 0 for a single sample."""
    return (m[2] - m[1]) / m[0] if m[0] > 0 else 0.0


def worst_spread(profile: dict) -> tuple[float, str]:
    """The widest relative spread among a profile's measurements and what it was (for the note)."""
    worst, what = 0.0, ""
    for name, value in profile.items():
        for m in _measurements(value):
            if spread(m) > worst:
                worst, what = spread(m), name
    return worst, what


def _measurements(value: object) -> list[list[float]]:
    """The [median, low, high] triples inside a profile entry: a triple, a point [work, median, low, high],
    a list or a dict of them; anything else (a count, a name) holds none."""
    number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
    if isinstance(value, dict):
        return [m for v in value.values() for m in _measurements(v)]
    if isinstance(value, list) and len(value) in (3, 4) and all(map(number, value)):
        return [list(value[-3:])]
    if isinstance(value, list):
        return [m for v in value for m in _measurements(v)]
    return []


def busy(profile: dict) -> bool:
    return worst_spread(profile)[0] > BUSY_SPREAD


def decode_line(work: Sequence[float], steps: Sequence[Sequence[float]]) -> tuple[float, float] | None:
    """The least-squares line seconds = fixed + work / rate through a decode step's time at each cache size,
    beyond its time at the first (``steps[i]`` = [median, low, high] at ``work[i]``, ``work[0]`` the first,
    the smallest cache): (slope, fixed), or None when the points do not support a line that grows.

    Supported: the slope is positive and the growth it gives across the range is larger than half the wider
    spread of the first and the last step (more keys never cost less; a rise smaller than the steps' own
    noise is no evidence of the rate, only of the noise).
    """
    x = [w - work[0] for w in work[1:]]
    y = [s[0] - steps[0][0] for s in steps[1:]]
    slope, fixed = (np.polyfit(x, y, 1) if len(x) > 1 else (y[0] / x[0], 0.0))
    noise = max(steps[0][2] - steps[0][1], steps[-1][2] - steps[-1][1]) / 2
    if not slope > 0 or slope * x[-1] <= noise:
        return None
    return float(slope), float(fixed)


def decode_points(work: Sequence[float], steps: Sequence[Sequence[float]], line: tuple[float, float]) -> list[list[float]]:
    """[KV bytes beyond the first, median, low, high] of the decode read on the fitted line: at each point the
    line's seconds (never below what the slope alone gives: a negative intercept is the fit's, not the
    machine's), its range the step's own at that cache size, scaled to the growth."""
    slope, fixed = line
    out = []
    for w, s in zip(work[1:], steps[1:]):
        x = w - work[0]
        seconds = max(fixed + slope * x, slope * x)
        out.append([float(x), seconds, seconds * s[1] / s[0], seconds * s[2] / s[0]])
    return out
