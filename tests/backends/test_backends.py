"""Every backend against the float64 reference, on the agreement cases (docs/design.md: the reference is the spec).

The cases are :data:`attnlab.backends.agreement.CASES`, the ones ``attnlab check`` runs: one table.
A backend that refuses a case is skipped with its reasons, after checking that the call is refused
for them; every case must still be served by the reference and by at least one fast backend.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from attnlab.backends import agreement
from attnlab.backends.agreement import CASES, allowed_of, reference_of
from attnlab.backends.api import attention
from attnlab.backends.dispatch import BACKENDS, NoBackendError, choose, refusals
from attnlab.reference import attention as reference

try:
    import torch
except ImportError:  # the tests that need it are marked needs("torch") and skip (or fail on CI)
    torch = None

REFERENCE = "numpy"
YARDSTICKS = ("numpy", "torch")  # the spec, and the same math in torch: what the others are measured against
FAST = tuple(n for n in BACKENDS if n not in YARDSTICKS)  # here for speed or memory: sdpa, blockwise, kernel


def _kinds() -> list:
    kinds = [pytest.param("numpy"), pytest.param("torch:cpu", marks=pytest.mark.needs("torch"))]
    if torch is not None and torch.cuda.is_available():
        kinds.append(pytest.param("torch:cuda"))
    return kinds


KIND_DTYPES = [pytest.param(k.values[0], d, marks=k.marks, id=f"{k.values[0]}-{d}")
               for k in _kinds() for d in agreement.dtypes(k.values[0])]
FULL_PRECISION = [p for p in KIND_DTYPES if p.values[1] in agreement.TOLERANCE]
case_ids = pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])


@functools.cache
def target(case: agreement.Case, kind: str, dtype: str) -> agreement.Target:
    """A case's inputs and expected answer, made once per session (the n = 1025 one costs most); a case
    with a 16-bit cache runs with a float32 query on tensors only (agreement.dtypes), others skip."""
    if dtype not in agreement.dtypes(kind, case):
        pytest.skip(f"{case.name!r} is checked in {agreement.dtypes(kind, case) or 'no dtype'} on {kind}")
    return agreement.target(case, kind, dtype)


@functools.cache
def full_reference(case: agreement.Case, kind: str, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The expected output, every weight and the LSE of a target, made once per session."""
    return target(case, kind, dtype).reference(return_weights=True, return_lse=True)


def skip_if_refused(t: agreement.Target, backend: str, **extra) -> None:
    """Skip with the backend's reasons where it declares it refuses, once the call is seen to be refused."""
    why = t.refusals(backend, **extra)
    if not why:
        return
    with pytest.raises(NoBackendError) as e:
        t.run(backend, **extra)
    assert all(w in str(e.value) for w in why), (why, str(e.value))
    pytest.skip(f"{backend} refuses: {'; '.join(why)}")


@pytest.mark.parametrize("kind, dtype", KIND_DTYPES)
@pytest.mark.parametrize("backend", list(BACKENDS))
@case_ids
def test_every_backend_agrees_with_the_float64_reference(case, backend, kind, dtype):
    t = target(case, kind, dtype)
    skip_if_refused(t, backend)
    out = t.run(backend)
    assert not t.mismatch(out), t.mismatch(out)
    err = t.error(out)
    assert err <= t.tolerance, f"max error {err:.2e} > {t.tolerance:.2e} {t.note}"


@case_ids
def test_every_case_is_served_by_the_reference_and_a_fast_backend(case):
    if case.kv_dtype is None:  # a 16-bit cache is a tensor's: the reference gets its exact values (Target.reference)
        assert not target(case, "numpy", "float64").refusals(REFERENCE)
    for kind in agreement.libraries():
        for dtype in agreement.dtypes(kind, case):
            t = target(case, kind, dtype)
            assert any(not t.refusals(n) for n in FAST), (kind, dtype, {n: t.refusals(n) for n in FAST})


LSE_BACKENDS = [n for n, b in BACKENDS.items() if {"lse", "weights_rows"} <= b.supports.features]


@pytest.mark.parametrize("kind, dtype", FULL_PRECISION)
@pytest.mark.parametrize("backend", LSE_BACKENDS)
@case_ids
def test_rows_of_weights_and_the_lse_agree_with_the_reference(case, backend, kind, dtype):
    t = target(case, kind, dtype)
    tq = case.q_shape[2]
    rows = sorted({0, 3, 5, tq // 2, tq - 1} & set(range(tq)))  # 5: the row that "fully masked row" hides
    extra = dict(weights_rows=rows, return_lse=True)
    skip_if_refused(t, backend, **extra)
    out, w, lse = (agreement.to_float64(x) for x in t.run(backend, **extra))
    exp_out, exp_w, exp_lse = full_reference(case, kind, dtype)
    tol = t.tolerance
    np.testing.assert_allclose(out, exp_out, rtol=0, atol=tol)
    np.testing.assert_allclose(w, exp_w[..., rows, :], rtol=0, atol=tol)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(exp_lse))  # −inf: nothing to attend to
    finite = np.isfinite(exp_lse)
    np.testing.assert_allclose(lse[finite], exp_lse[finite], rtol=tol, atol=tol)


@pytest.mark.parametrize("kind, dtype", KIND_DTYPES)
@case_ids
def test_auto_serves_every_case_and_agrees(case, kind, dtype):
    t = target(case, kind, dtype)
    out = attention(*t.args, **t.kwargs)
    assert not t.mismatch(out), t.mismatch(out)
    # 16-bit inputs: auto computes in float32, and is held to the bound every backend is (twice plain torch)
    assert t.error(out) <= t.tolerance


def test_auto_gives_every_weight_only_through_a_backend_that_materialises_them():
    t = target(agreement.case("grouped-query causal"), "numpy", "float64")
    out, w = attention(*t.args, return_weights=True, **t.kwargs)
    exp_out, exp_w = t.reference(return_weights=True)
    np.testing.assert_allclose(out, exp_out, atol=1e-10)
    np.testing.assert_allclose(w, exp_w, atol=1e-12)
    assert choose(t.request("numpy", return_weights=True)).name in YARDSTICKS  # the fast ones never hold (Tq, Tk)


def test_check_rows_give_the_error_or_the_reasons():
    t = target(agreement.case("mask and bias"), "numpy", "float64")
    served, refused = agreement.check("blockwise", t), agreement.check("kernel", t)
    assert served.passed and served.max_error <= served.tolerance == 1e-10
    assert refused.passed is None and refused.max_error is None
    assert "float64" in refused.note and "mask" in refused.note and "bias" in refused.note
    assert set(served.to_dict()) == {"backend", "case", "library", "dtype", "max_error", "tolerance", "passed", "note"}


# ------------------------------------------------------------------ the expected answer itself


def test_reference_of_spells_out_each_option_as_a_mask_written_by_hand():
    """q (1, 2, 3, 2) over one key/value head (Tk = 4): both query heads see it. Causal with Tq < Tk is
    bottom-right (query i sits at key i + 1), the window keeps keys pos − 1 .. pos; with length 3 the
    sequence's own end places query i at 3 − 3 + i = i, and key 3 is padding."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 2, 3, 2)), rng.standard_normal((1, 1, 4, 2)), rng.standard_normal((1, 1, 4, 5))
    bottom_right = np.array([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]], bool)
    by_length = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0]], bool)
    np.testing.assert_array_equal(allowed_of(3, 4, causal=True, window=1), bottom_right)
    np.testing.assert_array_equal(allowed_of(3, 4, causal=True, window=1, lengths=[3], batch_dims=2), by_length[None, None])
    for options, by_hand in (({}, bottom_right), ({"lengths": np.array([3])}, by_length)):
        got = reference_of(q, k, v, causal=True, window=1, **options)
        for h in range(2):
            np.testing.assert_allclose(got[0, h], reference.attention(q[0, h], k[0, 0], v[0, 0], mask=by_hand), atol=1e-15)
    out, lse = reference_of(q, k, v, mask=np.ones((3, 4), bool), bias=np.zeros((3, 4)), return_lse=True)
    s = np.einsum("hqd,kd->hqk", q[0], k[0, 0]) / np.sqrt(2)
    np.testing.assert_allclose(lse[0], np.log(np.exp(s).sum(-1)), atol=1e-12)
    np.testing.assert_allclose(out[0], reference.attention(q[0], k[0], v[0]), atol=1e-15)


# ------------------------------------------------------------------ refusals and errors


@pytest.mark.needs("torch")
def test_named_backend_never_falls_back_and_lists_every_reason():
    t = torch.zeros(1, 4, 8)
    with pytest.raises(NoBackendError) as e:
        attention(t, t, t, backend="sdpa", return_weights=True)
    msg = str(e.value)
    assert msg.startswith("backend 'sdpa' cannot serve this call: ") and "weights" in msg.splitlines()[0]
    why = refusals(agreement.request_of(t, t, t, return_weights=True))
    for name in BACKENDS:  # every backend, with its reasons or that it could serve it
        assert f"\n  {name}: {'; '.join(why[name]) or 'can serve it'}" in msg
    assert "torch" in "; ".join(why["numpy"])  # the reference takes NumPy arrays only


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"backend": "flash"}, ValueError, "backend must be 'auto' or one of numpy, torch, sdpa, blockwise, kernel, got 'flash'"),
        ({"window": -1}, ValueError, "window must be an int >= 0"),
        ({"lengths": [[3]]}, ValueError, "lengths must have the shape of the leading batch dims (2, 4)"),
        ({"lengths": [3, 99]}, ValueError, "lengths must lie in 0..Tk=6"),
        ({"weights_rows": [5]}, ValueError, "weights_rows must be query indices in 0..Tq-1=4, got [5]"),
        ({"weights_rows": [1], "return_weights": True}, ValueError, "not both"),
        ({"block_size": 0, "backend": "blockwise"}, ValueError, "block_size must be an int >= 1"),
        ({"block_size": 8, "backend": "sdpa"}, NoBackendError, "block size"),
        ({"causal": "yes"}, TypeError, "causal must be True or False, got 'yes'"),
    ],
)
def test_errors_name_the_argument(kwargs, error, text):
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 4, 5, 8)), rng.standard_normal((2, 4, 6, 8))
    with pytest.raises(error) as e:
        attention(q, k, k, **kwargs)
    assert text in str(e.value)


def test_grouped_query_heads_must_divide():
    q, k = np.zeros((1, 6, 3, 4)), np.zeros((1, 4, 3, 4))
    with pytest.raises(ValueError, match=r"key/value heads to divide the query heads \(dim -3\): q has 6"):
        attention(q, k, k)


@pytest.mark.needs("torch")
def test_mask_of_another_kind_is_refused():
    t = torch.zeros(1, 4, 8)
    with pytest.raises(TypeError, match="mask must be of the same array library as q"):
        attention(t, t, t, mask=np.ones((4, 4), bool))


@pytest.mark.needs("torch")
@pytest.mark.parametrize("shape", [(9, 8), (3, 9, 8), (2, 3, 4, 9, 8)], ids=["2-D", "3-D", "5-D"])
@pytest.mark.parametrize("backend", ["torch", "sdpa", "blockwise"])
def test_any_number_of_leading_dims(backend, shape):
    """SDPA's fused kernels want 4-D input; the backends take (..., T, D) with any leading dims."""
    x = np.random.default_rng(1).standard_normal(shape)
    mask = np.random.default_rng(2).random(shape[:-1] + (9,)) > 0.3  # per-batch masks, rows may be empty
    out = attention(torch.from_numpy(x), torch.from_numpy(x), torch.from_numpy(x), mask=torch.from_numpy(mask), backend=backend)
    assert tuple(out.shape) == shape
    np.testing.assert_allclose(out.numpy(), reference.attention(x, x, x, mask=mask), atol=1e-10)
