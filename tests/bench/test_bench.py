"""attnlab.bench and the `bench`/`check` commands, against facts known without the code: operation
counts by hand, allocations of known size, permutations, the backend auto's call really ran, the
documented JSON. No timing is asserted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab import bench
from attnlab.bench import methods, timing
from attnlab.cli.app import main

pytestmark = pytest.mark.needs("torch")

MEASUREMENT_KEYS = {"method", "n", "d", "heads", "causal", "time_s", "times_s", "peak_bytes", "max_error", "gflops",
                    "pct_of_gemm", "backend", "reason", "skipped"}


def test_flops_are_the_two_gemms_counted_by_hand():
    # n = 3, d = 2, one head: q·kᵀ is 3 × 3 dot products of length 2 (18 multiply-adds), p·v the same: 36 · 2 flops
    assert bench.flops(3, 2, 1, False) == 72
    assert bench.flops(3, 2, 1, True) == 36  # causal: half of the scores
    assert bench.flops(3, 2, 12, False) == 12 * 72


def test_measure_reports_the_median_and_gflops_from_the_hand_count():
    m = bench.measure("kernel", 256, d=16, heads=2, causal=True, repeats=3)
    assert len(m.times_s) == 3 and m.time_s == sorted(m.times_s)[1]
    assert m.gflops == pytest.approx(2 * 256 * 256 * 16 * 2 / m.time_s / 1e9)  # 4·n²·d per head, half of it causal
    assert m.max_error < 1e-5  # float32 against float64
    with pytest.raises(ValueError, match="method must be one of naive, numpy"):
        bench.measure("flash", 256)


def test_rss_probe_sees_a_buffer_of_known_size():
    _, _, extra = timing.probe(lambda: np.ones(8 * 2**20 // 8).sum())  # 8 MiB, touched
    if extra is None:
        pytest.skip("no /proc/self/clear_refs here")
    assert 7.5 * 2**20 <= extra <= 14 * 2**20  # the buffer, and at most a few MiB of the allocator's own


def test_traced_probe_sees_a_buffer_to_the_byte():
    _, _, extra = timing.probe_traced(lambda: np.ones(1_000_000).sum())  # 8 000 000 bytes of float64
    assert 8_000_000 <= extra < 8_000_000 + 4096


def test_every_round_runs_every_call_once_in_a_new_order():
    orders = timing.round_orders(6, 5)
    assert all(sorted(o) == list(range(6)) for o in orders)
    assert len({tuple(o) for o in orders}) > 1  # shuffled, not one fixed order
    ran: list[str] = []
    keys = ["a", "b", "c", "d"]
    times, peaks, errors = timing.interleaved(
        {k: (lambda: None) for k in keys}, lambda key, out: len(key), repeats=4, tick=ran.append)
    assert all(len(times[k]) == 4 for k in keys) and errors == {k: 1 for k in keys}
    rounds = [ran[i:i + 4] for i in range(0, 16, 4)]
    assert all(sorted(r) == keys for r in rounds)
    assert rounds == [[keys[i] for i in o] for o in timing.round_orders(4, 4)]


def test_short_calls_are_timed_several_in_a_row():
    assert timing.calls_per_sample(1.0) == 1  # longer than MIN_TIMING_S: one call per sample
    assert timing.calls_per_sample(0.01) == 5  # 50 ms / 10 ms
    assert timing.calls_per_sample(1e-9) == timing.MAX_NUMBER


def test_the_n_by_n_path_holds_an_n_by_n_matrix_and_sdpa_does_not():
    # n = 2048: the n x n matrix (32 MiB) stands well clear of what the RSS probe sees of a fused call
    # (a few MiB of the allocator's and the thread pool's own, which vary from run to run).
    ms = {m.method: m for m in bench.run(bench.BenchConfig(sizes=(2048,), heads=(1,), causal=(False,),
                                                           methods=("numpy", "sdpa"), repeats=1)).measurements}
    if ms["numpy"].peak_bytes is None:
        pytest.skip("no /proc/self/clear_refs here")
    scores = 2048 * 2048 * 8  # one 2048² float64 matrix: 32 MiB
    assert ms["numpy"].peak_bytes >= scores > 2 * ms["sdpa"].peak_bytes


def test_sweep_skips_over_budget_and_the_lessons_code_under_causal():
    cfg = bench.BenchConfig(sizes=(1024,), heads=(1,), methods=("naive", "numpy", "kernel", "auto", "gemm", "sdpa"),
                            repeats=1, memory_mb=4)
    res = bench.run(cfg)
    by = {(m.method, m.n, m.causal): m for m in res.measurements}
    assert len(res.measurements) == 2 * 6
    assert by["numpy", 1024, False].skipped == "needs ~32 MB > budget 4 MB"  # four 1024² float64 buffers
    assert by["naive", 1024, True].skipped == "the naive listing has no mask"
    assert by["gemm", 1024, False].pct_of_gemm == pytest.approx(100.0)
    assert set(res.to_dict()) == {"config", "machine", "measurements"}


def test_auto_says_which_backend_ran_and_its_output_is_that_backends():
    res = bench.run(bench.BenchConfig(sizes=(512,), heads=(2,), methods=("torch", "sdpa", "blockwise-torch", "kernel", "auto"),
                                      repeats=1))
    for causal in (False, True):
        by = {m.method: m for m in res.measurements if m.causal == causal}
        auto = by["auto"]
        assert auto.backend in ("torch", "sdpa", "blockwise", "kernel") and auto.backend in auto.reason
        # the same computation on the same inputs: bit for bit the chosen backend's error, no other's
        chosen = by[methods.method_of(auto.backend)]
        assert auto.max_error == chosen.max_error
        assert all(m.backend is None and m.reason is None for m in by.values() if m.method != "auto")


def test_time_budget_skips_larger_sizes():
    cfg = bench.BenchConfig(sizes=(64, 4096), heads=(1,), causal=(False,), methods=("numpy",), repeats=1, max_seconds=1e-6)
    big = bench.run(cfg).measurements[-1]
    assert big.n == 4096 and big.skipped.startswith("would take ~")


def test_bench_config_rejects_bad_values():
    with pytest.raises(ValueError, match="methods must be among"):
        bench.BenchConfig(methods=("fast",))
    with pytest.raises(ValueError, match="sizes must be ints >= 1"):
        bench.BenchConfig(sizes=(0,))
    with pytest.raises(ValueError, match="causal must be"):
        bench.BenchConfig(causal=())


def test_cli_bench_json_to_stdout_is_the_documented_json_and_nothing_else(capsys):
    assert main(["bench", "--sizes", "64", "--heads", "1", "--causal", "no", "--repeats", "1", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)  # fails on any table printed beside it
    assert set(data) == {"config", "machine", "measurements"}
    assert {m["method"] for m in data["measurements"]} == set(bench.METHODS)  # the CLI's default is the library's list
    assert all(set(m) == MEASUREMENT_KEYS for m in data["measurements"])
    assert {"cpu", "cores", "kernel", "load_average", "load_average_end"} <= set(data["machine"])
    (auto,) = [m for m in data["measurements"] if m["method"] == "auto"]
    assert auto["backend"] and auto["reason"]


def test_cli_bench_writes_json_and_png_and_prints_tables(tmp_path, capsys):
    js, png = tmp_path / "b.json", tmp_path / "b.png"
    code = main(["bench", "--sizes", "64", "--heads", "2", "--causal", "yes", "--methods", "sdpa,kernel,auto,gemm",
                 "--repeats", "1", "--json", str(js), "--png", str(png)])
    assert code == 0
    data = json.loads(js.read_text())
    assert [m["method"] for m in data["measurements"]] == ["sdpa", "kernel", "auto", "gemm"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = " ".join(capsys.readouterr().out.split())
    assert "n = 64, 2 heads, d = 64, causal" in out
    auto = data["measurements"][2]
    assert f"auto chose {auto['backend']}:" in out


def test_cli_bench_errors_are_one_line(capsys):
    assert main(["bench", "--causal", "maybe"]) == 2
    assert "error: --causal must be both, yes or no, got 'maybe'" in capsys.readouterr().err
    assert main(["bench", "--sizes", "1k"]) == 2
    assert "--sizes takes comma-separated integers" in capsys.readouterr().err


def test_cli_check_passes_and_reports_refusals_and_the_kernel(capsys):
    from attnlab.backends import kernel

    assert main(["check", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is True and data["calibration"] is None
    rows = data["rows"]
    assert {"numpy", "torch", "sdpa", "blockwise", "kernel"} <= {r["backend"] for r in rows}
    assert {r["dtype"] for r in rows} == {"float64", "float32", "float16", "bfloat16"}
    refused = [r for r in rows if r["passed"] is None]
    assert refused and all(r["note"] and r["max_error"] is None for r in refused)
    assert data["summary"]["ran"] == len(rows) - len(refused)
    assert sum(r["runs"] for r in data["summary"]["refused"]) == len(refused)
    isa = kernel.isa()
    assert isa is None or isa in json.dumps(data["kernel"])


def test_cli_check_calibrate_forgets_the_cache_and_lists_autos_choices(tmp_path, monkeypatch, capsys):
    from attnlab.backends import agreement, calibrate

    monkeypatch.setattr(agreement, "run_check", lambda tick=None: [])  # the table is the test above's
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNLAB_CALIBRATE", "0")  # no measuring in the tests: the priors choose
    stale = calibrate.cache_path()
    stale.write_text("{}")
    assert main(["check", "--calibrate", "--json", "-"]) == 0
    cal = json.loads(capsys.readouterr().out)["calibration"]
    assert not stale.exists() and cal["cache"] == str(stale) and cal["enabled"] is False
    shapes = {(tuple(c["shape"]), c["causal"]) for c in cal["choices"]}
    assert shapes == {((1, 1, 4096, 64), False), ((1, 1, 4096, 64), True), ((1, 12, 1024, 64), False), ((1, 12, 1024, 64), True)}
    assert all(c["backend"] in c["reason"] and c["measured"] is False for c in cal["choices"])


def test_decode_config_rejects_bad_values():
    from attnlab.bench.decode import DecodeConfig

    with pytest.raises(ValueError, match="lengths must be ints >= 1"):
        DecodeConfig(lengths=(0,))
    with pytest.raises(ValueError, match="dtypes must be among float32, bfloat16, float16, got float64"):
        DecodeConfig(dtypes=("float64",))
    with pytest.raises(ValueError, match="heads must be a multiple of kv_heads, got 32 and 6"):
        DecodeConfig(kv_heads=6)


def test_the_decode_benchmark_calls_attention_as_generate_does():
    """Its "generate" method passes what the KV cache's read of a dense one-token step passes (every
    sequence as long: no lengths; ragged ones pass theirs)."""
    import torch

    from attnlab.bench.decode import GENERATE_KWARGS
    from attnlab.transformer.cache import KVCache
    from attnlab.transformer.layer_cache import DenseCache

    for lengths in ([5], [5, 5], [5, 3]):
        b = len(lengths)
        cache = KVCache([DenseCache(b, 2, 8, 16, torch.float32, "cpu")])
        cache.lengths = torch.tensor(lengths)
        step = cache.begin(torch.ones(b, dtype=torch.long), 1)
        kw = cache.update(0, step, torch.ones(b, 2, 1, 8), torch.ones(b, 2, 1, 8)).kwargs()
        assert {n: x for n, x in kw.items() if n not in ("lengths", "k_norm")} == \
            {n: x for n, x in GENERATE_KWARGS.items() if n != "lengths"}
        assert kw["k_norm"] > 0
        if lengths == [5, 3]:
            assert kw["lengths"].tolist() == [6, 4]
        else:
            assert kw["lengths"] is GENERATE_KWARGS["lengths"] is None


@pytest.mark.needs("kernel")
def test_the_decode_benchmarks_pass_row_computes_what_generate_reads():
    """"pass" times the kernel's decode pass alone: its output is generate's read, bit for bit."""
    import torch

    from attnlab.bench.decode import DecodeConfig, _calls, _caches

    for dtype in ("float32", "bfloat16"):
        cfg = DecodeConfig(lengths=(300,), dtypes=(dtype,), methods=("generate", "pass"))
        calls = _calls(cfg, _caches(cfg, dtype, 300, 1), 300, False)
        assert torch.equal(torch.from_numpy(calls["pass"]()), calls["generate"]())


def test_cli_bench_decode_reports_bytes_read_over_time(capsys):
    from attnlab.bench.decode import DECODE_METHODS, STORED, DecodeConfig

    assert main(["bench", "--decode", "--sizes", "64", "--repeats", "1", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bandwidth_gbs"] > 0 and data["llc_bytes"] > 0
    ms = data["measurements"]
    assert {(m["dtype"], m["method"]) for m in ms} == {(d, m) for d in STORED for m in DECODE_METHODS}
    cfg = DecodeConfig(lengths=(64,))
    for m in ms:
        assert m["gbs"] == pytest.approx(cfg.cache_bytes(64, m["dtype"]) / m["time_s"] / 1e9)
        assert m["caches"] * cfg.cache_bytes(64, m["dtype"]) >= min(64 * cfg.cache_bytes(64, m["dtype"]),
                                                                    2 * data["llc_bytes"])
    assert all(m["backend"] for m in ms if m["method"] == "generate")
