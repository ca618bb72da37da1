"""attnlab's transformer against transformers on the default model (all-MiniLM-L6-v2).

    .venv/bin/python benchmarks/bench_transformer.py [--sentences 1000] [--batch-size 32]
        [--backends torch,sdpa,blockwise,kernel,numpy,auto] [--speed-backends auto,kernel] [--json F]

1. Max |difference| of the last hidden state against transformers' forward (float32, eager and
   SDPA attention), per attention backend, on the lesson's two "bank" sentences in one padded batch
   (real tokens only).
2. The time of a forward pass over ``--sentences`` generated sentences (seeded, 4–40 words, sorted by
   length, the same batches for both; tokenising is outside the timing): attnlab's transformer with
   each of ``--speed-backends`` against transformers' SDPA forward, one run each, wall and CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

BANK = ["I sat on the bank of the river.", "I put the money in the bank."]
WORDS = ("the river bank money water bridge walked slowly quickly under over a an and but said that it was "
         "people trees boat fish city market paid loan interest account sat stood near across old new small "
         "large green cold warm morning evening because while").split()


def make_sentences(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 41)))).capitalize() + "." for _ in range(n)]


def isa() -> str:
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "other"


def main() -> None:
    import torch
    from transformers import AutoModel

    from attnlab.locate.folder import resolve
    from attnlab.transformer import Transformer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--backends", default="torch,sdpa,blockwise,kernel,numpy,auto")
    ap.add_argument("--speed-backends", default="auto")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    folder = resolve(None)[0]
    ours = Transformer.from_pretrained()
    tok = ours.tokenizer
    refs = {a: AutoModel.from_pretrained(folder, attn_implementation=a, dtype=torch.float32).eval()
            for a in ("eager", "sdpa")}
    result: dict = {"machine": {"cpu_isa": isa(), "threads": torch.get_num_threads(), "python": platform.python_version(),
                                "torch": torch.__version__, "load_average": os.getloadavg()}}

    enc = tok(BANK, padding=True, return_tensors="pt")
    real = enc["attention_mask"].bool()
    diffs = {}
    with torch.inference_mode():
        theirs = {a: m(**enc).last_hidden_state for a, m in refs.items()}
        for b in args.backends.split(","):
            h = ours(enc["input_ids"], enc["attention_mask"], backend=b)
            diffs[b] = {a: float((h - t)[real].abs().max()) for a, t in theirs.items()}
    result["max_abs_diff"] = diffs

    sentences = sorted(make_sentences(args.sentences), key=len)
    batches = [tok(sentences[i:i + args.batch_size], padding=True, return_tensors="pt")
               for i in range(0, len(sentences), args.batch_size)]
    tokens = int(sum(int(b["attention_mask"].sum()) for b in batches))

    def timed(fn) -> dict:
        w, c = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            for b in batches:
                fn(b)
        return {"wall_s": time.perf_counter() - w, "cpu_s": time.process_time() - c}

    with torch.inference_mode():  # one untimed batch each: first-call costs (and auto's measuring) stay out
        refs["sdpa"](**batches[0])
        for b in args.speed_backends.split(","):
            ours(batches[0]["input_ids"], batches[0]["attention_mask"], backend=b)
    speed = {"transformers_sdpa": timed(lambda b: refs["sdpa"](**b))}
    for name in args.speed_backends.split(","):
        speed[f"attnlab_{name}"] = timed(lambda b, n=name: ours(b["input_ids"], b["attention_mask"], backend=n))
    base = speed["transformers_sdpa"]
    for name, s in speed.items():
        s["ratio_wall"] = s["wall_s"] / base["wall_s"]
        s["ratio_cpu"] = s["cpu_s"] / base["cpu_s"]
    result["speed"] = {"sentences": len(sentences), "batch_size": args.batch_size, "tokens": tokens, "runs": speed}
    result["machine"]["load_average_after"] = os.getloadavg()

    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
