"""Screenshot of a history page built from synthetic runs (docs/history.png), in headless Chromium.

The runs come from history_scale.make_storage (36 runs x 6 cases: a planted 1.3x slowdown and a
0.8x speed-up, A/B runs every sixth run, one run saved without raw rounds); the shot is the top
1280 x 900 pixels: what was read, the steps table and the first charts, with the tooltip of the
A/B regression point.

    .venv/bin/python lab/reference/history_screenshot.py [--out docs/history.png]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from history_scale import chromium_path, make_storage

from ddpbench.history import build_history, write_page

ROOT = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "history.png")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    if not chromium_path():
        parser.error("needs chromium: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        make_storage(Path(tmp) / ".benchmarks", runs=36, cases=6, ab_every=6)
        here = os.getcwd()
        os.chdir(tmp)  # the page names the storage as given: .benchmarks, as a user's would read
        try:
            history = build_history(".benchmarks")
        finally:
            os.chdir(here)
        page_path = write_page(history, Path(tmp) / "history.html")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(page_path.resolve().as_uri())
            page.wait_for_function(f"document.querySelectorAll('figure.chart[data-drawn=\"true\"]').length"
                                   f" === {len(history.series)}")
            page.hover(".pt.regression")  # the shot shows a tooltip: an A/B run just after the step
            page.screenshot(path=str(args.out), full_page=False)
            browser.close()
    print(f"screenshot: {args.out} ({len(history.series)} charts, {len(history.steps)} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
