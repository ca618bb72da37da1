"""Section 8: the data has the structure it claims, the scores are right on planted maps, training is
reproducible for a seed, and the full run grows the textbook circuit (the claim the section makes)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

pytestmark = pytest.mark.needs("torch")
try:
    import torch
except ImportError:  # the needs mark skips every test here (on CI: fails them)
    torch = None

from attnlab.lesson.transformer import InductionConfig, head_scores, repeats, train, transformer_section  # noqa: E402


def test_repeats_copy_a_segment_and_point_after_its_earlier_copy():
    c = InductionConfig()
    x, targets, source = repeats(np.random.default_rng(5), 200, c)
    assert x.shape == targets.shape == source.shape == (200, c.seq_len)
    assert int(x.min()) >= 0 and int(x.max()) < c.vocab
    b, t = (source >= 0).nonzero(as_tuple=True)
    assert torch.equal(x[b, source[b, t]], x[b, t + 1])  # the key after the earlier copy holds the next token
    assert torch.equal(x[b, source[b, t] - 1], x[b, t])  # ... and the key before it, the current token
    assert torch.equal(targets[:, 1:], source[:, :-1] >= 0)  # scored tokens are exactly those a copy predicts
    n = targets.sum(1) + 1  # segment lengths
    assert int(n.min()) >= c.segment[0] and int(n.max()) <= c.segment[1]
    starts = (source >= 0).float().argmax(1)  # where the repeat begins differs from sequence to sequence
    assert len(set(starts.tolist())) > 10


def test_scores_on_planted_maps():
    T = 8
    prev = torch.zeros(1, 2, T, T)
    prev[0, 0, 0, 0] = 1.0
    prev[0, 0, torch.arange(1, T), torch.arange(T - 1)] = 1.0  # head 1: all weight on the token before
    prev[0, 1] = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]  # head 2: uniform
    source = torch.full((1, T), -1)
    source[0, 5:7] = torch.tensor([2, 3])  # queries 5, 6 should look at keys 2, 3
    ind = torch.zeros(1, 2, T, T)
    ind[0, 1, 5, 2] = ind[0, 1, 6, 3] = 1.0  # head 2 of layer 2: a perfect induction head
    p, i = head_scores((prev, ind), source)
    assert p.shape == i.shape == (2, 2)
    assert p[0, 0] == pytest.approx(1.0) and p[0, 1] == pytest.approx(np.mean([1 / t for t in range(2, T + 1)]))
    assert i[1, 1] == pytest.approx(1.0) and i[1, 0] == 0.0
    assert i[0, 1] == pytest.approx(np.mean([prev[0, 1, 5, 2], prev[0, 1, 6, 3]]))


def test_training_is_reproducible_for_a_seed_and_restores_threads():
    threads = torch.get_num_threads()
    c = replace(InductionConfig(), steps=6, eval_every=3, eval_batch=8, batch=8)
    a, b = train(c), train(c)
    assert a["history"]["train_loss"] == b["history"]["train_loss"]
    assert a["history"]["repeat_loss"] == b["history"]["repeat_loss"]
    assert a["history"]["step"] == [0, 3, 6]
    other = train(replace(c, seed=1))
    assert other["history"]["train_loss"] != a["history"]["train_loss"]
    assert torch.get_num_threads() == threads


@pytest.fixture(scope="module")
def section():
    return transformer_section(seed=0)


def test_the_textbook_circuit_appears(section):
    d = section.data
    assert section.key == "transformer" and section.number == 8
    assert d["induction_score"] >= 0.5
    assert d["previous_token_score"] >= 0.5  # a previous-token head in layer 1, not another route
    assert d["induction_head"]["layer"] == 1 and d["previous_token_head"]["layer"] == 0  # 0-based: layers 2 and 1
    assert d["steps_to_induction"] is not None and d["steps_to_induction"] <= d["config"]["steps"]
    assert d["history"]["repeat_loss"][0] > 0.9 * d["chance_loss"]  # before: near chance
    assert d["loss_with_induction_head"] < 0.5 * d["chance_loss"]  # after: copying works
    # knocking out either head of the circuit brings the loss on the repeat back up
    assert d["loss_without_induction_head"] > d["loss_with_induction_head"] + 0.3
    assert d["loss_without_previous_token_head"] > d["loss_with_induction_head"] + 0.3
    assert d["train_seconds"] > 0 and len(d["history"]["train_loss"]) == d["config"]["steps"]
    L, H, T = 2, d["config"]["heads"], d["config"]["seq_len"]
    assert np.shape(d["maps"]["after"]) == np.shape(d["maps"]["before"]) == (L, H, T, T)


def test_section_matches_the_schema_and_draws(section):
    from importlib import resources

    import jsonschema
    schema = json.loads(resources.files("attnlab.lesson").joinpath("schema.json").read_text())
    doc = json.loads(json.dumps(section.to_dict()))  # through JSON, as lesson.json stores it
    jsonschema.validate(doc, {"$ref": "#/$defs/transformer", "$defs": schema["$defs"]})
    from attnlab.viz.induction import induction_training

    fig = induction_training(doc["data"])
    assert len(fig.axes) >= 5


def test_patching_finds_the_circuit(section):
    """At seed 0: activation patching names the induction head; path patching says the previous-token head
    works through its keys, at least 3 times the larger of q and v (v is 0: values cannot move a pattern)."""
    d, circ = section.data, section.data["circuit"]
    grid = np.asarray(circ["patching"]["effect"])
    assert grid.shape == (2, d["config"]["heads"]) and circ["head"] == d["induction_head"]
    assert grid[1].max() == grid.max() and grid[1].max() > 0.2  # a layer-2 head carries the copying
    assert circ["sender"] == d["previous_token_head"]
    s = circ["sender"]["head"]
    q, k, v = (circ["path"][w][s] for w in ("q", "k", "v"))
    assert v == 0.0 and k >= 3 * max(abs(q), abs(v)) and circ["k_over_qv"] == pytest.approx(k / max(abs(q), abs(v)))
    assert circ["patching"]["clean"] > circ["patching"]["corrupted"] and circ["path"]["clean"] > circ["path"]["corrupted"]
    text = " ".join(section.findings)
    assert "through the keys" in text and "K-composition" in text
    assert section.tables[-1].columns == ("layer-1 head", "through q", "through k", "through v")


def test_the_corruption_replaces_the_first_copy_only():
    from attnlab.lesson.circuit import corrupt

    c = InductionConfig()
    x, _, source = repeats(np.random.default_rng(3), 50, c)
    y = corrupt(np.random.default_rng(4), x, source, c.vocab)
    for r in range(50):
        after = source[r][source[r] >= 0]
        first = set(range(int(after.min()) - 1, int(after.max()) + 1))
        changed = set(torch.nonzero(y[r] != x[r]).flatten().tolist())
        assert changed == first  # every token of the first copy, nothing else
    assert int(y.min()) >= 0 and int(y.max()) < c.vocab


def test_the_circuit_figure_draws(section):
    from attnlab.viz.induction import induction_circuit

    fig = induction_circuit(json.loads(json.dumps(section.to_dict()))["data"])
    assert len(fig.axes) == 3  # the heat map, its colour bar, the three bars
