"""The one search for the largest length that meets the limits, used by ``attnlab plan`` and ``attnlab cost``.

The planner asks it of a prediction (``fits`` is a formula), the lesson's cost section of a
measurement (``fits`` runs the call); both give a predicate that holds up to some length and fails
beyond. The search doubles from ``start`` while the length fits, never past ``cap``, then bisects
between the last length that fitted and the first that did not, in multiples of ``grain``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Search:
    """n: the largest length found to fit (0: none did); first_failing: the smallest that failed
    (None when none failed); capped: the search reached ``cap`` and it fitted, so larger lengths were
    never tried; tried: every length asked, in order."""

    n: int
    first_failing: int | None
    cap: int | None
    grain: int
    capped: bool
    tried: tuple[int, ...]

    def to_dict(self) -> dict:
        return dict(asdict(self), tried=list(self.tried))


def largest_length(fits: Callable[[int], bool], start: int, cap: int | None = None, grain: int = 1,
                   steps: int | None = None) -> Search:
    """The largest multiple of ``grain`` (or ``cap`` itself) for which ``fits`` holds, assuming it holds up to
    some length and fails beyond; ``steps``: at most this many bisection steps (None: until the gap is one grain)."""
    if not (isinstance(grain, int) and grain >= 1):
        raise ValueError(f"grain must be an int >= 1, got {grain!r}")
    if not (isinstance(start, int) and start >= 1):
        raise ValueError(f"start must be an int >= 1, got {start!r}")
    if cap is not None and cap < 1:
        return Search(0, None, cap, grain, False, ())
    tried: list[int] = []
    seen: dict[int, bool] = {}

    def ok(n: int) -> bool:
        if n not in seen:
            tried.append(n)
            seen[n] = bool(fits(n))
        return seen[n]

    n = start if cap is None else min(start, cap)
    lo, hi = 0, None
    while hi is None:
        if not ok(n):
            hi = n
        elif cap is not None and n >= cap:
            return Search(n, None, cap, grain, True, tuple(tried))
        else:
            lo, n = n, 2 * n if cap is None else min(2 * n, cap)
    done = 0
    while steps is None or done < steps:
        mid = (lo + hi) // 2 // grain * grain
        if mid <= lo or mid >= hi:
            break
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        done += 1
    return Search(lo, hi, cap, grain, False, tuple(tried))
