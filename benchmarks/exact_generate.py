"""How exact attnlab's cached generation is, per architecture: one command, one table.

For a random model of each family (built from transformers' config classes, d = 64, 2 layers, GQA,
sliding windows of 8 where the family has them, weights drawn with std 0.3), greedy generation of
256 tokens from a 12-token prompt:

- f64 max Δ: the largest |cached − recomputed| logit in float64 (the whole sequence recomputed without
  a cache; causal, so position p's row is step p's recompute);
- f32 cached / uncached: the largest |float32 − float64| logit on the same tokens, with the cache
  and without, and their ratio (the target: at most 2);
- f64 = HF: the greedy ids equal transformers' generate (float64, its own cache) for 64 steps;
- f32 parts: the first step where float32 greedy ids part from transformers' float32 generate
  ("-": none in 256; random weights make near-ties, so a parting is not an error).

    python benchmarks/exact_generate.py [--steps 256]
"""

from __future__ import annotations

import argparse
import tempfile

import torch

WINDOWED = {"mistral", "qwen2", "gemma2"}


def hf_config(family: str):
    import transformers

    shape = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512)
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=256, n_positions=512, n_embd=64, n_layer=2, n_head=4, bos_token_id=0,
                                       eos_token_id=0)
    extra = {
        "llama": {},
        "llama3": {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 32}},
        "mistral": {"sliding_window": 8},
        "qwen2": {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
        "gemma2": {"sliding_window": 8, "head_dim": 16, "query_pre_attn_scalar": 24, "pad_token_id": 0},
    }[family]
    cls = {"llama": "LlamaConfig", "llama3": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config",
           "gemma2": "Gemma2Config"}[family]
    return getattr(transformers, cls)(**shape, **extra)


def build(family: str, folder: str) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_config(hf_config(family))
    with torch.no_grad():
        for name, p in net.named_parameters():
            if p.dim() > 1 or "norm" not in name:
                p.normal_(0.0, 0.3)
    net.save_pretrained(folder)


def figures(family: str, steps: int) -> dict:
    from transformers import AutoModelForCausalLM

    from attnlab.transformer import Transformer

    with tempfile.TemporaryDirectory() as folder:
        build(family, folder)
        ours = {d: Transformer.from_pretrained(folder, dtype=d, backend="torch") for d in ("float64", "float32")}
        theirs = {d: AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, d), attn_implementation="eager")
                  for d in ("float64", "float32")}
    cache = "window" if family in WINDOWED else "dense"
    prompt = torch.randint(1, 256, (1, 12), generator=torch.Generator().manual_seed(1))
    P = prompt.shape[1]

    def full(m, seq):  # logits of every position, no cache
        with torch.no_grad():
            return m.logits(m(torch.tensor([seq])))[0, P - 1: P - 1 + steps].double()

    g64 = ours["float64"].generate(prompt, steps, cache=cache)
    g32 = ours["float32"].generate(prompt, steps, cache=cache)
    exact32 = full(ours["float64"], g32.sequences[0])
    cached = float((g32.logits[0].double() - exact32).abs().max())
    uncached = float((full(ours["float32"], g32.sequences[0]) - exact32).abs().max())
    hf = {}
    for d, n in (("float64", 64), ("float32", steps)):
        with torch.no_grad():
            hf[d] = theirs[d].generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False,
                                       eos_token_id=None, pad_token_id=0)[0, P:]
    parts = [t for t in range(steps) if int(g32.ids[0, t]) != int(hf["float32"][t])]
    return {"family": family, "cache": cache,
            "f64": float((g64.logits[0] - full(ours["float64"], g64.sequences[0])).abs().max()),
            "cached": cached, "uncached": uncached, "ratio": cached / uncached,
            "hf64": g64.ids[0, :64].tolist() == hf["float64"].tolist(), "parts": parts[0] if parts else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)  # tiny models: one thread is the fastest and the quietest
    print(f"| family | cache | f64 max Δ ({args.steps} steps) | f32 cached | f32 uncached | ratio | f64 = HF (64) | f32 parts at |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for family in ("gpt2", "llama", "llama3", "mistral", "qwen2", "gemma2"):
        r = figures(family, args.steps)
        print(f"| {r['family']} | {r['cache']} | {r['f64']:.2e} | {r['cached']:.2e} | {r['uncached']:.2e} | "
              f"{r['ratio']:.2f} | {'yes' if r['hf64'] else 'NO'} | {'-' if r['parts'] is None else r['parts']} |")


if __name__ == "__main__":
    main()
