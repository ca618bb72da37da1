"""This machine's measurements: measured at the model's shapes, cached, measured again when asked; each with
its spread; a decode line that must grow; a busy machine's profile said to be so and not cached.

Every test but the last feeds fixed sample timings (``machine._samples`` and ``machine._generate`` replaced),
so what they check is decided the same way on every machine, busy or not.
"""

from __future__ import annotations

import pytest

from attnlab.planner import machine, noise, plan

from .conftest import MS, Canned

@pytest.mark.needs("torch")
def test_measures_once_caches_and_measures_again_when_asked(small, monkeypatch):
    Canned(monkeypatch)
    hw = machine.this_machine(small, "float32")
    assert hw.measured and machine.cache_file().exists() and not hw.notes
    layer_flops = 32 * 32 * 2 + 32 * 16 * 2 + 3 * 32 * 48
    # four distinct matrix shapes in this model's layer, seven matrices, 1 ms each: 7 ms per row count
    assert hw.matmul.points == tuple((2.0 * r * layer_flops, pytest.approx(7 * MS)) for r in (4, 16))
    assert len(hw.attention.points) == 2 and hw.attention.points[0][1] == MS
    # the decode read grows 1 µs per key: 2 k/v heads × 8 dims × 4 bytes × 2 = 128 bytes a key
    assert [p[0] for p in hw.decode_attention.points] == [128.0 * (64 - 16), 128.0 * (256 - 16)]
    assert [p[1] for p in hw.decode_attention.points] == pytest.approx([48e-6, 240e-6])
    # the fixed costs: 1 ms of TTFT and 0.1 ms of TPOT per layer, the rest per step
    assert (hw.layer_overhead_s, hw.step_overhead_s) == pytest.approx((0.1 * MS, 0.9 * MS))
    assert hw.prefill_overhead_s == pytest.approx((MS, 3 * MS))
    monkeypatch.setattr(machine, "_MEMO", {})
    monkeypatch.setattr(machine, "measure", lambda a, dtype: pytest.fail("measured although it was cached"))
    assert machine.this_machine(small, "float32").matmul == hw.matmul  # read back from the file
    cached = machine._load()[machine.profile_key(small, "float32")]
    monkeypatch.setattr(machine, "measure", lambda a, dtype: dict(cached, layer_overhead_s=[1.0, 1.0, 1.0]))
    assert machine.this_machine(small, "float32", refresh=True).layer_overhead_s == 1.0


@pytest.mark.needs("torch")
def test_a_larger_model_that_runs_faster_costs_no_negative_layer(small, monkeypatch):
    c = Canned(monkeypatch)
    c.generate = lambda model, prompt, repeats, new=17: ([4 * MS] * 3, [(1.2 - 0.05 * model.config.num_layers) * MS] * 3)
    monkeypatch.setattr(machine, "_generate", c.generate)
    out = machine._overheads(small, None)
    assert out["layer_overhead_s"] == [0.0, 0.0, 0.0]  # 4 layers 0.15 ms faster than 1: noise, not a layer's cost
    assert out["step_overhead_s"] == pytest.approx([1.15 * MS] * 3)  # the step holds the whole


@pytest.mark.needs("torch")
def test_a_flat_decode_is_measured_again_longer(small, monkeypatch):
    """The first measurement's steps do not grow (Llama-3.1-8B's shape gave 1.8416807, 1.8416823 and
    1.8416886 ms): the planner measures again over twice the runs and tokens, and keeps the line that grows."""
    c = Canned(monkeypatch, per_key=(0.0, 1e-6))
    hw = machine.this_machine(small, "float32")
    decode = [a for a in c.asked if a[1] != machine.OVERHEAD_PROMPT]
    assert [(a[2], a[3]) for a in decode] == [(1, 17)] * 3 + [(2, 33)] * 3
    assert [p[1] for p in hw.decode_attention.points] == pytest.approx([48e-6, 240e-6]) and not hw.notes


@pytest.mark.needs("torch")
def test_a_decode_that_never_grows_is_said_and_costed_at_the_read_rate(small, monkeypatch):
    Canned(monkeypatch, per_key=(0.0,))
    p = plan(small, "this", prompt_tokens=[64, 256], new_tokens=4, dtype="float32")
    hw = p.hardware
    assert hw.decode_attention == hw.bandwidth and hw.decode_attention.per_s > 0
    assert any("did not grow with the cache beyond their noise in 2 measurements" in n for n in p.notes)
    assert p.rows[1].tpot_s > p.rows[0].tpot_s  # more cache still costs more: at the read rate


def test_decode_line_is_refused_when_flat_negative_or_within_the_noise():
    work = [0.0, 1e6, 4e6]
    assert noise.decode_line(work, [[1.0, 0.9, 1.1], [1.1, 1.0, 1.2], [1.4, 1.3, 1.5]]) == pytest.approx((1e-7, 0.0))
    assert noise.decode_line(work, [[1.0, 0.9, 1.1]] * 3) is None  # flat
    assert noise.decode_line(work, [[1.0, 0.9, 1.1], [0.99, 0.9, 1.1], [0.98, 0.9, 1.1]]) is None  # falling
    assert noise.decode_line(work, [[1.0, 0.5, 1.5], [1.01, 0.5, 1.5], [1.02, 0.5, 1.5]]) is None  # within noise


@pytest.mark.needs("torch")
def test_a_busy_profile_is_measured_again_then_said_and_not_cached(small, monkeypatch):
    Canned(monkeypatch, call=(MS, MS, 3 * MS))  # a call's samples spread 200 %: another program ran
    measured = []
    once = machine._measure_once
    monkeypatch.setattr(machine, "_measure_once", lambda a, d: measured.append(1) or once(a, d))
    p = plan(small, "this", prompt_tokens=64, new_tokens=4, dtype="float32")
    assert len(measured) == 2 and p.hardware.details["busy"] and p.hardware.details["spread"] == pytest.approx(2.0)
    assert any(n.startswith("measured on a busy machine (spread up to 200 %") for n in p.notes)
    assert not machine.cache_file().exists()  # used for this process, never kept
    assert noise.summary([3.0, 1.0, 2.0]) == [2.0, 1.0, 3.0] and noise.spread([2.0, 1.0, 3.0]) == 1.0


@pytest.mark.needs("torch")
def test_plan_on_this_machine_says_measured(small, monkeypatch):
    """The real measurement, at tiny sizes: every figure is a time, whatever the machine's load."""
    monkeypatch.setattr(machine, "DECODE_ATTEMPTS", 1)  # one sample a point: the line may well not grow
    p = plan(small, "this", prompt_tokens=[64, 128], new_tokens=4, dtype="float32")
    assert not p.predicted and p.hardware.measured
    assert all(r.ttft_s > 0 and r.tpot_s > 0 for r in p.rows)
    with pytest.raises(ValueError, match="tensor parallelism needs a named accelerator"):
        plan(small, "this", prompt_tokens=64, gpus=2, dtype="float32")
