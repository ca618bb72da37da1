"""Numbers the way the seed prints them: weights as whole percents, vectors to two decimals.

One place for this rounding, shared by the lesson's tables, its HTML page and the CLI.
"""

from __future__ import annotations

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


def ms(seconds: float) -> str:
    """Seconds shown as milliseconds, three significant digits."""
    return f"{1000 * seconds:.3g} ms"


def mb(nbytes: float) -> str:
    """Bytes shown as MB (10^6), three significant digits."""
    return f"{nbytes / 1e6:.3g} MB"
