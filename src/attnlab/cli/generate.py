"""`attnlab generate`: text from a decoder, printed as it is produced, with what each new token looked at.

Every flag is checked before the model loads; the model's own limits (the prompt and the new tokens
past its positions with a dense cache, an encoder) are checked by ``Transformer.generate`` before
any work. The prompt, then the new text goes to stdout as it comes (stderr when ``--json -`` takes stdout), then the
speed to stderr. Ctrl-C stops at the next token: what was generated so far stays printed, exit 130.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import typer

from attnlab.cli.common import decoder_option, err, json_option, load_decoder, out_file, write_json
from attnlab.transformer.sampling import check_temperature

CACHES = ("dense", "window", "sink", "h2o", "snapkv", "knorm", "random")  # attnlab.transformer.cache.KINDS
EVICTING = CACHES[3:]
SAMPLING = "Sampling is on when --temperature, --top-k or --top-p is given; otherwise greedy."


def check_flags(prompt: str, temperature: float | None, top_k: int | None, top_p: float | None, seed: int | None,
                cache: str, window: int | None, sink: int | None, cache_budget: int | None = None) -> bool:
    """The flags' own rules, before any work; returns whether to sample."""
    if not prompt.strip():
        raise ValueError("PROMPT is empty; give the text to continue, e.g. attnlab generate 'Return the'")
    if temperature is not None:
        check_temperature(temperature, "--temperature")
    if top_k is not None and top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"--top-p must lie in (0, 1], got {top_p}")
    sample = any(x is not None for x in (temperature, top_k, top_p))
    if seed is not None and not sample:
        raise ValueError("--seed takes effect only when sampling; add --temperature, --top-k or --top-p")
    if cache not in CACHES:
        raise ValueError(f"--cache must be one of {', '.join(CACHES)}, got {cache!r}")
    for flag, value in (("--window", window), ("--sink", sink)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if sink is not None and cache not in ("sink", *EVICTING):
        raise ValueError(f"--sink {sink} goes with --cache sink or an evicting cache, got --cache {cache}")
    if (cache_budget is None) != (cache not in EVICTING):
        raise ValueError(f"--cache-budget goes with an evicting --cache ({', '.join(EVICTING)}) and it needs one; got "
                         f"--cache {cache}" + ("" if cache_budget is None else f" --cache-budget {cache_budget}"))
    if window is not None and cache == "dense":
        raise ValueError(f"--window {window} goes with --cache window, sink or an evicting cache; a dense cache keeps "
                         "every position")
    return sample


def check_cache_dtype(cache_dtype: str | None, rotate: bool) -> None:
    """--cache-dtype and --rotate by themselves (the model's head width is checked by generate, before any work)."""
    from attnlab.transformer.quant_cache import QUANTIZED
    from attnlab.transformer.weights import DTYPES

    if cache_dtype is not None and cache_dtype not in DTYPES + QUANTIZED:
        raise ValueError(f"--cache-dtype must be one of {', '.join(DTYPES + QUANTIZED)}, got {cache_dtype!r}")
    if rotate and cache_dtype not in QUANTIZED:
        raise ValueError(f"--rotate goes with a quantized --cache-dtype ({', '.join(QUANTIZED)}), got "
                         f"{'no --cache-dtype' if cache_dtype is None else '--cache-dtype ' + cache_dtype}")


class Printer:
    """The on_token callback: prints the prompt with the first token (so that nothing is printed when
    generate refuses its input), then the text as it grows (decoding all ids so far, so that a
    character split over byte-level tokens comes out whole), and keeps the time of each token."""

    def __init__(self, tokenizer: Any, out: Any, prompt: str) -> None:
        self.tokenizer, self.out, self.prompt = tokenizer, out, prompt
        self.ids: list[int] = []
        self.shown = ""
        self.times: list[float] = []

    def __call__(self, step: int, ids: Any) -> None:
        self.times.append(time.perf_counter())
        if not self.ids:
            self.out.write(self.prompt)  # the continuation reads on from it
        self.ids.append(int(ids[0]))
        text = (self.tokenizer.decode(self.ids, skip_special_tokens=True) if self.tokenizer is not None
                else " ".join(map(str, self.ids)))
        if text.endswith("\ufffd"):  # half a character: wait for its other bytes
            return
        self.out.write(text[len(self.shown):] if text.startswith(self.shown) else "\n" + text)
        self.out.flush()
        self.shown = text


def speed(start: float, printer: Printer, prompt_tokens: int) -> dict:
    n, times = len(printer.times), printer.times
    first = times[0] - start if n else None
    per = (times[-1] - times[0]) / (n - 1) if n > 1 else None
    return {"prompt_tokens": prompt_tokens, "new_tokens": n, "seconds": round(time.perf_counter() - start, 4),
            "time_to_first_token_s": None if first is None else round(first, 4),
            "time_per_output_token_s": None if per is None else round(per, 5),
            "tokens_per_second": None if per is None else round(1 / per, 2) if per > 0 else None}


def generate(
    prompt: str = typer.Argument(..., help="The text to continue."),
    model: str = decoder_option(),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", min=1, help="How many tokens to generate, at most."),
    temperature: float = typer.Option(None, "--temperature", help=f"Divide the logits by T > 0. {SAMPLING}"),
    top_k: int = typer.Option(None, "--top-k", help=f"Sample among the K most likely tokens (K >= 1). {SAMPLING}"),
    top_p: float = typer.Option(None, "--top-p", help=f"Sample among the most likely tokens whose probability reaches P, "
                                                      f"in (0, 1]. {SAMPLING}"),
    seed: int = typer.Option(None, "--seed", help="Seed of the sampling (the same seed draws the same tokens); sampling only."),
    cache: str = typer.Option("dense", "--cache", help="The KV cache: dense (every position), window (the last W), "
                                                        "sink (the first S and the last W: past the model's length); "
                                                        "evicting: h2o, snapkv, knorm, random (with --cache-budget)."),
    cache_budget: int = typer.Option(None, "--cache-budget", help="Tokens an evicting --cache keeps per layer and k/v "
                                                                  "head, sinks included (--window: its recent ones)."),
    window: int = typer.Option(None, "--window", help="W of --cache window or sink (default: the model's own window)."),
    sink: int = typer.Option(None, "--sink", help="S of --cache sink: the first tokens always kept."),
    cache_dtype: str = typer.Option(None, "--cache-dtype", help="What the cache stores: float32, float64, float16, "
                                    "bfloat16 (default: the model's), or quantized int8, int4, fp8 (docs/generation.md)."),
    rotate: bool = typer.Option(False, "--rotate", help="With a quantized --cache-dtype: Hadamard-rotate keys (and "
                                "queries) after rotary, before quantizing."),
    maps_path: str = typer.Option(None, "--maps", metavar="PATH", callback=out_file("--maps"),
                                  help="Write the attention of the generated sequence as a maps file (.npz; attnlab.load_maps)."),
    html_path: str = typer.Option(None, "--html", metavar="PATH", callback=out_file("--html"),
                                  help="Write a self-contained page with the Generation view of every step."),
    json_path: str = json_option(),
    stop_at_eos: bool = typer.Option(True, "--stop-at-eos/--no-stop-at-eos",
                                     help="Stop at the model's end-of-text token (the default), or go on past it."),
) -> None:
    """Generate text with attnlab's transformer and its KV cache, printing it as it comes, then tokens per second.

    Sampling is on when --temperature, --top-k or --top-p is given; otherwise greedy. It stops at the model's
    end-of-text token unless --no-stop-at-eos, and says so.
    """
    sample = check_flags(prompt, temperature, top_k, top_p, seed, cache, window, sink, cache_budget)
    check_cache_dtype(cache_dtype, rotate)
    net, model_id = load_decoder(model, "generate", "Transformer.generate")
    out = sys.stderr if json_path == "-" else sys.stdout
    printer = Printer(net.tokenizer, out, prompt)
    kw = dict(sample=sample, temperature=1.0 if temperature is None else temperature, top_k=top_k, top_p=top_p,
              seed=seed, cache=cache, window=window, sink=sink, cache_budget=cache_budget, maps=bool(maps_path or html_path),
              on_token=printer, stop_at_eos=stop_at_eos, cache_dtype=cache_dtype, rotate=rotate)
    start = time.perf_counter()
    try:
        gen = net.generate(prompt, max_new_tokens, **kw)
    except KeyboardInterrupt:
        out.write("\n" if printer.ids else "")
        err.print(f"interrupted after {len(printer.ids)} new tokens", highlight=False)
        raise typer.Exit(130) from None
    out.write("\n")
    out.flush()
    figures = speed(start, printer, int(gen.prompt_lengths[0]))
    from attnlab.transformer.generate import end_of_text

    figures["stopped"] = stopped(gen, max_new_tokens, end_of_text(net) if stop_at_eos else None)
    if figures["stopped"] == "end-of-text":
        err.print(f"stopped at end-of-text after {figures['new_tokens']} of {max_new_tokens} new tokens "
                  "(--no-stop-at-eos goes on)", highlight=False, soft_wrap=True)
    err.print(_speed_line(figures), highlight=False, soft_wrap=True)
    _write_outputs(net, gen, model_id, maps_path, html_path)
    write_json(json_path, {**gen.to_dict(), "model": model_id, "prompt": prompt, "text": gen.text[0], "speed": figures,
                           "options": {k: v for k, v in kw.items() if k != "on_token"}})


def stopped(gen: Any, max_new_tokens: int, eos: int | None) -> str:
    """Why the first sequence stopped: "end-of-text" (its last new token), or "max-new-tokens"."""
    n = int(gen.lengths[0])
    return "end-of-text" if eos is not None and n and int(gen.ids[0, n - 1]) == eos else "max-new-tokens"


def _speed_line(f: dict) -> str:
    line = f"{f['new_tokens']} new tokens after a prompt of {f['prompt_tokens']} in {f['seconds']:.2f} s"
    if f["time_to_first_token_s"] is not None:
        line += f" · first token {1000 * f['time_to_first_token_s']:.0f} ms"
    if f["tokens_per_second"] is not None:
        line += f" · {f['tokens_per_second']:.1f} tokens/s after it"
    return line


def _write_outputs(net: Any, gen: Any, model_id: str, maps_path: str | None, html_path: str | None) -> None:
    from attnlab.viz.generation import generation_maps, steps_payload

    if maps_path:
        written = generation_maps(net, gen, model_id).save(maps_path)
        err.print(f"wrote {written}", highlight=False)
    if html_path:
        from attnlab.viz.page import write_generation_html

        written = write_generation_html(steps_payload(net, gen, model_id), html_path)
        err.print(f"wrote {written}", highlight=False)
