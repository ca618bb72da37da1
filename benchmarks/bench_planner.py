"""The context planner against measurement: predicted ÷ measured TTFT and TPOT of attnlab's generate.

    .venv/bin/python benchmarks/bench_planner.py [--prompts 512,1024,2048,4096,8192,16384]
        [--new-tokens 32] [--configs narrow,wide] [--threads N] [--repeats 5] [--calibrate] [--no-transformers]
        [--deadline-search] [--json F]

For two Llama-style configs of different shapes (random weights, float32, attnlab's default backend):

1. ``attnlab.plan(config, "this", …)`` predicts TTFT and TPOT from this machine's calibration (the
   planner's measurements of the rates at the config's shapes; ``--calibrate`` measures them again).
2. ``Transformer.generate`` runs each prompt length once to warm up, then ``--repeats`` times, medians reported (``on_token``
   stamps each new token: TTFT is the first stamp, TPOT the mean gap between the later ones, as vLLM
   defines it); transformers'
   ``LlamaForCausalLM.generate`` (SDPA, the same config, greedy, no early stop) is measured beside it
   with a streamer stamping its tokens.
3. Each row: predicted, measured and predicted ÷ measured for TTFT and TPOT (target: within ±15 %),
   and attnlab ÷ transformers. The term the error comes from is where the prediction's largest term is.
4. ``--deadline-search``: a deadline on the total, set between two measured rows; the largest prompt
   meeting it is found by measuring (bisection with generate, to 64 tokens) and compared with the
   planner's ``max_prompt_tokens`` (target: within 10 %).

It prints the machine (CPU, threads, the planner's measured rates) and one table per config.
"""

from __future__ import annotations

import argparse
import json
import os
import time

CONFIGS = {  # config.json-style dicts: one source for attnlab's config, transformers' and the planner's
    "narrow": {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 2048},
    "wide": {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
             "num_key_value_heads": 8, "intermediate_size": 1376, "vocab_size": 4096},
}
TARGET_RATIO, TARGET_SEARCH = 0.15, 0.10


def _config(name: str, positions: int) -> dict:
    return dict(CONFIGS[name], max_position_embeddings=positions, rms_norm_eps=1e-6, tie_word_embeddings=False,
                hidden_act="silu", rope_theta=10000.0)


def measure_attnlab(model, n: int, new: int, vocab: int) -> dict:  # noqa: ANN001
    import torch

    ids = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(n))
    stamps: list[float] = []
    t0 = time.perf_counter()
    model.generate(ids, new, on_token=lambda step, tok: stamps.append(time.perf_counter()))
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"ttft_s": stamps[0] - t0, "tpot_s": sum(gaps) / len(gaps) if gaps else None,
            "total_s": stamps[-1] - t0}


def measure_transformers(model, n: int, new: int, vocab: int) -> dict:  # noqa: ANN001
    import torch

    class Stamps:  # transformers' streamer protocol: put() gets the prompt first, then each new token
        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value) -> None:  # noqa: ANN001
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    ids = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(n))
    s = Stamps()
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, streamer=s, pad_token_id=0, eos_token_id=None)
    tokens = s.times[1:]  # the first put is the prompt
    gaps = [b - a for a, b in zip(tokens, tokens[1:])]
    return {"ttft_s": tokens[0] - t0, "tpot_s": sum(gaps) / len(gaps) if gaps else None, "total_s": tokens[-1] - t0}


def median_of(repeats: int, run) -> dict:  # noqa: ANN001
    """Each figure the median of ``repeats`` runs after a warm one (attnlab's and transformers' alternate by row),
    with its spread over them as ``<figure>_range`` (min, max): how far the machine moves one measurement."""
    import statistics

    run()  # warm: a length's first run pays its first calls' costs (auto's choices for new shapes, allocations)
    runs = [run() for _ in range(repeats)]
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return out | {f"{k}_range": (min(r[k] for r in runs), max(r[k] for r in runs)) for k in runs[0]}


def search_measured(model, lo: int, hi: int, deadline_s: float, new: int, vocab: int) -> int:  # noqa: ANN001
    """The largest prompt (multiple of 64) whose measured total meets the deadline, between lo (meets) and hi."""
    while hi - lo > 64:
        mid = (lo + hi) // 2 // 64 * 64
        if mid <= lo:
            break
        if measure_attnlab(model, mid, new, vocab)["total_s"] <= deadline_s:
            lo = mid
        else:
            hi = mid
    return lo


def run_config(name: str, args: argparse.Namespace) -> dict:
    from attnlab.planner import plan
    from attnlab.planner.machine import this_machine
    from attnlab.planner.models import load_model
    from attnlab.transformer import Transformer, TransformerConfig

    hf = _config(name, max(args.prompts) + args.new_tokens)
    cfg = TransformerConfig.from_hf(hf)
    hw = this_machine(load_model(cfg), "float32", refresh=args.calibrate)
    predicted = plan(cfg, hw, prompt_tokens=list(args.prompts), new_tokens=args.new_tokens, dtype="float32")
    ours = Transformer(cfg).eval()
    theirs = None
    if not args.no_transformers:
        import transformers

        theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf, attn_implementation="sdpa")).eval()
    rows = []
    for n, p in zip(args.prompts, predicted.rows):
        m = median_of(args.repeats, lambda: measure_attnlab(ours, n, args.new_tokens, hf["vocab_size"]))
        t = (median_of(args.repeats, lambda: measure_transformers(theirs, n, args.new_tokens, hf["vocab_size"]))
             if theirs is not None else None)
        rows.append({"prompt": n, "predicted": {"ttft_s": p.ttft_s, "tpot_s": p.tpot_s, "total_s": p.total_s},
                     "attnlab": m, "transformers": t, "limited_by": p.limited_by,
                     "ttft_ratio": p.ttft_s / m["ttft_s"], "tpot_ratio": p.tpot_s / m["tpot_s"],
                     "prefill_terms": {k: v["seconds"] for k, v in p.prefill.items()},
                     "decode_terms": {k: v["seconds"] for k, v in p.decode.items()}})
        print_row(name, rows[-1])
    out = {"config": hf, "rows": rows, "hardware": hw.to_dict()}
    if args.deadline_search and len(rows) >= 3:
        out["search"] = deadline_search(cfg, hw, ours, rows, args, hf["vocab_size"])
    return out


def deadline_search(cfg, hw, model, rows: list[dict], args: argparse.Namespace, vocab: int) -> dict:  # noqa: ANN001
    from attnlab.planner import plan

    i = len(rows) - 2  # between the two largest measured rows
    a, b = rows[i - 1], rows[i]
    deadline_s = (a["attnlab"]["total_s"] * b["attnlab"]["total_s"]) ** 0.5
    measured = search_measured(model, a["prompt"], b["prompt"], deadline_s, args.new_tokens, vocab)
    p = plan(cfg, hw, prompt_tokens=a["prompt"], new_tokens=args.new_tokens, dtype="float32",
             deadline_ms=deadline_s * 1000)
    best = p.max_prompt_tokens
    result = {"deadline_ms": deadline_s * 1000, "measured_max_prompt": measured, "predicted_max_prompt": best,
              "ratio": None if best is None else best / measured}
    said = "none meets it" if best is None else f"{best:,} (ratio {result['ratio']:.3f})"
    print(f"  deadline {deadline_s * 1000:,.0f} ms on the total: largest prompt measured {measured:,}, predicted "
          f"{said}; target within ±{TARGET_SEARCH:.0%}", flush=True)
    return result


def print_row(name: str, r: dict) -> None:
    ok = lambda x: "ok" if abs(x - 1) <= TARGET_RATIO else "OFF"  # noqa: E731
    t = r["transformers"]
    beside = (f" | transformers TTFT {t['ttft_s'] * 1e3:9,.1f} ms TPOT {t['tpot_s'] * 1e3:7,.2f} ms "
              f"(attnlab ÷ transformers {r['attnlab']['ttft_s'] / t['ttft_s']:.2f} / {r['attnlab']['tpot_s'] / t['tpot_s']:.2f})"
              if t else "")
    m = r["attnlab"]
    spread = lambda key: "({:,.1f}–{:,.1f})".format(*(1e3 * x for x in m[f"{key}_range"]))  # noqa: E731
    print(f"{name:6} n={r['prompt']:6,}  TTFT pred {r['predicted']['ttft_s'] * 1e3:9,.1f} ms meas "
          f"{m['ttft_s'] * 1e3:9,.1f} ms {spread('ttft_s')} ratio {r['ttft_ratio']:.3f} {ok(r['ttft_ratio']):3} | TPOT "
          f"pred {r['predicted']['tpot_s'] * 1e3:7,.2f} ms meas {m['tpot_s'] * 1e3:7,.2f} ms {spread('tpot_s')} ratio "
          f"{r['tpot_ratio']:.3f} {ok(r['tpot_ratio']):3} | {r['limited_by']}{beside}", flush=True)


def main() -> None:
    import torch

    from attnlab.backends.calibrate import machine_facts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5, help="runs per row (medians)")
    ap.add_argument("--calibrate", action="store_true", help="measure the planner's rates again first")
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--deadline-search", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.prompts = tuple(int(x) for x in args.prompts.split(","))
    if args.threads:
        torch.set_num_threads(args.threads)
    facts = machine_facts()
    print(f"{facts['cpu']}, {os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    result = {"machine": dict(facts, torch_threads=torch.get_num_threads(), load_average=os.getloadavg()),
              "new_tokens": args.new_tokens, "configs": {}}
    for name in args.configs.split(","):
        result["configs"][name] = run_config(name, args)
        hw = result["configs"][name]["hardware"]
        print(f"  {name}: matmul {hw['matmul']['per_s'] / 1e9:.1f} GFLOP/s, read {hw['bandwidth']['per_s'] / 1e9:.1f} GB/s, "
              f"attention {hw['attention']['per_s'] / 1e9:.1f} GFLOP/s, decode attention "
              f"{hw['decode_attention']['per_s'] / 1e9:.2f} GB/s, {hw['layer_overhead_s'] * 1e6:.0f} µs per layer", flush=True)
    ratios = [r[k] for c in result["configs"].values() for r in c["rows"] for k in ("ttft_ratio", "tpot_ratio")]
    within = sum(abs(x - 1) <= TARGET_RATIO for x in ratios)
    print(f"{within} of {len(ratios)} ratios within ±{TARGET_RATIO:.0%}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
