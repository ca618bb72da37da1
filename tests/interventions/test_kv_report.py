"""kv_report / attnlab kv: the float32 dense row is float32's own error against a float64 forward of the whole
text, bytes are what each cache stores, evicting rows shrink to their budget, the Pareto front is marked, the
default settings say what they skip, and bad input is refused by name before any run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab.transformer import TransformerConfig

pytestmark = [pytest.mark.needs("torch"), pytest.mark.usefixtures("one_thread")]
H, HKV, D, L, P, N = 4, 2, 8, 2, 12, 5


def _model():
    import torch

    from attnlab.transformer import Transformer

    torch.manual_seed(0)
    c = TransformerConfig(vocab_size=31, d_model=H * D, num_layers=L, num_heads=H, num_kv_heads=HKV, positions="rotary",
                          norm="rmsnorm", ffn="gated", activation="silu", max_positions=64)
    return Transformer(c, backend="torch").eval()


TEXT = [int(i) for i in np.random.default_rng(0).integers(1, 31, P + N + 3)]


def test_the_dense_float32_row_is_float32s_own_error_and_bytes_are_what_is_stored():
    import copy

    import torch

    from attnlab.interventions.kv_report import kv_report

    m = _model()
    r = kv_report(m, TEXT, [{"cache_dtype": "bfloat16"}, {"cache": "h2o", "cache_budget": 8}], prompt_tokens=P,
                  scored_tokens=N)
    dense, bf16, h2o = r.rows
    assert [x.name for x in r.rows] == ["dense float32", "dense bfloat16", "h2o 8 float32"]
    per_token = 2 * L * HKV * D * 4  # keys and values of every layer, float32
    assert dense.cache_bytes == (P + N) * per_token and dense.bytes_per_token == per_token
    assert bf16.cache_bytes == (P + N) * per_token // 2 and h2o.cache_bytes == 8 * per_token
    x = torch.tensor([TEXT[:P + N]])
    with torch.no_grad():  # the scored positions are the outputs of tokens P .. P + N − 1, each from a full forward
        lp64 = torch.log_softmax(copy.deepcopy(m).double().run_with_hooks(x)[0, P:], -1).numpy()
        lp32 = torch.log_softmax(m.run_with_hooks(x)[0, P:].double(), -1).numpy()
    kl = (np.exp(lp64) * (lp64 - lp32)).sum(-1)
    np.testing.assert_allclose(dense.kl_mean, kl.mean(), rtol=0.05, atol=1e-12)
    assert dense.kl_mean < bf16.kl_mean < h2o.kl_mean and dense.top1 == 1.0
    assert len(h2o.layer_error) == L and max(dense.layer_error) < 1e-5 < min(h2o.layer_error)
    assert dense.pareto and h2o.pareto  # the least error; the fewest bytes
    out = json.loads(json.dumps(r.to_dict()))
    assert out["context"] == P + N and out["rows"][2]["setting"] == {"cache": "h2o", "cache_budget": 8}


def test_the_default_settings_say_what_they_skip():
    from attnlab.interventions.kv_report import default_settings

    settings, skipped = default_settings(_model().config, 64)
    evicting = [s for s in settings if "cache" in s]
    assert {s["cache_budget"] for s in evicting} == {16, 32} and len(evicting) == 8
    offered = [s["cache_dtype"] for s in settings if "cache" not in s]
    assert offered[0] == "bfloat16"
    for q in ("int8", "int4", "fp8"):  # each quantized dtype is run or said skipped, with the cache's reason
        assert (q in offered) != any(line.startswith(f"{q}: ") for line in skipped)


@pytest.mark.parametrize("kw, match", [
    ({"settings": [{"cache_dtpe": "bfloat16"}]}, "settings: unknown key 'cache_dtpe'.*a setting takes cache, cache_budget"),
    ({"settings": [{"cache": "lru", "cache_budget": 8}]}, "cache must be one of dense, window, sink, h2o"),
    ({"settings": [{"cache": "h2o", "cache_budget": 2}]}, "cache_budget=2 is below the 4 sink tokens"),
    ({"settings": [{"cache_dtype": "int3"}]}, "settings: dense int3: "),
    ({"prompt_tokens": 0}, "prompt_tokens must be an int >= 1, got 0"),
    ({"scored_tokens": 60}, "prompt_tokens \\+ scored_tokens = 72 passes the model's 64 positions"),
    ({"prompt_tokens": 30}, "text has 20 tokens; prompt_tokens \\+ scored_tokens = 35 needs at least that many"),
])
def test_bad_input_is_refused_by_name_before_any_run(kw, match, monkeypatch):
    from attnlab.interventions import kv_report as mod

    monkeypatch.setattr(mod, "_run", lambda *a: pytest.fail("a run started"))
    with pytest.raises(ValueError, match=match):
        mod.kv_report(_model(), TEXT, **{"settings": [{"cache_dtype": "bfloat16"}], "prompt_tokens": P,
                                         "scored_tokens": N, **kw})


def test_the_figure_marks_the_pareto_front():
    from attnlab.interventions.kv_report import KVRow, pareto
    from attnlab.viz.kvplot import kv_figure

    rows = pareto([KVRow("a", {}, 100.0, 1, 1e-12, 1e-12, 1.0, [0.0], 1.0),
                   KVRow("b", {"cache": "h2o"}, 50.0, 1, 1e-2, 1e-2, 0.9, [0.1], 1.0),
                   KVRow("c", {"cache": "knorm"}, 50.0, 1, 1e-1, 1e-1, 0.5, [0.1], 1.0)])
    assert [r.pareto for r in rows] == [True, True, False]
    fig = kv_figure({"model": "m", "prompt_tokens": 1, "scored_tokens": 1, "rows": [vars(r) for r in rows]})
    front = next(ln for ln in fig.axes[0].lines if ln.get_label() == "Pareto front")
    assert list(front.get_xdata()) == [50.0, 100.0]


def test_the_cli_writes_the_table_json_and_png(tmp_path, capsys):
    from attnlab.cli.app import main

    text = tmp_path / "t.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 10)
    assert main(["kv", "attnlab:decoder", "--text", str(text), "--prompt-tokens", "40", "--scored-tokens", "2",
                 "--png", str(tmp_path / "kv.png"), "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "attnlab:decoder" and out["rows"][0]["name"] == "dense float32"
    assert (tmp_path / "kv.png").stat().st_size > 0
    assert main(["kv", "attnlab:decoder", "--text", str(tmp_path / "none.txt")]) == 2
    assert "does not exist" in capsys.readouterr().err
