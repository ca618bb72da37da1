"""The agreement cases: every backend against the float64 reference, for ``attnlab check`` and the tests.

One table (:data:`CASES`) serves both: :func:`run_check` runs it where the user is (their torch
build, their BLAS, their GPU if any) and ``tests/backends/test_backends.py`` parametrizes over it.
Each case runs on NumPy arrays and on torch tensors on every device, in float64 and float32, and
in float16/bfloat16 on tensors. The expected answer is :func:`reference_of`: the float64 spec on
the very inputs the backend got (rounded to its dtype), so an error is the backend's own and not
the rounding of its inputs. Tolerances (docs/design.md): absolute in float64 and float32 (outputs are
of unit scale); in float16/bfloat16 at most twice the error of plain torch in that dtype. A
backend that refuses a case says why; that is not a failure.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from attnlab.backends.api import attention
from attnlab.backends.dispatch import BACKENDS, refusals
from attnlab.backends.options import Options
from attnlab.backends.request import Request, prepare
from attnlab import masks
from attnlab.reference import attention as reference
from attnlab.reference import validate

TOLERANCE = {"float64": 1e-10, "float32": 1e-5}  # absolute, outputs of unit scale
LOW_PRECISION_FACTOR = 2.0  # float16/bfloat16: at most this times plain torch's error
LOW_PRECISION = ("float16", "bfloat16")
PLAIN = "torch"  # the yardstick in float16/bfloat16: the reference's math in the inputs' dtype
# Tiles that divide none of the cases' lengths, for the backends that take a block size, so the
# partial tiles at every edge run. Only on the small cases: the n = 1025 case keeps the default
# tiles (which do not divide 1025 either) so the blockwise loop stays short there.
SMALL_TILES = (16, 23)
SMALL_TILES_UP_TO = 1 << 16  # scores per head
SMALL_TILES_KEYS = 1 << 10  # and keys: a decode case over 4,099 keys keeps the default tiles (which divide 4,099 neither)
# Long caches (Tk of 100,003): key blocks of 4,093 keys (dividing no case's length either), so that the
# blockwise loop runs a few dozen tiles, not hundreds of the default 256 keys.
LONG_TILES = (16, 4093)
LONG_TILES_FROM = 1 << 16  # keys


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: the cases are constants
class Case:
    """q (B, Hq, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv), and attention()'s options."""

    name: str
    q_shape: tuple[int, int, int, int]  # (B, Hq, Tq, D)
    kv_heads: int
    tk: int
    dv: int
    options: tuple[tuple[str, Any], ...] = ()  # (name, value) pairs for attention(); NumPy values
    kv_dtype: str | None = None  # k and v stored in this 16-bit dtype under a float32 query (tensors only)

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.options)

    @property
    def small(self) -> bool:
        return self.q_shape[2] * self.tk <= SMALL_TILES_UP_TO and self.tk <= SMALL_TILES_KEYS

    @property
    def tiles(self) -> tuple[int, int] | None:
        """The block size the backends that take one get on this case (None: their defaults)."""
        return SMALL_TILES if self.small else LONG_TILES if self.tk >= LONG_TILES_FROM else None


def _cases() -> tuple[Case, ...]:
    rng = np.random.default_rng(0)
    row_5_hidden = np.ones((20, 20), bool)
    row_5_hidden[5] = False
    return (
        Case("n=97, D=59", (2, 2, 97, 59), 2, 97, 59),
        Case("n=1025 causal", (1, 1, 1025, 64), 1, 1025, 64, (("causal", True),)),
        Case("Tq<Tk causal (bottom-right), Dv!=D", (2, 2, 33, 16), 2, 97, 24, (("causal", True),)),
        Case("Tq>Tk causal (empty rows)", (2, 2, 40, 8), 2, 25, 8, (("causal", True),)),
        Case("mask and bias", (2, 2, 31, 12), 2, 45, 12,
             (("mask", rng.random((31, 45)) > 0.3), ("bias", rng.standard_normal((2, 31, 45))))),
        Case("fully masked row", (2, 2, 20, 8), 2, 20, 8, (("mask", row_5_hidden),)),
        Case("padding lengths 0 and 37", (2, 2, 50, 16), 2, 50, 16, (("lengths", np.array([0, 37])),)),
        Case("grouped-query causal", (2, 6, 41, 16), 2, 41, 16, (("causal", True),)),
        Case("sliding window (5, 2)", (2, 2, 70, 16), 2, 70, 16, (("window", (5, 2)),)),
        Case("causal sliding window 8", (1, 2, 70, 16), 2, 70, 16, (("window", 8), ("causal", True))),
        # every key restriction at once: the second sequence (23 keys) places query i at 23 − 30 + i, so its first 7 rows see none
        Case("grouped-query, Tq<Tk, causal window, padding", (2, 4, 30, 16), 2, 50, 8,
             (("causal", True), ("window", 10), ("lengths", np.array([50, 23])))),
        Case("scale=1", (2, 2, 20, 8), 2, 20, 8, (("scale", 1.0),)),
        *_description_cases(),
    )


def _description_cases() -> tuple[Case, ...]:
    """attnlab.masks: each kind, their combinations, ALiBi, learned sinks and callables (the issue's list)."""
    m = masks
    docs = m.documents(_doc_ids(1, 20, 9, 1, 30, 6))  # ragged documents, two of length 1 (T = 67)
    per_row = m.documents(np.stack([_doc_ids(1, 20, 9, 1, 30, 6), _doc_ids(40, 27)]))
    sinks = np.array([0.5, -1.0, 2.0, 0.0])
    return (
        Case("documents & causal, ragged (lengths 1)", (2, 4, 67, 16), 2, 67, 16, (("mask", docs & m.causal()),)),
        Case("documents per sequence & causal", (2, 2, 67, 16), 2, 67, 8, (("mask", per_row & m.causal()),)),
        Case("documents, not causal", (1, 2, 67, 16), 2, 67, 16, (("mask", docs),)),
        Case("prefix | causal (prefix-LM)", (2, 2, 50, 16), 2, 50, 16, (("mask", m.prefix(np.array([12, 33])) | m.causal()),)),
        Case("(window | sink tokens) & causal", (1, 4, 70, 16), 2, 70, 16,
             (("mask", (m.window(7) | m.sink_tokens(3)) & m.causal()),)),
        Case("ALiBi causal", (2, 4, 45, 16), 2, 45, 16, (("causal", True), ("score_mod", m.alibi(m.alibi_slopes(4))))),
        Case("ALiBi causal window", (1, 4, 60, 16), 4, 60, 16,
             (("causal", True), ("window", 9), ("score_mod", m.alibi(m.alibi_slopes(4))))),
        Case("learned sinks, GQA, causal", (2, 4, 41, 16), 2, 41, 16, (("causal", True), ("sink_logits", sinks))),
        Case("softcap, (window | sink tokens) & causal, ALiBi", (1, 4, 70, 16), 2, 70, 16,
             (("mask", (m.window(9) | m.sink_tokens(2)) & m.causal()), ("softcap", 1.5),
              ("score_mod", m.alibi(m.alibi_slopes(4))))),
        Case("learned sinks, a row that sees nothing", (1, 4, 30, 8), 2, 20, 8, (("causal", True), ("sink_logits", sinks))),
        Case("Tq<Tk documents & causal, prefix", (2, 2, 25, 16), 2, 67, 16,
             (("mask", (docs & m.causal()) | m.prefix(np.array([5, 0]))),)),
        Case("documents & causal & cache lengths (Tq<Tk)", (2, 2, 9, 16), 2, 67, 16,
             (("mask", m.documents(_doc_ids(30, 37)) & m.causal()), ("lengths", np.array([67, 40])))),
        Case("mask_mod callable (stripes)", (1, 2, 33, 8), 2, 33, 8, (("mask", _stripes),)),
        Case("score_mod callable (a per-head bias)", (1, 2, 33, 8), 2, 33, 8, (("causal", True), ("score_mod", _tilt))),
    )


def _doc_ids(*sizes: int) -> np.ndarray:  # packed documents' ids, one run of each size
    return np.repeat(np.arange(len(sizes)), sizes)


def _stripes(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:  # a mask_mod: causal, every third key hidden from odd heads
    return (kv_idx <= q_idx) & ((kv_idx % 3 != 1) | (h % 2 == 0))


def _tilt(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    """A FlexAttention score_mod: a distance bias, steeper in later heads (powers of 2: exact in any float dtype)."""
    return score - 0.0625 * (h + 1) * (q_idx - kv_idx)


def _decode_cases() -> tuple[Case, ...]:
    """Decoding: Tq = 1 and 4 new tokens over caches of 1, 97, 4,099 and 100,003 keys (causal, each
    sequence placed at its own length), GQA ratios 1, 4 and 8, windows, ragged lengths, and 16-bit
    caches under a float32 query. Small heads where the cache is long: a check, not a benchmark."""
    causal = (("causal", True),)

    def ragged(*n: int) -> tuple[tuple[str, Any], ...]:
        return (*causal, ("lengths", np.array(n)))

    return (
        Case("decode Tq=1 Tk=1", (2, 2, 1, 16), 2, 1, 16, causal),
        Case("decode Tq=4 Tk=1 (3 rows before the cache)", (2, 4, 4, 16), 1, 1, 16, ragged(1, 0)),
        Case("decode Tq=1 Tk=97 GQA 4 ragged", (3, 8, 1, 32), 2, 97, 32, ragged(97, 40, 0)),
        Case("decode Tq=4 Tk=97 GQA 8 ragged window 16", (3, 8, 4, 16), 1, 97, 16,
             (*ragged(97, 50, 2), ("window", (15, 0)))),
        Case("decode Tq=1 Tk=4099 GQA 8 window 256", (1, 8, 1, 16), 1, 4099, 16, (*causal, ("window", (255, 0)))),
        Case("decode Tq=4 Tk=4099 ragged", (2, 2, 4, 16), 2, 4099, 16, ragged(4099, 1000)),
        Case("decode Tq=1 Tk=100003 GQA 8", (1, 8, 1, 16), 1, 100003, 16, causal),
        Case("decode Tq=4 Tk=100003 GQA 4 ragged window 1024", (2, 4, 4, 8), 1, 100003, 8,
             (*ragged(100003, 70001), ("window", (1023, 0)))),
        Case("decode Tq=1 Tk=4099 GQA 4 bfloat16 cache", (1, 8, 1, 16), 2, 4099, 16, ragged(4099), "bfloat16"),
        Case("decode Tq=4 Tk=97 float16 cache ragged", (2, 4, 4, 16), 4, 97, 16, ragged(97, 30), "float16"),
        Case("decode Tq=1 Tk=4099 (window | sink tokens) ragged", (2, 8, 1, 16), 2, 4099, 16,
             (*ragged(4099, 3000), ("mask", masks.window(255) | masks.sink_tokens(4)))),
        Case("decode Tq=4 Tk=1097 ALiBi ragged", (2, 4, 4, 16), 2, 1097, 16,
             (*ragged(1097, 500), ("score_mod", masks.alibi(masks.alibi_slopes(4))))),
        Case("decode Tq=1 Tk=1097 learned sinks GQA 4", (2, 8, 1, 16), 2, 1097, 16,
             (*ragged(1097, 0), ("sink_logits", np.linspace(-1, 2, 8)))),
        Case("decode Tq=1 Tk=1097 softcap, window", (2, 4, 1, 16), 2, 1097, 16,
             (*ragged(1097, 800), ("window", (300, 0)), ("softcap", 2.0))),
        Case("decode Tq=2 Tk=1097 documents", (1, 2, 2, 16), 2, 1097, 16,
             (*causal, ("mask", masks.documents(_doc_ids(600, 1, 496))))),
    )


DECODE_CASES: tuple[Case, ...] = _decode_cases()
CASES: tuple[Case, ...] = (*_cases(), *DECODE_CASES)


def case(name: str) -> Case:
    """The case of that name."""
    for c in CASES:
        if c.name == name:
            return c
    raise LookupError(f"no agreement case {name!r}; the cases: {', '.join(c.name for c in CASES)}")


def data(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v of ``case`` in float64, the same on every machine (seeded by the case's name)."""
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    b, h, tq, d = case.q_shape
    return (rng.standard_normal((b, h, tq, d)), rng.standard_normal((b, case.kv_heads, case.tk, d)),
            rng.standard_normal((b, case.kv_heads, case.tk, case.dv)))


def allowed_of(
    tq: int, tk: int, *, causal: bool = False, window: Any = None, lengths: Any = None, mask: Any = None,
    batch_dims: int | None = None,
) -> np.ndarray:
    """attention()'s causal, window, lengths and mask as one boolean mask (True = may attend), by the rule of
    :mod:`attnlab.masks`: (Tq, Tk), or (*batch, Tq, Tk) broadcastable with ``lengths`` (ints over the first of
    ``batch_dims`` leading dims; by default as many as ``lengths`` has) or the mask's own batch. ``lengths``
    is masks.cache_lengths: each sequence's queries end at its length (query i of sequence b at lengths[b] − Tq + i)."""
    dense = np.asarray(mask) if hasattr(mask, "shape") else None  # an array: ANDed as it is, after the rest
    description = masks.from_keywords(None if dense is not None else mask, causal, window, lengths)
    if description is None:
        allowed = np.ones((tq, tk), bool)
    else:
        own, given = description.batch_shape(), () if lengths is None else np.shape(lengths)  # prefixes of the batch
        width = max(len(own), batch_dims if batch_dims is not None else len(given))
        lead = tuple(np.broadcast_shapes(*(tuple(x) + (1,) * (width - len(x)) for x in (own, given))))
        full = description.dense(tq, tk, lead)  # (B, H, Tq, Tk)
        allowed = full.reshape(*lead, tq, tk) if lead else full[0, 0]
    return allowed if dense is None else allowed & dense


def reference_of(q: Any, k: Any, v: Any, **options: Any) -> Any:
    """What attention() must return, by the float64 spec alone: ``attention()``'s options (NumPy values,
    :class:`~attnlab.backends.options.Options`) evaluated by the reference, key/value heads repeated.

    Grouped-query heads are repeated (query head h uses key/value head h // G). Returns ``out``, or
    a tuple ``(out, weights)``, ``(out, lse)`` or ``(out, weights, lse)`` as asked, in float64.
    """
    o = Options.of(options, caller="reference_of()")
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    if q.ndim >= 3 and k.ndim >= 3 and k.shape[-3] not in (1, q.shape[-3]):
        g = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    bias = None if o.bias is None else np.asarray(o.bias, np.float64)
    sinks = None if o.sink_logits is None else np.asarray(o.sink_logits, np.float64)
    visibility = {"mask": o.mask, "causal": o.causal, "window": o.window, "lengths": o.lengths, "score_mod": o.score_mod}
    res = reference.attention(q, k, v, bias=bias, scale=o.scale, return_weights=o.wants_weights, softcap=o.softcap,
                              sink_logits=sinks, **visibility)
    if o.weights_rows is not None:
        res = (res[0], res[1][..., np.asarray(o.weights_rows).reshape(-1), :])
    if not o.return_lse:
        return res
    p = validate.check_qkv(q, k, v, o.scale)
    lse = reference.lse_with_sinks(reference.masked_scores(q, k, p, bias=bias, softcap=o.softcap, **visibility), sinks, p)
    return (*res, lse) if o.wants_weights else (res, lse)


# ------------------------------------------------------------------ running a case


def libraries() -> list[str]:
    """The array libraries (and devices) this machine runs: "numpy", and "torch:<device>" for every device torch has."""
    try:
        import torch
    except ImportError:
        return ["numpy"]
    return ["numpy", "torch:cpu"] + (["torch:cuda"] if torch.cuda.is_available() else [])


def dtypes(library: str, case: Case | None = None) -> list[str]:
    """The dtypes an array library is checked in: float16/bfloat16 on tensors only (NumPy has no bfloat16).
    A case with a 16-bit cache: its float32 query, on tensors only."""
    if case is not None and case.kv_dtype is not None:
        return ["float32"] if library != "numpy" else []
    return ["float64", "float32"] + (list(LOW_PRECISION) if library != "numpy" else [])


def _torch(x: np.ndarray, library: str, dtype: str | None) -> Any:
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x)).to(library.split(":", 1)[1])
    return t if dtype is None else t.to(getattr(torch, dtype))


def _convert(x: Any, library: str, dtype: str) -> Any:
    """A case's array in the library and dtype of a run: floats rounded to ``dtype``, masks as booleans, lengths as given."""
    if not isinstance(x, np.ndarray) or np.issubdtype(x.dtype, np.integer):
        return x
    if library == "numpy":
        return x if x.dtype == bool else x.astype(dtype)
    return _torch(x, library, None if x.dtype == bool else dtype)


def to_float64(x: Any) -> Any:
    """The exact float64 NumPy value of an array or tensor (a backend's input or result); other values as they are."""
    if hasattr(x, "detach"):
        return x.detach().cpu().double().numpy() if x.is_floating_point() else x.detach().cpu().numpy()
    return x.astype(np.float64) if isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating) else x


def _exact(args: tuple, kwargs: dict[str, Any], **flags: Any) -> Any:
    """:func:`reference_of` on the exact values of inputs in any library and dtype."""
    return reference_of(*(to_float64(x) for x in args), **{n: to_float64(x) for n, x in kwargs.items()}, **flags)


def request_of(q: Any, k: Any, v: Any, **options: Any) -> Request:
    """The request that ``attention(q, k, v, **options)`` shows the backends (without the backend's name)."""
    return prepare(q, k, v, Options.of(options)).request


@dataclass(frozen=True, eq=False)
class Target:
    """One case in one library and dtype: the inputs as the backends get them, and what they must return."""

    case: Case
    library: str  # "numpy" or "torch:<device>"
    dtype: str
    args: tuple  # q, k, v
    kwargs: dict[str, Any]  # the case's options, converted
    expected: np.ndarray  # float64: reference_of on exactly these inputs
    tolerance: float
    note: str = ""  # how the tolerance was set, where it was measured

    def call_kwargs(self, backend: str) -> dict[str, Any]:
        """attention()'s keywords for ``backend``: the case's, with the case's tiles where it takes a block size."""
        kw = dict(self.kwargs)
        if self.case.tiles is not None and "block_size" in BACKENDS[backend].supports.features:
            kw["block_size"] = self.case.tiles
        return kw

    def request(self, backend: str, **extra: Any) -> Request:
        """The request that ``backend`` accepts or refuses: this target's call, with ``extra`` keywords."""
        return request_of(*self.args, **self.call_kwargs(backend), **extra)

    def refusals(self, backend: str, **extra: Any) -> list[str]:
        """Why ``backend`` refuses this target (empty: it serves it)."""
        return refusals(self.request(backend, **extra))[backend]

    def run(self, backend: str, **extra: Any) -> Any:
        """attention() by ``backend`` on these inputs, as it returns it (NoBackendError if it refuses)."""
        return attention(*self.args, backend=backend, **self.call_kwargs(backend), **extra)

    def mismatch(self, out: Any) -> str:
        """What differs between ``out`` and a result of this target's library, device, dtype and shape ("" if nothing)."""
        if isinstance(out, np.ndarray):
            got = ("numpy", "cpu", str(out.dtype), out.shape)
        elif hasattr(out, "device"):
            got = ("torch", out.device.type, str(out.dtype).removeprefix("torch."), tuple(out.shape))
        else:
            got = (type(out).__name__,)
        want = (self.library.split(":")[0], self.library.split(":")[-1].replace("numpy", "cpu"), self.dtype, self.expected.shape)
        return "" if got == want else f"returned {got}, expected {want} (library, device, dtype, shape)"

    def reference(self, **flags: Any) -> Any:
        """:func:`reference_of` on exactly these inputs (``flags``: return_weights, return_lse)."""
        return _exact(self.args, self.kwargs, **flags)

    def error(self, out: Any) -> float:
        """The largest absolute difference between ``out`` and the expected answer."""
        return float(np.abs(to_float64(out) - self.expected).max())


def target(case: Case, library: str, dtype: str) -> Target:
    """``case`` in ``library`` and ``dtype``, with its expected answer and tolerance."""
    q, k, v = data(case)
    kv = case.kv_dtype or dtype  # a 16-bit cache is rounded to its dtype; the reference takes the values as stored
    args = (_convert(q, library, dtype), _convert(k, library, kv), _convert(v, library, kv))
    kwargs = {n: _convert(x, library, dtype) for n, x in case.options}
    t = Target(case, library, dtype, args, kwargs, _exact(args, kwargs), TOLERANCE.get(dtype, np.inf))
    if dtype not in LOW_PRECISION:
        return t
    plain = t.error(t.run(PLAIN))
    return replace(t, tolerance=LOW_PRECISION_FACTOR * plain, note=f"plain torch's error {plain:.2e}")


# ------------------------------------------------------------------ attnlab check


@dataclass(frozen=True)
class CheckRow:
    backend: str
    case: str
    library: str  # "numpy" or "torch:<device>"
    dtype: str
    max_error: float | None
    tolerance: float | None
    passed: bool | None  # None: the backend refused the case
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check(backend: str, t: Target) -> CheckRow:
    """One backend on one target: its max error and whether it passes, or its reasons to refuse."""
    why = t.refusals(backend)
    if why:
        return CheckRow(backend, t.case.name, t.library, t.dtype, None, None, None, "; ".join(why))
    out = t.run(backend)
    err, wrong = t.error(out), t.mismatch(out)
    note = "; ".join(x for x in (wrong, t.note) if x)
    return CheckRow(backend, t.case.name, t.library, t.dtype, err, t.tolerance, err <= t.tolerance and not wrong, note)


def run_check(tick: Callable[[str], None] | None = None) -> list[CheckRow]:
    """Every (backend, case, library, dtype): its max error against float64 and whether it passes."""
    rows: list[CheckRow] = []
    for c in CASES:
        for library in libraries():
            for dtype in dtypes(library, c):
                t = target(c, library, dtype)
                for name in BACKENDS:
                    if tick:
                        tick(name)
                    rows.append(check(name, t))
    return rows

