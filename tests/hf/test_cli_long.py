"""`attnlab maps` takes the long view by itself above LONG_VIEW_TOKENS (or where the full maps would pass
their limit), says so, and writes the long maps file and the self-contained long page."""

import json

import pytest

import attnlab
from attnlab.cli.app import main
from attnlab.maps.long import LongMaps

TEXT = "The cat sat on the mat, and the dog sat on the log; then the cat saw the dog."


@pytest.fixture
def short_limit(monkeypatch):
    monkeypatch.setattr("attnlab.maps.long.LONG_VIEW_TOKENS", 16)


def test_maps_takes_the_long_view_above_the_stated_length(tiny_llama, short_limit, tmp_path, capsys):
    npz, page, js = tmp_path / "long.npz", tmp_path / "long.html", tmp_path / "long.json"
    assert main(["maps", TEXT, "--model", str(tiny_llama), "--save", str(npz), "--html", str(page),
                 "--json", str(js)]) == 0
    err = capsys.readouterr().err
    assert "tokens (over 16): the full maps would hold about" in err and "so this is the long view" in err
    assert isinstance(attnlab.load_maps(npz), LongMaps)
    assert 'id="attnlab-data"' in page.read_text() and "http" not in page.read_text().split("<body>")[0]
    data = json.loads(js.read_text())
    assert data["view"] == "long" and len(data["heads"]) == 2 * 4 and len(data["heads"][0]["top"]) == 3
    assert main(["maps", TEXT, "--model", str(tiny_llama), "--layer", "2", "--head", "3"]) == 0
    out = capsys.readouterr().out
    assert "where the last token" in out and "L2H3" in out


def test_long_view_refuses_what_needs_the_full_maps(tiny_llama, short_limit, capsys):
    assert main(["maps", TEXT, "--model", str(tiny_llama), "--words"]) == 2
    assert "--words needs the full maps, which the long view does not hold" in capsys.readouterr().err
    assert main(["maps", TEXT, TEXT, "--model", str(tiny_llama)]) == 2
    assert "the long view takes one text at a time" in capsys.readouterr().err


def test_short_text_keeps_the_full_maps(tiny_llama, capsys):
    assert main(["maps", "The cat sat.", "--model", str(tiny_llama)]) == 0
    captured = capsys.readouterr()
    assert "long view" not in captured.err and "looks most" in captured.out
