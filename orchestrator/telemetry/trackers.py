"""The experiment trackers of `logging.report_to` (TensorBoard, W&B, MLflow, trackio): one tracker run per
rayward run, kept across `--resume`, `--max-retries` restarts and recovery by the ids file in the run
directory.

    <run dir>/trackers.json (IDS_FILE), one entry per tracker the run has opened:
      "wandb":       {"id", "project", "entity", "name"}     wandb.init(id=..., resume="allow")
      "mlflow":      {"run_id", "experiment", "tracking_uri"} the run reopened by its id
      "trackio":     {"project", "name", "id"}                trackio resumes a project's run by name
      "tensorboard": {}                                       its run is the folder <run dir>/tensorboard/
    each with "step" and "eval_step": the latest training and eval step the tracker has (null: none yet).

Which tracker run a run logs to: with no entry in the run directory for any of its trackers, they open new
runs at once (before the first step: a tracker that cannot start fails the run early); otherwise they open at
the first row, whose step says where the run starts. A run that continues from a checkpoint (`--resume`, a
retry that finds one) continues the tracker runs the file names; one that starts at step 0 (a fresh `rayward
run` into the same directory, a retry before the first checkpoint) opens new ones, which the file then names
(a tracker run with nothing in it yet is continued instead). Recovery (a new learner in the same driver) stays
in the open tracker runs. The file wins over the config: a continued tracker run stays in its project.

A step logged again: a resume replays the steps between its checkpoint and the stop (a recovery, those between
its checkpoint and the failure). metrics.jsonl gets them again, the trackers do not: a row at or below the
step a tracker has is not sent to it (an eval's: at or below its latest eval step), so each tracker holds
every step once, with the values it got first. Sent again, W&B would drop them (its steps only increase; a
warning each), MLflow and trackio would keep both values at the step, TensorBoard both points.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
from collections.abc import Callable, Iterable
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IDS_FILE = "trackers.json"
# report_to's trackers, in the order `all` lists them, and the package each needs.
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
DEFAULT_PROJECT = "rayward"

Say = Callable[[str], None]


def installed(tracker: str) -> bool:
    return importlib.util.find_spec(PACKAGES[tracker]) is not None


def missing(report_to: Iterable[str]) -> list[str]:
    """The trackers report_to names whose package is not installed (`all` names none)."""
    named = set(report_to)
    return [t for t in PACKAGES if t in named and not installed(t)]


def expand(report_to: Iterable[str]) -> tuple[list[str], str | None]:
    """report_to's sinks, `all` replaced by jsonl and every installed tracker (as transformers reads it); and,
    with `all`, the line that says which it took."""
    asked = list(dict.fromkeys(report_to))
    if "all" not in asked:
        return asked, None
    sinks = list(dict.fromkeys(["jsonl", *(s for s in asked if s != "all"), *filter(installed, PACKAGES)]))
    absent = [t for t in PACKAGES if t not in sinks]
    return sinks, f"rayward: logging.report_to all: {', '.join(sinks)}" + (
        f" (not installed: {', '.join(absent)})" if absent else "")


@dataclass(frozen=True)
class RunInfo:
    """What a new tracker run is opened with."""

    run_dir: Path
    name: str  # the run's name in the trackers (logging.run_name, default the run's name)
    project: str | None = None  # logging.project (None: the tracker's environment variable, or "rayward")
    config: dict[str, Any] | None = None


class Tracker:
    """One tracker's run. `open` starts a new one (entry None) or continues the one an ids-file entry names;
    it returns the ids to keep and whether it continued that run."""

    name = ""
    tables = False  # takes the completions tables (`table`)

    def open(self, info: RunInfo, entry: dict[str, Any] | None, say: Say) -> tuple[dict[str, Any], bool]:
        raise NotImplementedError

    def log(self, step: int, scalars: dict[str, float], evaluation: bool) -> None:
        raise NotImplementedError

    def table(self, step: int, columns: list[str], data: list[list[Any]]) -> None:
        """The step's completions as a table (TRL's columns: metrics.completions_table)."""

    def close(self) -> None:
        raise NotImplementedError


class TensorBoard(Tracker):
    name = "tensorboard"

    def open(self, info: RunInfo, entry: dict[str, Any] | None, say: Say) -> tuple[dict[str, Any], bool]:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(info.run_dir / "tensorboard"))
        return {}, entry is not None

    def log(self, step: int, scalars: dict[str, float], evaluation: bool) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.close()


class WandB(Tracker):
    """Weights & Biases; its local files under <run dir>/wandb/ unless WANDB_DIR says otherwise (offline:
    `wandb sync <run dir>/wandb/offline-run-*` uploads the segments of a resumed run in order, as one run)."""

    name = "wandb"
    tables = True

    def open(self, info: RunInfo, entry: dict[str, Any] | None, say: Say) -> tuple[dict[str, Any], bool]:
        import wandb

        where = {} if os.environ.get("WANDB_DIR") else {"dir": str(info.run_dir)}
        if entry is None:  # wandb picks the id (WANDB_RUN_ID where set)
            project = info.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
            self.run = wandb.init(project=project, name=info.name, config=info.config, **where)
        else:
            project = entry["project"]
            self.run = wandb.init(project=project, entity=entry.get("entity") or None, name=entry.get("name"),
                                  id=entry["id"], resume="allow", config=info.config, **where)
        # wandb drops rows whose step goes backwards, and a pipelined run's eval arrives a step or two after
        # the step it evaluated: eval rows are logged at the latest step, charted against their own step.
        self.run.define_metric("eval/*", step_metric="eval/policy_version")
        self.latest = (entry or {}).get("step") or 0
        segments = Path(self.run.dir).parent.parent / f"offline-run-*-{self.run.id}"
        offline = f"; offline: `wandb sync {segments}`" if self.run.offline else ""
        say(f"rayward: W&B run {project}/{self.run.id} ({'continued' if entry else 'new'}){offline}")
        entity = self.run.entity or (entry or {}).get("entity")
        ids = {"id": self.run.id, "project": project, "entity": entity, "name": self.run.name}
        return ids, entry is not None

    def log(self, step: int, scalars: dict[str, float], evaluation: bool) -> None:
        if not evaluation:
            self.latest = max(self.latest, step)
        self.run.log(scalars, step=max(step, self.latest))

    def table(self, step: int, columns: list[str], data: list[list[Any]]) -> None:
        import wandb

        self.run.log({"completions": wandb.Table(columns=columns, data=data)}, step=max(step, self.latest))

    def close(self) -> None:
        self.run.finish()


def mlflow_key(key: str) -> str:
    """A metric name MLflow takes (alphanumerics, `_ - . / :`, spaces): not gates' `b<-a`, evals' `pass@k`."""
    return re.sub(r"[^/\w.\- :]", "_", key.replace("<-", "_from_").replace("@", "_at_"))


class MLflow(Tracker):
    """MLflow, at its tracking URI (MLFLOW_TRACKING_URI; MLflow's default: sqlite:///mlflow.db in the working
    directory). Through a client, not mlflow's active run: a notebook's own active run is left alone."""

    name = "mlflow"

    def open(self, info: RunInfo, entry: dict[str, Any] | None, say: Say) -> tuple[dict[str, Any], bool]:
        import mlflow
        from mlflow.exceptions import MlflowException

        self.client, uri = mlflow.MlflowClient(), mlflow.get_tracking_uri()
        if entry is not None:
            try:
                self.client.update_run(entry["run_id"], status="RUNNING")
                self.run_id, experiment = entry["run_id"], entry["experiment"]
                say(f"rayward: MLflow run {self.run_id} (continued) in experiment {experiment!r} at {uri}")
                return {"run_id": self.run_id, "experiment": experiment, "tracking_uri": uri}, True
            except MlflowException as err:  # another tracking URI than the first attempt's
                say(f"rayward: MLflow run {entry['run_id']} is not at {uri} ({err.message.splitlines()[0]}): "
                    "a new run")
        from mlflow.tracking.context.registry import resolve_tags

        experiment = info.project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = self.client.create_experiment(experiment) if found is None else found.experiment_id
        run = self.client.create_run(experiment_id, run_name=info.name, tags=resolve_tags())
        self.run_id = run.info.run_id
        say(f"rayward: MLflow run {self.run_id} (new) in experiment {experiment!r} at {uri}")
        return {"run_id": self.run_id, "experiment": experiment, "tracking_uri": uri}, False

    def log(self, step: int, scalars: dict[str, float], evaluation: bool) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(mlflow_key(k), float(v), now, step)
                                                    for k, v in scalars.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class Trackio(Tracker):
    """trackio, Hugging Face's local-first tracker: its data in TRACKIO_DIR (default
    ~/.cache/huggingface/trackio), shown by `trackio show`; a run is its project's run of that name."""

    name = "trackio"

    def open(self, info: RunInfo, entry: dict[str, Any] | None, say: Say) -> tuple[dict[str, Any], bool]:
        import trackio

        project = entry["project"] if entry else info.project or DEFAULT_PROJECT
        name = entry["name"] if entry else info.name
        with redirect_stdout(io.StringIO()):  # its banner; the line below says where the run is
            self.run = trackio.init(project=project, name=name, config=info.config, embed=False,
                                    resume="allow" if entry else "never")
        continued = entry is not None and self.run.id == entry.get("id")
        say(f"rayward: trackio run {name!r} ({'continued' if continued else 'new'}) in project {project!r} "
            f"(`trackio show --project {project}`)")
        return {"project": project, "name": name, "id": self.run.id}, continued

    def log(self, step: int, scalars: dict[str, float], evaluation: bool) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        import trackio

        with redirect_stdout(io.StringIO()):
            if trackio.context_vars.current_run.get() is self.run:
                trackio.finish()  # trackio's current run too, else its exit handler finishes this one again
            else:
                self.run.finish()


KINDS: dict[str, type[Tracker]] = {k.name: k for k in (TensorBoard, WandB, MLflow, Trackio)}


def read_ids(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The ids file's entries ({}: none, or a file that cannot be read, whose trackers then open new runs)."""
    try:
        ids = json.loads((run_dir / IDS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return ids if isinstance(ids, dict) else {}


def _empty(entry: dict[str, Any]) -> bool:
    return entry.get("step") is None and entry.get("eval_step") is None


def _floor(value: int | None) -> int:
    return -1 if value is None else value


class Trackers:
    """The run's trackers (report_to's, in order): opened as the module docstring says, each row sent to each
    tracker that does not have its step yet, the ids file rewritten after each."""

    def __init__(self, names: Iterable[str], info: RunInfo, say: Say):
        self.info, self.say, self.path = info, say, info.run_dir / IDS_FILE
        self.trackers = [KINDS[n]() for n in names if n in KINDS]
        self.saved = read_ids(info.run_dir)
        self.entries: dict[str, dict[str, Any]] = {}
        self.others: dict[str, dict[str, Any]] = {}  # entries of trackers not in this run's report_to, kept
        self.floors: dict[str, tuple[int, int]] = {}  # per tracker: the step and eval step it has at most
        self.opened = False
        self.tables = any(t.tables for t in self.trackers)
        if self.trackers and not any(t.name in self.saved for t in self.trackers):
            self._open(fresh=True)

    def _open(self, fresh: bool) -> None:
        self.opened = True
        mine = {t.name for t in self.trackers}
        self.others = {} if fresh else {k: v for k, v in self.saved.items() if k not in mine}
        for t in self.trackers:
            saved = self.saved.get(t.name)
            go_on = saved if saved is not None and (not fresh or _empty(saved)) else None
            ids, continued = t.open(self.info, go_on, self.say)
            has = (go_on.get("step"), go_on.get("eval_step")) if go_on and continued else (None, None)
            self.entries[t.name] = {**ids, "step": has[0], "eval_step": has[1]}
            self.floors[t.name] = (_floor(has[0]), _floor(has[1]))
        self._write()

    def _ensure_open(self, step: int, evaluation: bool) -> None:
        if not self.opened:
            self._open(fresh=step == (0 if evaluation else 1))  # a run from a checkpoint starts past step 1

    def log(self, step: int, scalars: dict[str, float], evaluation: bool = False) -> None:
        """A training row (evaluation=False) or an eval's (step: the step whose weights it evaluated)."""
        if not self.trackers:
            return
        self._ensure_open(step, evaluation)
        i, key = (1, "eval_step") if evaluation else (0, "step")
        sent = False
        for t in self.trackers:
            if step > self.floors[t.name][i]:
                t.log(step, scalars, evaluation)
                entry = self.entries[t.name]
                entry[key] = max(_floor(entry[key]), step)
                sent = True
        if sent:
            self._write()

    def table(self, step: int, columns: list[str], data: list[list[Any]]) -> None:
        if not self.trackers:
            return
        self._ensure_open(step, False)
        for t in self.trackers:
            if t.tables and step > self.floors[t.name][0]:
                t.table(step, columns, data)

    def rewind(self) -> None:
        """Recovery went back to a checkpoint: the steps it trains again are not sent again."""
        for name, e in self.entries.items():
            self.floors[name] = (_floor(e["step"]), _floor(e["eval_step"]))

    def close(self) -> None:
        if not self.opened:
            return
        for t in self.trackers:
            try:
                t.close()
            except Exception as err:  # noqa: BLE001 - one tracker's failing close leaves the others to close
                self.say(f"rayward: {t.name} did not close cleanly: {err}")
        self._write()

    def _write(self) -> None:
        """Written whole, then renamed: a driver killed meanwhile leaves the previous file."""
        tmp = self.path.with_name(IDS_FILE + ".tmp")
        tmp.write_text(json.dumps({**self.others, **self.entries}, indent=1) + "\n")
        os.replace(tmp, self.path)
