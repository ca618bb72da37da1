"""`attnlab ablate`: the table, --json and --png, on a tiny GPT-2 folder (and the default model once)."""

from __future__ import annotations

import json

import pytest

from attnlab.cli.app import main


def test_ablate_heads_prints_the_loss_change(gpt2_folder, capsys):
    assert main(["ablate", "The river runs past the bank.", "I put the money in the bank.", "--heads", "1.2,2.4",
                 "--model", str(gpt2_folder)]) == 0
    out = capsys.readouterr().out
    assert "layer 1, head 2, layer 2, head 4" in out and "(zero)" in out and "change" in out


def test_ablate_json_and_importance_png(gpt2_folder, tmp_path, capsys):
    assert main(["ablate", "The river runs past the bank.", "--heads", "2.1", "--how", "mean", "--model",
                 str(gpt2_folder), "--json", "-"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["heads"] == [{"layer": 1, "head": 0}] and found["how"] == "mean" and found["metric"] == "loss"
    png = tmp_path / "importance.png"
    assert main(["ablate", "The river runs past the bank.", "--model", str(gpt2_folder), "--png", str(png),
                 "--json", str(tmp_path / "imp.json")]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    imp = json.loads((tmp_path / "imp.json").read_text())
    assert len(imp["ablation"]) == 2 and len(imp["gradient"][0]) == 4


def test_ablate_importance_table(gpt2_folder, capsys):
    assert main(["ablate", "The river runs past the bank.", "--model", str(gpt2_folder), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "the 3 heads whose removal alone matters most" in out and "Spearman" in out


@pytest.mark.parametrize("heads", ["1", "1.x", "9.1"])
def test_ablate_bad_heads_is_one_line(gpt2_folder, heads, capsys):
    assert main(["ablate", "The bank.", "--heads", heads, "--model", str(gpt2_folder)]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.model
def test_ablate_default_model_cosines(capsys):
    assert main(["ablate", "I sat on the bank of the river.", "--heads", "1.1", "--json", "-"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["metric"] == "cosine" and 0.9 < found["cosine"][0] <= 1.0 + 1e-6
