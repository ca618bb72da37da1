"""Decode steps of the models of 2025: attnlab's transformer against transformers' on a gpt-oss-shaped and a
DeepSeek-V3-shaped (MLA) layer stack, and MLA's latent decoding against expanded keys and values.

    .venv/bin/python benchmarks/bench_models.py [--lengths 2048,16384] [--steps 8] [--rounds 3] [--threads 2]
        [--json benchmarks/results/models.json]

Both models are small, with random weights (float32, the same weights in both libraries: transformers'
state dict converted by attnlab's loader): the gpt-oss one d = 512, 4 layers (window 128 and full,
alternating), 8 query heads over 2 k/v heads of 64, learned sinks, 8 experts of 512 with 2 per token;
the DeepSeek-V3 one d = 512, 4 layers (the first dense), 8 heads, a low-rank query of 192, latent 128 +
rotary 32, nope 64, values 64, 8 routed experts of 256 with 2 per token in 4 groups (2 kept) and a shared
expert. Per cached length T each library's cache is filled with the same random entries (no prefill: a
step's time depends on how much is cached, not on what), then ``--steps`` one-token steps are timed
(transformers: ``model(input_ids, cache=cache)``, ``sdpa`` attention for DeepSeek-V3 and ``eager``
for gpt-oss, which has no SDPA path in transformers (its sinks); attnlab:
``model(ids, kv_cache=cache)`` with its default backend; gpt-oss's local layers in a window cache in
both); the median step of each round, rounds alternating the order; the table gives the median of the
rounds and the ratio attnlab / transformers; ``kernel``: attnlab with ``backend="kernel"`` (the compiled decode
pass on every layer) beside its default ``auto``. transformers' DeepSeek-V3 caches the latent too but expands
every cached token's keys and values through kv_b_proj at each step; attnlab attends in the latent space.

Last, one MLA layer's attention at T = the longest length: the latent read (the query heads over one
k/v head of 128 + 32, values the same rows, W_UK and W_UV applied before and after; and with the values a
view of the rows' first 128 columns, which the compiled decode pass does not read in place) against the expanded
read (every head's keys of 96 and values of 64 cached), attnlab.attention on the default backend, and
the bytes each cache holds per token.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

GPT_OSS = dict(vocab_size=4096, hidden_size=512, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
               num_key_value_heads=2, head_dim=64, sliding_window=128, num_local_experts=8, num_experts_per_tok=2,
               max_position_embeddings=32768, rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                                               "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                                               "truncate": False,
                                                               "original_max_position_embeddings": 4096})
MLA = dict(vocab_size=4096, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256, num_hidden_layers=4,
           num_attention_heads=8, num_key_value_heads=8, q_lora_rank=192, kv_lora_rank=128, qk_rope_head_dim=32,
           qk_nope_head_dim=64, v_head_dim=64, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
           n_shared_experts=1, first_k_dense_replace=1, max_position_embeddings=32768)


def models(family: str, **overrides):
    """(transformers' model, attnlab's Transformer) with the same random weights (``overrides``: config keys
    changed from the shape above, e.g. ``num_hidden_layers``)."""
    import torch
    import transformers

    from attnlab.transformer import Transformer, TransformerConfig
    from attnlab.transformer.weights import convert

    torch.manual_seed(0)
    cls, shape = (transformers.GptOssConfig, GPT_OSS) if family == "gpt_oss" else (transformers.DeepseekV3Config, MLA)
    attn = "eager" if family == "gpt_oss" else "sdpa"  # transformers' gpt-oss has no SDPA path (its sinks)
    cfg = cls(**{**shape, **overrides}, attn_implementation=attn, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():  # transformers' init leaves some at zero (sinks, router biases)
            if "norm" not in name:
                p.normal_(0.0, 0.05)
    c = TransformerConfig.from_hf(cfg.to_dict())
    ours = Transformer(c).eval().requires_grad_(False)
    state = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    ours.load_state_dict(convert(state, c), strict=True)
    return hf, ours


def filled(family: str, hf, ours, T: int, steps: int):
    """(transformers' cache, attnlab's cache), each holding the same T random entries per layer."""
    import torch
    from transformers import DynamicCache

    from attnlab.transformer.cache import KVCache

    c, g = ours.config, torch.Generator().manual_seed(T)
    theirs = DynamicCache(config=hf.config)
    kind = "window" if family == "gpt_oss" else "dense"
    mine = KVCache.for_model(c, 1, kind=kind, capacity=T + steps + 1)
    step = mine.begin(torch.tensor([T]), T)
    for layer in range(c.num_layers):
        if c.latent is not None:  # transformers keeps (latent, rotary key); attnlab one row of both
            a = c.latent
            rows = torch.randn(1, 1, T, a.cached, generator=g)
            theirs.update(rows[..., : a.kv_rank].clone(), rows[..., a.kv_rank:].clone(), layer)
            mine.update(layer, step, rows, rows)
        else:
            k, v = (torch.randn(1, c.heads_kv, T, c.head_dim, generator=g) for _ in range(2))
            theirs.update(k, v, layer)
            mine.update(layer, step, k, v)
    mine.commit(step)
    return theirs, mine


WARMUP = 3  # untimed steps first (auto's first choice of a backend measures, once per shape)


def time_steps(run, steps: int) -> float:
    """Median seconds of ``steps`` calls of ``run(i)``, after WARMUP untimed ones."""
    for i in range(WARMUP):
        run(i)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        run(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def decode(family: str, T: int, steps: int, rounds: int) -> dict:
    import torch

    hf, ours = models(family)
    tok = torch.tensor([[7]])
    kernel = ours.with_backend("kernel")
    per: dict = {"transformers": [], "attnlab": [], "attnlab-kernel": []}
    for r in range(rounds):
        theirs, mine = filled(family, hf, ours, T, steps + WARMUP)
        _, mine_k = filled(family, hf, ours, T, steps + WARMUP)
        runs = {"transformers": lambda i, c=theirs: hf(input_ids=tok, cache=c, use_cache=True),
                "attnlab": lambda i, c=mine: ours(tok, kv_cache=c),
                "attnlab-kernel": lambda i, c=mine_k: kernel(tok, kv_cache=c)}
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            with torch.no_grad():
                per[name].append(time_steps(runs[name], steps))
    out = {name: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v)} for name, v in per.items()}
    out["ratio"] = out["attnlab"]["median_s"] / out["transformers"]["median_s"]
    out["ratio_kernel"] = out["attnlab-kernel"]["median_s"] / out["transformers"]["median_s"]
    out["attnlab_cache_bytes"] = mine.nbytes
    return out


def latent_vs_expanded(T: int, rounds: int) -> dict:
    """One MLA layer's decode attention at T cached tokens: in the latent space against expanded heads."""
    import torch

    import attnlab

    H, r, rope, nope, v = MLA["num_attention_heads"], MLA["kv_lora_rank"], MLA["qk_rope_head_dim"], \
        MLA["qk_nope_head_dim"], MLA["v_head_dim"]
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(1, 1, T, r + rope, generator=g)
    w_uk, w_uv = torch.randn(H, nope, r, generator=g) / r ** 0.5, torch.randn(H, v, r, generator=g) / r ** 0.5
    q_nope, q_rope = torch.randn(1, H, 1, nope, generator=g), torch.randn(1, H, 1, rope, generator=g)
    keys = torch.cat((torch.einsum("bstr,hnr->bhtn", rows[..., :r], w_uk), rows[..., r:].expand(1, H, T, rope)), -1)
    values = torch.einsum("bstr,hvr->bhtv", rows[..., :r], w_uv).contiguous()
    scale = (nope + rope) ** -0.5

    def latent(_: int) -> torch.Tensor:
        q = torch.cat((torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk), q_rope), -1)
        z = attnlab.attention(q, rows, rows, scale=scale, causal=True)
        return torch.einsum("bhtr,hvr->bhtv", z[..., :r], w_uv)

    def view(_: int) -> torch.Tensor:  # the values as a view of the first r columns (rows r + rope apart)
        q = torch.cat((torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk), q_rope), -1)
        z = attnlab.attention(q, rows, rows[..., :r], scale=scale, causal=True)
        return torch.einsum("bhtr,hvr->bhtv", z, w_uv)

    def expanded(_: int) -> torch.Tensor:
        return attnlab.attention(torch.cat((q_nope, q_rope), -1), keys, values, scale=scale, causal=True)

    err = max(float((latent(0) - expanded(0)).abs().max()), float((view(0) - expanded(0)).abs().max()))
    with torch.no_grad():
        lat = statistics.median(time_steps(latent, 20) for _ in range(rounds))
        viewed = statistics.median(time_steps(view, 20) for _ in range(rounds))
        exp = statistics.median(time_steps(expanded, 20) for _ in range(rounds))
    return {"T": T, "latent_s": lat, "latent_view_s": viewed, "expanded_s": exp, "ratio": lat / exp,
            "max_abs_difference": err,
            "latent_bytes_per_token": (r + rope) * 4, "expanded_bytes_per_token": H * (nope + rope + v) * 4}


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2048,16384", help="cached tokens, comma-separated")
    ap.add_argument("--steps", type=int, default=8, help="timed one-token steps per round (median)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the order alternating (median of rounds)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    result = {"machine": {"threads": args.threads, "python": platform.python_version(), "torch": torch.__version__,
                          "cpu": platform.processor() or platform.machine(), "load_average": os.getloadavg()},
              "decode": {}, "latent_vs_expanded": None}
    print(f"{'model':11s} {'T':>6s} {'transformers':>13s} {'attnlab':>10s} {'ratio':>6s} {'kernel':>10s} {'ratio':>6s}")
    for family in ("gpt_oss", "deepseek_v3"):
        for T in lengths:
            row = decode(family, T, args.steps, args.rounds)
            result["decode"][f"{family}/{T}"] = row
            print(f"{family:11s} {T:6d} {row['transformers']['median_s'] * 1e3:10.2f} ms "
                  f"{row['attnlab']['median_s'] * 1e3:7.2f} ms {row['ratio']:6.2f} "
                  f"{row['attnlab-kernel']['median_s'] * 1e3:7.2f} ms {row['ratio_kernel']:6.2f}", flush=True)
    lv = result["latent_vs_expanded"] = latent_vs_expanded(max(lengths), args.rounds)
    print(f"MLA attention at T = {lv['T']}: latent {lv['latent_s'] * 1e3:.2f} ms (values a view of the latent "
          f"columns instead: {lv['latent_view_s'] * 1e3:.2f} ms), expanded {lv['expanded_s'] * 1e3:.2f} "
          f"ms (ratio {lv['ratio']:.2f}; max |difference| {lv['max_abs_difference']:.1e}); cache per token and layer "
          f"{lv['latent_bytes_per_token']} B latent against {lv['expanded_bytes_per_token']} B expanded")
    result["machine"]["load_average_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
