"""Activation patching: batched (many patches share one forward) against one forward pass per head.

    .venv/bin/python benchmarks/bench_patching.py [--quick] [--tokens 32] [--rounds 5] [--threads 2]
        [--json benchmarks/results/patching.json]

An [L, H] grid of ``attnlab.patch(site="z", over="head")``, one clean / corrupted pair (B = 1, the
corrupted text differing in one word), the metric a logit difference at the last position. Two
models: the bundled attnlab:decoder (Llama-style, 4 layers × 4 heads, d = 128) and a random model of
GPT-2 small's shape (12 layers × 12 heads, d = 768, vocabulary 50,257), float32, ``--threads`` threads.
Batched is ``copies=None`` (as many patched copies per pass as about PASS_TOKENS positions and
PASS_LOGITS logits allow); one pass per head is ``copies=1``. Each is timed as the median of ``--rounds`` rounds (the two
alternating), with the spread; the speed-up is one-pass-per-head / batched. The two grids are checked
equal (max |difference| printed). ``--quick``: the decoder only, 2 rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

CLEAN, CORRUPTED = "The river runs past the bank and the river", "The money runs past the bank and the river"


def decoder():
    """(the bundled decoder, clean ids, corrupted ids (1, T)), the texts tokenised to one length."""
    import torch

    from attnlab.transformer import DEFAULT_DECODER, Transformer

    net = Transformer.from_pretrained(DEFAULT_DECODER).eval().requires_grad_(False)
    a, b = (net.tokenizer.encode(t, add_special_tokens=False) for t in (CLEAN, CORRUPTED))
    n = min(len(a), len(b))
    return net, torch.tensor([a[:n]]), torch.tensor([b[:n]])


def gpt2_small(tokens: int):
    """A random model of GPT-2 small's shape and random clean / corrupted ids (1, tokens), one position apart."""
    import torch

    from attnlab.transformer import Transformer, TransformerConfig

    torch.manual_seed(0)
    c = TransformerConfig(vocab_size=50257, d_model=768, num_layers=12, num_heads=12, max_positions=1024,
                          activation="gelu_new", family="gpt2")
    net = Transformer(c).eval().requires_grad_(False)
    clean = torch.randint(0, c.vocab_size, (1, tokens))
    corrupted = clean.clone()
    corrupted[0, tokens // 2] = (corrupted[0, tokens // 2] + 1) % c.vocab_size
    return net, clean, corrupted


def measure(net, clean, corrupted, rounds: int) -> dict:
    """Median seconds (and spread) of the grid batched and one pass per head, and their agreement."""
    from attnlab import patch

    def metric(logits):
        return logits[:, -1, 1] - logits[:, -1, 2]

    times = {"batched": [], "one_pass_per_head": []}
    grids = {}
    for r in range(rounds):
        order = ("batched", "one_pass_per_head") if r % 2 == 0 else ("one_pass_per_head", "batched")
        for how in order:
            t0 = time.perf_counter()
            grids[how] = patch(net, clean, corrupted, metric, copies=None if how == "batched" else 1).raw
            times[how].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    c = net.config
    return {"layers": c.num_layers, "heads": c.num_heads, "d_model": c.d_model, "tokens": int(clean.shape[1]),
            "patches": c.num_layers * c.num_heads, "seconds": med,
            "spread": {k: [min(v), max(v)] for k, v in times.items()},
            "speedup": med["one_pass_per_head"] / med["batched"],
            "max_abs_difference": float(abs(grids["batched"] - grids["one_pass_per_head"]).max())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--tokens", type=int, default=32, help="positions of the GPT-2-small-shaped model's inputs")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    rounds = 2 if args.quick else args.rounds
    runs = {"attnlab:decoder": decoder()}
    if not args.quick:
        runs["gpt2-small shape (random)"] = gpt2_small(args.tokens)
    results = {}
    with torch.no_grad():
        for name, (net, clean, corrupted) in runs.items():
            r = results[name] = measure(net, clean, corrupted, rounds)
            print(f"{name}: [{r['layers']}, {r['heads']}] grid, T = {r['tokens']}: batched {r['seconds']['batched']:.3f} s, "
                  f"one pass per head {r['seconds']['one_pass_per_head']:.3f} s, speed-up {r['speedup']:.1f}x "
                  f"(grids differ by at most {r['max_abs_difference']:.1e})")
    if args.json:
        out = {"machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                           "threads": args.threads, "torch": torch.__version__}, "rounds": rounds, "results": results}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
