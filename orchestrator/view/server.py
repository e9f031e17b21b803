"""The page's server (aiohttp): `/` and its static files, and JSON endpoints over the runs' directories.

    GET /api/runs                              the runs: name, directory, whether they have samples and tokens
    GET /api/run/{i}/metrics?since=N&epoch=E   metric rows from N on, by column (a stale epoch: all of them)
    GET /api/run/{i}/steps                     the steps with samples, and those with a token record
    GET /api/run/{i}/samples?step=S            a step's completions rows (default: the latest step)
    GET /api/run/{i}/tokens?step=S&sample=K    one sample's token record (404 without one)
    GET /api/run/{i}/file/images/NAME          an image the completions log names (under <run dir>/images only)

Every request for a run first reads what the files it answers from gained since the last (store.py): a page that
polls follows a running run, and a finished run costs a stat per file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from aiohttp import web

from orchestrator.telemetry.metrics import IMAGES_DIR
from orchestrator.view.store import RunView

STATIC_DIR = Path(__file__).parent / "static"
RUNS_KEY: web.AppKey[list[RunView]] = web.AppKey("runs", list)
# JSON bodies above this many bytes go out gzipped when the browser takes it: a long run's metrics through an ssh
# tunnel; small polls skip the compression's cost.
COMPRESS_BYTES = 1 << 14


def _finite(value: Any) -> Any:
    """`value` with NaN and infinities as None, at any depth (a browser's JSON.parse refuses them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _json(data: Any, request: web.Request) -> web.Response:
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)
    resp = web.Response(text=body, content_type="application/json", headers={"Cache-Control": "no-store"})
    if len(body) > COMPRESS_BYTES:
        resp.enable_compression()
    return resp


def _int(request: web.Request, name: str, default: int | None = None) -> int | None:
    raw = request.query.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be an integer, not {raw!r}") from None


def _run(request: web.Request) -> RunView:
    runs = request.app[RUNS_KEY]
    try:
        return runs[int(request.match_info["run"])]
    except (ValueError, IndexError):
        raise web.HTTPNotFound(text=f"no run {request.match_info['run']!r}: the page serves {len(runs)}") from None


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


async def runs(request: web.Request) -> web.Response:
    return _json([{"id": i, **run.info()} for i, run in enumerate(request.app[RUNS_KEY])], request)


async def metrics(request: web.Request) -> web.Response:
    run = _run(request)
    run.metrics.refresh()
    data = run.metrics.payload(since=_int(request, "since", 0), epoch=_int(request, "epoch"))
    data["updated_s"] = run.updated_s()
    return _json(data, request)


async def steps(request: web.Request) -> web.Response:
    run = _run(request)
    run.refresh_samples()
    token_steps = sorted({s for s, _ in run.tokens.lines})
    return _json({"epoch": run.completions.epoch, "steps": run.completions.steps(), "token_steps": token_steps,
                  "tokens": run.tokens.exists}, request)


async def samples(request: web.Request) -> web.Response:
    run = _run(request)
    run.refresh_samples()
    all_steps = run.completions.steps()
    step = _int(request, "step")
    if step is None:
        if not all_steps:
            return _json({"step": None, "rows": [], "tokens": []}, request)
        step = all_steps[-1]
    if step not in run.completions.rows:
        raise web.HTTPNotFound(text=f"run {run.label!r} has no samples at step {step}")
    rows = _finite(run.completions.read(step))
    return _json({"step": step, "rows": rows, "tokens": run.tokens.samples(step)}, request)


async def tokens(request: web.Request) -> web.Response:
    run = _run(request)
    run.refresh_samples()
    step, sample = _int(request, "step"), _int(request, "sample")
    record = None if step is None or sample is None else run.tokens.read(step, sample)
    if record is None:
        raise web.HTTPNotFound(text=f"run {run.label!r} has no token record of step {step} sample {sample}")
    return _json(record, request)


async def run_file(request: web.Request) -> web.FileResponse:
    """An image of the completions log: only files under <run dir>/images, nothing else of the run directory
    (nor, through `..` or a link, outside it)."""
    run = _run(request)
    root = (run.dir / IMAGES_DIR).resolve()
    path = (run.dir / request.match_info["path"]).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise web.HTTPNotFound(text="no such image")
    return web.FileResponse(path, headers={"Cache-Control": "max-age=3600"})  # named by content: never changes


def make_app(run_dirs: list[Path], labels: list[str] | None = None) -> web.Application:
    """The app over these run directories (labels: their names on the page; default the directories' names,
    made distinct)."""
    labels = labels or distinct_labels(run_dirs)
    app = web.Application()
    app[RUNS_KEY] = [RunView(d, label) for d, label in zip(run_dirs, labels, strict=True)]
    app.router.add_get("/", index)
    app.router.add_static("/static/", STATIC_DIR, append_version=False)
    app.router.add_get("/api/runs", runs)
    app.router.add_get("/api/run/{run}/metrics", metrics)
    app.router.add_get("/api/run/{run}/steps", steps)
    app.router.add_get("/api/run/{run}/samples", samples)
    app.router.add_get("/api/run/{run}/tokens", tokens)
    app.router.add_get("/api/run/{run}/file/{path:.+}", run_file)
    return app


def distinct_labels(run_dirs: list[Path]) -> list[str]:
    """Each run's directory name; where two share a name (runs/a/x and other/x), their parent's name too."""
    names = [Path(d).resolve().name for d in run_dirs]
    return [f"{Path(d).resolve().parent.name}/{n}" if names.count(n) > 1 else n for d, n in zip(run_dirs, names,
                                                                                                 strict=True)]
