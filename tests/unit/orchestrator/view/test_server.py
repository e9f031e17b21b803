import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from orchestrator.cli.main import parse_args
from orchestrator.view.server import distinct_labels, make_app

from .synthetic import SyntheticRun


def fetch(app, *paths):
    """[(status, body)] for GETs of the paths, in order, on one app (its state kept between them); a callable
    among them is called there instead (a run writing between two requests)."""

    async def go():
        async with TestClient(TestServer(app)) as client:
            out = []
            for path in paths:
                if callable(path):
                    path()
                    continue
                resp = await client.get(path)
                body = await resp.read()
                out.append((resp.status, json.loads(body) if resp.content_type == "application/json" else body))
            return out

    return asyncio.run(go())


@pytest.fixture
def run(tmp_path):
    return SyntheticRun(tmp_path / "run", groups=2, group_size=3, token_samples=2, agentic=True, eval_every=2)


def test_runs_and_the_page(run, tmp_path):
    run.write(range(1, 3))
    (status, runs), (page_status, page), (js_status, _), (css_status, _) = fetch(
        make_app([run.dir]), "/api/runs", "/", "/static/app.js", "/static/uplot/uPlot.min.css")
    assert status == 200 and runs == [{"id": 0, "name": "run", "dir": str(run.dir), "max_steps": None,
                                       "completions": True, "tokens": True}]
    assert page_status == js_status == css_status == 200
    assert b"static/uplot/uPlot.iife.min.js" in page


def test_metrics_incremental_follow(run):
    run.write(range(1, 3))
    (_, first), (_, more), (_, stale) = fetch(
        make_app([run.dir]), "/api/run/0/metrics?since=0&epoch=-1", lambda: run.write_step(3),
        "/api/run/0/metrics?since=3&epoch=0", "/api/run/0/metrics?since=3&epoch=7")
    assert first["steps"] == [1, 2, 2]  # step 2's eval row after its training row
    assert first["cols"]["eval/reward"] == [None, None, 0.12]
    assert "grad_norm" not in first["cols"] and "roles/bottleneck" not in first["cols"]  # NaN, a string
    assert more["since"] == 3 and more["steps"] == [3] and more["total"] == 4
    written = json.loads((run.dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert more["cols"]["reward"] == [pytest.approx(written["reward"], rel=1e-5)]
    assert more["cols"]["kl"] == [0.003] and "eval/reward" not in more["cols"]
    assert stale["since"] == 0 and stale["steps"] == [1, 2, 2, 3]  # a client of another epoch gets every row


def test_steps_samples_and_tokens(run):
    run.write(range(1, 4))
    app = make_app([run.dir])
    (_, steps), (_, latest), (_, two), (tok_status, tok), (missing, _), (bad, _) = fetch(
        app, "/api/run/0/steps", "/api/run/0/samples", "/api/run/0/samples?step=2",
        "/api/run/0/tokens?step=2&sample=3", "/api/run/0/tokens?step=2&sample=1", "/api/run/0/samples?step=x")
    assert steps == {"epoch": 0, "steps": [1, 2, 3], "token_steps": [1, 2, 3], "tokens": True}
    assert latest["step"] == 3 and len(latest["rows"]) == 6 and latest["tokens"] == [0, 3]
    assert two["rows"][4]["completion"][2]["content"] == "step 2 group 1 answer 1"
    assert tok_status == 200 and tok["step"] == 2 and tok["sample"] == 3 and tok["mask"][3] == 0
    assert missing == 404 and bad == 400


def test_samples_of_a_run_without_completions_and_a_missing_step(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.1}\n')
    (_, latest), (status, _), (_, steps), (no_run, _) = fetch(
        make_app([tmp_path]), "/api/run/0/samples", "/api/run/0/samples?step=5", "/api/run/0/steps",
        "/api/run/3/steps")
    assert latest == {"step": None, "rows": [], "tokens": []}
    assert status == 404 and steps["tokens"] is False and steps["steps"] == []
    assert no_run == 404


def test_rows_with_nan_are_valid_json(tmp_path):
    (tmp_path / "completions.jsonl").write_text('{"step": 1, "prompt": "p", "completion": "c", "total": NaN, '
                                                '"rewards/x": Infinity}\n')
    ((status, body),) = fetch(make_app([tmp_path]), "/api/run/0/samples")
    assert status == 200 and body["rows"][0]["total"] is None and body["rows"][0]["rewards/x"] is None


def test_images_only_from_the_run_images_dir(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(b"\x89PNG fake")
    (tmp_path / "secret.txt").write_text("no")
    (ok, body), (outside, _), (dotted, _) = fetch(make_app([tmp_path]), "/api/run/0/file/images/a.png",
                                                  "/api/run/0/file/secret.txt",
                                                  "/api/run/0/file/images/%2E%2E/secret.txt")
    assert ok == 200 and body == b"\x89PNG fake"
    assert outside == 404 and dotted == 404


def test_distinct_labels(tmp_path):
    a, b, c = tmp_path / "x" / "run", tmp_path / "y" / "run", tmp_path / "z" / "other"
    assert distinct_labels([a, b, c]) == ["x/run", "y/run", "other"]


def test_view_subcommand_parses(tmp_path):
    args = parse_args(["view", str(tmp_path), "runs/b", "--port", "0"])
    assert args.command == "view" and args.runs == [str(tmp_path), "runs/b"] and args.port == 0
    assert args.host == "127.0.0.1"
