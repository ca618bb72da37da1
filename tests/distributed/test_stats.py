"""attnlab stats over 2 local gloo processes equals one process's (the bundled model in every rank)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dist_workers
from attnlab.interventions.stats import ROW_STATS, head_stats
from attnlab.distributed import run_local

pytestmark = [pytest.mark.needs("transformers", "torch"), pytest.mark.gloo]

TEXTS = ["I sat on the bank of the river.", "Hi.", "Attention mixes words, gently, and then mixes them again.",
         "The bank raised its rates again."]


@pytest.mark.model  # each rank loads the bundled model
def test_two_processes_equal_one(default_model):
    one = head_stats(TEXTS, default_model, distributed=False)
    ranks = run_local(dist_workers.head_stats_result, 2, TEXTS, timeout_s=240)
    for r in ranks:
        assert r["tokens"] == one.tokens  # every text, in order, whichever rank read it
        for name in ROW_STATS:
            np.testing.assert_allclose(r["means"][name], one.means[name], atol=1e-6, err_msg=name)
        for got, want in zip(r["received"], one.received):
            np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.model
def test_cli_stats_under_two_ranks_writes_once_from_rank_0(tmp_path, default_model):
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "stats.json"
    ranks = run_local(dist_workers.cli_stats, 2, str(src), str(out), timeout_s=240)
    assert [r["status"] for r in ranks] == [0, 0], ranks
    assert ranks[1]["stdout"] == "" and ranks[1]["stderr"] == ""  # rank 1 stays quiet
    written = json.loads(out.read_text())
    one = head_stats(TEXTS, default_model, distributed=False)
    assert [t["tokens"] for t in written["texts"]] == [len(t) for t in one.tokens]
    np.testing.assert_allclose(written["means"]["prev"], one.means["prev"], atol=1e-5)
