"""Long inputs on a tiny Llama-style model (4 layers × 8 heads, RoPE, grouped-query attention,
32,768 positions, random init, built locally): what head_stats and capture cost against the plain
forward of the same input through transformers' SDPA attention.

Each measurement runs in a fresh process, so its peak resident memory (``ru_maxrss``) is its own;
the process's resident memory after loading the model (``base``) is reported beside it.

    .venv/bin/python benchmarks/bench_long.py --tokens 32768 --json /tmp/long_32768.json
    .venv/bin/python benchmarks/bench_long.py --tokens 4096,8192,16384,32768 --modes stats --json ...
    .venv/bin/python benchmarks/bench_long.py --tokens 2048 --modes capture,sdpa --json ...

Modes: ``stats`` (attnlab.head_stats: the kernel's forward taking the statistics in the same pass),
``sdpa`` (AutoModel with attn_implementation="sdpa", no weights), ``capture`` (attnlab.capture: every
weight, [L, H, T, T]), ``ratio`` (head_stats and the SDPA forward alternated in one process for
three rounds, the median of each: on a loaded machine the fairest time ratio; head_stats with its two passes
too, the forward and then the statistics pass, as where the one pass's kept tiles would not fit), ``kernel``
(one layer's attention alone, random q, k, v of the model's shapes: the kernel's forward, with the statistics
in the same pass, and followed by the statistics pass, alternated five times: medians). Dense maps of T
tokens would need L · H · T² · 4 bytes.

``--before SO`` (ratio mode): also time head_stats with the compiled kernel loaded from SO, a build of
``_tiles.c`` from another commit, in the same rounds, so a change to the kernel is measured before and
after in one run (e.g. ``git show REV:src/attnlab/backends/kernel/_tiles.c`` and its headers built with
the ``gcc`` line of ``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

LAYERS, HEADS, KV_HEADS, HIDDEN, FFN, POSITIONS = 4, 8, 4, 256, 512, 32768
WORDS = ("the river runs past the bank and the money sits in the bank while I sat on the bank of the "
         "river slowly counting boats that drift under old bridges toward a quiet sea").split()


def build(folder: Path) -> None:
    """The tiny model and a word-level tokenizer (one token per word, a <s> first) in ``folder``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaModel, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>", *sorted(set(WORDS))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", model_max_length=POSITIONS)
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    LlamaModel(LlamaConfig(vocab_size=len(vocab), hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                           max_position_embeddings=POSITIONS)).save_pretrained(folder)


def text(tokens: int) -> str:
    """Words (one token each) for ``tokens`` tokens with the leading <s>."""
    import numpy as np

    return " ".join(np.random.default_rng(0).choice(WORDS, tokens - 1))


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _kernel_from(path: str):
    """The compiled kernel module of another build, loaded beside this one's."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader("before._tiles", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location("before._tiles", path, loader=loader))
    loader.exec_module(module)
    return module


def measure(mode: str, folder: Path, tokens: int, before: str | None = None) -> dict:
    """One measurement, in this process (run by the parent in a fresh one)."""
    import torch

    from attnlab.hf.loading import load_model

    if mode == "kernel":
        return kernel_passes(tokens)
    words = text(tokens)
    if mode == "ratio":
        return ratio(folder, words, tokens, before=before)
    if mode == "sdpa":
        from transformers import AutoModel, AutoTokenizer

        net = AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval()
        ids = AutoTokenizer.from_pretrained(folder)(words, return_tensors="pt")["input_ids"]
        assert ids.shape[1] == tokens
        base = rss_mib()
        start = time.perf_counter()
        with torch.inference_mode():
            net(input_ids=ids)
        seconds = time.perf_counter() - start
    else:
        lm = load_model(folder)
        base = rss_mib()
        start = time.perf_counter()
        if mode == "stats":
            from attnlab.interventions.stats import head_stats

            found = head_stats(words, lm)
            assert found.received[0].shape == (LAYERS, HEADS, tokens)
        else:
            from attnlab.hf.capture import capture

            maps = capture([words], lm)
            assert maps.weights[0].shape == (LAYERS, HEADS, tokens, tokens)
        seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": mode, "tokens": tokens, "seconds": seconds, "peak_mib": peak, "base_mib": base,
            "dense_maps_gb": LAYERS * HEADS * tokens**2 * 4 / 1e9, "threads": torch.get_num_threads()}


def ratio(folder: Path, words: str, tokens: int, rounds: int = 3, before: str | None = None) -> dict:
    """head_stats and the plain SDPA forward, alternated ``rounds`` times in this process: medians (with
    ``before``, head_stats with that build of the kernel too, in the same rounds)."""
    import statistics

    import torch
    from transformers import AutoModel

    from attnlab.interventions.stats import head_stats
    from attnlab.hf.loading import load_model

    lm = load_model(folder)
    net = AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval()
    ids = lm.tokenizer(words, return_tensors="pt")["input_ids"]
    from attnlab.backends import kernel

    from attnlab.backends.kernel import fused

    builds = {"stats": kernel._tiles} | ({"stats_before": _kernel_from(before)} if before else {})
    kept = fused.KEPT_BYTES
    runs = {name: (build, kept) for name, build in builds.items()} | {"two_passes": (kernel._tiles, 0)}
    times: dict[str, list[float]] = {"sdpa": [], **{name: [] for name in runs}}
    for _ in range(rounds):
        start = time.perf_counter()
        with torch.inference_mode():
            net(input_ids=ids)
        times["sdpa"].append(time.perf_counter() - start)
        for name, (build, fits) in runs.items():  # two_passes: nothing fits, the statistics pass after the forward
            kernel._tiles, fused.KEPT_BYTES = build, fits
            start = time.perf_counter()
            head_stats(words, lm)
            times[name].append(time.perf_counter() - start)
        kernel._tiles, fused.KEPT_BYTES = builds["stats"], kept
    med = {k: statistics.median(v) for k, v in times.items()}
    extra = {"before_seconds": med["stats_before"], "before_ratio": med["stats_before"] / med["sdpa"]} if before else {}
    extra |= {"two_passes_seconds": med["two_passes"], "two_passes_ratio": med["two_passes"] / med["sdpa"]}
    return {"mode": "ratio", "tokens": tokens, "seconds": med["stats"], "sdpa_seconds": med["sdpa"],
            "ratio": med["stats"] / med["sdpa"], **extra, "rounds": times, "peak_mib": float("nan"), "base_mib": float("nan"),
            "dense_maps_gb": LAYERS * HEADS * tokens**2 * 4 / 1e9, "threads": torch.get_num_threads()}


def kernel_passes(tokens: int, rounds: int = 5) -> dict:
    """The attention alone at the model's shapes (8 query heads over 4 key/value heads, D = 32, causal, random
    q, k, v): the kernel's forward, the forward then the statistics pass, and the forward taking the statistics
    in the same pass (kernel.fused), alternated ``rounds`` times in this process: medians."""
    import statistics

    import numpy as np

    from attnlab import masks
    from attnlab.backends import kernel
    from attnlab.backends.kernel import fused
    from attnlab.backends.tiling import Tiling
    from attnlab.backends.visible import describe

    rng = np.random.default_rng(0)
    g, d = HEADS // KV_HEADS, HIDDEN // HEADS
    q = rng.standard_normal((KV_HEADS, g, tokens, d), dtype=np.float32)
    k, v = (rng.standard_normal((KV_HEADS, tokens, d), dtype=np.float32) for _ in range(2))
    tiling, scale = Tiling(tokens, tokens, describe(masks.causal(), tokens, tokens, (KV_HEADS, g))), d**-0.5
    times: dict[str, list[float]] = {"forward": [], "two_passes": [], "one_pass": []}
    for _ in range(rounds):
        start = time.perf_counter()
        _, lse = kernel.forward(q, k, v, tiling, scale=scale)
        times["forward"].append(time.perf_counter() - start)
        kernel.stats(q, k, lse, scale=scale, mask=masks.causal())
        times["two_passes"].append(time.perf_counter() - start)
        start = time.perf_counter()
        fused.forward_stats(q, k, v, tiling, scale=scale)
        times["one_pass"].append(time.perf_counter() - start)
    med = {name: statistics.median(x) for name, x in times.items()}
    return {"mode": "kernel", "tokens": tokens, "seconds": med["one_pass"], "forward_seconds": med["forward"],
            "two_passes_seconds": med["two_passes"], "one_pass_ratio": med["one_pass"] / med["forward"],
            "two_passes_ratio": med["two_passes"] / med["forward"], "rounds": times, "peak_mib": float("nan"),
            "base_mib": float("nan"), "dense_maps_gb": LAYERS * HEADS * tokens**2 * 4 / 1e9, "threads": None}


def cpu_flags() -> str:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return platform.machine()
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE/other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="32768", help="comma-separated input lengths")
    ap.add_argument("--modes", default="stats,sdpa", help="comma-separated: stats, sdpa, capture, ratio, kernel")
    ap.add_argument("--folder", default="/tmp/attnlab-bench-long-llama", help="where the tiny model is built")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--before", default=None, metavar="SO", help="ratio mode: also head_stats with this kernel build")
    ap.add_argument("--one", nargs=2, metavar=("MODE", "TOKENS"), help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args()
    folder = Path(args.folder)
    if args.one:
        print(json.dumps(measure(args.one[0], folder, int(args.one[1]), args.before)))
        return
    if not (folder / "config.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        build(folder)
    env = {**os.environ, "ATTNLAB_CALIBRATE": "0"}
    results = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        for mode in args.modes.split(","):
            before = ["--before", args.before] if args.before else []
            out = subprocess.run([sys.executable, __file__, "--folder", str(folder), *before, "--one", mode, str(tokens)],
                                 capture_output=True, text=True, env=env)
            if out.returncode:
                sys.exit(f"{mode} at {tokens} tokens failed:\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results.append(r)
            if mode == "ratio":
                print(f"ratio    T={tokens:6}  head_stats {r['seconds']:.2f} s / SDPA forward {r['sdpa_seconds']:.2f} s "
                      f"= {r['ratio']:.2f} (medians of 3 alternated rounds)", flush=True)
                print(f"         two passes (the forward, then the statistics pass): head_stats "
                      f"{r['two_passes_seconds']:.2f} s = {r['two_passes_ratio']:.2f} the SDPA forward", flush=True)
                if "before_ratio" in r:
                    print(f"         before ({args.before}): head_stats {r['before_seconds']:.2f} s "
                          f"= {r['before_ratio']:.2f} the SDPA forward", flush=True)
                continue
            if mode == "kernel":
                print(f"kernel   T={tokens:6}  attention of one layer: forward {r['forward_seconds']:.3f} s; with the "
                      f"statistics in the same pass {r['one_pass_ratio']:.2f}x it, then the statistics pass "
                      f"{r['two_passes_ratio']:.2f}x it (medians of 5 alternated rounds)", flush=True)
                continue
            print(f"{mode:8} T={tokens:6}  {r['seconds']:8.2f} s  peak {r['peak_mib']:8.0f} MiB "
                  f"(after loading {r['base_mib']:6.0f} MiB)  dense maps would be {r['dense_maps_gb']:.1f} GB", flush=True)
    meta = {"cpu": platform.processor() or platform.machine(), "isa": cpu_flags(), "cores": os.cpu_count(),
            "model": {"layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS, "hidden": HIDDEN, "ffn": FFN}}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
