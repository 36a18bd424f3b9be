"""ddpbench history, its page: self-contained, and in headless Chromium every chart draws with one
point per run, hovering a point shows its run (and its numerics replay), the planted step is in the
table with its commit range, and the page logs no error and fetches nothing.

The browser tests skip (with what to install) when Playwright or a chromium executable is missing;
they use Debian's chromium (``apt-get install chromium``), not Playwright's own download."""

from __future__ import annotations

import re
import shutil
from datetime import timedelta

import numpy as np
import pytest

from helpers.benchjson import bench
from ddpbench.history import build_history, write_page
from test_history import ALL_REDUCE, DAY0, OTHER_MACHINE, commit_of, numerics_record, rounds, save

STEP_CASE = "test_all_reduce[gloo-2p-1MB]"
RUNS, STEP_AT, AB_RUN, NO_DATA_RUN, NUMERICS_RUN = 12, 6, 8, 3, 10


def flat_info(i: int) -> dict:
    """The flat case's numerics replay from the run before NUMERICS_RUN on, its gradient doubled there."""
    return {"numerics": numerics_record(2.0 if i >= NUMERICS_RUN else 1.0)} if i >= NUMERICS_RUN - 1 else {}


@pytest.fixture(scope="module")
def history_page(tmp_path_factory):
    """12 runs on one machine: a 1.5x step at run 6, an A/B regression at run 8, run 3 saved without
    rounds, a flat case; and the step case on a second machine (4 runs), which must be its own chart."""
    tmp = tmp_path_factory.mktemp("history")
    storage, rng = tmp / ".benchmarks", np.random.default_rng(0)
    for i in range(RUNS):
        level = 0.010 * (1.5 if i >= STEP_AT else 1.0) * np.exp(rng.normal(0, 0.02))
        info = dict(ALL_REDUCE, ab={"verdict": "regression", "ratio": 1.52}) if i == AB_RUN else ALL_REDUCE
        save(storage, i, [bench(STEP_CASE, rounds(level, rng), info, include_data=i != NO_DATA_RUN),
                          bench("test_flat", rounds(0.002, rng), flat_info(i), include_data=i != NO_DATA_RUN)])
    for i in range(RUNS, RUNS + 4):
        save(storage, i, [bench(STEP_CASE, rounds(0.02, rng), ALL_REDUCE)], machine=OTHER_MACHINE,
             folder="other-machine", when=DAY0 + timedelta(days=i))
    history = build_history(storage)
    return history, write_page(history, tmp / "history.html")


def test_the_page_is_self_contained(history_page):
    _, path = history_page
    html = path.read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html)
    assert "<link" not in html and "<script src" not in html and "@import" not in html and "url(" not in html
    assert '<script type="application/json" id="history-data">' in html


def test_the_step_table_names_the_step_and_its_commit_range(history_page):
    history, path = history_page
    (step,) = history.steps
    assert (step.series.name, step.series.machine.label, step.index) == (STEP_CASE, "box (Test CPU)", STEP_AT)
    row = re.search(r'<table class="steps">.*?<tbody>(.*?)</tbody>', path.read_text(), re.S).group(1)
    assert f'href="#{step.series.chart_id}"' in row and "&times;1.5" in row
    assert re.search(rf"{commit_of(STEP_AT - 1)[:7]}</code> 2026-02-06 &rarr; <code>{commit_of(STEP_AT)[:7]}</code> "
                     rf"2026-02-07", row)
    # ... and the ddpbench bisect command that searches those commits for the one that made it slower.
    command = f"ddpbench bisect {commit_of(STEP_AT - 1)[:7]} {commit_of(STEP_AT)[:7]} -k '{STEP_CASE}'"
    assert step.bisect_command().startswith(command) and f"<code>{command.replace(chr(39), '&#x27;')}" in row
    assert step.to_dict()["bisect"] == step.bisect_command()


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: pip install -e '.[dev]' (and apt-get install chromium)")
    # Debian's and Ubuntu's packages, or the Chrome that GitHub's ubuntu runners ship.
    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if not chromium:
        pytest.skip("no chromium executable on PATH (chromium, chromium-browser, google-chrome): "
                    "apt-get install chromium")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def loaded(history_page, browser):
    """The page opened in Chromium once every chart drew, with what it logged and fetched."""
    _, path = history_page
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors, requests = [], []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda request: requests.append(request.url))
    page.goto(path.as_uri())
    page.wait_for_function("document.querySelectorAll('figure.chart').length > 0 && "
                           "[...document.querySelectorAll('figure.chart')].every(f => f.dataset.drawn === 'true')",
                           timeout=10_000)
    yield page, errors, requests
    page.close()


def test_every_chart_draws_one_point_per_run(history_page, loaded):
    history, _ = history_page
    page, errors, _ = loaded
    drawn = page.eval_on_selector_all("figure.chart", "fs => fs.map(f => [f.id, f.dataset.drawn, "
                                                      "f.querySelectorAll('.pt').length])")
    assert drawn == [[s.chart_id, "true", len(s.points)] for s in history.series]
    # the case measured on two machines is two charts; the flat case one
    assert sorted(n for _, _, n in drawn) == [4, RUNS, RUNS]
    assert errors == []


def test_hovering_a_point_shows_its_run(history_page, loaded):
    history, _ = history_page
    page, errors, _ = loaded
    chart = next(s for s in history.series if s.name == STEP_CASE and len(s.points) == RUNS).chart_id
    tooltip = page.locator("#tooltip")
    page.hover(f'#{chart} .pt[data-commit="{commit_of(STEP_AT)[:7]}"]')
    text = tooltip.inner_text()
    assert tooltip.is_visible() and f"commit {commit_of(STEP_AT)[:7]} on main" in text
    assert "committed 2026-02-07 09:00 UTC" in text and f"run 0007_{commit_of(STEP_AT)[:8]}.json" in text
    assert "IQR " in text and "median " in text

    page.hover(f'#{chart} .pt[data-i="{NO_DATA_RUN}"]')
    assert "no spread (saved without --benchmark-save-data)" in tooltip.inner_text()

    ab_point = page.locator(f'#{chart} .pt[data-i="{AB_RUN}"]')
    assert ab_point.evaluate("e => e.tagName + ' ' + e.getAttribute('class')") == "path pt regression"
    ab_point.hover()
    assert "A/B: regression, ratio 1.520" in tooltip.inner_text()
    steps = page.eval_on_selector_all(f"#{chart} .stepline", "ls => ls.length")
    assert steps == 1 and errors == []

    flat = next(s for s in history.series if s.name == "test_flat").chart_id
    page.hover(f'#{flat} .pt[data-i="{NUMERICS_RUN}"]')
    text = tooltip.inner_text()
    assert "numerics replay: 2 steps, digest " in text
    assert "numerics vs the run before: changed from step 1 of 2: largest relative difference 1 (100%)" in text
    page.hover(f'#{flat} .pt[data-i="{NUMERICS_RUN - 2}"]')
    assert "numerics" not in tooltip.inner_text() and errors == []


def test_the_page_fetches_nothing_but_itself(history_page, loaded):
    _, path = history_page
    _, _, requests = loaded
    assert requests and all(url == path.as_uri() or url.startswith("data:") for url in requests), requests
