"""Layouts and block plans: pure NumPy, checked against hand examples and the dense causal mask."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.distributed.layout import Rect, plan_block, positions, shard, shard_lengths, unshard


def test_zigzag_by_hand():
    # 8 rows, 2 ranks: chunks [0 1] [2 3] [4 5] [6 7]; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert [p.tolist() for p in positions([4, 4], "zigzag")] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    x = np.arange(8.0)[:, None]
    assert shard(x, 0, 2, "zigzag")[:, 0].tolist() == [0, 1, 6, 7]


def test_contiguous_uneven_by_hand():
    assert shard_lengths(10, 3) == [4, 3, 3]
    assert [p.tolist() for p in positions([4, 3, 3])] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert shard_lengths(14, 3, "zigzag") == [6, 4, 4]  # halves of 3, 2, 2 rows


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("n,world", [(12, 2), (26, 3), (40, 4), (14, 7)])
def test_shard_then_unshard_is_the_identity(layout, n, world):
    x = np.random.default_rng(0).normal(size=(2, n, 3))
    pieces = [shard(x, r, world, layout, dim=1) for r in range(world)]
    assert sum(p.shape[1] for p in pieces) == n
    np.testing.assert_array_equal(unshard(pieces, layout, dim=1), x)


@pytest.mark.needs("torch")
def test_shard_works_on_torch():
    import torch
    x = torch.arange(12.0).reshape(1, 12, 1)
    pieces = [shard(x, r, 3, "zigzag") for r in range(3)]
    assert pieces[0][0, :, 0].tolist() == [0, 1, 10, 11]
    assert torch.equal(unshard(pieces, "zigzag"), x)


def test_zigzag_errors_name_the_rank_and_length():
    with pytest.raises(ValueError, match="rank 1: 3 rows"):
        positions([4, 3], "zigzag")
    with pytest.raises(ValueError, match="even sequence length"):
        shard_lengths(9, 2, "zigzag")
    with pytest.raises(ValueError, match="layout must be one of"):
        shard_lengths(9, 2, "ring")


def dense(rects: list[Rect], nq: int, nk: int) -> np.ndarray:
    """The pairs the rectangles visit, as a (nq, nk) count (a pair visited twice would count 2)."""
    seen = np.zeros((nq, nk), int)
    for r in rects:
        for i in range(r.q0, r.q1):
            last = r.keys - (r.q1 - 1 - i) if r.causal else r.keys  # bottom-right: row q1 − 1 sees all
            seen[i, :last] += 1
    return seen


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("seed", range(12))
def test_plans_cover_exactly_the_causal_mask(layout, seed):
    """Over every (rank, block) pair the rectangles visit each visible pair once and nothing else."""
    rng = np.random.default_rng(seed)
    world = int(rng.integers(1, 6))
    half = 2 if layout == "zigzag" else 1
    qrows = (rng.integers(1, 6, size=world) * half).tolist()
    krows = qrows if seed % 3 else (rng.integers(1, 6, size=world) * half).tolist()  # some cross-attention
    qpos, kpos = positions(qrows, layout), positions(krows, layout)
    shift = sum(krows) - sum(qrows)
    for r in range(world):
        for s in range(world):
            rects = plan_block(qpos[r] + shift, kpos[s], True)
            want = (kpos[s][None, :] <= qpos[r][:, None] + shift).astype(int)
            np.testing.assert_array_equal(dense(rects, len(qpos[r]), len(kpos[s])), want)
            assert all(r_.keys >= r_.q1 - r_.q0 for r_ in rects if r_.causal)  # a valid bottom-right band


def test_contiguous_causal_skips_later_blocks_and_keeps_the_diagonal_whole():
    qpos = positions([4, 4, 4])
    assert plan_block(qpos[0], qpos[2], True) == []  # keys after every query: no work
    assert plan_block(qpos[1], qpos[1], True) == [Rect(0, 4, 4, True)]  # one causal call
    assert plan_block(qpos[2], qpos[0], True) == [Rect(0, 4, 4, False)]  # one full call


def test_zigzag_balances_causal_work():
    for world in (2, 3, 4):
        pos = positions([8] * world, "zigzag")
        work = [sum(r.scores for s in range(world) for r in plan_block(pos[q], pos[s], True)) for q in range(world)]
        assert len(set(work)) == 1, work
        pos = positions([8] * world)
        contiguous = [sum(r.scores for s in range(world) for r in plan_block(pos[q], pos[s], True)) for q in range(world)]
        assert contiguous[-1] > contiguous[0]
