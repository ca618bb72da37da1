"""Visibility as one description (attnlab.masks), served fused by the compiled kernel: what each costs.

    .venv/bin/python benchmarks/bench_masks.py [--t 8192] [--heads 4,12] [--rounds 5] [--no-flex] [--json PATH]

Per head count (B = 1, D = 64, float32, torch tensors, the kernel backend), the seconds of the forward
and of forward + backward for: the plain causal call over all T; 8 packed documents of T/8 tokens,
causal within each (documents & causal); a prefix-LM (prefix T/4, 2,048 of 8,192, | causal); causal with ALiBi; causal
with learned sinks. Medians of ``--rounds`` interleaved rounds, and each one's ratio to the plain causal
call measured beside it. PyTorch's FlexAttention (torch.compile'd, on the CPU) runs the packed-documents
forward with the same mask (compiled and warmed before timing); it has no CPU backward, which the table
says. Last, a ``mask_mod`` callable through blockwise at T = 16,384 (B = H = 1, D = 64, NumPy inputs):
its extra memory (tracemalloc's peak beyond q, k, v and the output) and its time against the same mask
as attnlab.masks objects on the kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import tracemalloc


def _timed(fn, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def cases(t: int, heads: int):
    """name → attention()'s keywords."""
    import numpy as np
    import torch

    from attnlab import masks

    ids = np.repeat(np.arange(8), t // 8)
    return {
        "causal": {"causal": True},
        "documents & causal (8 x T/8)": {"mask": masks.documents(ids) & masks.causal()},
        "prefix T/4 | causal": {"mask": masks.prefix(t // 4) | masks.causal()},
        "causal + ALiBi": {"causal": True, "score_mod": masks.alibi(masks.alibi_slopes(heads))},
        "causal + learned sinks": {"causal": True, "sink_logits": torch.linspace(-1, 1, heads)},
    }


def measure(t: int, heads: int, rounds: int) -> dict:
    import torch

    from attnlab import attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, t, 64, generator=g) for _ in range(3))
    dout = torch.randn(1, heads, t, 64, generator=g)
    runs = {}
    for name, kw in cases(t, heads).items():
        def fwd(kw=kw):
            with torch.no_grad():
                attention(q, k, v, backend="kernel", **kw)

        def fwd_bwd(kw=kw):
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            extra = dict(kw)
            if "sink_logits" in extra:
                extra["sink_logits"] = extra["sink_logits"].clone().requires_grad_()
            (attention(*leaves, backend="kernel", **extra) * dout).sum().backward()

        runs[name] = (fwd, fwd_bwd)
    times = {name: {"forward": [], "forward+backward": []} for name in runs}
    for fns in runs.values():  # warm
        fns[0]()
    for r in range(rounds):
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for name in order:
            times[name]["forward"] += _timed(runs[name][0], 1)
            times[name]["forward+backward"] += _timed(runs[name][1], 1)
    return {name: {what: {"median_s": statistics.median(x), "min_s": min(x), "max_s": max(x),
                          "ratio_to_causal": statistics.median(x) / statistics.median(times["causal"][what])}
                   for what, x in d.items()} for name, d in times.items()}


def flex(t: int, heads: int, rounds: int) -> dict:
    """FlexAttention's compiled CPU forward of packed documents, against the kernel's, side by side."""
    import numpy as np
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from attnlab import attention, masks

    doc = t // 8

    def doc_causal(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx // doc == kv_idx // doc)

    t0 = time.perf_counter()
    block = create_block_mask(doc_causal, B=None, H=None, Q_LEN=t, KV_LEN=t, device="cpu")
    compiled = torch.compile(flex_attention)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, heads, t, 64, generator=g) for _ in range(3))
    with torch.no_grad():
        compiled(q, k, v, block_mask=block)  # compile and warm, outside the timing
    setup = time.perf_counter() - t0
    description = masks.documents(np.repeat(np.arange(8), doc)) & masks.causal()
    runs = {"flex_attention (compiled)": lambda: compiled(q, k, v, block_mask=block),
            "attnlab kernel": lambda: attention(q, k, v, mask=description, backend="kernel")}
    got = {name: [] for name in runs}
    with torch.no_grad():  # both against the float64 blockwise loop (O(T) memory), not against each other
        exact = attention(q.double(), k.double(), v.double(), mask=description, backend="blockwise")
        errors = {"flex_attention": float((compiled(q, k, v, block_mask=block).double() - exact).abs().max()),
                  "attnlab kernel": float((attention(q, k, v, mask=description, backend="kernel").double() - exact).abs().max())}
        for r in range(rounds):
            for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                got[name] += _timed(runs[name], 1)
    med = {name: statistics.median(x) for name, x in got.items()}
    return {"forward_median_s": med, "kernel_over_flex": med["attnlab kernel"] / med["flex_attention (compiled)"],
            "compile_and_warm_s": setup, "max_abs_error_vs_float64": errors,
            "backward": "FlexAttention does not support backward on CPU (torch " + torch.__version__ + ")"}


def callable_memory(t: int) -> dict:
    """A mask_mod callable through blockwise (NumPy loop, tile by tile): extra memory and time."""
    import numpy as np

    from attnlab import attention, masks

    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 1, t, 64)).astype(np.float32) for _ in range(3))
    doc = t // 8

    def doc_causal(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx // doc == kv_idx // doc)

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    out = attention(q, k, v, mask=doc_causal, backend="blockwise")
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] - base - out.nbytes
    tracemalloc.stop()
    description = masks.documents(np.repeat(np.arange(8), doc)) & masks.causal()
    t0 = time.perf_counter()
    fused = attention(q, k, v, mask=description, backend="kernel")
    kernel_s = time.perf_counter() - t0
    return {"t": t, "blockwise_callable_s": seconds, "extra_memory_mb": peak / 2**20,
            "kernel_object_s": kernel_s, "blockwise_over_kernel": seconds / kernel_s,
            "max_abs_difference": float(np.abs(out - fused).max())}


def main() -> None:
    import torch

    from attnlab.backends import kernel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--t", type=int, default=8192)
    ap.add_argument("--heads", default="4,12")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--callable-t", type=int, default=16384)
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    result = {"machine": {"isa": kernel.isa(), "threads": torch.get_num_threads(), "python": platform.python_version(),
                          "torch": torch.__version__, "cpu_count": os.cpu_count(), "load_average": os.getloadavg()},
              "t": args.t, "rounds": args.rounds, "heads": {}}
    for h in [int(x) for x in args.heads.split(",")]:
        result["heads"][h] = {"kernel": measure(args.t, h, args.rounds)}
        if not args.no_flex:
            result["heads"][h]["flex"] = flex(args.t, h, args.rounds)
        print(json.dumps({h: result["heads"][h]}, indent=1))
    result["callable"] = callable_memory(args.callable_t)
    print(json.dumps(result["callable"], indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
