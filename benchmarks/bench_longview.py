"""The long view (issue 30) on a Llama-style model with random weights: capture against a plain forward
with the same (kernel) attention, the first overview of one head and of every head (``--tiles-too``: one head's
also from attention's tiles, the path without the compiled kernel, in the same run), a 256 × 256 tile
and a row's top keys through the server, and the self-contained page's size and load time.

    .venv/bin/python benchmarks/bench_longview.py --tokens 32768 --json /tmp/longview_32768.json
    .venv/bin/python benchmarks/bench_longview.py --tokens 8192 --layers 4 --heads 4 --kv-heads 4 --d-model 256 \\
        --page --json /tmp/longview_page16.json

Defaults are the issue's model: d = 512, 8 layers, 8 query heads over 2 k/v heads of 64, causal. Times
are medians of ``--repeat`` runs (the capture and the forward alternate, so a busy machine slows both);
peak memory is the process's ``ru_maxrss`` after each step. ``--all-heads N`` times the overviews of
the first N heads only and scales by L · H / N (said in the output) where all of them would take long.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

WORDS = ("the river runs past the bank and the money sits in the bank while I sat on the bank of the "
         "river slowly counting boats that drift under old bridges toward a quiet sea").split()


def build(folder: Path, layers: int, heads: int, kv_heads: int, d_model: int, positions: int) -> None:
    """The model and a word-level tokenizer (one token per word, <s> first) in ``folder``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaModel, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>", *sorted(set(WORDS))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                            model_max_length=positions).save_pretrained(folder)
    torch.manual_seed(0)
    LlamaModel(LlamaConfig(vocab_size=len(vocab), hidden_size=d_model, intermediate_size=2 * d_model,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                           head_dim=d_model // heads, max_position_embeddings=positions)).save_pretrained(folder)


def text(tokens: int) -> str:
    import numpy as np

    return " ".join(np.random.default_rng(0).choice(WORDS, tokens - 1))


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn, repeat: int) -> tuple[float, list[float], object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times, out


def capture_vs_forward(lm, words: str, repeat: int) -> dict:
    """capture_long against the same forward with the observed kernel attention keeping nothing."""
    import torch

    from attnlab.hf.capture_attention import observing
    from attnlab.hf.capture_long import capture_long

    ids = torch.tensor([lm.tokenizer(words)["input_ids"]])

    def forward():
        with torch.inference_mode(), observing(lambda *a, **k: None):
            lm.model(input_ids=ids, attention_mask=torch.ones_like(ids))

    fwd, cap = [], []
    long = None
    for _ in range(repeat):  # alternated: a busy machine slows both alike
        fwd.append(timed(forward, 1)[0])
        t, _, long = timed(lambda: capture_long(words, lm, max_bytes=None), 1)
        cap.append(t)
    f, c = statistics.median(fwd), statistics.median(cap)
    return {"forward_s": f, "capture_s": c, "ratio": c / f, "forward_runs": fwd, "capture_runs": cap,
            "held_bytes": long.nbytes, "full_bytes": long.full_bytes, "peak_mib": peak_mib()}, long


def overviews(long, repeat: int, all_heads: int | None, tiles_too: bool = False) -> dict:
    from attnlab.analysis.longview import overview
    from attnlab.backends import kernel

    one, runs, _ = timed(lambda: overview(long, 0, 0), repeat)
    before = {}
    if tiles_too and kernel.isa() is not None:  # the same overview from attention's tiles, as without the kernel
        built = kernel.isa
        kernel.isa = lambda: None
        try:
            before["one_head_tiles_s"] = timed(lambda: overview(long, 0, 0), 1)[0]
        finally:
            kernel.isa = built
        before["tiles_over_compiled"] = before["one_head_tiles_s"] / one
    heads = [(l, h) for l in range(long.num_layers) for h in range(long.num_heads)]
    some = heads if all_heads is None else heads[:all_heads]
    t = time.perf_counter()
    for l, h in some:
        overview(long, l, h)
    spent = time.perf_counter() - t
    return {"one_head_s": one, "one_head_runs": runs, **before, "all_heads_s": spent * len(heads) / len(some),
            "all_heads_timed": len(some), "all_heads_of": len(heads), "peak_mib": peak_mib()}


def served(lm, words: str, long_tokens: int, repeat: int) -> dict:
    """Through the server's app (its workers, JSON, gzip): the capture (/api/long/info), the first overview of one
    head (/api/long/overview, 512 cells: computed on request, as a user's first look at a head), a 256 × 256
    tile, a row's top keys and a column (who attends to one key)."""
    from fastapi.testclient import TestClient

    from attnlab.web.server import create_app

    with TestClient(create_app(lm), base_url="http://127.0.0.1") as c:
        t = time.perf_counter()
        assert c.post("/api/long/info", json={"text": words}).status_code == 200
        first = time.perf_counter() - t
        mid = long_tokens // 2
        overview_s = []
        for head in range(min(repeat, lm.num_heads)):  # a head not yet shown each time: nothing cached
            t = time.perf_counter()
            assert c.post("/api/long/overview", json={"text": words, "layer": 1 % lm.num_layers,
                                                       "head": head}).status_code == 200
            overview_s.append(time.perf_counter() - t)
        body = {"text": words, "layer": 3 % lm.num_layers, "head": 1, "rows": [mid, mid + 256], "cols": [mid - 128, mid + 128]}

        def tile():
            assert c.post("/api/long/tile", json=body).status_code == 200

        def row():
            assert c.post("/api/long/row", json={"text": words, "layer": 0, "head": 0, "query": long_tokens - 1,
                                                  "top": 10}).status_code == 200
        def column():
            assert c.post("/api/long/column", json={"text": words, "layer": 0, "head": 0, "key": 0}).status_code == 200
        tile_s, tile_runs, _ = timed(tile, repeat)
        row_s, row_runs, _ = timed(row, repeat)
        column_s, column_runs, _ = timed(column, repeat)
    return {"capture_through_server_s": first, "first_overview_s": statistics.median(overview_s),
            "first_overview_runs": overview_s, "tile_256_s": tile_s, "tile_runs": tile_runs, "row_top_s": row_s,
            "row_runs": row_runs, "column_s": column_s, "column_runs": column_runs}


CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]


def page(long, folder: Path, repeat: int, tiles_too: bool = False) -> dict:
    """The self-contained page: the time to write it (its precomputation: every head's 256-cell overview and every
    row's top 8 keys), its size, and its load time in Chromium (median of ``repeat`` loads); ``tiles_too``: one
    head's precomputation also from attention's tiles (the path without the compiled kernel), in the same run."""
    from attnlab.analysis.longview import overview
    from attnlab.backends import kernel
    from attnlab.viz.longpage import PAGE_CELLS, PAGE_TOP, write_long_html

    t = time.perf_counter()
    path = write_long_html(long, folder / "long.html")
    out = {"page_bytes": path.stat().st_size, "page_write_s": time.perf_counter() - t,
           "precomputed_by": "compiled pooled pass" if kernel.isa() is not None else "attention's tiles"}
    if tiles_too and kernel.isa() is not None:
        one = lambda: overview(long, 0, 0, PAGE_CELLS, top=PAGE_TOP)  # noqa: E731
        out["page_one_head_s"] = timed(one, repeat)[0]
        built = kernel.isa
        kernel.isa = lambda: None
        try:
            out["page_one_head_tiles_s"] = timed(one, 1)[0]
        finally:
            kernel.isa = built
        out["tiles_over_compiled"] = out["page_one_head_tiles_s"] / out["page_one_head_s"]
    chromium = "/usr/bin/chromium"
    if os.path.exists(chromium):
        from playwright.sync_api import sync_playwright

        loads = []
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
            for _ in range(repeat):
                pg = b.new_page()
                t = time.perf_counter()
                pg.goto(path.as_uri())
                pg.wait_for_function("() => attnlab.long.shown.overview && attnlab.long.shown.row", timeout=120_000)
                loads.append(time.perf_counter() - t)
                pg.close()
            b.close()
        out["page_first_view_s"], out["page_first_view_runs"] = statistics.median(loads), loads
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--all-heads", type=int, default=None, help="time this many heads' overviews and scale up")
    ap.add_argument("--tiles-too", action="store_true",
                    help="also time one head's overview (and with --page, one head's page data) from attention's "
                         "tiles (the path without the compiled kernel)")
    ap.add_argument("--page", action="store_true", help="also write the self-contained page and load it in Chromium")
    ap.add_argument("--no-server", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from attnlab.hf.loading import load_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build(folder, args.layers, args.heads, args.kv_heads, args.d_model, max(args.tokens, 64))
        lm = load_model(str(folder))
        words = text(args.tokens)
        result = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                  "model": vars(args), "base_mib": peak_mib(), "load_average_at_start": os.getloadavg()}
        result["capture"], long = capture_vs_forward(lm, words, args.repeat)
        print(json.dumps(result["capture"], indent=1), file=sys.stderr)
        result["overview"] = overviews(long, args.repeat, args.all_heads, args.tiles_too)
        print(json.dumps(result["overview"], indent=1), file=sys.stderr)
        if not args.no_server:
            result["server"] = served(lm, words, args.tokens, args.repeat)
            print(json.dumps(result["server"], indent=1), file=sys.stderr)
        if args.page:
            result["page"] = page(long, folder, args.repeat, args.tiles_too)
            print(json.dumps(result["page"], indent=1), file=sys.stderr)
    result["load_average_at_end"] = os.getloadavg()
    out = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).write_text(out)
    print(out)


if __name__ == "__main__":
    main()
