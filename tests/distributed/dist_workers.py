"""What each rank of a test's local group runs (module-level functions: the processes import them by name)."""

from __future__ import annotations

import torch

from attnlab.distributed import all_reduce_sum, rank_and_world, ring_attention, shard


def ring_cases(rank: int, world: int, cases: list[dict]) -> dict:
    """Every case's output and gradients on this rank's shard (float32), keyed by case name."""
    results = {}
    for c in cases:
        layout = c["layout"]
        q, k, v = (shard(c[n], rank, world, layout).float().requires_grad_() for n in ("q", "k", "v"))
        out, lse = ring_attention(q, k, v, causal=c["causal"], scale=c["scale"], layout=layout, return_lse=True)
        (out * shard(c["dout"], rank, world, layout).float()).sum().backward()
        results[c["name"]] = [x.detach() for x in (out, lse, q.grad, k.grad, v.grad)]
    return results


def ring_errors(rank: int, world: int) -> dict:
    """(error type, message) of calls that must fail, per case; None where a call did not raise."""
    torch.manual_seed(rank)
    found = {}

    def attempt(name, fn):
        try:
            fn()
            found[name] = None
        except Exception as e:  # noqa: BLE001 - the test looks at which
            found[name] = (type(e).__name__, str(e))

    x = torch.randn(1, 2, 4, 8)
    odd = torch.randn(1, 2, 3 + rank, 8)  # rank 0 holds 3 rows: odd for zigzag
    attempt("zigzag_odd", lambda: ring_attention(odd, odd, odd, layout="zigzag"))
    wide = torch.randn(1, 2, 4, 8 + 8 * (rank == world - 1))  # the last rank has D = 16
    attempt("d_differs", lambda: ring_attention(wide, wide, wide))
    typed = x.double() if rank == 1 else x
    attempt("dtype_differs", lambda: ring_attention(typed, typed, typed))
    bad = x.clone()
    if rank == 1:
        bad[0, 0, 0, 0] = float("nan")
    attempt("nan_on_rank_1", lambda: ring_attention(bad, x, x))
    attempt("layout", lambda: ring_attention(x, x, x, layout="spiral"))
    attempt("still_works", lambda: ring_attention(x, x, x, causal=True))  # the group survived the errors
    return found


def fails_on(rank: int, world: int, bad_rank: int) -> None:
    if rank == bad_rank:
        raise ValueError(f"rank {rank} was told to fail")
    torch.distributed.barrier()  # the others wait for it in a collective


def sleeps(rank: int, world: int, seconds: float) -> None:
    import time

    time.sleep(seconds)


def reduce_ranks(rank: int, world: int) -> list:
    r, w = rank_and_world()
    return all_reduce_sum([torch.full((2, 3), float(r + 1)).numpy(), [float(w)]])


def corpus_scores(rank: int, world: int, sentences: list, fail_on: int | None = None) -> dict:
    """corpus_roles over the group (each rank loads the bundled model): scores, sentence count, roles left out.

    With ``fail_on``, that rank names a model that does not exist, and each rank returns the error it raised.
    """
    from attnlab.interventions.corpus import corpus_roles
    from attnlab.hf.loading import load_model

    if fail_on is not None:
        try:
            corpus_roles(sentences, "/nonexistent/model" if rank == fail_on else load_model(), distributed=True)
        except Exception as e:  # noqa: BLE001 - the test looks at which
            return {"error": (type(e).__name__, str(e))}
        return {"error": None}
    roles = corpus_roles(sentences, load_model(), batch_size=2, distributed=True)
    return {"scores": roles.scores, "num_sentences": roles.num_sentences, "not_applicable": roles.not_applicable}


def cli_heads(rank: int, world: int, corpus: str, json_path: str) -> dict:
    """`attnlab heads --corpus FILE --json PATH` on this rank, as torchrun would start it: exit status and what it printed."""
    import contextlib
    import io

    from attnlab.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["heads", "--corpus", corpus, "--json", json_path, "--batch-size", "2"])
    return {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}


def head_stats_result(rank: int, world: int, texts: list) -> dict:
    """head_stats over the group (each rank loads the bundled model): means, received, tokens."""
    from attnlab.interventions.stats import head_stats
    from attnlab.hf.loading import load_model

    found = head_stats(texts, load_model(), distributed=True)
    return {"means": found.means, "received": found.received, "tokens": found.tokens}


def cli_stats(rank: int, world: int, path: str, json_path: str) -> dict:
    """`attnlab stats FILE --lines --json PATH` on this rank: exit status and what it printed."""
    import contextlib
    import io

    from attnlab.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["stats", path, "--lines", "--json", json_path])
    return {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}
