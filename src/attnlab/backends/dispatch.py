"""Which backend serves a call: every backend's refusals, and auto's choice among the rest.

Each backend declares what it supports (:class:`~attnlab.backends.base.Supports`) and lists every
reason it refuses a call. A backend named by the caller never falls back to another; when nothing
can serve a call the error lists every backend with its reasons.

``auto`` keeps one precision per input dtype at every size: among the backends that fit, only
those computing in the first precision of :func:`precisions` that any of them offers (float32
inputs are computed in float32, never in float64 for small calls and float32 for large ones).
Among those it takes the fastest *on this machine* (:mod:`attnlab.backends.calibrate`: measured
once, cached), or by each backend's rough prior where nothing is measured.

=========== =====================================================================================
numpy       the float64 NumPy reference, the specification (NumPy arrays only)
torch       the same math in PyTorch eager: every mask, weights, LSE, gradients, any device
sdpa        ``torch.nn.functional.scaled_dot_product_attention``: fused; no weights, no LSE
blockwise   attnlab's online softmax as a loop of NumPy/torch calls: O(T) memory, any mask, LSE
kernel      the same online softmax compiled (C, OpenMP, SIMD): float32 on the CPU
=========== =====================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from attnlab.backends.base import Backend
from attnlab.backends.blockwise import BlockwiseBackend
from attnlab.backends.eager import TorchBackend
from attnlab.backends.kernel import KernelBackend
from attnlab.backends.numpy_ref import NumpyBackend
from attnlab.backends.options import Options
from attnlab.backends.request import Request, prepare
from attnlab.backends.sdpa import SdpaBackend

BACKENDS: dict[str, Backend] = {
    b.name: b for b in (NumpyBackend(), TorchBackend(), SdpaBackend(), BlockwiseBackend(), KernelBackend())
}


class NoBackendError(ValueError):
    """No backend (or not the one named) can serve a call; the message gives each one's reasons."""


def refusals(request: Request) -> dict[str, list[str]]:
    """Every backend's reasons to refuse ``request`` (an empty list: it can serve it)."""
    return {name: b.refusals(request) for name, b in BACKENDS.items()}


def precisions(dtype: str) -> tuple[str, ...]:
    """auto's precisions for an input dtype, most wanted first: its own (float32 accumulation for 16-bit)."""
    if dtype in ("float16", "bfloat16"):
        return ("float32", dtype, "float64")
    return (dtype, "float64")


@dataclass(frozen=True)
class Choice:
    """auto's choice for a call, and why."""

    backend: str
    precision: str
    seconds: dict[str, float] = field(default_factory=dict)  # each candidate's expected time
    measured: bool = False  # timings from this machine (else the priors)
    excluded: dict[str, str] = field(default_factory=dict)  # backends that fit but compute in another precision

    @property
    def reason(self) -> str:
        how = "measured on this machine" if self.measured else "by the backends' priors (not measured here)"
        times = ", ".join(f"{n} {1e3 * s:.3g} ms" for n, s in sorted(self.seconds.items(), key=lambda x: x[1]))
        text = f"{self.backend}: the fastest in {self.precision} {how} ({times})"
        if self.excluded:
            text += "; " + ", ".join(f"not {n} ({why})" for n, why in self.excluded.items())
        return text


def _listing(reasons: dict[str, list[str]]) -> str:
    return "".join(f"\n  {n}: {'; '.join(why) or 'can serve it'}" for n, why in reasons.items())


def _run_for_calibration(name: str, qkv: tuple, causal: bool, sinks: Any = None) -> Any:
    call = prepare(*qkv, Options(causal=causal, sink_logits=sinks))
    return BACKENDS[name].run(call)[0]


def explain(request: Request) -> Choice:
    """auto's choice for ``request``, with its reason (``attnlab bench`` prints it)."""
    from attnlab.backends import calibrate

    reasons = refusals(request)
    fits = [n for n, why in reasons.items() if not why]
    if not fits:
        raise NoBackendError("no backend can serve this call" + _listing(reasons))
    by_precision = {n: BACKENDS[n].compute_dtype(request.dtype) for n in fits}
    precision = next(p for p in precisions(request.dtype) if p in by_precision.values())
    names = [n for n in fits if by_precision[n] == precision]
    excluded = {n: f"computes in {by_precision[n]}" for n in fits if n not in names}
    seconds = calibrate.timings(request, names, _run_for_calibration) if len(names) > 1 else None
    measured = seconds is not None
    if seconds is None:
        seconds = {n: BACKENDS[n].estimate(request) for n in names}
    best = min(names, key=lambda n: seconds[n])
    return Choice(best, precision, seconds, measured, excluded)


# auto's choices by the facts of a call in its length bucket (its score bound aside, which only an
# overflow check reads) and the state of the measurements: explain() costs a fraction of a millisecond,
# as much as a whole attention call of a few hundred tokens, so each kind of call is explained once per
# bucket, not once per length (a decoding step's Tk grows by one each step). Bounded.
_CHOICES: dict[tuple, str] = {}
_CHOICES_MAX = 512


def bucket(n: int) -> int:
    """The length bucket of ``n`` (Tq or Tk): the next power of two, n itself when it is one."""
    return 1 << max(n - 1, 0).bit_length()


def bucketed(request: Request) -> Request:
    """``request`` at the top of its length bucket (Tq, Tk rounded up by :func:`bucket`; the fraction of
    pairs its band leaves rounded to 1/16): the call auto explains for every call of the bucket."""
    p = request.problem
    if p.tq == bucket(p.tq) and p.tk == bucket(p.tk) and request.visible in (0.0, 1.0):
        return request
    return replace(request, problem=replace(p, tq=bucket(p.tq), tk=bucket(p.tk)),
                   visible=round(request.visible * 16) / 16)


def _bucket_key(request: Request) -> tuple:
    """What :func:`bucketed` keeps of ``request``, as a tuple built without a new Request (a decoding step
    asks once per layer)."""
    p = request.problem
    facts = tuple(v for name, v in vars(request).items() if name not in ("problem", "visible", "score_bound"))
    return facts + (p.batch, bucket(p.tq), bucket(p.tk), p.d, p.dv, p.dtype, p.scale, p.groups, p.kv_dtype,
                    round(request.visible * 16) / 16)


def _auto(request: Request) -> Backend:
    """auto's choice, made once per bucket (:func:`bucketed`); a backend that refuses this very call (its
    scores overflow, say) is passed over by explaining the call itself."""
    import os

    from attnlab.backends import calibrate

    key = (_bucket_key(request), calibrate.enabled(), calibrate.generation(),
           os.environ.get(calibrate.ENV_CACHE), os.environ.get("XDG_CACHE_HOME"))
    name = _CHOICES.get(key)
    if name is None:
        try:
            name = explain(bucketed(request)).backend
        except NoBackendError:  # nothing serves the bucket's top (a backend's length limit): the call itself decides
            name = explain(request).backend
        if len(_CHOICES) >= _CHOICES_MAX:
            _CHOICES.clear()
        _CHOICES[key] = name
    if BACKENDS[name].refusals(request):  # this call's own reason (its scores overflow): explained by itself, not kept
        return BACKENDS[explain(request).backend]
    return BACKENDS[name]


def choose(request: Request, backend: str = "auto") -> Backend:
    """The backend that serves ``request``: the named one, or auto's choice."""
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return _auto(request)
    why = BACKENDS[backend].refusals(request)
    if why:
        raise NoBackendError(f"backend {backend!r} cannot serve this call: {'; '.join(why)}" + _listing(refusals(request)))
    return BACKENDS[backend]
