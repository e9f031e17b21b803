"""The trackers (orchestrator/telemetry/trackers.py) with their real packages in their offline modes: a
stopped run resumed over the same run directory (a new MetricsLogger, as a resumed driver builds) is one
tracker run that holds every step once; a run that starts again at step 0 is a new one; recovery; `all`; the
names; the check before Ray. Each tracker's test skips where its package is not installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.telemetry import trackers
from orchestrator.telemetry.metrics import MetricsLogger
from orchestrator.telemetry.trackers import IDS_FILE, expand, mlflow_key, read_ids
from tests.conftest import ROOT
from tests.unit.orchestrator.telemetry.tracker_records import (
    mlflow_runs,
    point_trackio_at,
    steps_of,
    trackio_runs,
    wandb_run_meta,
    wandb_runs,
)

# The stopped driver trained steps 1-4 (evals of steps 2 and 4) and its checkpoint is at step 2: the resumed
# one trains 3-6 from there, 3 and 4 again (evals of 4 and 6), with other values than the first time.
FIRST = {"steps": [1, 2, 3, 4], "evals": (2, 4), "bump": 0.0}
RESUMED = {"steps": [3, 4, 5, 6], "evals": (4, 6), "bump": 1.0}
ALL_STEPS = [1, 2, 3, 4, 5, 6]


def logger(run_dir: Path, report_to: list[str], **kw) -> MetricsLogger:
    return MetricsLogger(run_dir, report_to=report_to, progress=False, max_steps=10, run_name="run",
                         config={"seed": 0}, **kw)


def attempt(run_dir: Path, report_to: list[str], steps: list[int], evals: tuple[int, ...] = (),
            bump: float = 0.0, **kw) -> MetricsLogger:
    """One driver's life over run_dir: per step a row and its completions, the evals, closed at the end."""
    log = logger(run_dir, report_to, **kw)
    for s in steps:
        log.log(s, {"reward": s / 10 + bump, "gates/b<-a/closed_frac": 0.5})
        log.log_table(s, [{"step": s, "prompt": "p", "completion": "c", "total": 1.0, "advantage": 0.0,
                           "policy_version": s}][: log.table_rows])  # as the completions writer returns them
        if s in evals:
            log.log_eval(s, {"eval/reward": s / 5 + bump, "eval/pass@1": 0.5, "eval/policy_version": s})
    log.close()
    return log


def jsonl_steps(run_dir: Path) -> list[int]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["step"] for row in rows if "reward" in row]


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    """One MLflow sqlite store (MLflow's default backend) for the module: creating one takes seconds; each
    test has an experiment of its own."""
    pytest.importorskip("mlflow")
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


@pytest.fixture
def mlflow_at(mlflow_uri, monkeypatch) -> str:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return mlflow_uri


@pytest.mark.slow  # W&B's service process
def test_wandb_offline_resumed_run_is_one_run_with_every_step_once(tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    for var in ("WANDB_DIR", "WANDB_PROJECT", "WANDB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    attempt(run_dir, ["jsonl", "wandb"], **FIRST, tracker_name="trl-name", project="trl-project")
    first = read_ids(run_dir)["wandb"]
    attempt(run_dir, ["jsonl", "wandb"], **RESUMED, tracker_name="other", project="other")
    ids = read_ids(run_dir)["wandb"]
    assert ids == {**first, "step": 6, "eval_step": 6}, (first, ids)
    runs = wandb_runs(run_dir / "wandb")
    assert list(runs) == [ids["id"]]  # a segment per driver, one run id: `wandb sync` makes them one run
    # the ids file wins over the resumed config: the run stays where it is
    assert wandb_run_meta(run_dir / "wandb") == [(ids["id"], "trl-project", "trl-name")] * 2
    rows = runs[ids["id"]]
    assert steps_of(rows, "reward") == ALL_STEPS and steps_of(rows, "completions/_type") == ALL_STEPS
    assert [m["reward"] for _, m in rows if "reward" in m] == pytest.approx([0.1, 0.2, 0.3, 0.4, 1.5, 1.6])
    assert [m["eval/policy_version"] for _, m in rows if "eval/reward" in m] == [2, 4, 6]
    assert jsonl_steps(run_dir) == [1, 2, 3, 4, 3, 4, 5, 6]  # metrics.jsonl keeps every row logged
    out = capsys.readouterr().out
    assert f"rayward: W&B run trl-project/{ids['id']} (new); offline: `wandb sync " in out, out
    assert f"rayward: W&B run trl-project/{ids['id']} (continued)" in out, out


@pytest.mark.slow  # MLflow's imports
def test_mlflow_resumed_run_is_one_run_with_every_step_once(tmp_path, mlflow_at):
    run_dir = tmp_path / "run"
    attempt(run_dir, ["jsonl", "mlflow"], **FIRST, tracker_name="trl-name", project="resumed")
    first = read_ids(run_dir)["mlflow"]
    attempt(run_dir, ["jsonl", "mlflow"], **RESUMED, tracker_name="trl-name", project="resumed")
    ids = read_ids(run_dir)["mlflow"]
    assert ids == {**first, "step": 6, "eval_step": 6} and ids["tracking_uri"] == mlflow_at, (first, ids)
    runs = mlflow_runs(mlflow_at, "resumed")
    assert list(runs) == [ids["run_id"]]
    run = runs[ids["run_id"]]
    assert run["name"] == "trl-name" and run["status"] == "FINISHED"
    assert [s for s, _ in run["metrics"]["reward"]] == ALL_STEPS
    assert [v for _, v in run["metrics"]["reward"]] == pytest.approx([0.1, 0.2, 0.3, 0.4, 1.5, 1.6])
    assert [s for s, _ in run["metrics"]["eval/pass_at_1"]] == [2, 4, 6]
    assert [s for s, _ in run["metrics"]["gates/b_from_a/closed_frac"]] == ALL_STEPS


@pytest.mark.slow  # trackio's imports and its writer thread
def test_trackio_logs_every_step_and_a_resumed_run_continues_it(tmp_path, monkeypatch, capsys):
    point_trackio_at(tmp_path / "trackio", monkeypatch)
    run_dir = tmp_path / "run"
    attempt(run_dir, ["jsonl", "trackio"], **FIRST, tracker_name="trl-name", project="trl-project")
    first = read_ids(run_dir)["trackio"]
    assert list(trackio_runs("trl-project")) == [first["id"]]
    attempt(run_dir, ["jsonl", "trackio"], **RESUMED, tracker_name="trl-name", project="trl-project")
    ids = read_ids(run_dir)["trackio"]
    assert ids == {**first, "step": 6, "eval_step": 6, "name": "trl-name"}, (first, ids)
    runs = trackio_runs("trl-project")
    assert list(runs) == [ids["id"]] and runs[ids["id"]]["name"] == "trl-name"
    rows = runs[ids["id"]]["rows"]
    assert steps_of(rows, "reward") == ALL_STEPS
    assert [m["reward"] for _, m in rows if "reward" in m] == pytest.approx([0.1, 0.2, 0.3, 0.4, 1.5, 1.6])
    assert steps_of(rows, "eval/reward") == [2, 4, 6]
    out = capsys.readouterr().out
    assert "rayward: trackio run 'trl-name' (continued) in project 'trl-project'" in out, out
    assert "* Trackio" not in out  # trackio's own banner stays off rayward's terminal


@pytest.mark.slow
def test_a_run_that_starts_again_at_step_0_opens_a_new_tracker_run_unless_the_last_is_empty(tmp_path,
                                                                                           mlflow_at):
    """A driver that failed before its first step left an empty tracker run: its retry (from step 0) continues
    it. A fresh start over a run that has steps (no --resume, or a retry before the first checkpoint) starts a
    new tracker run, which the ids file then names."""
    run_dir = tmp_path / "run"
    logger(run_dir, ["mlflow"], project="again").close()  # opened at once: no ids file yet
    empty = read_ids(run_dir)["mlflow"]["run_id"]
    attempt(run_dir, ["mlflow"], steps=[1, 2], project="again")
    assert read_ids(run_dir)["mlflow"]["run_id"] == empty
    attempt(run_dir, ["mlflow"], steps=[1, 2, 3], project="again")
    second = read_ids(run_dir)["mlflow"]["run_id"]
    runs = mlflow_runs(mlflow_at, "again")
    assert set(runs) == {empty, second} and second != empty
    assert [s for s, _ in runs[empty]["metrics"]["reward"]] == [1, 2]
    assert [s for s, _ in runs[second]["metrics"]["reward"]] == [1, 2, 3]


@pytest.mark.slow
def test_recovery_does_not_send_the_steps_it_trains_again(tmp_path, mlflow_at, monkeypatch):
    """A new learner rewound to checkpoint-2 after step 4 trains 3 and 4 again: the tracker keeps the first
    values. The experiment and the run's name default to MLFLOW_EXPERIMENT_NAME and the run's name."""
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    log = logger(tmp_path / "run", ["jsonl", "mlflow"])
    for s in [1, 2, 3, 4]:
        log.log(s, {"reward": s / 10})
    log.rewind(2)
    for s in [3, 4, 5]:
        log.log(s, {"reward": 1 + s / 10})
    log.close()
    (run,) = mlflow_runs(mlflow_at, "from-env").values()
    assert run["name"] == "run"
    assert [s for s, _ in run["metrics"]["reward"]] == [1, 2, 3, 4, 5]
    assert [v for _, v in run["metrics"]["reward"]] == pytest.approx([0.1, 0.2, 0.3, 0.4, 1.5])


@pytest.mark.slow
def test_an_mlflow_run_the_store_does_not_have_is_replaced_by_a_new_one(tmp_path, mlflow_at, capsys):
    """The resumed driver's tracking URI is another than the first's (here: an id the store never had)."""
    run_dir = tmp_path / "run"
    attempt(run_dir, ["mlflow"], steps=[1, 2], project="moved")
    ids = json.loads((run_dir / IDS_FILE).read_text())
    ids["mlflow"]["run_id"] = "0" * 32
    (run_dir / IDS_FILE).write_text(json.dumps(ids))
    attempt(run_dir, ["mlflow"], steps=[3, 4], project="moved")
    new = read_ids(run_dir)["mlflow"]
    assert new["run_id"] != "0" * 32 and new["step"] == 4
    assert f"rayward: MLflow run {'0' * 32} is not at {mlflow_at}" in capsys.readouterr().out
    assert [s for s, _ in mlflow_runs(mlflow_at, "moved")[new["run_id"]]["metrics"]["reward"]] == [3, 4]


def test_tensorboard_gets_every_step_once_across_a_resume(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    attempt(run_dir, ["tensorboard"], **FIRST)
    attempt(run_dir, ["tensorboard"], **RESUMED)
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 3)) for e in events.Scalars("reward")] == [
        (1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4), (5, 1.5), (6, 1.6)]
    assert [e.step for e in events.Scalars("eval/reward")] == [2, 4, 6]


def test_all_is_jsonl_and_the_installed_trackers_and_says_which(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(trackers, "installed", lambda t: t == "tensorboard")
    assert expand(["jsonl", "wandb"]) == (["jsonl", "wandb"], None)
    sinks, line = expand(["all"])
    assert sinks == ["jsonl", "tensorboard"]
    assert line == ("rayward: logging.report_to all: jsonl, tensorboard "
                    "(not installed: wandb, mlflow, trackio)")
    assert trackers.missing(["all"]) == [] and trackers.missing(["all", "trackio"]) == ["trackio"]
    attempt(tmp_path, ["all"], steps=[1])
    assert capsys.readouterr().out.splitlines()[0] == line
    assert jsonl_steps(tmp_path) == [1] and list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert set(read_ids(tmp_path)) == {"tensorboard"}


def test_a_named_tracker_that_is_not_installed_fails_before_ray_naming_it(monkeypatch, capsys):
    import ray

    from orchestrator.cli.main import main

    monkeypatch.setattr(trackers, "installed", lambda t: t != "trackio")
    was_up = ray.is_initialized()
    assert main(["run", str(ROOT / "configs" / "demo.yaml"), "logging.report_to=[jsonl,trackio]"]) == 2
    err = capsys.readouterr().err
    assert "logging.report_to: 'trackio' needs the `trackio` package (pip install trackio)" in err, err
    assert ray.is_initialized() == was_up


def test_mlflow_metric_names():
    assert mlflow_key("gates/b<-a/closed_frac") == "gates/b_from_a/closed_frac"
    assert mlflow_key("eval/pass@4") == "eval/pass_at_4"
    assert mlflow_key("rewards/my reward: x/mean") == "rewards/my reward: x/mean"
    assert mlflow_key("a+b") == "a_b"


def test_only_jsonl_writes_no_ids_file(tmp_path):
    attempt(tmp_path, ["jsonl"], steps=[1, 2])
    assert not (tmp_path / IDS_FILE).exists()
