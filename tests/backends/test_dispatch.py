"""auto's rules: one precision per input dtype at every size, the fastest measured here, overflow refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab.backends import calibrate, dispatch
from attnlab.backends.api import attention
from attnlab.backends.dispatch import BACKENDS, NoBackendError, explain
from attnlab.backends.options import Options
from attnlab.backends.request import prepare

pytestmark = pytest.mark.needs("torch")
try:
    import torch
except ImportError:  # the needs mark skips every test here (on CI: fails them)
    torch = None

def request(*qkv, **kw):
    return prepare(*qkv, Options(**kw)).request


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_auto_computes_in_the_inputs_precision_at_every_size(kind, dtype, monkeypatch):
    monkeypatch.setenv(calibrate.ENV_SWITCH, "0")
    for n in (4, 16, 64, 256, 2048):
        x = np.ones((1, n, 64), dtype)
        if kind == "torch":
            x = torch.from_numpy(x)
        choice = explain(request(x, x, x))
        assert choice.precision == dtype
        assert BACKENDS[choice.backend].compute_dtype(dtype) == dtype, (n, choice)


def test_sixteen_bit_inputs_get_float32_accumulation():
    x = torch.ones(1, 256, 64, dtype=torch.float16)
    choice = explain(request(x, x, x))
    assert choice.precision == "float32"
    assert "torch" in choice.excluded  # plain torch computes in float16
    assert choice.backend in ("sdpa", "blockwise", "kernel")


BIG = np.full((1, 4, 8), 1e20, np.float32)  # finite, but q·k = 8e40 overflows float32


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_overflowing_scores_are_computed_right_or_refused_by_name(backend, kind):
    x = BIG if kind == "numpy" else torch.from_numpy(BIG)
    try:
        out = attention(x, x, x, backend=backend)
    except NoBackendError as e:
        reasons = BACKENDS[backend].refusals(request(x, x, x))
        assert reasons, "refused without a reason"
        if kind == "numpy" or backend != "numpy":
            assert "overflow" in str(e) and "2.83e+40" in str(e)
        return
    out = np.asarray(out, dtype=np.float64)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, 1e20, rtol=1e-6)  # every value row is 1e20: so is their average


def test_auto_takes_the_float64_reference_for_overflowing_float32_numpy_input():
    out = attention(BIG, BIG, BIG)
    np.testing.assert_allclose(out, 1e20, rtol=1e-6)


def test_float16_scores_beyond_its_range_are_refused_by_plain_torch_only():
    h = torch.full((1, 4, 64), 300.0, dtype=torch.float16)  # q·k/8 = 720,000 > 65,504
    with pytest.raises(NoBackendError, match="float16 without overflow"):
        attention(h, h, h, backend="torch")
    out = attention(h, h, h, backend="sdpa")  # computes in float32
    assert torch.equal(out, h)


# ---------------------------------------------------------------- calibration


def test_estimate_interpolates_in_log_log_space():
    pts = [[1e4, 1e-3], [1e6, 1e-1], [1e8, 1e1]]
    assert calibrate.estimate(pts, 1e5) == pytest.approx(1e-2)
    assert calibrate.estimate(pts, 1e7) == pytest.approx(1.0)
    assert calibrate.estimate(pts, 1e9) == pytest.approx(1e2)  # the last segment extended
    assert calibrate.estimate([[1e4, 2e-3]], 4e4) == pytest.approx(8e-3)  # one point: linear in scores


def test_beyond_the_measured_sizes_time_grows_at_least_with_the_scores():
    """A backend pruned after two overhead-bound sizes (a flat line) is not predicted to stay flat."""
    flat = [[2**16, 5.66e-3], [2**20, 13.76e-3]]
    assert calibrate.estimate(flat, 2**24) == pytest.approx(13.76e-3 * 16)
    assert calibrate.estimate(flat, 2**12) >= 5.66e-3 / 16


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(calibrate.ENV_CACHE, str(tmp_path))
    monkeypatch.setenv(calibrate.ENV_SWITCH, "1")
    monkeypatch.setattr(calibrate, "_TABLE", None)
    return tmp_path


def test_auto_follows_the_timings_measured_here(cache):
    """A table that says sdpa is fastest small and torch fastest large: auto switches where the table does."""
    x_small, x_large = (torch.ones(1, n, 64) for n in (512, 4096))
    prof = calibrate.profile(request(x_small, x_small, x_small))
    fake = {"sdpa": [[2**16, 1e-4], [2**26, 1.0]], "torch": [[2**16, 1e-3], [2**26, 0.1]],
            "blockwise": [[2**16, 1e-2], [2**26, 10.0]], "kernel": [[2**16, 1e-2], [2**26, 10.0]]}
    calibrate.cache_path().write_text(json.dumps({"machine": calibrate.machine_facts(), "profiles": {prof.key(): fake}}))
    small, large = explain(request(x_small, x_small, x_small)), explain(request(x_large, x_large, x_large))
    assert (small.backend, large.backend) == ("sdpa", "torch")
    assert small.measured and "measured on this machine" in small.reason


def test_a_table_from_another_machine_is_not_used(cache):
    x = torch.ones(1, 512, 64)
    prof = calibrate.profile(request(x, x, x))
    other = {**calibrate.machine_facts(), "cpu": "another CPU"}
    calibrate.cache_path().write_text(json.dumps({"machine": other, "profiles": {prof.key(): {"torch": [[1, 1e-9]]}}}))
    assert calibrate.Table().profiles == {}


def test_measuring_fills_the_cache_once(cache, monkeypatch):
    monkeypatch.setattr(calibrate, "SCORES", (2**12, 2**14))  # n = 64 and 128 for one head
    monkeypatch.setattr(calibrate, "MIN_SCORES", 1)
    monkeypatch.setattr(calibrate, "REPEATS", 1)
    calls = []
    real = dispatch._run_for_calibration
    monkeypatch.setattr(dispatch, "_run_for_calibration", lambda *a: calls.append(a[0]) or real(*a))
    x = torch.ones(1, 128, 64)
    first = explain(request(x, x, x))
    assert first.measured and calls and set(calls) <= {"torch", "sdpa", "blockwise", "kernel"}
    saved = json.loads(calibrate.cache_path().read_text())
    assert saved["machine"] == calibrate.machine_facts()
    assert set(saved["profiles"][calibrate.profile(request(x, x, x)).key()]) == set(first.seconds)
    calls.clear()
    monkeypatch.setattr(calibrate, "_TABLE", None)  # a new process: read back from the file
    assert explain(request(x, x, x)).backend == first.backend and not calls


def test_switched_off_auto_uses_the_priors(cache, monkeypatch):
    monkeypatch.setenv(calibrate.ENV_SWITCH, "0")
    x = torch.ones(1, 4096, 64)
    choice = explain(request(x, x, x))
    assert not choice.measured and "priors" in choice.reason
    assert not calibrate.cache_path().exists()


def test_masked_and_windowed_calls_use_the_priors():
    x = torch.ones(1, 4096, 64)
    assert calibrate.profile(request(x, x, x, window=8)) is None
    assert calibrate.profile(request(x, x, x, mask=torch.ones(4096, 4096, dtype=torch.bool))) is None
    assert calibrate.profile(request(x, x, x, causal=True)) is not None


@pytest.mark.parametrize("heads", [1, 3, 12, 64])
def test_each_head_count_is_measured_at_its_own_sizes(heads):
    """A call's own head count is measured, at lengths whose scores span calibrate.SCORES."""
    ns = calibrate.sizes(heads)
    assert len(ns) == len(calibrate.SCORES) and all(n % 16 == 0 for n in ns)
    for n, target in zip(ns, calibrate.SCORES):
        assert target / 1.5 <= heads * n * n <= target * 1.5
    x8, x12 = torch.ones(8, 1024, 64), torch.ones(12, 1024, 64)
    assert calibrate.profile(request(x8, x8, x8)).key() != calibrate.profile(request(x12, x12, x12)).key()
    many = torch.ones(4096, 16, 64)
    assert calibrate.profile(request(many, many, many)).heads == calibrate.MAX_HEADS


def test_decoding_calls_have_their_own_profile_measured_against_long_caches():
    """Tq = 1 (or a few rows) against a long cache, GQA and padded as generate calls it: its own table."""
    q, k = torch.ones(1, 32, 1, 128), torch.ones(1, 8, 8192, 128)
    prof = calibrate.profile(request(q, k, k, causal=True, lengths=torch.tensor([8000])))
    assert (prof.tq, prof.groups, prof.heads) == (1, 4, 32) and "decode-tq1-g4" in prof.key()
    assert calibrate.profile(request(torch.ones(1, 32, 3, 128), k, k, causal=True)).tq == 4
    ns = prof.sizes()
    assert len(ns) >= 2 and all(n in calibrate.DECODE_KEYS for n in ns)
    assert 8 * ns[-1] * 2 * 128 * 4 > 32 << 20  # the largest beyond a last-level cache of 32 MB
    q0, k0, _ = calibrate._inputs(prof, ns[0])
    assert tuple(q0.shape) == (1, 32, 1, 128) and tuple(k0.shape) == (1, 8, ns[0], 128)
    assert prof.scores(ns[0]) == 32 * ns[0]


def test_auto_takes_the_backend_measured_fastest_for_decoding(cache):
    q, k = torch.randn(1, 32, 1, 64), torch.randn(1, 8, 4096, 64)
    r = request(q, k, k, causal=True, lengths=torch.tensor([4000]))
    fake = {"sdpa": [[2**15, 1e-3], [2**17, 4e-3]], "torch": [[2**15, 2e-3], [2**17, 8e-3]],
            "blockwise": [[2**15, 5e-3], [2**17, 2e-2]], "kernel": [[2**15, 1e-4], [2**17, 4e-4]]}
    profiles = {calibrate.profile(r).key(): fake}
    calibrate.cache_path().write_text(json.dumps({"machine": calibrate.machine_facts(), "profiles": profiles}))
    choice = explain(r)
    assert choice.backend == "kernel" and choice.measured


def test_calls_with_learned_sinks_have_profiles_of_their_own():
    """gpt-oss's calls (sink logits) are measured, with sinks, in a table apart from the same call without."""
    q, k = torch.ones(1, 8, 1, 64), torch.ones(1, 2, 16384, 64)
    plain = calibrate.profile(request(q, k, k, causal=True))
    sinks = calibrate.profile(request(q, k, k, causal=True, sink_logits=torch.zeros(8)))
    assert sinks is not None and sinks.sinks and not plain.sinks
    assert sinks.key() == plain.key() + "/sinks"
    x = torch.ones(1, 8, 1024, 64)
    assert calibrate.profile(request(x, x, x, causal=True, sink_logits=torch.zeros(8))).key().endswith("/fwd/sinks")


def test_auto_takes_the_backend_measured_fastest_for_decoding_with_sinks(cache, monkeypatch):
    """A 16k decoding step with sinks (gpt-oss's full layers) is ranked by the table measured here, among
    the backends that serve sinks (not SDPA), not by the priors."""
    q, k = torch.randn(1, 8, 1, 64), torch.randn(1, 2, 16384, 64)
    r = request(q, k, k, causal=True, sink_logits=torch.zeros(8))
    fake = {"torch": [[2**13, 2e-3], [2**19, 8e-2]], "blockwise": [[2**13, 5e-3], [2**19, 2e-1]],
            "kernel": [[2**13, 1e-4], [2**19, 4e-3]]}
    profiles = {calibrate.profile(r).key(): fake}
    calibrate.cache_path().write_text(json.dumps({"machine": calibrate.machine_facts(), "profiles": profiles}))
    choice = explain(r)
    assert choice.backend == "kernel" and choice.measured and set(choice.seconds) == set(fake)
    fake["blockwise"], fake["kernel"] = fake["kernel"], fake["blockwise"]  # a table that says otherwise
    calibrate.cache_path().write_text(json.dumps({"machine": calibrate.machine_facts(), "profiles": profiles}))
    monkeypatch.setattr(calibrate, "_TABLE", None)
    assert explain(r).backend == "blockwise"


def test_a_profile_with_sinks_is_measured_with_sink_logits(cache, monkeypatch):
    monkeypatch.setattr(calibrate, "DECODE_KEYS", (64, 128))
    monkeypatch.setattr(calibrate, "MIN_SCORES", 1)
    monkeypatch.setattr(calibrate, "REPEATS", 1)
    seen = []
    real = dispatch._run_for_calibration
    monkeypatch.setattr(dispatch, "_run_for_calibration", lambda *a: seen.append((a[0], a[3])) or real(*a))
    q, k = torch.randn(1, 8, 1, 64), torch.randn(1, 2, 128, 64)
    choice = explain(request(q, k, k, causal=True, sink_logits=torch.zeros(8)))
    assert choice.measured and {n for n, _ in seen} == {"torch", "blockwise", "kernel"}
    assert all(s is not None and tuple(s.shape) == (8,) for _, s in seen)


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_switched_off_auto_decodes_a_long_cache_by_the_decode_pass(cache, monkeypatch, kv_dtype):
    """Without measurements a decoding step is ranked by the read it is (base.read_seconds), not by its scores:
    SDPA and the Python loop read grouped keys once per query head in float32, the decode pass once as stored."""
    from attnlab.backends import kernel

    if kernel.isa() is None:
        pytest.skip("the compiled kernel is not built here")
    monkeypatch.setenv(calibrate.ENV_SWITCH, "0")
    dtype = getattr(torch, kv_dtype)
    q, k = torch.randn(1, 32, 1, 128), torch.randn(1, 8, 8192, 128).to(dtype)
    choice = explain(request(q, k, k, causal=True, lengths=torch.tensor([8000])))
    assert choice.backend == "kernel" and not choice.measured
