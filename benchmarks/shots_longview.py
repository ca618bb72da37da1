"""Screenshots of the long view at a long input (the issue's closing note): the overview of one head, a
zoomed tile at full resolution and the reading view, served by attnlab's app, in headless Chromium.

    .venv/bin/python benchmarks/shots_longview.py --tokens 32768 --out benchmarks/results

Uses bench_longview's Llama-style model (random weights) with one layer of its 8 heads over 2, which
gives each head's map as the 8-layer model would at the first layer, in a fraction of the time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import bench_longview as bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "web"))
    from playwright.sync_api import sync_playwright

    from attnlab.hf.loading import load_model
    from attnlab.web.server import create_app
    from conftest import served

    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        bench.build(Path(tmp), 1, 8, 2, 512, max(args.tokens, 64))
        app = create_app(load_model(tmp))
        words = bench.text(args.tokens)
        with served(app) as url, sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url + "/long")
            page.fill("#long-text", words)
            t = time.perf_counter()
            page.click("#run")
            page.wait_for_function("() => attnlab.long.shown.overview && attnlab.long.shown.row", timeout=600_000)
            print(f"first overview and row after {time.perf_counter() - t:.1f} s")
            page.locator(".long-body").screenshot(path=str(out / f"longview_overview_{args.tokens}.png"))
            box = page.locator("#long-overview").bounding_box()  # drag the first cell's neighbourhood: a tile
            page.mouse.move(box["x"] + 1, box["y"] + 1)
            page.mouse.down()
            page.mouse.move(box["x"] + 3, box["y"] + 3)
            page.mouse.up()
            page.wait_for_function("() => attnlab.long.shown.tile", timeout=120_000)
            page.locator(".long-body").screenshot(path=str(out / f"longview_tile_{args.tokens}.png"))
            page.locator("#long-read").scroll_into_view_if_needed()
            page.screenshot(path=str(out / f"longview_reading_{args.tokens}.png"))
            b.close()


if __name__ == "__main__":
    main()
