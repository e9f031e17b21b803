"""The page in a real browser (headless Chromium): a finished run, a run that writes while the page is open, real
run directories (the demo's, a tools run's, a VLM run's), and a run without a token record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.fixtures.waiting import wait_until
from tests.unit.orchestrator.view.synthetic import SyntheticRun, token_record_for

# Recorded real runs (their first steps, as `rayward run` wrote them): configs/demo.yaml, configs/tools.yaml,
# configs/vlm.yaml.
RECORDED = Path(__file__).parent / "recorded"
# The page polls every couple of seconds; a loaded 2-core machine is slower.
PAGE_WAIT_S = 60


def js(browser, script: str, *args):
    return browser.execute_script(script, *args)


def open_page(browser, url: str) -> None:
    browser.get(url)
    wait_until(lambda: js(browser, "return window.__ready === true"), "the page's curves", PAGE_WAIT_S)
    wait_until(lambda: js(browser, "return document.querySelectorAll('#groups .group').length > 0 || "
                                   "!!document.querySelector('#groups .note')"), "the samples", PAGE_WAIT_S)


def groups_text(browser) -> str:
    return js(browser, "return document.getElementById('groups').innerText")


def chart_points(browser, panel: str) -> list[int]:
    """The x values (steps) the panel's chart holds, and checks it drew (a canvas of its size)."""
    return js(browser, """
        const c = window.__viewer.charts.get(arguments[0]);
        if (!c || !c.el.querySelector('canvas').width) return null;
        return Array.from(c.plot.data[0]);""", panel)


def open_tokens(browser, sample: int) -> None:
    browser.find_element("css selector", f'#groups tr[data-sample="{sample}"] button.tokbtn').click()
    wait_until(lambda: js(browser, f"return document.querySelectorAll('tr.tokrow[data-sample=\"{sample}\"] .toks .tok')"
                                   ".length > 0"), f"sample {sample}'s tokens", PAGE_WAIT_S)


def shaded_tokens(browser, sample: int) -> list[dict]:
    return js(browser, """
        return Array.from(document.querySelectorAll(`tr.tokrow[data-sample="${arguments[0]}"] .toks .tok`)).map(t => ({
            text: t.textContent, bg: t.style.backgroundColor, out: t.classList.contains('out')}));""", sample)


def hover_text(browser, sample: int, index: int) -> str:
    from selenium.webdriver import ActionChains

    tok = browser.find_element("css selector", f'tr.tokrow[data-sample="{sample}"] .tok[data-i="{index}"]')
    ActionChains(browser).move_to_element(tok).perform()
    wait_until(lambda: js(browser, "return !document.getElementById('tip').hidden"), "the token's tooltip", 10)
    return js(browser, "return document.getElementById('tip').textContent")


def test_a_finished_run(browser, serve, tmp_path):
    run = SyntheticRun(tmp_path / "done", groups=4, group_size=4, agentic=True, eval_every=5).write(range(1, 21))
    open_page(browser, serve([run.dir]))
    steps = list(range(1, 21))
    assert chart_points(browser, "reward") == steps
    assert chart_points(browser, "eval") == steps and chart_points(browser, "gates") == steps
    legend = js(browser, "return window.__viewer.charts.get('reward').el.innerText")
    assert "letter" in legend and "format" in legend
    text = groups_text(browser)
    assert "step 20 group 2 answer 3" in text  # a completion of the latest step, its last turn
    assert "→ open_box({\"box\":3})" in text and "← open_box: code 103" in text  # turn by turn, the tool call
    assert "no spread" in js(browser, "return document.querySelector('.group.flat .badge').textContent")
    assert js(browser, "return document.querySelectorAll('.group.flat').length") == 1
    # sample 6: group 1 (flat), its third completion: letter, format (raw = gated), total
    row = js(browser, "return Array.from(document.querySelectorAll('#groups tr[data-sample=\"6\"] td')).map("
                      "td => td.innerText)")
    assert row[2:5] == ["0.5", "1", "0.5"]  # letter, format, total

    open_tokens(browser, 8)
    toks = shaded_tokens(browser, 8)
    assert len(toks) == 12 and [t["out"] for t in toks] == [False] * 3 + [True] * 3 + [False] * 6
    assert all(t["bg"].startswith("rgba(234, 88, 12") for t in toks if not t["out"])
    assert len({t["bg"] for t in toks if not t["out"]}) > 1  # shaded by each token's own log-prob
    record = json.loads((run.dir / "tokens.jsonl").read_text().splitlines()[-2])
    assert (record["step"], record["sample"]) == (20, 8)
    tip = hover_text(browser, 8, 0)
    assert f"sampling log-prob {js(browser, 'return fmt(arguments[0])', record['logprobs'][0])}" in tip
    assert "learner log-prob" in tip and "learner − sampling" in tip and f"id {record['ids'][0]}" in tip
    assert "not in the loss" in hover_text(browser, 8, 4)

    # filters: a text search, and the stop reason
    browser.find_element("id", "f-text").send_keys("group 3 answer 2")
    wait_until(lambda: "4 of 16" not in js(browser, "return document.getElementById('sample-count').textContent")
               and "1 of 16" in js(browser, "return document.getElementById('sample-count').textContent"),
               "the search to leave one sample", 10)
    assert "step 20 group 3 answer 2" in groups_text(browser) and "group 0" not in groups_text(browser)


def test_following_a_running_run(browser, serve, tmp_path):
    run = SyntheticRun(tmp_path / "live", groups=2, group_size=4, token_samples=2).write(range(1, 4))
    open_page(browser, serve([run.dir]))
    assert chart_points(browser, "reward") == [1, 2, 3]
    assert "step 3 group 1 answer 2" in groups_text(browser)
    # the run trains two more steps while the page is open; the second's metrics row torn at first
    run.write_step(4)
    row = json.dumps(run.metrics_row(5)) + "\n"
    with open(run.dir / "metrics.jsonl", "a") as f:
        f.write(row[:20])
        f.flush()
        wait_until(lambda: chart_points(browser, "reward") == [1, 2, 3, 4], "step 4 on the curves", PAGE_WAIT_S)
        f.write(row[20:])
    wait_until(lambda: chart_points(browser, "reward") == [1, 2, 3, 4, 5], "step 5 on the curves", PAGE_WAIT_S)
    wait_until(lambda: "step 4 group 1 answer 2" in groups_text(browser), "step 4's samples (following)",
               PAGE_WAIT_S)
    options = js(browser, "return Array.from(document.querySelectorAll('#step option')).map(o => o.value)")
    assert options == ["1", "2", "3", "4"]
    open_tokens(browser, 4)
    assert shaded_tokens(browser, 4)[0]["bg"]


def test_two_runs_overlaid(browser, serve, tmp_path):
    a = SyntheticRun(tmp_path / "a" / "run", seed=1).write(range(1, 8))
    b = SyntheticRun(tmp_path / "b" / "run", seed=2).write(range(1, 5))
    open_page(browser, serve([a.dir, b.dir]))
    assert chart_points(browser, "reward") == list(range(1, 8))
    labels = js(browser, "return window.__viewer.charts.get('reward').plot.series.map(s => s.label)")
    assert labels[1:] == ["a/run: reward", "a/run: letter", "a/run: format",
                          "b/run: reward", "b/run: letter", "b/run: format"]
    b_reward = js(browser, "return window.__viewer.charts.get('reward').plot.data[4]")
    assert b_reward[4:] == [None, None, None] and all(v is not None for v in b_reward[:4])


def test_the_demo_run(browser, serve, tmp_path, tiny_model_path):
    from transformers import AutoTokenizer

    run_dir = tmp_path / "demo"
    shutil.copytree(RECORDED / "demo", run_dir)
    token_record_for(run_dir, AutoTokenizer.from_pretrained(tiny_model_path))
    open_page(browser, serve([run_dir]))
    assert chart_points(browser, "reward") == [1, 2, 3] and chart_points(browser, "time") == [1, 2, 3]
    rows = [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]
    last = [r for r in rows if r["step"] == 3]
    first = last[0]
    tds = js(browser, "return Array.from(document.querySelectorAll('#groups tr[data-sample=\"0\"] td'))"
                      ".map(td => td.innerText)")
    as_shown = js(browser, "return [fmt(arguments[0]), fmt(arguments[1])]", first["rewards/letter"], first["total"])
    assert tds[2:4] == as_shown  # the row's letter reward and total, as the page writes numbers
    assert js(browser, "return visibleText(arguments[0])", first["completion"]) in groups_text(browser)
    open_tokens(browser, 0)
    toks = shaded_tokens(browser, 0)
    record = next(json.loads(line) for line in (run_dir / "tokens.jsonl").read_text().splitlines()
                  if line.startswith('{"step":3,"sample":0,'))
    assert [t["text"] for t in toks] == js(browser, "return arguments[0].map(visibleToken)", record["tokens"])
    assert sum(bool(t["bg"]) for t in toks) == sum(lp is not None and lp < 0 for lp in record["logprobs"])


def test_a_tools_run_and_a_vlm_run(browser, serve, tmp_path):
    tools, vlm = tmp_path / "tools", tmp_path / "vlm"
    shutil.copytree(RECORDED / "tools", tools)
    shutil.copytree(RECORDED / "vlm", vlm)
    open_page(browser, serve([tools, vlm]))
    assert "← open_box:" in groups_text(browser) and "→ submit(" in groups_text(browser)
    assert js(browser, "return document.getElementById('f-stop').options.length") >= 2  # any, stop, ...
    js(browser, "const s = document.getElementById('sample-run'); s.value = '1'; s.dispatchEvent(new Event('change'))")
    wait_until(lambda: js(browser, "return document.querySelectorAll('#groups .prompt img.inline').length > 0"),
               "the VLM prompts' images", PAGE_WAIT_S)
    wait_until(lambda: js(browser, "return Array.from(document.querySelectorAll('#groups .prompt img.inline'))"
                                   ".slice(0, 4).every(i => i.complete && i.naturalWidth > 0)"),
               "the first images decoded (served from the run's images/)", 20)
    assert "Write the letter of this colour:" in groups_text(browser)


def test_without_a_token_record_and_without_learner_logprobs(browser, serve, tmp_path):
    none = SyntheticRun(tmp_path / "none", token_samples=0).write(range(1, 3))
    open_page(browser, serve([none.dir]))
    assert js(browser, "return document.getElementById('token-note').hidden") is False
    assert "no token record" in js(browser, "return document.getElementById('token-note').textContent")
    assert js(browser, "return document.querySelectorAll('button.tokbtn').length") == 0
    assert "step 2 group 0 answer 1" in groups_text(browser)

    partial = SyntheticRun(tmp_path / "partial", learner_logprobs=False).write(range(1, 3))
    open_page(browser, serve([partial.dir]))
    open_tokens(browser, 0)
    head = js(browser, "return document.querySelector('tr.tokrow .tokhead').textContent")
    assert "learner log-probs not recorded" in head
    tip = hover_text(browser, 0, 1)
    assert "sampling log-prob" in tip and "learner" not in tip
