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
    (["--deadline-on", "first"], "--deadline-on must be"),
    (["--hardware", "h100", "--dtype", "float12"], "--dtype must be one of"),
    (["--dtype", "fp8"], "--dtype must be one of float32, bfloat16, float16, float64 on this machine"),
    (["--hardware", "h100", "--calibrate"], "--calibrate measures this machine"),
])
def test_bad_flags_are_one_line_naming_the_flag(capsys, args, text):
    assert main(["plan", "--model", "gpt2", *args]) == 2
    _one_error(capsys, text)


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
