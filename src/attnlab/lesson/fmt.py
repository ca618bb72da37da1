"""Numbers the way the lesson prints them: weights as whole percents, vectors to two decimals.

One place for this rounding, shared by the lesson's tables, its HTML page and the CLI.
"""

from __future__ import annotations

import math
from typing import Any


def pct(x: float) -> str:
    """A weight the way the lesson prints it: 0.598 → '60 %'."""
    return f"{round(100 * x)} %"


def vec(xs: Any, digits: int = 2) -> str:
    """(0.7512, 0.049) → '(0.75, 0.05)'."""
    return "(" + ", ".join(f"{x:.{digits}f}" for x in xs) + ")"


def num(x: float, digits: int = 2) -> str:
    """A plain number to ``digits`` decimals."""
    return f"{x:.{digits}f}"


def big(x: float) -> str:
    """A large count readably: 1_234_567 → '1.23 M', 4.5e9 → '4.50 G'."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.2f} {unit}"
    return f"{x:g}"


def sig3(x: float) -> str:
    """Three significant digits in plain notation, thousands grouped: 1234.5 → '1,230',
    12.34 → '12.3', 0.01234 → '0.0123' (never '1.23e+03')."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    r = float(f"{x:.3g}")  # rounded first: 999.7 becomes 1000, with one more integer digit
    return f"{r:,.{max(0, 2 - math.floor(math.log10(abs(r))))}f}"


def compact(x: float) -> str:
    """A large count in few characters, for tables read at 80 columns: 100_663_296 → '101 M'."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{float(f'{x / size:.3g}'):g} {unit}"
    return f"{x:g}"


def ms(seconds: float) -> str:
    """Seconds shown as milliseconds, three significant digits: 1.2345 → '1,230 ms'."""
    return f"{sig3(1000 * seconds)} ms"


def mb(nbytes: float) -> str:
    """Bytes shown as MB (10^6), three significant digits: 2.5e9 → '2,500 MB'."""
    return f"{sig3(nbytes / 1e6)} MB"
