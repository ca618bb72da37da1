"""This machine's measurements: measured at the model's shapes, cached, measured again when asked."""

from __future__ import annotations

import pytest

from attnlab.planner import machine, plan
from attnlab.planner.models import load_model


@pytest.fixture
def small(monkeypatch, tmp_path):
    """Tiny sizes, so that measuring takes a moment; a cache folder of the test's own, written to."""
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNLAB_CALIBRATE", "1")
    monkeypatch.setattr(machine, "ROWS", (4, 16))
    monkeypatch.setattr(machine, "PREFILL_N", (32, 64))
    monkeypatch.setattr(machine, "DECODE_T", (16, 64, 256))  # decode points: the steps beyond the first
    monkeypatch.setattr(machine, "ELEMENTWISE", (1024, 4096))
    monkeypatch.setattr(machine, "BANDWIDTH_BYTES", 1 << 20)
    monkeypatch.setattr(machine, "REPEATS", 1)
    monkeypatch.setattr(machine, "MIN_SAMPLE_S", 0.0)
    monkeypatch.setattr(machine, "_MEMO", {})
    return load_model({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 50,
                       "max_position_embeddings": 4096})


@pytest.mark.needs("torch")
def test_measures_once_caches_and_measures_again_when_asked(small, monkeypatch):
    hw = machine.this_machine(small, "float32")
    assert hw.measured and machine.cache_file().exists()
    assert [p[0] for p in hw.matmul.points] == [2.0 * r * (32 * 32 * 2 + 32 * 16 * 2 + 3 * 32 * 48) for r in (4, 16)]
    assert len(hw.attention.points) == 2 and len(hw.decode_attention.points) == 2 and hw.bandwidth.per_s > 0
    assert hw.layer_overhead_s >= 0 and hw.step_overhead_s >= 0 and hw.memory_bytes > 0
    monkeypatch.setattr(machine, "_MEMO", {})
    monkeypatch.setattr(machine, "measure", lambda a, dtype: pytest.fail("measured although it was cached"))
    assert machine.this_machine(small, "float32").matmul == hw.matmul  # read back from the file
    cached = machine._load()[machine.profile_key(small, "float32")]
    monkeypatch.setattr(machine, "measure", lambda a, dtype: dict(cached, layer_overhead_s=1.0))  # a new measurement
    assert machine.this_machine(small, "float32", refresh=True).layer_overhead_s == 1.0


@pytest.mark.needs("torch")
def test_plan_on_this_machine_says_measured(small):
    p = plan(small, "this", prompt_tokens=[64, 128], new_tokens=4, dtype="float32")
    assert not p.predicted and p.hardware.measured and not p.notes
    assert all(r.ttft_s > 0 and r.tpot_s > 0 for r in p.rows)
    with pytest.raises(ValueError, match="tensor parallelism needs a named accelerator"):
        plan(small, "this", prompt_tokens=64, gpus=2, dtype="float32")
