"""The CLI verbs maps, heads and find-head: they run, write what they say, and fail with exit 2 and one line."""

import json

import pytest

from attnlab.cli.app import main

RIVER, MONEY = "I sat on the bank of the river.", "I put the money in the bank."


@pytest.fixture(autouse=True)
def _model_loaded_once(default_model):
    """The CLI loads the same cached model as the fixture, so these tests pay for it once."""


def test_maps_one_head_words_png_json(tmp_path, capsys):
    png, js, npz = tmp_path / "h.png", tmp_path / "m.json", tmp_path / "m.npz"
    rc = main(["maps", RIVER, MONEY, "--layer", "3", "--head", "11", "--words", "--png", str(png),
               "--json", str(js), "--save", str(npz)])
    assert rc == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and npz.is_file()
    data = json.loads(js.read_text())
    assert (data["layer"], data["head"], data["unit"]) == (2, 10, "words")  # --layer 3 --head 11, 0-based in JSON
    first = data["sentences"][0]
    assert first["words"][5] == "bank" and len(first["weights"]) == len(first["words"]) == 11
    out = capsys.readouterr().out
    assert "layer 3, head 11" in out and "river" in out


def test_maps_overview_and_json_to_stdout(capsys):
    assert main(["maps", RIVER]) == 0
    assert "where each head looks most" in capsys.readouterr().out
    assert main(["maps", RIVER, "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["sentences"][0]["weights"]) == 6  # every layer, every head


def test_heads_on_a_corpus(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text(f"{RIVER}\n\n{MONEY}\nThe cat sat.\tIt slept.\n")
    assert main(["heads", "--corpus", str(corpus), "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "over 3 sentences" in out and "previous word" in out
    assert main(["heads", "--corpus", str(corpus), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    top = data["roles"]["prev"]["top"]
    assert data["num_sentences"] == 3 and (top["layer"], top["head"]) == (0, 2) and top["score"] > 0.9


def test_find_head_says_plainly_that_none_qualifies(capsys):
    assert main(["find-head", "--target", "bank", "--decider", "river", "--decider", "money", RIVER, MONEY]) == 0
    out = capsys.readouterr().out
    assert "No head of 72 qualifies" in out and "Closest:" in out and "marks: in" in out


def test_find_head_json(capsys):
    args = ["find-head", "--target", "bank", "--decider", "river", "--decider", "money", RIVER, MONEY]
    assert main(args + ["--exclude-marks", "--exclude-self", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["exclude_marks"] and data["best"] is not None and data["total_heads"] == 72


@pytest.mark.parametrize(
    "args, message",
    [
        (["find-head", "--target", "bonk", "--decider", "river", RIVER], "'bonk' is not in sentence 1"),
        (["maps", RIVER, "--layer", "7", "--head", "1"], "--layer 7 is out of range; this model has layers 1 to 6"),
        (["maps", RIVER, "--layer", "1", "--head", "13"], "--head 13 is out of range"),
        (["maps", RIVER, "--layer", "1"], "--layer and --head go together"),
        (["maps", RIVER, "--png", "x.png"], "--png draws one head"),
        (["maps", "   "], "sentences[0] is empty"),
        (["maps", RIVER, "--model", "/no/such/model"], "model folder '/no/such/model' does not exist"),
        (["heads", "--corpus", "/no/such/file.txt"], "corpus file '/no/such/file.txt' does not exist"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split())


def test_uncached_hub_id_exits_2(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["maps", RIVER, "--model", "attnlab-tests/no-such-model", "--revision", "main"]) == 2
    assert "not in the Hugging Face cache" in " ".join(capsys.readouterr().err.split())
