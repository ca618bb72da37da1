"""The viewer with a 512-token sentence (the default model's limit): is it still responsive?

    .venv/bin/python benchmarks/bench_viewer.py [--repeats 5] [--json F]
    .venv/bin/python benchmarks/bench_viewer.py --load [--clients 20 --tokens 450 --seconds 30] [--json F]

Measured in one run, medians over the repeats:
- server: POST /api/maps for a new sentence (capture + word maps + roles + overview), the same
  request again (cached capture), POST /api/head for one head (full 512-word map); bytes sent,
  gzipped as the browser gets them, and raw.
- browser (headless Chromium, as the tests launch it): time from "Show attention" to the head view
  drawn (the first repeat captures, the others find the capture cached: the median is the page's
  own cost plus the transfer), switching to another head, hovering a word (redraw of the visible lines), opening the
  model view; and, side by side, drawing the model view's 72 maps from the 32 × 32 overview the
  server sends against drawing them from full 512 × 512 maps.

``--load``: the server in its own process on 127.0.0.1 (as ``attnlab serve`` runs it), ``--clients``
threads each posting new ``--tokens``-token sentences to /api/maps for ``--seconds`` (a 503 waits
its Retry-After, at most 2 s), while one more thread asks for the light endpoints (``/``, a static
file, /api/info, /api/scene) every 50 ms: their latency (median, p95, max), the heavy answers by
status, and the server's resident memory before the load and at its peak (VmHWM).
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
    head, hres = timed(lambda: client.post("/api/head", json={"sentences": [text], "layer": 2, "head": 10}), repeats)
    raw = lambda path, body: len(client.post(path, json=body, headers={"Accept-Encoding": "identity"}).content)  # noqa: E731
    return {
        "maps_new_sentence_s": cold, "maps_cached_s": warm, "head_s": head,
        "maps_bytes_gzip": int(res.headers.get("content-length", len(res.content))),
        "maps_bytes_raw": raw("/api/maps", {"sentences": [text]}),
        "head_bytes_gzip": int(hres.headers.get("content-length", len(hres.content))),
        "head_bytes_raw": raw("/api/head", {"sentences": [text], "layer": 2, "head": 10}),
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


SERVER = """
import sys, uvicorn
from attnlab.lesson.scene import scene
from attnlab.web.server import create_app
uvicorn.run(create_app(preload=True, scene=scene()), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak) of a process, in kB, from /proc (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if k in ("VmRSS", "VmHWM")}


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def load_test(clients: int, tokens: int, seconds: float) -> dict:
    import socket
    import subprocess
    import sys

    import httpx
    from transformers import AutoTokenizer

    from attnlab.hf.loading import load_model

    tokenizer = AutoTokenizer.from_pretrained(load_model().path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/api/info", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the viewer did not start")
            time.sleep(0.2)
        httpx.post(base + "/api/maps", json={"sentences": [sentence_of(tokens, tokenizer, 10**6)]}, timeout=120)
        before = memory_kb(proc.pid)
        sentences = iter(sentence_of(tokens, tokenizer, seed) for seed in range(clients * 200))
        lock = threading.Lock()
        heavy: dict[str, int] = {}
        light: list[float] = []
        stop = time.monotonic() + seconds

        def heavy_client() -> None:
            with httpx.Client(base_url=base, timeout=300) as c:
                while time.monotonic() < stop:
                    with lock:
                        text = next(sentences)
                    r = c.post("/api/maps", json={"sentences": [text]})
                    with lock:
                        heavy[str(r.status_code)] = heavy.get(str(r.status_code), 0) + 1
                    if r.status_code == 503:
                        time.sleep(min(2.0, float(r.headers.get("Retry-After", 1))))

        def light_client() -> None:
            paths = ("/", "/viewer.css", "/api/info", "/api/scene")
            with httpx.Client(base_url=base, timeout=60) as c:
                k = 0
                while time.monotonic() < stop:
                    t = time.perf_counter()
                    c.get(paths[k % len(paths)]).raise_for_status()
                    light.append(time.perf_counter() - t)
                    k += 1
                    time.sleep(0.05)

        threads = [threading.Thread(target=heavy_client) for _ in range(clients)] + [threading.Thread(target=light_client)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = memory_kb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    return {"clients": clients, "tokens": tokens, "seconds": seconds, "heavy_by_status": heavy,
            "light_requests": len(light), "light_median_ms": 1000 * percentile(light, 50),
            "light_p95_ms": 1000 * percentile(light, 95), "light_max_ms": 1000 * max(light, default=float("nan")),
            "rss_before_mb": before["VmRSS"] / 1024, "rss_peak_mb": after["VmHWM"] / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--load", action="store_true", help="the load test instead (see above)")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=450)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    if args.load:
        r = load_test(args.clients, args.tokens, args.seconds)
        print(f"{r['clients']} clients posting {r['tokens']}-token sentences for {r['seconds']:g} s: "
              f"heavy answers by status {r['heavy_by_status']}")
        print(f"  light endpoints ({r['light_requests']} requests): median {r['light_median_ms']:.1f} ms, "
              f"p95 {r['light_p95_ms']:.1f} ms, max {r['light_max_ms']:.1f} ms")
        print(f"  server memory: {r['rss_before_mb']:.0f} MB before the load, peak {r['rss_peak_mb']:.0f} MB")
        if args.json_path:
            with open(args.json_path, "w") as f:
                json.dump(r, f, indent=2)
        return

    import torch
    import uvicorn
    from fastapi.testclient import TestClient

    from attnlab.hf.loading import load_model
    from attnlab.web.server import create_app

    lm = load_model()
    app = create_app(lm)
    client = TestClient(app, base_url="http://127.0.0.1")  # the viewer answers only to its own names
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
