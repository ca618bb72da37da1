"""Corpus statistics over 2 local gloo processes equal one process's (the bundled model in every rank)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dist_workers
from attnlab.interventions.corpus import corpus_roles
from attnlab.distributed import run_local

pytestmark = [pytest.mark.needs("transformers", "torch"), pytest.mark.gloo]

SENTENCES = ["I sat on the bank of the river.", "Hi.", ("The cat sat.", "It slept."), "Attention mixes words, gently.",
             "The bank raised its rates again.", "Words, words, words!", "She read the book that he wrote."]


def test_two_processes_equal_one(default_model):
    one = corpus_roles(SENTENCES, default_model, batch_size=2, distributed=False)
    ranks = run_local(dist_workers.corpus_scores, 2, SENTENCES, timeout_s=240)
    for r in ranks:
        assert r["num_sentences"] == len(SENTENCES)
        assert r["not_applicable"] == one.not_applicable
        assert set(r["scores"]) == set(one.scores)
        for name, s in one.scores.items():
            np.testing.assert_array_equal(r["scores"][name], ranks[0]["scores"][name])  # every rank: the same result
            np.testing.assert_allclose(r["scores"][name], s, atol=1e-5, err_msg=name)  # batches differ: float32 maps


@pytest.mark.model  # each rank loads the bundled model
def test_a_rank_that_fails_makes_every_rank_fail_without_waiting():
    errors = [r["error"] for r in run_local(dist_workers.corpus_scores, 2, SENTENCES, 1, timeout_s=240)]
    assert "/nonexistent/model" in errors[1][1]  # its own error
    assert errors[0][0] == "RuntimeError" and "rank(s) [1] failed" in errors[0][1]


@pytest.mark.model  # each rank loads the bundled model
def test_cli_heads_under_two_ranks_writes_once_from_rank_0(tmp_path, default_model):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(s if isinstance(s, str) else "\t".join(s) for s in SENTENCES) + "\n")
    out = tmp_path / "roles.json"
    ranks = run_local(dist_workers.cli_heads, 2, str(corpus), str(out), timeout_s=240)
    assert [r["status"] for r in ranks] == [0, 0], ranks
    assert ranks[1]["stdout"] == "" and ranks[1]["stderr"] == ""  # rank 1 stays quiet
    assert f"wrote {out}" in ranks[0]["stderr"]
    written = json.loads(out.read_text())
    one = corpus_roles(SENTENCES, default_model, batch_size=2, distributed=False)
    assert written["num_sentences"] == len(SENTENCES)
    for name, role in written["roles"].items():
        np.testing.assert_allclose(role["scores"], one.scores[name], atol=1e-5, err_msg=name)
