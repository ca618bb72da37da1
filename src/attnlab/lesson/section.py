"""What every section of the lesson hands back: its numbers, its tables, what the lesson states.

A section is plain data. The CLI renders its tables with rich, the report renders the same tables
as HTML and draws its figures from ``data``; ``lesson.json`` is ``Section.to_dict()`` of each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Table:
    """Rows of already-rounded strings, so the terminal and the page show the same figures."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"table {self.title!r}: row {row} has {len(row)} cells, expected {len(self.columns)}")

    def to_dict(self) -> dict:
        return {"title": self.title, "columns": list(self.columns), "rows": [list(r) for r in self.rows]}


@dataclass(frozen=True)
class Section:
    """One section of the lesson.

    key: stable id (``formula``, ``qkv``, ``scaling``, ``heads``, ``maps``, ``cost``, ``next``);
    findings: sentences stating the results, numbers included; data: every number, JSON-ready;
    seed: the figures the lesson states for the same things, for comparison.
    """

    key: str
    number: int
    title: str
    findings: tuple[str, ...]
    tables: tuple[Table, ...]
    data: dict[str, Any]
    seed: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "number": self.number,
            "title": self.title,
            "findings": list(self.findings),
            "tables": [t.to_dict() for t in self.tables],
            "data": self.data,
            "seed": self.seed,
        }


def table(title: str, columns: list[str] | tuple[str, ...], rows: list) -> Table:
    """A :class:`Table` from lists (cells converted with ``str``)."""
    return Table(title, tuple(columns), tuple(tuple(str(c) for c in r) for r in rows))
