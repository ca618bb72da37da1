"""The planner's tests' shared fixtures: a tiny model measured at tiny sizes, and fixed timings in place of
the machine's (so that what depends on them is decided the same way on every machine, busy or not)."""

from __future__ import annotations

import pytest

from attnlab.planner import machine
from attnlab.planner.models import load_model

MS = 1e-3


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


class Canned:
    """Fixed timings in place of the machine's: every call timed takes ``call`` (samples: its list), and
    ``generate`` gives a step that grows by ``per_key`` seconds per key of the prompt (the decode runs), or
    the overhead runs' fixed (TTFT, TPOT) of a 1- and a 4-layer model. ``asked`` records each generate call."""

    def __init__(self, monkeypatch, call=(MS,), per_key=(1e-6,)):
        self.call, self.per_key, self.asked = list(call), list(per_key), []
        monkeypatch.setattr(machine, "_samples", lambda fn: list(self.call))
        monkeypatch.setattr(machine, "_generate", self.generate)

    def generate(self, model, prompt, repeats, new=machine.GEN_NEW):
        layers = model.config.num_layers
        self.asked.append((layers, prompt, repeats, new))
        if prompt == machine.OVERHEAD_PROMPT:  # the fixed costs: TTFT 3 ms + 1 ms a layer, TPOT 0.9 ms + 0.1 ms
            return [(3 + layers) * MS] * 3, [(0.9 + 0.1 * layers) * MS] * 3
        attempt = sum(1 for a in self.asked if a[1] == prompt) - 1
        grow = self.per_key[min(attempt, len(self.per_key) - 1)]
        tpot = 2 * MS + grow * prompt  # its runs within ±0.1 ms
        return [10 * MS] * 3, [tpot, tpot - MS / 10, tpot + MS / 10]
