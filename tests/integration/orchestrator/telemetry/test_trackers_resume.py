"""A real run logging to W&B (offline), MLflow (a sqlite store in tmp) and trackio (its data directory in
tmp), stopped by SIGTERM to its process group (as `timeout -s TERM` sends it), then `--resume`d on the real
CLI: each tracker holds one run, with every step once, though the resumed driver trained some steps again."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.unit.orchestrator.telemetry.tracker_records import (
    mlflow_runs,
    point_trackio_at,
    steps_of,
    trackio_runs,
    wandb_runs,
)

MAX_STEPS, STOP_PAST = 6, 3
START_S = 420  # a run's start-up and its steps, beside other runs on 2 cores


def _run(logdir: Path, env: dict[str, str], *extra: str, stop_past: int | None = None) -> tuple[int, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "configs/demo.yaml", "--name", "tracked",
         f"logging.dir={logdir}", "logging.progress=false", f"grpo.max_steps={MAX_STEPS}",
         "grpo.save_steps=2", "logging.report_to=[jsonl,wandb,mlflow,trackio]",
         "logging.project=trackers-test", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )
    if stop_past is not None:
        metrics, deadline = logdir / "tracked" / "metrics.jsonl", time.monotonic() + START_S
        while not (metrics.exists() and any(json.loads(x)["step"] >= stop_past
                                            for x in metrics.read_text().splitlines())):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"no step {stop_past} (rc {proc.poll()}):\n{proc.communicate()[0][-4000:]}")
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=START_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the run did not end:\n{proc.communicate()[0][-4000:]}")
    return proc.returncode, out


def test_a_run_stopped_by_sigterm_and_resumed_is_one_run_in_each_tracker(tmp_path, monkeypatch):
    for name in ("wandb", "mlflow", "trackio"):
        pytest.importorskip(name)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "RAY_ADDRESS"))}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", MLFLOW_TRACKING_URI=uri,
               TRACKIO_DIR=str(tmp_path / "trackio"))
    run_dir = tmp_path / "tracked"
    rc, out = _run(tmp_path, env, stop_past=STOP_PAST)
    assert rc == 143 and "Traceback" not in out, out[-4000:]
    # Its checkpoints after checkpoint-2 removed (the stop's among them), the resume trains the steps after
    # step 2 again (as after a driver killed outright: a --max-retries restart's case): the trackers must not
    # get them twice.
    later = [p for p in run_dir.glob("checkpoint-*") if p.name != "checkpoint-2"]
    assert (run_dir / "checkpoint-2").is_dir() and later, out[-4000:]
    for p in later:
        shutil.rmtree(p)
    first = json.loads((run_dir / "trackers.json").read_text())
    rc, out = _run(tmp_path, env, "--resume")
    assert rc == 0 and "resumed from" in out and "checkpoint-2 at step 2" in out, out[-4000:]
    ids = json.loads((run_dir / "trackers.json").read_text())
    for tracker, key in (("wandb", "id"), ("mlflow", "run_id"), ("trackio", "id")):
        assert ids[tracker][key] == first[tracker][key] and ids[tracker]["step"] == MAX_STEPS, (first, ids)
    assert f"rayward: W&B run trackers-test/{ids['wandb']['id']} (continued)" in out, out[-4000:]
    assert f"rayward: MLflow run {ids['mlflow']['run_id']} (continued)" in out
    assert "rayward: trackio run 'tracked' (continued) in project 'trackers-test'" in out
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps.count(3) == 2, steps  # metrics.jsonl has step 3 from both drivers

    every_step = list(range(1, MAX_STEPS + 1))
    wb = wandb_runs(run_dir / "wandb")
    assert list(wb) == [ids["wandb"]["id"]] and steps_of(wb[ids["wandb"]["id"]], "reward") == every_step, wb
    ml = mlflow_runs(uri, "trackers-test")
    assert list(ml) == [ids["mlflow"]["run_id"]], ml
    assert [s for s, _ in ml[ids["mlflow"]["run_id"]]["metrics"]["reward"]] == every_step
    point_trackio_at(tmp_path / "trackio", monkeypatch)
    tr = trackio_runs("trackers-test")
    assert list(tr) == [ids["trackio"]["id"]]
    assert steps_of(tr[ids["trackio"]["id"]]["rows"], "reward") == every_step
