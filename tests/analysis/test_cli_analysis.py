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
