"""Corpus statistics on the default model: how long 1,000 sentences of up to 128 tokens take.

    .venv/bin/python benchmarks/bench_corpus.py [--sentences 1000] [--batch-size 32] [--repeats 1] [--json F]

The sentences are generated deterministically (seeded) from a small vocabulary, with lengths
spread from 4 to ~120 words so that, with [CLS]/[SEP] and word pieces, no sentence passes 128
tokens. Reported: wall time of the whole `corpus_roles` run (capture + word aggregation + role
scores) and of capture alone, median over the repeats, side by side in one run, with the
machine's thread count.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

WORDS = ("the river bank money water bridge walked slowly quickly under over a an and but said that it was "
         "people trees boat fish city market paid loan interest account sat stood near across old new small "
         "large green cold warm morning evening because while").split()
MAX_TOKENS = 128


def make_sentences(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(4, 120))
        words = rng.choice(WORDS, size=length)
        out.append(" ".join(words).capitalize() + rng.choice([".", "!", "?"]))
    return out


def main() -> None:
    import torch

    from attnlab.interventions.corpus import corpus_roles
    from attnlab.hf.capture import iter_capture
    from attnlab.hf.loading import load_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()

    lm = load_model()
    sentences = make_sentences(args.sentences)
    lengths = [len(lm.tokenizer(s)["input_ids"]) for s in sentences]
    assert max(lengths) <= MAX_TOKENS, max(lengths)
    corpus_roles(sentences[:8], lm)  # warm-up
    full, capture_only = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _batch in iter_capture(sentences, lm, batch_size=args.batch_size):
            pass
        t1 = time.perf_counter()
        corpus_roles(sentences, lm, batch_size=args.batch_size)
        t2 = time.perf_counter()
        capture_only.append(t1 - t0)
        full.append(t2 - t1)
    result = {
        "model": lm.model_id, "sentences": len(sentences), "tokens_mean": float(np.mean(lengths)),
        "tokens_max": int(max(lengths)), "batch_size": args.batch_size, "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
        "corpus_roles_s_median": statistics.median(full), "capture_only_s_median": statistics.median(capture_only),
    }
    result["sentences_per_s"] = len(sentences) / result["corpus_roles_s_median"]
    result["role_overhead_ratio"] = result["corpus_roles_s_median"] / result["capture_only_s_median"]
    print(json.dumps(result, indent=2))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
