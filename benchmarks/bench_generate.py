"""Generation: attnlab's ``Transformer.generate`` against transformers' ``generate`` on the same weights.

    .venv/bin/python benchmarks/bench_generate.py [--quick] [--lengths 512,2048,8192,32768] [--new 64]
        [--rounds 5] [--threads 2] [--json benchmarks/results/generate.json]

A Llama-style model of realistic shape with random weights (d = 512, 8 layers, 8 query heads, 2 k/v
heads, head dim 64, SwiGLU 1,408, vocabulary 32,000), float32, greedy (``eos_token_id=None``: random
weights never stop early), ``--threads`` threads. Per prompt length: time to the first token (the
prefill and one choice) and time per output token after it, from each token's arrival time
(attnlab's ``on_token``, transformers' ``streamer``), as medians of ``--rounds`` rounds in which
the runs follow one another (the order alternating), with the spread (min–max); the ratio is
attnlab / transformers. ``attnlab-sdpa`` is attnlab's generate with every step's attention on SDPA
(``backend="sdpa"``), without the compiled decode pass that auto takes: the decode pass's own share. Memory: the KV cache's bytes (``Generation.cache``, and 2·L·H_kv·D·T·4) beside
the process's peak resident memory after that length (lengths ascending, both libraries in one process).
Last, greedy tokens per second of the default ``attnlab generate`` (the bundled attnlab:decoder).
``--quick``: lengths 128 and 512, 16 new tokens, 3 rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import time
from pathlib import Path

SHAPE = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
             intermediate_size=1408, vocab_size=32000)


class Arrivals:
    """transformers' streamer interface: the first put() is the prompt, each later one a new token."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.prompt_seen = False

    def put(self, value) -> None:  # noqa: ANN001
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def models(max_len: int):
    """(transformers' LlamaForCausalLM, attnlab's Transformer) with the same random weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from attnlab.transformer import Transformer, TransformerConfig
    from attnlab.transformer.weights import convert

    torch.manual_seed(0)
    cfg = LlamaConfig(**SHAPE, max_position_embeddings=max_len, tie_word_embeddings=False, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None, attn_implementation="sdpa")
    hf = LlamaForCausalLM(cfg).eval()
    c = TransformerConfig.from_hf(cfg.to_dict())
    ours = Transformer(c).eval().requires_grad_(False)
    ours.load_state_dict(convert(hf.state_dict(), c), strict=True)
    return hf, ours


def one(run) -> tuple[float, float, list[float]]:  # noqa: ANN001
    """(time to first token, time per output token after it, arrival times) of one generation."""
    start = time.perf_counter()
    times, extra = run()
    ttft = times[0] - start
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else float("nan")
    return ttft, tpot, extra


def runners(hf, ours, ids, new: int) -> dict:  # noqa: ANN001
    import torch

    def theirs():
        arr = Arrivals()
        with torch.inference_mode():
            hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None,
                        pad_token_id=0, streamer=arr, attention_mask=torch.ones_like(ids))
        return arr.times, None

    def mine(backend=None):  # noqa: ANN001
        times: list[float] = []
        gen = ours.generate(ids, new, on_token=lambda step, tok: times.append(time.perf_counter()), backend=backend)
        return times, gen.cache

    return {"transformers": theirs, "attnlab": mine, "attnlab-sdpa": lambda: mine("sdpa")}


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def at_length(hf, ours, T: int, new: int, rounds: int) -> dict:  # noqa: ANN001
    import torch

    ids = torch.randint(0, SHAPE["vocab_size"], (1, T), generator=torch.Generator().manual_seed(T))
    run = runners(hf, ours, ids, new)
    for warm in runners(hf, ours, ids, 2).values():  # one untimed call each at this length: first-call costs (and auto's measuring) stay out
        warm()
    got = {name: {"ttft": [], "tpot": []} for name in run}
    cache = None
    for r in range(rounds):
        for name in (list(run) if r % 2 == 0 else list(run)[::-1]):
            ttft, tpot, extra = one(run[name])
            got[name]["ttft"].append(ttft)
            got[name]["tpot"].append(tpot)
            cache = extra if extra is not None else cache
    out = {name: {"time_to_first_token_s": spread(g["ttft"]), "time_per_output_token_s": spread(g["tpot"])}
           for name, g in got.items()}
    for key in ("time_to_first_token_s", "time_per_output_token_s"):
        out[f"ratio_{key}"] = out["attnlab"][key]["median"] / out["transformers"][key]["median"]
    tpot = "time_per_output_token_s"
    out["ratio_decode_pass_" + tpot] = out["attnlab"][tpot]["median"] / out["attnlab-sdpa"][tpot]["median"]
    c = ours.config
    out["cache"] = cache
    out["cache_bytes_formula"] = 2 * c.num_layers * c.heads_kv * c.head_dim * (T + new - 1) * 4
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def default_decoder(new: int, rounds: int) -> dict:
    """Greedy tokens per second of ``attnlab generate`` with no --model (the bundled decoder)."""
    from attnlab.transformer import DEFAULT_DECODER, Transformer

    net = Transformer.from_pretrained(DEFAULT_DECODER)
    rates = []
    for _ in range(rounds):
        times: list[float] = []
        net.generate("Return the number of", new, stop_at_eos=False, on_token=lambda s, t: times.append(time.perf_counter()))
        rates.append((len(times) - 1) / (times[-1] - times[0]))
    return {"model": DEFAULT_DECODER, "new_tokens": new, "tokens_per_second": spread(rates)}


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="lengths 128 and 512, 16 new tokens, 3 rounds")
    ap.add_argument("--lengths", default="512,2048,8192,32768")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=str(Path(__file__).resolve().parent / "results" / "generate.json"))
    args = ap.parse_args()
    lengths = [128, 512] if args.quick else sorted(int(x) for x in args.lengths.split(","))
    new, rounds = (16, 3) if args.quick else (args.new, args.rounds)
    torch.set_num_threads(args.threads)
    hf, ours = models(max(lengths) + new)
    result = {"machine": {"threads": args.threads, "python": platform.python_version(), "torch": torch.__version__,
                          "cpu_count": os.cpu_count(), "load_average": os.getloadavg()},
              "shape": SHAPE, "dtype": "float32", "greedy": True, "new_tokens": new, "rounds": rounds, "lengths": {}}
    for T in lengths:
        result["lengths"][str(T)] = at_length(hf, ours, T, new, rounds)
        r = result["lengths"][str(T)]
        print(f"T={T:6d}  ttft {r['attnlab']['time_to_first_token_s']['median']:.3f} s vs "
              f"{r['transformers']['time_to_first_token_s']['median']:.3f} s ({r['ratio_time_to_first_token_s']:.2f}x)  "
              f"tpot {1e3 * r['attnlab']['time_per_output_token_s']['median']:.1f} ms vs "
              f"{1e3 * r['transformers']['time_per_output_token_s']['median']:.1f} ms ({r['ratio_time_per_output_token_s']:.2f}x)  "
              f"without the decode pass (sdpa) {1e3 * r['attnlab-sdpa']['time_per_output_token_s']['median']:.1f} ms "
              f"({r['ratio_decode_pass_time_per_output_token_s']:.2f}x)  "
              f"cache {r['cache_bytes_formula'] / 2**20:.1f} MiB  peak {r['peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)
    result["default_generate"] = default_decoder(64 if not args.quick else 16, rounds)
    print(f"attnlab generate (attnlab:decoder): {result['default_generate']['tokens_per_second']['median']:.1f} tokens/s")
    result["machine"]["load_average_after"] = os.getloadavg()
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
