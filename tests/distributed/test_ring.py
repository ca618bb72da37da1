"""Ring attention on 2, 3 and 4 local gloo processes against one process and the float64 reference.

One group per world size runs every case (a group costs a fork; a case costs milliseconds). The
reference is plain torch float64 written here, independent of attnlab's backends. The bar: the
ring's error is at most twice that of single-process float32 attention (attnlab.attention, the
kernel and eager torch: the larger of the two) against the reference. Error is the RMS over the
whole tensor: the largest error of a few thousand elements varies 2-3x between two single-process
float32 computations themselves, too noisy to compare at 2x.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import attnlab
import dist_workers
from attnlab.distributed import ring_attention, run_local, unshard

pytestmark = [pytest.mark.needs("torch"), pytest.mark.gloo]

WORLDS = (2, 3, 4)
KINDS = ("out", "lse", "dq", "dk", "dv")


def case(name: str, world: int, layout: str, causal: bool, hq: int, hkv: int, *, dv: int = 16, cross: bool = False,
         scale: float | None = None, seed: int = 0) -> dict:
    """Whole float64 tensors; lengths that shard unevenly (contiguous) or with uneven chunks (zigzag)."""
    g = torch.Generator().manual_seed(seed)
    n = 2 * (5 * world + 1) if layout == "zigzag" else 7 * world + 1
    tq = n - 2 * world if cross else n  # cross: fewer queries than keys, causal aligned bottom-right
    rand = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return dict(name=name, layout=layout, causal=causal, scale=scale, q=rand(2, hq, tq, 16), k=rand(2, hkv, n, 16) * 1.5,
                v=rand(2, hkv, n, dv), dout=rand(2, hq, tq, dv))


def cases(world: int) -> list[dict]:
    out = []
    for layout in ("contiguous", "zigzag"):
        for causal in (False, True):
            for gqa in (False, True):
                name = f"{layout}-{'causal' if causal else 'full'}-{'gqa' if gqa else 'mha'}"
                out.append(case(name, world, layout, causal, 4, 2 if gqa else 4, seed=len(out)))
    out.append(case("contiguous-causal-mqa-dv", world, "contiguous", True, 3, 1, dv=9, scale=0.3, seed=20))
    out.append(case("contiguous-causal-cross", world, "contiguous", True, 2, 2, cross=True, seed=21))
    out.append(case("zigzag-causal-cross", world, "zigzag", True, 2, 1, cross=True, seed=22))
    return out


def reference(c: dict, dtype: Any, backend: str | None = None) -> list:
    """out, LSE, dq, dk, dv of the whole problem in one process: plain torch math, or attnlab.attention."""
    q, k, v = (c[n].detach().to(dtype, copy=True).requires_grad_() for n in ("q", "k", "v"))
    if backend is None:
        groups = q.shape[-3] // k.shape[-3]
        kk, vv = k.repeat_interleave(groups, -3), v.repeat_interleave(groups, -3)
        s = q @ kk.transpose(-1, -2) * (c["scale"] or 1 / math.sqrt(q.shape[-1]))
        tq, tk = s.shape[-2:]
        if c["causal"]:
            keep = torch.arange(tk)[None, :] <= torch.arange(tq)[:, None] + (tk - tq)
            s = s.masked_fill(~keep, -math.inf)
        lse = torch.logsumexp(s, -1)
        out = torch.softmax(s, -1) @ vv
    else:
        out, lse = attnlab.attention(q, k, v, causal=c["causal"], scale=c["scale"], backend=backend, return_lse=True)
    (out * c["dout"].to(dtype)).sum().backward()
    return [x.detach().double() for x in (out, lse, q.grad, k.grad, v.grad)]


def rms(x: Any) -> float:
    return x.pow(2).mean().sqrt().item()


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"p{w}")
def ring_run(request):
    world = request.param
    cs = cases(world)
    results = run_local(dist_workers.ring_cases, world, cs, timeout_s=120)
    return world, cs, results


def test_ring_equals_one_process_within_float32_rounding(ring_run):
    world, cs, results = ring_run
    failures = []
    for c in cs:
        ref = reference(c, torch.float64)
        singles = [reference(c, torch.float32, b) for b in ("kernel", "torch")]
        for i, kind in enumerate(KINDS):
            got = unshard([r[c["name"]][i] for r in results], c["layout"], dim=-1 if kind == "lse" else -2).double()
            err = rms(got - ref[i])
            bar = 2 * max(rms(s[i] - ref[i]) for s in singles)
            if not err <= bar:
                failures.append(f"{c['name']} {kind}: ring error {err:.3g} > 2x single-process float32 {bar / 2:.3g}")
    assert not failures, f"p={world}:\n" + "\n".join(failures)


def test_errors_are_clear_and_raised_on_every_rank():
    found = run_local(dist_workers.ring_errors, 2, timeout_s=60)
    for rank, f in enumerate(found):
        assert f["zigzag_odd"][0] == "ValueError" and "rank 0: 3 rows" in f["zigzag_odd"][1]
        assert f["d_differs"][0] == "ValueError" and "same D" in f["d_differs"][1]
        assert f["layout"][0] == "ValueError" and "'spiral'" in f["layout"][1]
        assert f["dtype_differs"] == ("ValueError", "ring_attention: every rank must have the same dtype, "
                                      "got rank 0: float32, rank 1: float64")
        assert f["still_works"] is None
    assert found[1]["nan_on_rank_1"] == ("ValueError", "q contains NaN or Inf; attention needs finite inputs")
    assert found[0]["nan_on_rank_1"][0] == "RuntimeError" and "rank(s) [1]" in found[0]["nan_on_rank_1"][1]


@pytest.mark.parametrize("causal", [False, True])
def test_one_process_is_plain_attention(causal):
    """Outside a distributed job: world size 1, plain attention, differentiable, GQA kept."""
    c = case("single", 1, "contiguous", causal, 4, 2)
    q, k, v = (c[n].float().requires_grad_() for n in ("q", "k", "v"))
    out = ring_attention(q, k, v, causal=causal)
    out.backward(c["dout"].float())
    want = reference(c, torch.float32, "kernel")
    for got, w in zip((out.detach(), q.grad, k.grad, v.grad), [want[0], *want[2:]]):
        torch.testing.assert_close(got.double(), w, rtol=0, atol=1e-5)


def test_half_precision_comes_back_in_its_dtype():
    x = torch.randn(2, 5, 8, dtype=torch.bfloat16)
    out = ring_attention(x, x, x, causal=True)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 5, 8)
    torch.testing.assert_close(out.float(), attnlab.attention(x.float(), x.float(), x.float(), causal=True), rtol=0.02, atol=0.02)


def test_bad_arguments_name_what_they_got():
    x = torch.randn(2, 5, 8)
    with pytest.raises(TypeError, match="torch tensors"):
        ring_attention(x.numpy(), x.numpy(), x.numpy())
    with pytest.raises(ValueError, match="backend must be one of"):
        ring_attention(x, x, x, backend="sdpa")
    with pytest.raises(ValueError, match="same leading dims"):
        ring_attention(torch.randn(3, 2, 5, 8), x, x)
    with pytest.raises(ValueError, match="divide the query heads"):
        ring_attention(torch.randn(3, 5, 8), x, x)


def test_under_torchrun_without_a_group_says_what_to_call(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    x = torch.randn(2, 5, 8)
    with pytest.raises(RuntimeError, match=r"init_from_env\(\) first"):
        ring_attention(x, x, x)
