"""The page's first paint on a 2,000-step run: it draws every step of every curve. The seconds it took are printed
(run with -s), never asserted (no timed assertions): the number is in the viewer's docs, with how it was taken."""

from __future__ import annotations

import time

from tests.fixtures.waiting import wait_until
from tests.unit.orchestrator.view.synthetic import long_run

STEPS = 2000
# Loads measured: the first after the server starts (it parses metrics.jsonl), then a few more (a reload).
LOADS = 4


def test_first_paint_of_a_2000_step_run(browser, serve, tmp_path):
    t0 = time.perf_counter()
    run_dir = long_run(tmp_path / "long", STEPS)
    written = time.perf_counter() - t0
    url = serve([run_dir])
    mib = (run_dir / "completions.jsonl").stat().st_size / 2**20
    for load in range(LOADS):
        browser.get("about:blank")
        browser.get(url)
        wait_until(lambda: browser.execute_script("return window.__ready === true"), "the curves", 120)
        timing = browser.execute_script("""
            const nav = performance.getEntriesByType('navigation')[0];
            const fcp = performance.getEntriesByName('first-contentful-paint')[0];
            const ready = performance.getEntriesByName('rayward-ready')[0];
            return {fcp: fcp ? fcp.startTime : null, ready: ready.startTime, dom: nav.domContentLoadedEventEnd};""")
        print(f"first paint, {STEPS} steps, load {load + 1}: first-contentful-paint {timing['fcp']:.0f} ms, "
              f"curves drawn (rayward-ready) {timing['ready']:.0f} ms, DOMContentLoaded {timing['dom']:.0f} ms "
              f"(run dir written in {written:.1f} s)")
        if load == 0:  # the completions log indexed (once) and the latest step's samples drawn
            wait_until(lambda: browser.execute_script("return document.querySelectorAll('#groups .group').length") == 8,
                       f"step {STEPS}'s 8 groups", 120)
            shown = browser.execute_script("return performance.now()")
            print(f"samples of the latest step shown at {shown:.0f} ms (completions.jsonl {mib:.0f} MiB indexed)")
    for panel in ("reward", "eval", "entropy", "length", "time"):
        xs = browser.execute_script("return Array.from(window.__viewer.charts.get(arguments[0]).plot.data[0])", panel)
        assert xs == list(range(1, STEPS + 1)), panel
    wait_until(lambda: browser.execute_script("return document.querySelectorAll('#groups .group').length") == 8,
               f"step {STEPS}'s 8 groups", 120)
