"""The context planner against measurement: predicted ÷ measured TTFT and TPOT of attnlab's generate.

    .venv/bin/python benchmarks/bench_planner.py [--prompts 512,2048,8192] [--new-tokens 32]
        [--configs narrow,wide | --random 4 --seed S] [--threads N] [--repeats 5] [--calibrate]
        [--no-transformers] [--deadline-search] [--compete] [--json F]

For Llama-style configs (random weights, float32, attnlab's default backend): two named ones, or with
``--random N`` N drawn from the family :data:`FAMILY` by ``--seed`` (the configs are printed):

1. this machine's profile at the config's shapes (``attnlab.planner.machine.for_model``; ``--calibrate``
   measures it again) and ``attnlab.planner.verify.verify``: the plan's TTFT and TPOT, with their range,
   beside ``Transformer.generate`` run at each prompt once to warm up and ``--repeats`` times (medians, with
   min–max): the same path as ``attnlab plan --verify``;
2. transformers' ``LlamaForCausalLM.generate`` (SDPA, the same config, greedy, no early stop) beside it
   (``--no-transformers`` skips it);
3. each row: predicted, measured and predicted ÷ measured for TTFT and TPOT (target: within ±15 %), and the
   term the prediction's largest share is in;
4. ``--deadline-search``: a deadline on the total between two measured rows; the largest prompt meeting it
   found by measuring (bisection with generate, to 64 tokens) against the planner's ``max_prompt_tokens``
   (target: within 10 %);
5. ``--compete``: a second process spinning on one core for the whole run, so that the profile's spread
   shows a busy machine (the plan says so, and the profile is not cached).

It prints the machine (CPU, threads, load) and one line per row.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

CONFIGS = {  # config.json-style dicts: one source for attnlab's config, transformers' and the planner's
    "narrow": {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 2048},
    "wide": {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
             "num_key_value_heads": 8, "intermediate_size": 1376, "vocab_size": 4096},
}
TARGET_RATIO, TARGET_SEARCH = 0.15, 0.10
# the family --random draws from (issue 29): head width 32-256, 1-8 query heads per k/v head, d 128-1,024,
# 2-12 layers; the feed-forward 2.5-4 d (a multiple of 32), the vocabulary one of three sizes
FAMILY = {"head_dim": (32, 48, 64, 80, 96, 128, 160, 192, 256), "group": (1, 2, 3, 4, 5, 6, 8), "d": (128, 1024),
          "layers": (2, 12), "ff": (2.5, 4.0), "vocab": (2048, 8192, 32000)}


def random_config(rng: random.Random) -> dict:
    """One config of :data:`FAMILY`: its heads split d exactly, the query heads a multiple of the k/v heads."""
    while True:
        head_dim, group = rng.choice(FAMILY["head_dim"]), rng.choice(FAMILY["group"])
        kv = [k for k in range(1, 33) if FAMILY["d"][0] <= k * group * head_dim <= FAMILY["d"][1]]
        if kv:
            break
    k = rng.choice(kv)
    d = k * group * head_dim
    return {"model_type": "llama", "hidden_size": d, "num_hidden_layers": rng.randint(*FAMILY["layers"]),
            "num_attention_heads": k * group, "num_key_value_heads": k, "head_dim": head_dim,
            "intermediate_size": round(d * rng.uniform(*FAMILY["ff"]) / 32) * 32, "vocab_size": rng.choice(FAMILY["vocab"])}


def _config(shape: dict, positions: int) -> dict:
    return dict(shape, max_position_embeddings=positions, rms_norm_eps=1e-6, tie_word_embeddings=False,
                hidden_act="silu", rope_theta=10000.0, torch_dtype="float32")


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
    """Each figure [median, min, max] over ``repeats`` runs after a warm one."""
    from attnlab.planner.noise import summary

    run()  # warm: a length's first run pays its first calls' costs
    runs = [run() for _ in range(repeats)]
    return {k: summary([r[k] for r in runs]) for k in runs[0]}


def search_measured(model, lo: int, hi: int, deadline_s: float, new: int) -> int:  # noqa: ANN001
    """The largest prompt (multiple of 64) whose measured total meets the deadline, between lo (meets) and hi."""
    from attnlab.planner.verify import run_once

    while hi - lo > 64:
        mid = (lo + hi) // 2 // 64 * 64
        if mid <= lo:
            break
        if run_once(model, mid, new)["total_s"] <= deadline_s:
            lo = mid
        else:
            hi = mid
    return lo


def run_config(name: str, shape: dict, args: argparse.Namespace) -> dict:
    from attnlab.planner.machine import for_model
    from attnlab.planner.verify import verify
    from attnlab.transformer import TransformerConfig

    hf = _config(shape, max(args.prompts) + args.new_tokens + 1)
    cfg = TransformerConfig.from_hf(hf)
    hw = for_model(cfg, "float32", refresh=args.calibrate)
    v = verify(cfg, list(args.prompts), args.new_tokens, "float32", args.repeats, hardware=hw)
    theirs = None
    if not args.no_transformers:
        import transformers

        theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf, attn_implementation="sdpa")).eval()
    rows = []
    for c, p in zip(v.checks, v.plan.rows):
        t = (median_of(args.repeats, lambda: measure_transformers(theirs, c.prompt_tokens, args.new_tokens,
                                                                  hf["vocab_size"])) if theirs is not None else None)
        rows.append(dict(c.to_dict(), transformers=t, limited_by=p.limited_by, total_s=p.total_s,
                         terms=[term.to_dict() for term in p.terms]))
        print_row(name, rows[-1])
    out = {"config": hf, "rows": rows, "hardware": hw.to_dict(), "notes": list(v.notes)}
    for note in v.notes:
        print(f"  note: {note}", flush=True)
    if args.deadline_search and len(rows) >= 3:
        from attnlab.planner.verify import build

        out["search"] = deadline_search(cfg, hw, build(v.plan.model, "float32", max(args.prompts) + args.new_tokens + 1),
                                        rows, args)
    return out


def deadline_search(cfg, hw, model, rows: list[dict], args: argparse.Namespace) -> dict:  # noqa: ANN001
    from attnlab.planner import plan

    i = len(rows) - 2  # between the two largest measured rows
    a, b = rows[i - 1], rows[i]
    deadline_s = (a["total_s"] * b["total_s"]) ** 0.5
    measured = search_measured(model, a["prompt_tokens"], b["prompt_tokens"], deadline_s, args.new_tokens)
    p = plan(cfg, hw, prompt_tokens=a["prompt_tokens"], new_tokens=args.new_tokens, dtype="float32",
             deadline_ms=deadline_s * 1000)
    best = p.max_prompt_tokens
    result = {"deadline_ms": deadline_s * 1000, "measured_max_prompt": measured, "predicted_max_prompt": best,
              "predicted_range": p.max_prompt_range, "ratio": None if best is None else best / measured}
    said = "none meets it" if best is None else f"{best:,} (ratio {result['ratio']:.3f})"
    print(f"  deadline {deadline_s * 1000:,.0f} ms on the total: largest prompt measured {measured:,}, predicted "
          f"{said}, range {p.max_prompt_range}; target within ±{TARGET_SEARCH:.0%}", flush=True)
    return result


def _ms(m: list) -> str:
    """[median, low, high] seconds as "6.3 ms (5.8–7.0)"; the figure alone where no range is known."""
    if m[1] is None:
        return f"{m[0] * 1e3:,.2f} ms"
    return "{:,.2f} ms ({:,.2f}–{:,.2f})".format(*(1e3 * x for x in m))


def print_row(name: str, r: dict) -> None:
    ok = lambda x: "ok" if abs(x - 1) <= TARGET_RATIO else "OFF"  # noqa: E731
    t = r["transformers"]
    beside = (f" | transformers TTFT {_ms(t['ttft_s'])} TPOT {_ms(t['tpot_s'])} (attnlab ÷ transformers "
              f"{r['measured_ttft_s'][0] / t['ttft_s'][0]:.2f} / {r['measured_tpot_s'][0] / t['tpot_s'][0]:.2f})"
              if t else "")
    print(f"{name:8} n={r['prompt_tokens']:6,}  TTFT pred {_ms(r['predicted_ttft_s'])} meas {_ms(r['measured_ttft_s'])} "
          f"ratio {r['ttft_ratio']:.3f} {ok(r['ttft_ratio']):3} | TPOT pred {_ms(r['predicted_tpot_s'])} meas "
          f"{_ms(r['measured_tpot_s'])} ratio {r['tpot_ratio']:.3f} {ok(r['tpot_ratio']):3} | {r['limited_by']}{beside}",
          flush=True)


def _shapes(args: argparse.Namespace) -> dict[str, dict]:
    if not args.random:
        return {name: CONFIGS[name] for name in args.configs.split(",")}
    rng = random.Random(args.seed)
    shapes = {f"random{i}": random_config(rng) for i in range(args.random)}
    for name, c in shapes.items():
        print(f"{name}: d {c['hidden_size']}, {c['num_hidden_layers']} layers, {c['num_attention_heads']} heads of "
              f"{c['head_dim']} over {c['num_key_value_heads']} k/v, ff {c['intermediate_size']}, vocab "
              f"{c['vocab_size']}", flush=True)
    return shapes


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="512,2048,8192")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--random", type=int, default=0, help="draw this many configs from FAMILY instead")
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5, help="runs per row (medians)")
    ap.add_argument("--calibrate", action="store_true", help="measure the planner's rates again first")
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--deadline-search", action="store_true")
    ap.add_argument("--compete", action="store_true", help="run a process spinning on one core beside")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.prompts = tuple(int(x) for x in args.prompts.split(","))
    return args


def main() -> None:
    import torch

    from attnlab.backends.calibrate import machine_facts

    args = _args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rival = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.compete else None
    facts = machine_facts()
    print(f"{facts['cpu']}, {os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} threads, "
          f"ISA {os.environ.get('ATEN_CPU_CAPABILITY', 'default')}, load average {os.getloadavg()[0]:.1f}"
          + (", beside a competing process" if rival else ""), flush=True)
    result = {"machine": dict(facts, torch_threads=torch.get_num_threads(), load_average=os.getloadavg()),
              "new_tokens": args.new_tokens, "seed": args.seed if args.random else None, "compete": args.compete,
              "configs": {}}
    try:
        for name, shape in _shapes(args).items():
            result["configs"][name] = run_config(name, shape, args)
    finally:
        if rival is not None:
            rival.kill()
    ratios = [r[k] for c in result["configs"].values() for r in c["rows"] for k in ("ttft_ratio", "tpot_ratio")]
    within = sum(abs(x - 1) <= TARGET_RATIO for x in ratios)
    print(f"{within} of {len(ratios)} ratios within ±{TARGET_RATIO:.0%}; load average now {os.getloadavg()[0]:.1f}",
          flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
