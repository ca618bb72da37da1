"""attnlab.bench and the `bench`/`check` verbs: structure, budgets, files. No timing is asserted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab.bench import harness as bench
from attnlab.cli.app import main

pytest.importorskip("torch")


def test_measure_reports_time_memory_error_and_flops():
    m = bench.measure("blockwise-torch", 256, d=16, heads=2, causal=True, repeats=2)
    assert m.time_s > 0 and len(m.times_s) == 2 and m.time_s == float(np.median(m.times_s))
    assert m.max_error < 1e-5  # float32 against float64
    assert m.gflops == pytest.approx(bench.flops(256, 16, 2, True) / m.time_s / 1e9)
    assert m.peak_bytes is None or m.peak_bytes >= 0
    with pytest.raises(ValueError, match="method must be one of naive, numpy"):
        bench.measure("flash", 256)


def test_probe_sees_a_buffer_of_known_size():
    _, _, extra = bench._probe(lambda: np.ones(8 * 2**20 // 8).sum())  # 8 MB, touched
    if extra is None:
        pytest.skip("no /proc/self/clear_refs here")
    assert 7 * 2**20 <= extra <= 32 * 2**20


def test_sweep_skips_over_budget_and_the_seed_code_under_causal():
    cfg = bench.BenchConfig(sizes=(1024,), heads=(1,), methods=("naive", "numpy", "blockwise-torch", "auto", "gemm", "sdpa"),
                            repeats=1, memory_mb=4)
    res = bench.run(cfg)
    by = {(m.method, m.n, m.causal): m for m in res.measurements}
    assert len(res.measurements) == 2 * 6
    assert by["numpy", 1024, False].skipped == "needs ~32 MB > budget 4 MB"  # 1024² float64 buffers
    assert by["blockwise-torch", 1024, True].time_s is not None
    assert by["naive", 1024, True].skipped == "the seed's code has no mask"
    auto = by["auto", 1024, False]
    assert auto.time_s is not None and auto.backend in ("sdpa", "blockwise", "torch")
    assert by["gemm", 1024, False].pct_of_gemm == pytest.approx(100.0)
    d = res.to_dict()
    assert d["machine"]["cores"] >= 1 and set(d["targets"]) == {"blockwise_vs_sdpa", "causal_saving", "memory_65536", "auto_vs_fastest"}


def test_time_budget_skips_larger_sizes():
    cfg = bench.BenchConfig(sizes=(64, 4096), heads=(1,), causal=(False,), methods=("numpy",), repeats=1, max_seconds=1e-6)
    big = bench.run(cfg).measurements[-1]
    assert big.n == 4096 and big.skipped.startswith("would take ~")


def test_targets_are_ratios_of_the_same_run():
    M = bench.Measurement
    ms = [M("sdpa", 4096, 64, 1, False, 1.0), M("blockwise-torch", 4096, 64, 1, False, 1.2),
          M("sdpa", 8192, 64, 1, True, 2.0), M("blockwise-torch", 8192, 64, 1, False, 4.0),
          M("blockwise-torch", 8192, 64, 1, True, 2.4), M("auto", 4096, 64, 1, False, 1.05, backend="sdpa"),
          M("blockwise-torch", 65536, 64, 1, True, 9.0, peak_bytes=80 * 2**20)]
    t = bench.targets(ms)
    assert t["blockwise_vs_sdpa"] == [{"n": 4096, "heads": 1, "ratio": 1.2, "met": True}]
    (c,) = t["causal_saving"]
    assert c["saving"] == pytest.approx(0.4) and not c["met"] and c["vs_sdpa_causal"] == pytest.approx(1.2)
    assert t["memory_65536"] == [{"causal": True, "peak_mb": 80.0, "met": False}]
    assert t["auto_vs_fastest"][0]["ratio"] == pytest.approx(1.05)


def test_bench_config_rejects_bad_values():
    with pytest.raises(ValueError, match="methods must be among"):
        bench.BenchConfig(methods=("fast",))
    with pytest.raises(ValueError, match="sizes must be ints >= 1"):
        bench.BenchConfig(sizes=(0,))


def test_cli_bench_writes_json_and_png(tmp_path, capsys):
    js, png = tmp_path / "b.json", tmp_path / "b.png"
    code = main(["bench", "--sizes", "64", "--heads", "2", "--causal", "yes", "--methods", "sdpa,blockwise-torch,gemm",
                 "--repeats", "1", "--json", str(js), "--png", str(png)])
    assert code == 0
    data = json.loads(js.read_text())
    assert [m["method"] for m in data["measurements"]] == ["sdpa", "blockwise-torch", "gemm"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "n = 64, 2 heads, d = 64, causal" in capsys.readouterr().out


def test_cli_bench_errors_are_one_line(capsys):
    assert main(["bench", "--causal", "maybe"]) == 2
    assert "error: --causal must be both, yes or no, got 'maybe'" in capsys.readouterr().err
    assert main(["bench", "--sizes", "1k"]) == 2
    assert "--sizes takes comma-separated integers" in capsys.readouterr().err


def test_cli_check_passes_and_reports_refusals(capsys):
    assert main(["check", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is True
    rows = data["rows"]
    assert {r["backend"] for r in rows} == {"numpy", "torch", "sdpa", "blockwise"}
    assert {r["dtype"] for r in rows} == {"float64", "float32", "float16", "bfloat16"}
    refused = [r for r in rows if r["passed"] is None]
    assert refused and all(r["note"] == "takes NumPy arrays, got torch tensors" for r in refused)
    assert all(r["max_error"] <= r["tolerance"] for r in rows if r["passed"])
