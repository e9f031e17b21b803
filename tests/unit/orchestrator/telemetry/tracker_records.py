"""What each tracker holds after a run, read back with its own package from its offline store: W&B's offline
run directories (its transaction log), MLflow's tracking store, trackio's local database. Shared by the unit
tests and the real resumed runs (tests/integration/orchestrator/telemetry/test_trackers_resume.py)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

# W&B's transaction log (<offline run dir>/run-<id>.wandb): a 7-byte header, then LevelDB's log format: 32 KiB
# blocks of records (crc32 4 bytes, length 2, type 1: FULL, FIRST, MIDDLE, LAST), each a wandb_internal
# Record.
WANDB_HEADER, WANDB_BLOCK = 7, 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _wandb_records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    out, pos, pending = [], WANDB_HEADER, b""
    while pos + 7 <= len(data):
        left = WANDB_BLOCK - pos % WANDB_BLOCK
        if left < 7:  # a block's tail too short for a record header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # zero padding to the block's end
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
    return out


def wandb_runs(wandb_dir: Path) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """Per W&B run id, its history rows in the order they were logged, every offline segment (one per attempt
    of a resumed run, by start time) in turn: (step, {metric: value})."""
    import json

    from wandb.proto import wandb_internal_pb2 as pb

    runs: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for segment in sorted(wandb_dir.glob("offline-run-*")):
        (log,) = segment.glob("run-*.wandb")
        run_id = log.stem.removeprefix("run-")
        rows = runs.setdefault(run_id, [])
        for raw in _wandb_records(log):
            record = pb.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "run":
                assert record.run.run_id == run_id
            if record.WhichOneof("record_type") == "history":
                items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                         for i in record.history.item}
                metrics = {k: v for k, v in items.items() if not k.startswith("_")}  # not _step, _runtime
                rows.append((record.history.step.num, metrics))
    return runs


def wandb_run_meta(wandb_dir: Path) -> list[tuple[str, str, str]]:
    """(run id, project, display name) of each offline segment."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for segment in sorted(wandb_dir.glob("offline-run-*")):
        for raw in _wandb_records(next(segment.glob("run-*.wandb"))):
            record = pb.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "run":
                out.append((record.run.run_id, record.run.project, record.run.display_name))
    return out


def mlflow_runs(tracking_uri: str, experiment: str) -> dict[str, dict[str, Any]]:
    """Per MLflow run id of the experiment: its name, status and each metric's history [(step, value)]."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r} at {tracking_uri}"
    out = {}
    for run in client.search_runs([found.experiment_id]):
        history = {k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k))
                   for k in run.data.metrics}
        out[run.info.run_id] = {"name": run.info.run_name, "status": run.info.status, "metrics": history}
    return out


def point_trackio_at(where: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """trackio's data directory for this test: TRACKIO_DIR, which trackio reads once, on import (so set on its
    modules too)."""
    import importlib

    pytest.importorskip("trackio")
    monkeypatch.setenv("TRACKIO_DIR", str(where))
    for name in ("trackio", "trackio.utils", "trackio.sqlite_storage"):
        monkeypatch.setattr(importlib.import_module(name), "TRACKIO_DIR", where, raising=False)


def trackio_runs(project: str) -> dict[str, dict[str, Any]]:
    """Per trackio run id of the project (in the data directory `point_trackio_at` set): its name and its rows
    [(step, {metric: value})] in the order logged."""
    from trackio.sqlite_storage import SQLiteStorage

    out = {}
    for record in SQLiteStorage.get_run_records(project):
        logs = SQLiteStorage.get_logs(project, run_id=record["id"])
        rows = [(row["step"], {k: v for k, v in row.items() if k not in ("step", "timestamp")})
                for row in logs]
        out[record["id"]] = {"name": record["name"], "rows": rows}
    return out


def steps_of(rows: list[tuple[int, dict[str, Any]]], key: str) -> list[int]:
    """The steps at which `key` was logged, as often as it was."""
    return [step for step, metrics in rows if key in metrics]
