"""The cost section's second half: the second source's question, answered by the planner for one model.

The source ends on it: a larger token limit "can mean slower inference, more timeouts, or hardware
memory limits", so a longer context window "is useful only if its latency and reliability remain
acceptable". Here: raising Llama-3.1-8B's context from 8k to 32k and 128k tokens, what happens to the
first token, to each token after it and to memory, on this machine (measured rates) and on one
accelerator (predicted), and which part of it is attention.
"""

from __future__ import annotations

from attnlab.lesson.section import Table, table
from attnlab.planner import plan

MODEL = "llama-3.1-8b"
WHERE = {"this": "this machine (predicted from rates measured here)", "h100": "H100 SXM (predicted from its datasheet and published measurements)"}
PROMPTS = (8000, 32000, 128000)
NEW_TOKENS = 256
CURVE = tuple(1000 * 2**k for k in range(8)) + (128000,)  # 1k … 128k for the figure
QUESTION = ("A larger token limit can therefore mean slower inference, more timeouts, or hardware memory limits. "
            "When an application needs a response within a deadline, a longer context window is useful only if its "
            "latency and reliability remain acceptable.")


def _shares(row: dict) -> dict:
    """What part of each quantity attention is: of the first token, of each token after it, of the memory."""
    term = {(t["phase"], t["name"]): t["seconds"] for t in row["terms"]}
    return {"ttft_attention": term["prefill", "attention"] / row["ttft_s"],
            "tpot_kv_read": term["decode", "KV cache read"] / row["tpot_s"],
            "memory_kv": row["kv_bytes"] / row["peak_bytes"]}


def serving_data() -> dict:
    """Plans at :data:`PROMPTS` and curves over :data:`CURVE`, here and on the accelerator."""
    plans, curves = {}, {}
    for where in WHERE:
        p = plan(MODEL, where, prompt_tokens=list(PROMPTS), new_tokens=NEW_TOKENS)
        plans[where] = p.to_dict()
        curves[where] = plan(MODEL, p.hardware, prompt_tokens=list(CURVE), new_tokens=NEW_TOKENS).to_dict()
    shares = {w: [_shares(r) for r in plans[w]["rows"]] for w in WHERE}
    return {"model": MODEL, "new_tokens": NEW_TOKENS, "prompts": list(PROMPTS), "where": WHERE, "question": QUESTION,
            "plans": plans, "curves": curves, "shares": shares}


def _t(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.1f} s" if s < 600 else f"{s / 60:,.0f} min"


def serving_table(data: dict) -> Table:
    rows = []
    for where, label in data["where"].items():
        p = data["plans"][where]
        for r, sh in zip(p["rows"], data["shares"][where]):
            rows.append([label, f"{r['prompt_tokens']:,}", _t(r["ttft_s"]), f"{sh['ttft_attention']:.0%}", _t(r["tpot_s"]),
                         f"{sh['tpot_kv_read']:.0%}", _t(r["total_s"]), f"{r['kv_bytes'] / 2**30:.1f} GiB",
                         f"{r['peak_bytes'] / 1e9:.1f} GB", "yes" if r["fits_memory"] else
                         f"no ({p['memory_bytes'] / 1e9:.0f} GB)"])
    p0 = data["plans"]["this"]
    return table(
        f"Serving {data['model']} ({p0['dtype']}, batch 1, {data['new_tokens']} new tokens): the context window raised "
        "(attnlab plan; TTFT: the first token; TPOT: each token after it)",
        ["where", "prompt", "TTFT", "of it attention", "TPOT", "of it KV read", "total", "KV cache", "peak memory",
         "fits?"], rows)


def serving_findings(data: dict) -> list[str]:
    out = [f"The second source's question ({QUESTION}) asked of {data['model']}, by the planner (attnlab plan):"]
    for where, label in data["where"].items():
        p, sh = data["plans"][where], data["shares"][where]
        r8, r32, r128 = p["rows"]
        mem = p["memory_bytes"] / 1e9
        fits = [f"{r['prompt_tokens'] // 1000}k" for r in p["rows"] if r["fits_memory"]]
        out.append(
            f"On {label}: from 8k to 32k tokens (4×) the first token takes {r32['ttft_s'] / r8['ttft_s']:.1f}× as long "
            f"({_t(r8['ttft_s'])} → {_t(r32['ttft_s'])}), and to 128k (16×) {r128['ttft_s'] / r8['ttft_s']:.0f}× "
            f"({_t(r128['ttft_s'])}): attention, growing as n², is {sh[0]['ttft_attention']:.0%} of it at 8k and "
            f"{sh[2]['ttft_attention']:.0%} at 128k. Each token after it takes {_t(r8['tpot_s'])} at 8k and "
            f"{_t(r128['tpot_s'])} at 128k ({r128['tpot_s'] / r8['tpot_s']:.1f}×): reading the weights is the same at "
            f"every length, reading the KV cache grows with it ({sh[0]['tpot_kv_read']:.0%} of the step at 8k, "
            f"{sh[2]['tpot_kv_read']:.0%} at 128k). The KV cache grows from {r8['kv_bytes'] / 2**30:.1f} to "
            f"{r128['kv_bytes'] / 2**30:.1f} GiB beside {r8['weight_bytes'] / 1e9:.1f} GB of weights; in "
            f"{mem:.0f} GB {'only ' if len(fits) < 3 else ''}{', '.join(fits) or 'none'} fit"
            + (f" ({p['max_prompt_tokens']:,} tokens at most)." if p["max_prompt_tokens"] else "."))
    out.append(_trust(data))
    out.append("So a longer window is paid three times: the first token grows as n² (attention), every later token "
               "grows as n (the cache read), and memory grows as n (the cache), until the window no longer fits; "
               "on the accelerator the figures are predictions (datasheet × efficiencies fitted to published "
               "vLLM measurements), here they rest "
               "on this machine's rates measured at the model's shapes, extrapolated to lengths never run "
               "(attnlab plan --verify runs a model here and prints predicted beside measured).")
    return out


def _trust(data: dict) -> str:
    """How far the figures can be trusted: the range of the first row's TTFT on each machine, and what it rests on."""
    said = []
    for where, label in data["where"].items():
        p = data["plans"][where]
        r, hw = p["rows"][0], p["hardware"]
        span = r["ranges"]["ttft_s"]
        within = f"{_t(r['ttft_s'])} ({_t(span[0])}–{_t(span[1])})" if span else _t(r["ttft_s"])
        validation = hw["details"].get("validation")
        if hw["measured"]:
            why = ("the fast and slow ends of the rates measured here (attnlab plan --verify runs a model here and "
                   "prints predicted beside measured)")
        elif validation:
            why = (f"efficiencies fitted to published {hw['details']['engine']} measurements, which on rows of other "
                   f"models gave {validation[0]:.2f}–{validation[1]:.2f} × the measured total")
        else:
            why = "assumed efficiencies, with no published measurement to check them"
        said.append(f"on {label} the first token at {r['prompt_tokens'] // 1000}k is {within}, from {why}")
    return "How far to trust these: " + "; ".join(said) + "."

