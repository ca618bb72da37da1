"""``plan --verify``: the plan beside a run of the model here, through the one path the CLI and the benchmark use;
refused before allocating when the model would not fit."""

from __future__ import annotations

import json

import pytest

from attnlab.cli.app import main
from attnlab.planner import verify as V

from .conftest import Canned


@pytest.mark.needs("torch")
def test_verify_runs_the_model_and_puts_the_prediction_beside_it(small, monkeypatch):
    Canned(monkeypatch)  # the prediction from fixed timings; the run is real (a tiny model, a few tokens)
    v = V.verify(small, prompt_tokens=[8, 24], new_tokens=3, dtype="float32", repeats=2)
    assert [c.prompt_tokens for c in v.checks] == [8, 24] and v.repeats == 2
    for c, r in zip(v.checks, v.plan.rows):
        assert c.predicted_ttft_s[0] == r.ttft_s and c.predicted_tpot_s[0] == r.tpot_s
        assert c.predicted_ttft_s[1] <= r.ttft_s <= c.predicted_ttft_s[2]
        low, median, high = c.measured_ttft_s[1], c.measured_ttft_s[0], c.measured_ttft_s[2]
        assert 0 < low <= median <= high and c.ttft_ratio == r.ttft_s / median
        assert c.tpot_ratio == r.tpot_s / c.measured_tpot_s[0]
    json.dumps(v.to_dict())
    wide = V.Check(8, (1.0, None, None), (1.0, None, None), (1.0, 0.5, 2.0), (1.0, 1.0, 1.0))
    busy = V.Verification(v.plan, (wide,), 2)
    assert busy.notes[-1].startswith("the runs spread up to 150 %: the machine was busy")


@pytest.mark.needs("torch")
def test_the_model_built_has_the_plans_shapes(small):
    m = V.build(small, "float32", positions=64)
    c = m.config
    assert (c.num_layers, c.num_heads, c.heads_kv, c.head_dim, c.d_model, c.hidden_ff, c.vocab_size) == (2, 4, 2, 8, 32, 48, 50)
    from attnlab.planner import load_model
    from attnlab.planner.formulas import weight_params

    assert sum(p.numel() for p in m.parameters()) == sum(weight_params(small).values())
    mistral = V.transformer_config(load_model("mistral-7b-v0.1"), positions=64)
    assert mistral.sliding_window == 4096 and mistral.num_kv_heads == 8


@pytest.mark.needs("torch")
def test_a_model_too_large_for_this_machine_is_refused_before_allocating(small, monkeypatch):
    Canned(monkeypatch)
    monkeypatch.setattr("attnlab.bench.sweep.memory_available", lambda: 10**4)
    monkeypatch.setattr(V, "build", lambda *a: pytest.fail("allocated a model that does not fit"))
    with pytest.raises(ValueError, match=r"--verify would need [\d,]+ bytes for .* at 64 prompt tokens .* this machine "
                                         r"has 10,000 bytes available"):
        V.verify(small, prompt_tokens=[16, 64], new_tokens=3, dtype="float32", repeats=1)


def test_verify_and_calibrate_measure_this_machine_only(capsys):
    assert main(["plan", "--model", "gpt2", "--hardware", "h100", "--verify"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --verify measures this machine; it goes with --hardware this"), err
    assert main(["plan", "--model", "gpt2", "--verify", "--repeats", "0"]) == 2
    assert "--repeats must be" in capsys.readouterr().err


def test_help_says_what_verify_and_calibrate_do(capsys):
    assert main(["plan", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "random weights" in text and "predicted, measured and their ratio" in text
    assert "Measure this machine's rates at the model's shapes again" in text


@pytest.mark.needs("torch")
def test_cli_verify_prints_predicted_measured_and_ratio(small, monkeypatch, tmp_path, capsys):
    Canned(monkeypatch)
    config = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 50, "max_position_embeddings": 4096,
              "torch_dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["plan", "--model", str(tmp_path), "--prompt", "16", "--new-tokens", "3", "--verify",
                 "--repeats", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "TTFT predicted" in out and "TPOT measured" in out and "median (min–max) of 1 runs" in out
    assert "note:" not in out  # the canned profile: no flat decode, no busy machine
