"""`attnlab plan`: the table, the JSON, the PNG, --list, and bad input as one line naming the flag."""

from __future__ import annotations

import json

import pytest

from attnlab.cli.app import main


def _one_error(capsys, text):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert text in err, err


@pytest.mark.parametrize("args, text", [
    (["--prompt", "0"], "--prompt takes"),
    (["--prompt", "4q"], "--prompt takes"),
    (["--batch", "0"], "--batch must be"),
    (["--new-tokens", "0"], "--new-tokens must be"),
    (["--deadline-ms", "-5"], "--deadline-ms must be"),
    (["--memory-gb", "0"], "--memory-gb must be"),
    (["--gpus", "0"], "--gpus must be"),
    (["--hardware", "tpu"], "--hardware 'tpu' is not known; known: this, h100"),
    (["--hardware", "h100", "--efficiency", "matmul=3"], "--efficiency: efficiency matmul must be in (0, 1]"),
    (["--hardware", "this", "--efficiency", "matmul=0.5"], "--efficiency applies to a named accelerator"),
    (["--hardware", "this", "--engine", "vllm"], "--engine applies to a named accelerator"),
    (["--hardware", "h100", "--engine", "tgi"], "--engine must be one of vllm, trt-llm, ideal, got 'tgi'"),
    (["--deadline-on", "first"], "--deadline-on must be"),
    (["--hardware", "h100", "--dtype", "float12"], "--dtype must be one of"),
    (["--dtype", "fp8"], "--dtype must be one of float32, bfloat16, float16, float64 on this machine"),
    (["--hardware", "h100", "--calibrate"], "--calibrate measures this machine"),
    (["--hardware", "h100", "--prompt", "1e12"], "--prompt takes token counts up to 16,777,216"),
    (["--hardware", "h100", "--new-tokens", "100000000"], "--new-tokens must be at most 16,777,216"),
    (["--hardware", "h100", "--batch", "100000000"], "--batch must be at most 1,048,576"),
    (["--hardware", "h100", "--gpus", "5"], "--gpus must split gpt2's 12 query heads and 12 k/v heads evenly"),
    (["--hardware", "h100", "--cache-dtype", "int3"], "--cache-dtype must be one of float32, float16, bfloat16"),
    (["--hardware", "h100", "--cache-budget", "2"], "--cache-budget must be an int from 5"),
    (["--verify", "--cache-dtype", "int8"], "--verify runs the model with a dense cache"),
])
def test_bad_flags_are_one_line_naming_the_flag(capsys, args, text):
    assert main(["plan", "--model", "gpt2", *args]) == 2
    _one_error(capsys, text)


BASE = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 8, "intermediate_size": 512, "vocab_size": 100, "max_position_embeddings": 2048}


@pytest.mark.parametrize("change, text", [
    ({"num_hidden_layers": "four"}, "num_hidden_layers must be an int >= 1, got 'four'"),
    ({"num_key_value_heads": 2.5}, "num_key_value_heads must be an int >= 1, got 2.5"),
    ({"hidden_size": 250}, "hidden_size=250 is not a multiple of num_attention_heads=8"),
    ({"num_key_value_heads": 3}, "num_attention_heads=8 is not a multiple of num_key_value_heads=3"),
    ({"intermediate_size": None}, "the config has no 'intermediate_size', which the planner needs"),
    ({"sliding_window": "4k"}, "sliding_window must be an int >= 1, got '4k'"),
    ({"torch_dtype": "float12"}, "torch_dtype must be one of"),
])
def test_a_bad_config_is_one_line_naming_the_key(tmp_path, capsys, change, text):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **change}))
    assert main(["plan", "--model", str(tmp_path), "--hardware", "h100", "--prompt", "1k"]) == 2
    _one_error(capsys, text)


def test_gpus_that_do_not_split_the_kv_heads_are_refused(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--hardware", "h100", "--gpus", "3", "--prompt", "1k"]) == 2
    _one_error(capsys, "--gpus must split llama-3.1-8b's 32 query heads and 8 k/v heads evenly (tensor "
                       "parallelism), got 3; it can be 1, 2, 4, 8, 16, 32")
    assert main(["plan", "--model", "llama-3.1-8b", "--hardware", "h100", "--gpus", "16", "--prompt", "1k"]) == 0


def test_unknown_model_and_missing_model(capsys):
    assert main(["plan", "--model", "no-such", "--hardware", "h100"]) == 2
    _one_error(capsys, "bundled: gpt2, llama-3.1-8b")
    assert main(["plan", "--hardware", "h100"]) == 2
    _one_error(capsys, "--model is required")


def test_table_json_and_png(tmp_path, capsys):
    png, out = tmp_path / "plan.png", tmp_path / "plan.json"
    code = main(["plan", "--model", "llama-3.1-8b", "--hardware", "h100", "--prompt", "4k,8k,32k,128k",
                 "--new-tokens", "256", "--deadline-ms", "5000", "--png", str(png), "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert [r["prompt_tokens"] for r in data["rows"]] == [4000, 8000, 32000, 128000]
    assert data["predicted"] and data["max_prompt_tokens"] and round(data["rows"][-1]["kv_bytes"] / 2**30, 1) == 15.7
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["plan", "--model", "mistral-7b-v0.1", "--hardware", "a100", "--prompt", "8k,40k"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the console wraps at its width
    assert "PREDICTED" in text and "beyond" in text and "largest prompt meeting the memory: 32,512 tokens" in text


def test_list_shows_models_and_accelerators(capsys):
    assert main(["plan", "--list", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"llama-3.1-8b", "gemma-2-9b"} <= set(data["models"]) and "h100" in data["accelerators"]
    assert data["models"]["mistral-7b-v0.1"]["windows"][0] == 4096 and data["efficiencies"]["matmul"] == 0.7


def test_no_figure_is_cut_to_fit_a_narrow_output(capsys):
    """Off a terminal rich lays tables out in 80 columns and would cut cells ("128,0…"); the tables
    print at their own width instead."""
    assert main(["plan", "--model", "llama-3.1-8b", "--hardware", "h100", "--prompt", "8k,32k,128k",
                 "--new-tokens", "256", "--deadline-ms", "5000"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert "128,000" in out and "no: deadline" in out and "decode weights (memory bandwidth)" in out


def test_cache_dtype_and_budget_are_said_and_written(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--hardware", "h100", "--prompt", "128k", "--new-tokens", "256",
                 "--cache-dtype", "int4", "--cache-budget", "8192", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cache"] == {"cache_dtype": "int4", "bytes_per_token_per_kv_head": 192.0,
                            "fixed_bytes_per_sequence_per_kv_head": 81920, "cache_budget": 8192}
    assert out["rows"][0]["kv_bytes"] == 32 * 8 * (8192 * 192 + 81920)
    assert main(["plan", "--model", "llama-3.1-8b", "--hardware", "h100", "--prompt", "128k", "--cache-dtype", "int8"]) == 0
    assert "KV cache: int8, 264 bytes per token and k/v head" in " ".join(capsys.readouterr().out.split())
