"""What ``attnlab check`` reports beside the agreement table: auto's measured choices, and a summary of the table.

The agreement itself (every backend against the float64 reference) is
:func:`attnlab.backends.agreement.run_check`; the compiled kernel's build is
:func:`attnlab.bench.sweep.kernel_info`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from attnlab.backends import calibrate
from attnlab.backends.api import attention
from attnlab.backends.dispatch import explain
from attnlab.backends.options import Options
from attnlab.backends.request import prepare

# The usual profiles auto measures: one long head, and a BERT-base layer's twelve heads; full and causal.
PROFILES = ((1, 1, 4096, 64), (1, 12, 1024, 64))


@dataclass(frozen=True)
class AutoChoice:
    shape: tuple[int, ...]  # q, k and v: (B, H, n, d), float32 torch tensors on the CPU
    causal: bool
    backend: str
    measured: bool  # from timings on this machine (else the backends' priors)
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def auto_choices(shapes: Iterable[tuple[int, ...]] = PROFILES, causal: Iterable[bool] = (False, True)) -> list[AutoChoice]:
    """auto's choice for each shape (full and causal): one auto call each, which measures the
    backends on this machine first where their timings are not cached (and measuring is on)."""
    import torch

    rows = []
    for shape in shapes:
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
        for c in causal:
            with torch.no_grad():
                attention(q, k, v, causal=c)  # the call itself, as a user makes it
            choice = explain(prepare(q, k, v, Options(causal=c)).request)
            rows.append(AutoChoice(tuple(shape), c, choice.backend, choice.measured, choice.reason))
    return rows


def recalibrate() -> dict[str, Any]:
    """Forget auto's cached timings and measure the usual profiles again (:data:`PROFILES`).

    Returns the cache file, whether measuring is on (``ATTNLAB_CALIBRATE``) and auto's choices.
    """
    path = calibrate.forget()
    return {"cache": str(path), "enabled": calibrate.enabled(),
            "choices": [c.to_dict() for c in auto_choices()]}


def summary(rows: list[Any]) -> dict[str, Any]:
    """The agreement table in numbers: runs, failures, and refusals grouped by (backend, reason)."""
    ran = [r for r in rows if r.passed is not None]
    refused: dict[tuple[str, str], int] = {}
    for r in rows:
        if r.passed is None:
            refused[r.backend, r.note] = refused.get((r.backend, r.note), 0) + 1
    return {"ran": len(ran), "failed": sum(r.passed is False for r in ran),
            "refused": [{"backend": b, "reason": why, "runs": n} for (b, why), n in refused.items()]}
