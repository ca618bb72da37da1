"""The viewer with a 512-token sentence (the default model's limit): is it still responsive?

    .venv/bin/python benchmarks/bench_viewer.py [--repeats 5] [--json F]

Measured in one run, medians over the repeats:
- server: POST /api/maps for a new sentence (capture + word maps + roles + overview), the same
  request again (cached capture), POST /api/head for one head (full 512-word map); bytes sent,
  gzipped as the browser gets them, and raw.
- browser (headless Chromium, as the tests launch it): time from "Show attention" to the head view
  drawn (the first repeat captures, the others find the capture cached: the median is the page's
  own cost plus the transfer), switching to another head, hovering a word (redraw of the visible lines), opening the
  model view; and, side by side, drawing the model view's 72 maps from the 32 × 32 overview the
  server sends against drawing them from full 512 × 512 maps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import numpy as np

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
WORDS = "the river bank money water bridge people trees boat fish city market paid loan account old new".split()


def sentence_of(tokens: int, tokenizer, seed: int) -> str:
    """A sentence of exactly ``tokens`` tokens with [CLS] and [SEP] (these words are one piece each)."""
    rng = np.random.default_rng(seed)
    words = list(rng.choice(WORDS, size=tokens - 2))
    text = " ".join(words)
    n = len(tokenizer(text)["input_ids"])
    if n != tokens:
        raise RuntimeError(f"built a sentence of {n} tokens, wanted {tokens}")
    return text


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def server_side(client, tokenizer, repeats: int) -> dict:
    fresh = iter(range(1000))
    cold, res = timed(lambda: client.post("/api/maps", json={"sentences": [sentence_of(512, tokenizer, next(fresh))]}), repeats)
    text = sentence_of(512, tokenizer, 999)
    client.post("/api/maps", json={"sentences": [text]})
    warm, _ = timed(lambda: client.post("/api/maps", json={"sentences": [text]}), repeats)
    head, hres = timed(lambda: client.post("/api/head", json={"sentences": [text], "layer": 3, "head": 11}), repeats)
    raw = lambda path, body: len(client.post(path, json=body, headers={"Accept-Encoding": "identity"}).content)  # noqa: E731
    return {
        "maps_new_sentence_s": cold, "maps_cached_s": warm, "head_s": head,
        "maps_bytes_gzip": int(res.headers.get("content-length", len(res.content))),
        "maps_bytes_raw": raw("/api/maps", {"sentences": [text]}),
        "head_bytes_gzip": int(hres.headers.get("content-length", len(hres.content))),
        "head_bytes_raw": raw("/api/head", {"sentences": [text], "layer": 3, "head": 11}),
    }


def browser_side(base: str, text: str, repeats: int) -> dict:
    from playwright.sync_api import sync_playwright

    out: dict[str, list[float]] = {k: [] for k in ("show_s", "switch_head_s", "hover_ms", "model_view_s",
                                                   "draw_overview_ms", "draw_full_ms")}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        for r in range(repeats):
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(base + "/#head")
            page.wait_for_selector("#head-words .word")  # the default sentence, first
            page.fill("#sentence-a", text)
            t = time.perf_counter()
            page.click("#run")
            page.wait_for_function("document.querySelectorAll('#head-words .word').length > 500 && document.querySelector('#head-lines')")
            out["show_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            page.select_option("#head-head", str(2 + r % 10))
            page.wait_for_selector(f"#head-caption:has-text('head {2 + r % 10} of')")
            page.wait_for_selector("#head-lines")
            out["switch_head_s"].append(time.perf_counter() - t)
            box = page.locator("#head-lines").bounding_box()
            out["hover_ms"].append(page.evaluate(
                """([x, y]) => { const c = document.querySelector('#head-lines'); const t = performance.now();
                   for (let k = 0; k < 20; k++) c.dispatchEvent(new MouseEvent('mousemove', {clientX: x, clientY: y + (k % 2) * 20, bubbles: true}));
                   return (performance.now() - t) / 20; }""", [box["x"] + 80, box["y"] + 30]))
            t = time.perf_counter()
            page.click('#tabs button[data-view="model"]')
            page.wait_for_function("document.querySelectorAll('#model-grid .cell').length === 72")
            out["model_view_s"].append(time.perf_counter() - t)
            # The model view's choice, side by side: 72 maps from 32 x 32 cells vs from 512 x 512.
            for key, n in (("draw_overview_ms", 32), ("draw_full_ms", 512)):
                out[key].append(page.evaluate(
                    """(n) => { const data = new Float32Array(n * n).map(() => Math.random() / n);
                       const c = document.createElement('canvas'); const t = performance.now();
                       for (let k = 0; k < 72; k++) window.attnlab.drawMatrix(c, data, n, 80);
                       return performance.now() - t; }""", n))
            page.close()
        browser.close()
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()

    import torch
    import uvicorn
    from fastapi.testclient import TestClient

    from attnlab.models.loading import load_model
    from attnlab.viz.server import create_app

    lm = load_model()
    app = create_app(lm)
    client = TestClient(app)
    result = {"model": lm.model_id, "tokens": 512, "threads": torch.get_num_threads(), "repeats": args.repeats}
    result["server"] = server_side(client, lm.tokenizer, args.repeats)

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    result["browser"] = browser_side(f"http://127.0.0.1:{port}", sentence_of(512, lm.tokenizer, 7), args.repeats)
    server.should_exit = True
    b = result["browser"]
    result["ratio_full_over_overview_draw"] = b["draw_full_ms"] / b["draw_overview_ms"]

    s = result["server"]
    print(f"{lm.model_id}, 512 tokens, {result['threads']} threads, median of {args.repeats}")
    print(f"  server  /api/maps new sentence {s['maps_new_sentence_s']:.2f} s, cached {s['maps_cached_s']:.3f} s "
          f"({s['maps_bytes_gzip'] / 1e3:.0f} kB gzip, {s['maps_bytes_raw'] / 1e3:.0f} kB raw)")
    print(f"          /api/head one head {s['head_s']:.3f} s ({s['head_bytes_gzip'] / 1e3:.0f} kB gzip, "
          f"{s['head_bytes_raw'] / 1e3:.0f} kB raw)")
    print(f"  browser show (capture cached) {b['show_s']:.2f} s, switch head {b['switch_head_s']:.3f} s, hover redraw {b['hover_ms']:.2f} ms, "
          f"model view {b['model_view_s']:.3f} s")
    print(f"          72 small maps from 32×32 {b['draw_overview_ms']:.1f} ms vs from 512×512 {b['draw_full_ms']:.1f} ms "
          f"(× {result['ratio_full_over_overview_draw']:.0f})")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
