"""The bundled accelerators' efficiencies fitted to published measurements, and their error on rows not fitted.

    .venv/bin/python benchmarks/fit_accelerators.py [--csv benchmarks/published/llm_inference_bench.csv] [--json F]

The table (``benchmarks/published/llm_inference_bench.csv``) holds batch-1 rows of Argonne's LLM-Inference-Bench
(``Plots/All_results.csv``: input = output tokens, ``total_s`` the request's latency, prefill included) on one,
two and four H100 SXM and A100 80GB under vLLM and TensorRT-LLM, each row with its source. For each (GPU,
engine) the script fits, by least squares on log(predicted ÷ measured), the planner's

- ``bandwidth`` efficiency (the decode's weight reads; the KV cache read is given the same),
- ``step_overhead_s`` (fixed seconds per pass: the engine's scheduling, sampling and host work; both engines
  replay a decode step as one CUDA graph, so a per-layer launch cost is left at 0: the fitted models all have
  32 layers, so the rows could not tell a per-layer cost from a per-step one),
- ``allreduce_latency_s`` (the fixed cost of one all-reduce under tensor parallelism),

on the rows of **FIT_MODELS** (Llama-3-8B and Mistral-7B, every GPU count), and reports the error on the
**held-out** rows: every other model (Qwen2-7B, Llama-2-7B, Llama-3-70B, Llama-2-70B), which differ from
every fitted row in the model. The prefill's ``matmul`` and ``attention`` efficiencies stay assumed: at batch
1 with at most 2,048 prompt tokens the prefill is under 1 % of these totals, so they cannot be fitted here.
The fitted values are what ``attnlab.planner.hardware.ENGINES`` holds; this script is how they were made.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FIT_MODELS = ("meta-llama/Meta-Llama-3-8B", "mistralai/Mistral-7B-v0.1")
# models the planner does not bundle, from their published config.json (float16, as published)
EXTRA = {
    "llama-2-7b": {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
                   "max_position_embeddings": 4096, "torch_dtype": "float16"},
    "llama-2-70b": {"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
                    "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 32000,
                    "max_position_embeddings": 4096, "torch_dtype": "float16"},
}
STARTS = [(0.7, step, ar) for step in (0.0, 1e-3, 3e-3) for ar in (5e-6, 20e-6)]  # efficiency, per step, all-reduce


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [dict(r, gpus=int(r["gpus"]), input_tokens=int(r["input_tokens"]), output_tokens=int(r["output_tokens"]),
                     batch=int(r["batch"]), total_s=float(r["total_s"])) for r in csv.DictReader(f)]


def possible(row: dict) -> bool:
    """False for a row faster than reading the weights once per new token at the datasheet's full bandwidth (a
    run that failed: three of the table's 2,048-token rows took 0.05-0.08 s where 14 s is the least possible)."""
    from attnlab.planner.formulas import decode_weight_bytes
    from attnlab.planner.hardware import ACCELERATORS
    from attnlab.planner.models import DTYPE_BYTES, load_model

    a = load_model(EXTRA.get(row["planner_model"], row["planner_model"]))
    least = row["output_tokens"] * decode_weight_bytes(a, DTYPE_BYTES[a.dtype]) / (row["gpus"] * ACCELERATORS[row["hardware"]].bandwidth)
    return row["total_s"] >= least


def predict(row: dict, params: tuple[float, float, float]) -> float:
    """The planner's total seconds for the row on its accelerator with these efficiencies (its time model,
    :func:`attnlab.planner.predict.latency`, without the plan's searches for the largest prompt and batch)."""
    from attnlab.planner import predict as P
    from attnlab.planner.hardware import Efficiencies, accelerator
    from attnlab.planner.models import load_model

    eff, step_s, allreduce_s = params
    e = Efficiencies(bandwidth=eff, decode_attention=eff, layer_overhead_s=0.0, step_overhead_s=step_s,
                     allreduce_latency_s=allreduce_s)
    a = load_model(EXTRA.get(row["planner_model"], row["planner_model"]))
    s = P.Setup(a, accelerator(row["hardware"], e, engine="ideal"), P.nbytes_of(a.dtype), row["gpus"], row["output_tokens"])
    return P.latency(s, row["input_tokens"], row["batch"])[2]


def _clip(x: np.ndarray) -> tuple[float, float, float]:
    return (float(np.clip(x[0], 0.05, 1.0)), float(max(x[1], 0.0)), float(max(x[2], 0.0)))


def fit(rows: list[dict]) -> tuple[float, float, float]:
    """Least squares on log(predicted ÷ measured) over ``rows`` (Nelder-Mead; overheads in µs for its scale)."""
    from scipy.optimize import minimize

    def loss(x: np.ndarray) -> float:
        params = _clip(np.array([x[0], x[1] * 1e-6, x[2] * 1e-6]))
        return float(np.mean([math.log(predict(r, params) / r["total_s"]) ** 2 for r in rows]))

    runs = [minimize(loss, np.array([e, step * 1e6, ar * 1e6]), method="Nelder-Mead",
                     options={"xatol": 1e-3, "fatol": 1e-8, "maxiter": 600}) for e, step, ar in STARTS]
    best = min(runs, key=lambda r: r.fun)  # several starts: the loss has shallow valleys (step against all-reduce)
    return _clip(np.array([best.x[0], best.x[1] * 1e-6, best.x[2] * 1e-6]))


def errors(rows: list[dict], params: tuple[float, float, float]) -> list[dict]:
    return [dict(r, predicted_s=predict(r, params), ratio=predict(r, params) / r["total_s"]) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(HERE / "published" / "llm_inference_bench.csv"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = read_rows(Path(args.csv))
    for r in rows:
        if not possible(r):
            print(f"left out (faster than the datasheet allows): {r['hardware']} × {r['gpus']} {r['engine']} {r['model']} "
                  f"{r['input_tokens']} + {r['output_tokens']}: {r['total_s']} s")
    rows = [r for r in rows if possible(r)]
    out = {}
    for key in sorted({(r["hardware"], r["engine"]) for r in rows}):
        mine = [r for r in rows if (r["hardware"], r["engine"]) == key]
        fitted = [r for r in mine if r["model"] in FIT_MODELS]
        held = [r for r in mine if r["model"] not in FIT_MODELS]
        params = fit(fitted)
        fit_err, held_err = errors(fitted, params), errors(held, params)
        out["/".join(key)] = {"bandwidth": params[0], "step_overhead_s": params[1], "allreduce_latency_s": params[2],
                              "fitted": fit_err, "held_out": held_err}
        worst = lambda rs: max((abs(r["ratio"] - 1) for r in rs), default=float("nan"))  # noqa: E731
        within = sum(abs(r["ratio"] - 1) <= 0.15 for r in held_err)
        print(f"{key[0]} {key[1]}: bandwidth {params[0]:.3f}, {params[1] * 1e6:.1f} µs per step, all-reduce "
              f"{params[2] * 1e6:.1f} µs; fitted on {len(fitted)} rows (worst {worst(fit_err):.1%}), held out "
              f"{len(held)}: {within} within ±15 %, worst {worst(held_err):.1%}", flush=True)
        for r in held_err:
            print(f"    held out {r['model']:28} × {r['gpus']} {r['input_tokens']:5} + {r['output_tokens']:5}: "
                  f"measured {r['total_s']:7.3f} s, predicted {r['predicted_s']:7.3f} s, ratio {r['ratio']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
