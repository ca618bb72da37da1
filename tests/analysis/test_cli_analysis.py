"""The CLI commands over the decoder analyses: `heads --induction`, roles that do not apply."""

import json

from attnlab.cli.app import main


def test_heads_induction_json(tiny_llama, capsys):
    assert main(["heads", "--induction", "--model", str(tiny_llama), "--length", "8", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["length"] == 8 and out["prefix"] == "<s>" and len(out["scores"]) == 2 and len(out["scores"][0]) == 4


def test_heads_induction_takes_no_sentences(tiny_llama, capsys):
    assert main(["heads", "--induction", "--model", str(tiny_llama), "a sentence"]) == 2
    assert "--induction makes its own token sequence" in capsys.readouterr().err


def test_heads_on_a_decoder_says_which_roles_do_not_apply(tiny_llama, capsys):
    assert main(["heads", "the cat sat on the mat", "--model", str(tiny_llama), "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["not_applicable"]) >= {"next", "cls", "marks"} and "sink" in out["roles"]


def test_stats_command(tiny_llama, tmp_path, capsys):
    f = tmp_path / "long.txt"
    f.write_text("The river runs past the bank, slowly! " * 3)
    assert main(["stats", str(f), "--model", str(tiny_llama), "--top", "3", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["causal"] and len(out["means"]["entropy"]) == 2 and len(out["texts"][0]["top_received"]) == 3
    assert main(["stats", str(f), "--model", str(tiny_llama)]) == 0
    assert "most attended" in capsys.readouterr().out


def test_rollout_command(tiny_llama, tmp_path, capsys):
    png = tmp_path / "r.png"
    assert main(["rollout", "The river runs past the bank.", "--model", str(tiny_llama), "--flow", "--png", str(png),
                 "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    rolled, flowed = out["rollout"], out["flow"]
    assert (rolled["method"], rolled["level"], rolled["residual"], flowed["method"], flowed["layer"]) == (
        "rollout", "word", 0.5, "flow", 1)
    assert len(rolled["weights"][0]) == 2 and len(flowed["weights"][0]) == len(flowed["labels"][0]) == len(rolled["labels"][0])
    assert png.stat().st_size > 1000
    assert main(["rollout", "The river.", "--model", str(tiny_llama), "--tokens"]) == 0
    assert "rollout through all 2 layers" in capsys.readouterr().out
