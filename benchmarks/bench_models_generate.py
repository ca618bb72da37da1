"""Time to first token and time per output token of attnlab's ``generate`` against transformers' ``generate``
on the models of 2025: a gpt-oss-shaped and a DeepSeek-V3-shaped (MLA) model with the same random weights.

    .venv/bin/python benchmarks/bench_models_generate.py [--lengths 2048,16384] [--new 8] [--rounds 3]
        [--long-rounds 1] [--threads 2] [--max-eager-gib 6] [--families gpt_oss,deepseek_v3] [--update]
        [--json benchmarks/results/models_generate.json]

The models are :mod:`bench_models`'s (float32, transformers' weights converted by attnlab's loader), the
gpt-oss one with 8 layers here (d = 512, window 128 alternating with full layers, 8 query heads over 2 k/v
heads of 64, learned sinks, 8 experts with 2 per token), the DeepSeek-V3 one as there (4 layers, MLA latent
128 + rotary 32). Per prompt length (random ids): one untimed generation of each first, then ``--rounds``
rounds (``--long-rounds`` past 4,096 tokens, where one prefill takes tens of seconds), the runs in alternating order, of a greedy ``generate`` of ``--new`` tokens each: transformers'
(``model.generate``, its ``eager`` attention for gpt-oss, which has no SDPA path there, ``sdpa`` for
DeepSeek-V3; each token's arrival seen by a streamer) and attnlab's (``Transformer.generate`` with its default
backend, ``auto``; arrivals by ``on_token``). Time to first token: the prefill and the first choice; time per
output token: the mean gap between the later tokens' arrivals; medians of the rounds, and the ratio
attnlab / transformers. The greedy ids of the two are compared (every round's).

transformers' eager attention materialises each layer's scores, (H, T, T + 1) float32 with its sinks, and
makes about four such tensors (scores, the scores with the sink column, the softmax, its cast): where that
estimate passes ``--max-eager-gib`` (at 16,384 tokens: 8 · 16,384 · 16,385 · 4 B · 4 ≈ 32 GiB) transformers
is not run and attnlab is reported alone, saying so. ``--update`` keeps the JSON file's other entries (each
entry holds the load average it was measured under), so that lengths may be measured in separate calls.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from bench_decoder import Arrivals  # transformers' streamer: each new token's arrival
from bench_models import GPT_OSS, MLA, models

GPT_OSS_LAYERS = 8
EAGER_COPIES = 4  # score-sized tensors transformers' eager attention holds at once (see the docstring)


def eager_bytes(T: int) -> int:
    """Bytes of transformers' eager attention scores for one gpt-oss layer's prefill of T tokens."""
    return EAGER_COPIES * GPT_OSS["num_attention_heads"] * T * (T + 1) * 4


def runners(hf, ours, ids, new: int) -> dict:  # noqa: ANN001
    """name -> run(): (arrival times, the new ids) of one greedy generation."""
    import torch

    def theirs():
        arr = Arrivals()
        with torch.inference_mode():
            out = hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None,
                              pad_token_id=0, streamer=arr, attention_mask=torch.ones_like(ids))
        return arr.times, out[0, ids.shape[1]:].tolist()

    def mine():
        times: list[float] = []
        gen = ours.generate(ids, new, on_token=lambda step, tok: times.append(time.perf_counter()))
        return times, gen.ids[0].tolist()

    return {"transformers": theirs, "attnlab": mine}


def timed(run) -> tuple[float, float, list[int]]:  # noqa: ANN001
    start = time.perf_counter()
    times, new_ids = run()
    return times[0] - start, (times[-1] - times[0]) / (len(times) - 1), new_ids


def at_length(family: str, hf, ours, T: int, new: int, rounds: int, max_eager: float) -> dict:  # noqa: ANN001
    import torch

    ids = torch.randint(0, hf.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(T))
    run = runners(hf, ours, ids, new)
    out: dict = {}
    if family == "gpt_oss" and eager_bytes(T) > max_eager:
        del run["transformers"]
        out["transformers_skipped"] = (f"not run: its eager attention would hold about {eager_bytes(T) / 2**30:.1f} GiB "
                                       f"of scores per layer (over --max-eager-gib {max_eager / 2**30:g})")
    for r in run.values():  # untimed first calls (auto measures its choices once per kind of call)
        r()
    got = {name: {"ttft": [], "tpot": [], "ids": []} for name in run}
    for i in range(rounds):
        for name in (list(run) if i % 2 == 0 else list(run)[::-1]):
            ttft, tpot, new_ids = timed(run[name])
            got[name]["ttft"].append(ttft)
            got[name]["tpot"].append(tpot)
            got[name]["ids"].append(new_ids)
    for name, g in got.items():
        out[name] = {"time_to_first_token_s": statistics.median(g["ttft"]), "ttft_runs": g["ttft"],
                     "time_per_output_token_s": statistics.median(g["tpot"]), "tpot_runs": g["tpot"],
                     "ids": g["ids"][0]}
    if "transformers" in got:
        for key in ("time_to_first_token_s", "time_per_output_token_s"):
            out["ratio_" + key] = out["attnlab"][key] / out["transformers"][key]
        pairs = list(zip(got["attnlab"]["ids"], got["transformers"]["ids"]))
        out["greedy_ids_equal"] = all(a == b for a, b in pairs)
        a, b = pairs[0]
        out["first_differing_step"] = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return out


def line(family: str, T: int, r: dict) -> str:
    a = r["attnlab"]
    text = (f"{family:11s} {T:6d}  attnlab ttft {a['time_to_first_token_s']:.3f} s, "
            f"tpot {a['time_per_output_token_s'] * 1e3:.1f} ms")
    if "transformers" not in r:
        return text + f"; transformers {r['transformers_skipped']}"
    t = r["transformers"]
    return (text + f" | transformers ttft {t['time_to_first_token_s']:.3f} s, tpot {t['time_per_output_token_s'] * 1e3:.1f}"
            f" ms | ratio ttft {r['ratio_time_to_first_token_s']:.2f}, tpot {r['ratio_time_per_output_token_s']:.2f}"
            f" | greedy ids {'equal' if r['greedy_ids_equal'] else 'differ from step %s' % r['first_differing_step']}")


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2048,16384", help="prompt lengths, comma-separated")
    ap.add_argument("--new", type=int, default=8, help="new tokens per generation (at least 2)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds, the order alternating (medians)")
    ap.add_argument("--long-rounds", type=int, default=1, help="timed rounds for prompts past 4,096 tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--families", default="gpt_oss,deepseek_v3")
    ap.add_argument("--max-eager-gib", type=float, default=6.0,
                    help="skip transformers' gpt-oss where its eager scores would pass this (GiB)")
    ap.add_argument("--update", action="store_true", help="keep the JSON file's entries of other lengths")
    ap.add_argument("--json", default=str(Path(__file__).resolve().parent / "results" / "models_generate.json"))
    args = ap.parse_args(argv)
    if args.new < 2:
        ap.error(f"--new must be at least 2 (a time per output token needs two tokens), got {args.new}")
    torch.set_num_threads(args.threads)
    lengths = sorted(int(x) for x in args.lengths.split(","))
    result = {"machine": {"threads": args.threads, "python": platform.python_version(), "torch": torch.__version__,
                          "cpu": platform.processor() or platform.machine(), "load_average": os.getloadavg()},
              "dtype": "float32", "greedy": True, "new_tokens": args.new, "runs": {}}
    for family in args.families.split(","):
        layers = {"num_hidden_layers": GPT_OSS_LAYERS} if family == "gpt_oss" else {}
        hf, ours = models(family, **layers)
        result[f"shape_{family}"] = {**(GPT_OSS if family == "gpt_oss" else MLA), **layers}
        for T in lengths:
            rounds = args.rounds if T <= 4096 else args.long_rounds
            r = result["runs"][f"{family}/{T}"] = at_length(family, hf, ours, T, args.new, rounds,
                                                            args.max_eager_gib * 2**30)
            r["rounds"], r["load_average"] = rounds, os.getloadavg()
            print(line(family, T, r), flush=True)
        del hf, ours
    result["machine"]["load_average_after"] = os.getloadavg()
    if args.update and Path(args.json).is_file():
        old = json.loads(Path(args.json).read_text())
        result = {**old, **{k: v for k, v in result.items() if k != "runs"}, "runs": {**old.get("runs", {}), **result["runs"]}}
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
