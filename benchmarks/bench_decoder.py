"""The bundled decoder's greedy decoding: attnlab's ``generate`` beside transformers' on the same weights,
the ``attnlab generate`` command, where a step spends its time, idle and under a competing load.

    .venv/bin/python benchmarks/bench_decoder.py [--rounds 5] [--new 64] [--loaded] [--profile]
        [--json benchmarks/results/decoder.json]

Library: ``Transformer.generate`` on a prompt of 16 ids, ``--new`` new tokens, greedy, no stop ids and
``stop_at_eos=False``; transformers: ``LlamaForCausalLM.generate`` from the same folder (``eos_token_id=None``,
``min_new_tokens``), SDPA attention; and the library's ``generate`` with a hook that changes nothing watching,
so every step takes the model's forward (the path before the lean step). Tokens per second after the first token, from each token's arrival
(``on_token``, a streamer), medians of ``--rounds`` rounds, the order alternating. CLI: ``attnlab generate
"Return the value of" --max-new-tokens 32 --no-stop-at-eos --json -`` in a fresh process per round, its
own tokens/s figure. ``--loaded``: everything again while ``benchmarks/load.py`` (a 2-thread NumPy matrix
product) runs, and each figure's loaded/idle ratio. ``--profile``: the time of a step by part (attention
call, inside it the backend's own ``run``, the cache's update, linear layers, norms, rotary, the rest),
measured by wrapping those functions (the wrappers add their own microseconds), for the path ``generate``
takes (the lean step, :mod:`attnlab.transformer.step`) and, beside it, the model's forward at every step
(a hook that changes nothing watching); and one attention call's time beyond the backend's own work.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WATCH = [("blocks.0.hook_resid_pre", lambda x, name: None)]  # a hook that changes nothing: every step the forward
CLI_RUN = ["generate", "Return the value of", "--max-new-tokens", "32", "--no-stop-at-eos", "--json", "-"]


def models():
    import torch
    from transformers import LlamaForCausalLM

    from attnlab.locate.folder import decoder_folder
    from attnlab.transformer import DEFAULT_DECODER, Transformer

    ours = Transformer.from_pretrained(DEFAULT_DECODER)
    theirs = LlamaForCausalLM.from_pretrained(decoder_folder(), attn_implementation="sdpa", torch_dtype=torch.float32).eval()
    return ours, theirs


class Arrivals:
    """transformers' streamer: the first put() is the prompt, each later one a new token."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.prompt_seen = False

    def put(self, value) -> None:  # noqa: ANN001
        if self.prompt_seen:
            self.times.append(time.perf_counter())
        self.prompt_seen = True

    def end(self) -> None:
        pass


def go_on(model) -> dict:  # noqa: ANN001
    """generate's keywords to go on past the end-of-text (none where generate never stopped there: before it did)."""
    import inspect

    from attnlab.transformer.generate import generate

    return {"stop_at_eos": False} if "stop_at_eos" in inspect.signature(generate).parameters else {}


def rate(times: list[float]) -> float:
    return (len(times) - 1) / (times[-1] - times[0])


def library(ours, theirs, new: int, rounds: int) -> dict:  # noqa: ANN001
    import torch

    ids = torch.arange(1, 17)[None]  # a prompt of 16 ids

    def mine(**hooks) -> float:  # noqa: ANN003
        times: list[float] = []
        ours.generate(ids, new, **go_on(ours), **hooks, on_token=lambda s, t: times.append(time.perf_counter()))
        return rate(times)

    def hf() -> float:
        arr = Arrivals()
        with torch.inference_mode():
            theirs.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None,
                            pad_token_id=0, streamer=arr, attention_mask=torch.ones_like(ids))
        return rate(arr.times)

    # attnlab_forward: the model's forward at every step (a hook that changes nothing watching), the path before
    # the lean step, in the same run
    runs = {"attnlab": mine, "attnlab_forward": functools.partial(mine, fwd_hooks=WATCH), "transformers": hf}
    for f in runs.values():
        f()  # first-call costs (and auto's measuring) stay out
    got: dict[str, list[float]] = {n: [] for n in runs}
    for r in range(rounds):
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            got[name].append(runs[name]())
    out = {n: {"tokens_per_second": statistics.median(v), "runs": v} for n, v in got.items()}
    out["ratio_attnlab_to_transformers"] = out["attnlab"]["tokens_per_second"] / out["transformers"]["tokens_per_second"]
    out["ratio_attnlab_to_forward"] = out["attnlab"]["tokens_per_second"] / out["attnlab_forward"]["tokens_per_second"]
    return out


def cli(rounds: int) -> dict:
    exe = Path(sys.executable).with_name("attnlab")
    rates = []
    helps = subprocess.run([str(exe), "generate", "--help"], capture_output=True, text=True).stdout
    run = CLI_RUN if "no-stop-at-eos" in helps else [a for a in CLI_RUN if a != "--no-stop-at-eos"]
    for _ in range(rounds):
        done = subprocess.run([str(exe), *run], capture_output=True, text=True, check=True)
        rates.append(json.loads(done.stdout)["speed"]["tokens_per_second"])
    return {"command": "attnlab " + " ".join(CLI_RUN), "tokens_per_second": statistics.median(rates), "runs": rates}


class Parts:
    """Wrappers that time the functions doing each part of a step: ``spent`` seconds and ``calls`` per part (a call
    nested in one of the same part is counted there only); :meth:`undo` puts the functions back."""

    def __init__(self) -> None:
        self.spent: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self.inside: collections.Counter = collections.Counter()
        self.undone: list = []

    def wrap(self, owner, name: str, label: str) -> None:  # noqa: ANN001
        f = getattr(owner, name)
        self.undone.append((owner, name, f))
        spent, calls, inside = self.spent, self.calls, self.inside

        @functools.wraps(f)
        def timed(*a, **k):  # noqa: ANN002, ANN003
            if inside[label]:
                return f(*a, **k)
            inside[label] += 1
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[label] += time.perf_counter() - t
                calls[label] += 1
                inside[label] -= 1

        setattr(owner, name, timed)

    def undo(self) -> None:
        for owner, name, f in reversed(self.undone):
            setattr(owner, name, f)


RUN = "  of which: the backend's own run"


def _parts() -> Parts:
    """Every part of a step wrapped: the model's forward's functions and the lean step's."""
    import torch.nn.functional as F

    import attnlab.backends.api as api
    import attnlab.transformer.attend as attend
    import attnlab.transformer.cache as cache
    import attnlab.transformer.linear as linear
    import attnlab.transformer.model as model
    from attnlab.backends.dispatch import BACKENDS

    parts = Parts()
    parts.wrap(attend, "attention", "attention call")
    if hasattr(attend, "attention_read"):
        parts.wrap(attend, "attention_read", "attention call")
    parts.wrap(api, "choose", "  of which: choosing the backend")
    for b in BACKENDS.values():
        parts.wrap(type(b), "run", RUN)
    parts.wrap(cache.KVCache, "update", "cache update (checks, write, read)")
    parts.wrap(linear, "linear", "linear layers")
    parts.wrap(model, "normed", "norms")
    parts.wrap(model, "rotate", "rotary")
    try:  # a generation's reads (every step's, lean or not): its choice, and its direct calls of the decode pass
        import attnlab.backends.reads as reads
        from attnlab.backends import kernel

        parts.wrap(reads.Reads, "__call__", "attention call")
        parts.wrap(reads, "choose", "  of which: choosing the backend")
        if kernel._tiles is not None:
            parts.wrap(kernel._tiles, "decode", RUN)
    except ImportError:
        pass
    try:
        import attnlab.transformer.step as step
    except ImportError:  # before the lean step
        return parts
    parts.wrap(step.LeanStep, "_attend", "attention call")
    if hasattr(step, "choose"):  # before a generation's Reads: the lean step chose, and called SDPA, itself
        parts.wrap(step, "choose", "  of which: choosing the backend")
    parts.wrap(F, "scaled_dot_product_attention", RUN)  # the lean step's direct call (inside SDPA's run: nested)
    parts.wrap(step._Product, "__call__", "linear layers")
    parts.wrap(step._Layer, "_write", "cache update (checks, write, read)")
    parts.wrap(F, "rms_norm", "norms")
    parts.wrap(F, "layer_norm", "norms")
    parts.wrap(step, "rotate", "rotary")
    return parts


def profile(ours, new: int, rounds: int, watched: bool = False) -> dict:  # noqa: ANN001
    """Microseconds per step by part (:func:`_parts`). ``watched``: a hook that changes nothing sends every step
    through the model's forward (the path before the lean step); else the steps take the lean step where it serves."""
    import torch

    parts = _parts()
    spent, calls = parts.spent, parts.calls
    ids = torch.arange(1, 17)[None]
    hooks = {"fwd_hooks": WATCH} if watched else {}
    try:
        steps, wall = 0, 0.0
        ours.generate(ids, 4, **go_on(ours), **hooks)
        spent.clear()
        calls.clear()
        for _ in range(rounds):
            times: list[float] = []
            ours.generate(ids, new, **go_on(ours), **hooks, on_token=lambda s, t: times.append(time.perf_counter()))
            wall += times[-1] - times[0] + (times[1] - times[0])  # ≈ every step's, the prefill's out
            steps += len(times)
    finally:
        parts.undo()
    per = {label: 1e6 * s / steps for label, s in spent.items()}
    top = ("attention call", "cache update (checks, write, read)", "linear layers", "norms", "rotary")
    per["the rest (Python, embedding, logits, the choice)"] = 1e6 * wall / steps - sum(per.get(k, 0.0) for k in top)
    per["step (wrapped)"] = 1e6 * wall / steps
    per["attention call beyond the backend's run"] = per.get("attention call", 0.0) - per.get(RUN, 0.0)
    beyond = 1e6 * (spent["attention call"] - spent[RUN]) / max(calls["attention call"], 1)
    return {"path": "forward (watched)" if watched else "generate's own", "microseconds_per_step": per,
            "attention_call_beyond_the_backend_us": beyond, "layers": ours.config.num_layers}


def measure(ours, theirs, args) -> dict:  # noqa: ANN001
    return {"library": library(ours, theirs, args.new, args.rounds), "cli": cli(args.rounds)}


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--loaded", action="store_true", help="again under benchmarks/load.py, and the ratios")
    ap.add_argument("--profile", action="store_true", help="a step's time by part")
    ap.add_argument("--json", default=str(HERE / "results" / "decoder.json"))
    args = ap.parse_args()
    ours, theirs = models()
    result = {"machine": {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                          "load_average": os.getloadavg()}, "new_tokens": args.new, "rounds": args.rounds}
    if args.profile:  # the path generate takes, and the model's forward at every step (a hook watching) beside it
        result["profile"] = profile(ours, args.new, args.rounds)
        result["profile_forward"] = profile(ours, args.new, args.rounds, watched=True)
        a, b = result["profile"], result["profile_forward"]
        print(f"{'microseconds per step':52s} {'generate':>9s} {'forward':>9s}")
        for label in b["microseconds_per_step"]:
            print(f"{label:52s} {a['microseconds_per_step'].get(label, 0.0):9.1f} {b['microseconds_per_step'][label]:9.1f}")
        print(f"{'one attention call beyond the backend (us)':52s} {a['attention_call_beyond_the_backend_us']:9.1f} "
              f"{b['attention_call_beyond_the_backend_us']:9.1f}", flush=True)
    result["idle"] = measure(ours, theirs, args)
    show("idle", result["idle"])
    if args.loaded:
        load = subprocess.Popen([sys.executable, str(HERE / "load.py"), "--seconds", "600"], stderr=subprocess.DEVNULL)
        try:
            time.sleep(2)
            result["loaded"] = measure(ours, theirs, args)
        finally:
            load.terminate()
            load.wait()
        show("loaded", result["loaded"])
        i, ld = result["idle"], result["loaded"]
        result["loaded_over_idle"] = {
            "attnlab": ld["library"]["attnlab"]["tokens_per_second"] / i["library"]["attnlab"]["tokens_per_second"],
            "transformers": ld["library"]["transformers"]["tokens_per_second"] / i["library"]["transformers"]["tokens_per_second"],
            "cli": ld["cli"]["tokens_per_second"] / i["cli"]["tokens_per_second"]}
        print("loaded / idle: " + ", ".join(f"{k} {v:.2f}x" for k, v in result["loaded_over_idle"].items()))
    result["machine"]["load_average_after"] = os.getloadavg()
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")


def show(label: str, r: dict) -> None:
    lib = r["library"]
    print(f"{label}: library attnlab {lib['attnlab']['tokens_per_second']:.0f} tokens/s, transformers "
          f"{lib['transformers']['tokens_per_second']:.0f} ({lib['ratio_attnlab_to_transformers']:.2f}x), the forward "
          f"at every step {lib['attnlab_forward']['tokens_per_second']:.0f} ({lib['ratio_attnlab_to_forward']:.2f}x); "
          f"CLI {r['cli']['tokens_per_second']:.0f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
