"""`attnlab patch` and `attnlab attribute` on the bundled decoder: the table, the JSON and the heat map
are the library's results (checked against attnlab.patch and attnlab.logit_attribution called here
with a metric written here), and the printed sum check adds up to the model's own logit difference."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import attnlab
from attnlab.cli.app import main
from circuit_models import ids_of, one_id

pytestmark = pytest.mark.needs("torch", "transformers")

CLEAN, CORRUPTED = "Set the class of the", "Set the file of the"
TARGET, BASELINE = " class", " file"


def difference(decoder):
    t, b = one_id(decoder, TARGET), one_id(decoder, BASELINE)
    return lambda logits: logits[:, -1, t] - logits[:, -1, b]


@pytest.fixture(scope="module")
def patched(decoder):
    return attnlab.patch(decoder, ids_of(decoder, CLEAN), ids_of(decoder, CORRUPTED), difference(decoder))


def test_patch_prints_the_top_heads_and_writes_the_librarys_grid(decoder, patched, tmp_path, capsys):
    out_json, png = tmp_path / "p.json", tmp_path / "p.png"
    assert main(["patch", "--clean", CLEAN, "--corrupted", CORRUPTED, "--target", TARGET, "--baseline", BASELINE,
                 "--top", "3", "--json", str(out_json), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert f"logit difference {TARGET!r} − {BASELINE!r} at the last token: clean {patched.clean[0]:.4f}" in out
    rows = re.findall(r"│ (L\dH\d) │ ([-\d.]+) │", out)
    assert rows == [(str(head), f"{effect:.4f}") for head, effect in patched.top(3)]  # 1-based labels: L1H4 ...
    got = json.loads(out_json.read_text())
    np.testing.assert_allclose(got["effect"], patched.effect, rtol=0, atol=1e-12)
    assert got["top"][0] == patched.top(1)[0].to_dict()  # 0-based in the JSON
    assert got["target"] == {"text": TARGET, "id": one_id(decoder, TARGET)}
    assert got["tokens"]["corrupted"] == ["S", "et", " the", " file", " of", " the"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_patch_per_position_is_the_librarys_grid_over_heads_and_positions(decoder, tmp_path, capsys):
    want = attnlab.patch(decoder, ids_of(decoder, CLEAN), ids_of(decoder, CORRUPTED), difference(decoder),
                         over="head_pos")
    assert main(["patch", "--clean", CLEAN, "--corrupted", CORRUPTED, "--target", TARGET, "--baseline", BASELINE,
                 "--over", "head_pos", "--top", "2", "--json", "-"]) == 0
    got = json.loads(capsys.readouterr().out)  # --json -: the JSON alone on stdout
    assert np.shape(got["effect"]) == (4, 4, 6)
    np.testing.assert_allclose(got["effect"], want.effect, rtol=0, atol=1e-12)
    assert main(["patch", "--clean", CLEAN, "--corrupted", CORRUPTED, "--target", TARGET, "--baseline", BASELINE,
                 "--over", "head_pos", "--top", "2"]) == 0
    head, effect = want.top(1)[0]
    where = int(want.effect[head].argmax())
    assert f"│ {head} │ {where + 1} ' the' │ {effect:.4f} │" in capsys.readouterr().out


def test_attribute_prints_components_and_the_check_that_they_add_up(decoder, tmp_path, capsys):
    t, b = one_id(decoder, TARGET), one_id(decoder, BASELINE)
    want = attnlab.logit_attribution(decoder, ids_of(decoder, CLEAN), t, baseline=b)
    assert main(["attribute", CLEAN, "--target", TARGET, "--baseline", BASELINE, "--top", "0"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"│\s+(embed|bias|mlp \d|L\dH\d) │\s+([-+\d.]+) │", out)
    assert rows == [(str(c), f"{v:+.4f}") for c, v in want.ranked()] and len(rows) == 1 + 16 + 4 + 1
    total, logit, error = map(float, re.search(r"sum of the 22 components ([-\d.]+) · the model's ([-\d.]+) · "
                                               r"error ([-+\d.e]+)", out).groups())
    own = decoder.run_with_hooks(ids_of(decoder, CLEAN))[0, -1]  # the model's logits, not the tool's
    assert logit == pytest.approx(float(own[t] - own[b]), abs=1e-5)
    assert total == pytest.approx(logit, abs=1e-5) and abs(error) < 1e-5
    path = tmp_path / "a.json"
    assert main(["attribute", CLEAN, "--target", TARGET, "--baseline", BASELINE, "--json", str(path)]) == 0
    got = json.loads(path.read_text())
    assert [c["value"] for c in got["components"]] == want.values.tolist()
    assert got["components"][1] == {"kind": "head", "label": "L1H1", "layer": 0, "head": 0, "value": want.values[1]}
    assert got["total"] == want.total and got["logit"] == want.logit


def test_attribute_of_the_target_alone_is_its_logit(decoder, capsys):
    t = one_id(decoder, TARGET)
    assert main(["attribute", CLEAN, "--target", TARGET, "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert f"logit of {TARGET!r} at the last token" in out and "… and 20 more (--top 0 lists them all)" in out
    logit = float(re.search(r"the model's ([-\d.]+)", out).group(1))
    assert logit == pytest.approx(float(decoder.run_with_hooks(ids_of(decoder, CLEAN))[0, -1, t]), abs=1e-5)


def test_another_decoder_through_model(tiny_folder, capsys):
    """--model takes any decoder attnlab's transformer builds: a tiny Gemma-2 from its folder, whose final
    softcap the check says the logit is taken before."""
    from attnlab.transformer import Transformer

    folder = str(tiny_folder("gemma2"))
    net = Transformer.from_pretrained(folder)
    text, target = "the cat sat on the mat", "the"
    want = attnlab.logit_attribution(net, ids_of(net, text), target)
    assert main(["attribute", text, "--target", target, "--model", folder]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"the model's {want.logit:.6f}" in out
    assert net.config.final_softcap and "(before its final softcap)" in out
    assert main(["patch", "--clean", "the cat sat", "--corrupted", "the mat sat", "--target", target, "--model",
                 folder, "--json", "-"]) == 0
    assert np.shape(json.loads(capsys.readouterr().out)["effect"]) == (net.config.num_layers, net.config.num_heads)


def test_the_per_position_figure_says_what_was_patched(decoder, tmp_path, monkeypatch):
    import attnlab.viz.patching as figure

    titles, draw = [], figure.patching_figure
    monkeypatch.setattr(figure, "patching_figure", lambda effect, title, tokens=None: titles.append(title) or draw(
        effect, title, tokens))
    for over in ("head", "head_pos"):
        assert main(["patch", "--clean", CLEAN, "--corrupted", CORRUPTED, "--target", TARGET, "--baseline", BASELINE,
                     "--over", over, "--png", str(tmp_path / f"{over}.png")]) == 0
    assert [t.splitlines()[0] for t in titles] == ["attnlab:decoder: each head patched",
                                                   "attnlab:decoder: each head at each position patched"]
