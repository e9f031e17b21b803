"""Step metrics: phase timing, the metric sinks (JSON lines, Ray's Prometheus endpoint, and trackers.py's
TensorBoard, W&B, MLflow, trackio), the completions log, and reading a run directory back (`rayward samples`,
`rayward plot`)."""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from actors.runtime.completions import IMAGES_DIR, image_files  # noqa: F401 - readers import them here
from orchestrator.telemetry.progress import Display, StepLines
from orchestrator.telemetry.ray_metrics import RayMetricsExporter
from orchestrator.telemetry.trackers import RunInfo, Trackers, expand

# The completions log of a run directory (TRL's name), one JSON line per trained sample.
COMPLETIONS_FILE = "completions.jsonl"
METRICS_FILE = "metrics.jsonl"
# Completions per step in a tracker's table: a sample of the batch (TRL tables every completion of a small batch;
# at a cluster's batch sizes that is megabytes a step sent to the tracker, and text through the driver).
TABLE_ROWS = 64


class PhaseTimer:
    """`with timer("generate"): ...` accumulates wall seconds per phase, reported as time/<phase>."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t0 = time.perf_counter()

    @contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def add(self, what: str, seconds: float) -> None:
        """Seconds measured elsewhere, reported as time/<what> (not a phase of the loop's: not in time/step's
        sum of phases, e.g. the generators' idle time while the learner trained)."""
        self.seconds[what] = self.seconds.get(what, 0.0) + seconds

    def metrics(self) -> dict[str, float]:
        out = {f"time/{k}": v for k, v in self.seconds.items()}
        out["time/step"] = time.perf_counter() - self._t0
        return out


class MetricsLogger:
    """Writes one JSON object per step to <run_dir>/metrics.jsonl (and the other sinks) and shows the step on
    the run's display (a live bar, or one line per step); an eval is a row of its own (`step` = the step whose
    weights it evaluated, keys `eval/...`), in every sink."""

    def __init__(
        self, run_dir: Path, *, report_to: list[str], progress: bool, max_steps: int, run_name: str = "",
        config: dict[str, Any] | None = None, display: Display | None = None, tracker_name: str | None = None,
        project: str | None = None,
    ):
        """report_to: the sinks (`all`: jsonl and the installed trackers, said in a line); run_name: the
        run's (Ray metrics; the trackers' unless tracker_name); project: the trackers' (None: theirs)."""
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.display = display if display is not None else StepLines(max_steps) if progress else Display(max_steps)
        sinks, which = expand(report_to)
        if which is not None:
            self.display.message(which)
        self._jsonl = open(run_dir / METRICS_FILE, "a") if "jsonl" in sinks else None  # noqa: SIM115
        info = RunInfo(run_dir, tracker_name or run_name or run_dir.name, project, config)
        self.trackers = Trackers(sinks, info, self.display.message)
        self.max_steps = max_steps
        # Ray's Prometheus endpoint (dashboard metrics, Grafana); a no-op outside a Ray session.
        self._ray = RayMetricsExporter(run_name or run_dir.name)
        self.history: list[dict[str, Any]] = []  # every row logged: steps and evals

    def _write(self, step: int, metrics: dict[str, Any], evaluation: bool) -> dict[str, Any]:
        row = {"step": step, **{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}}
        self.history.append(row)
        if self._jsonl:
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        self.trackers.log(step, scalars, evaluation)
        return row

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = self._write(step, metrics, evaluation=False)
        self._ray.export(step, metrics)
        self.display.step(step, row)

    @property
    def table_rows(self) -> int:
        """Completions a step's tracker table holds (0: no tracker takes tables): the writer returns that many rows
        with their text (actors/runtime/completions.py), the rest stay in completions.jsonl."""
        return TABLE_ROWS if self.trackers.tables else 0

    def log_table(self, step: int, rows: list[dict[str, Any]]) -> None:
        """The step's first completions as a tracker table (W&B's `completions`, TRL's columns)."""
        if rows:
            self.trackers.table(step, *completions_table(rows))

    def log_eval(self, step: int, metrics: dict[str, Any]) -> None:
        """An eval of the weights of `step` (keys `eval/...`): its own row and progress line."""
        row = self._write(step, metrics, evaluation=True)
        self._ray.export(step, metrics, with_step=False)  # the step gauge is the learner's, never set back
        parts = [f"eval {step:>4}/{self.max_steps}"]
        for k, v in row.items():
            if k.startswith(("eval/reward", "eval/pass@", "eval/mean_length")) and isinstance(v, (int, float)):
                parts.append(f"{k.removeprefix('eval/').removeprefix('rewards/')} {v:.4g}")
        parts.append(f"prompts {row.get('eval/prompts')} | time {row.get('eval/seconds', 0.0):.2f}s")
        self.display.message(" | ".join(parts))

    def rewind(self, step: int) -> None:
        """A recovery went back to `step`: the rows of later steps leave the history (they are trained and logged
        again); metrics.jsonl gets them again, the trackers do not (trackers.py), and faults.jsonl says which
        were lost."""
        self.history = [r for r in self.history if r["step"] <= step]
        self.trackers.rewind()

    def close(self) -> None:
        if self._jsonl:
            self._jsonl.close()
        self.trackers.close()


def completions_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The W&B completions table, with TRL's columns (GRPOTrainer.log): step, prompt, completion, each reward's
    raw score under its name, the reward functions' log_extra columns, advantage; then rayward's total and
    policy_version. Conversations become their text (W&B cells are scalars)."""
    rewards = sorted({k for r in rows for k in r if k.startswith("rewards/")})
    fixed = {"step", "policy_version", "prompt", "completion", "total", "advantage"}
    extra = sorted({k for r in rows for k in r if k not in fixed and not k.startswith(("rewards/", "gated/"))})
    columns = ["step", "prompt", "completion", *(k.split("/", 1)[1] for k in rewards), *extra, "advantage", "total",
               "policy_version"]
    keys = ["step", "prompt", "completion", *rewards, *extra, "advantage", "total", "policy_version"]
    data = [[_cell(r.get(k)) for k in keys] for r in rows]
    return columns, data


def _cell(v: Any) -> Any:
    if isinstance(v, list):  # chat messages: "role: content" per message
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" if isinstance(m, dict) else str(m) for m in v)
    if isinstance(v, dict):
        return json.dumps(v, default=str)
    return v


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file; a torn last line (a run still writing it) is skipped."""
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def find_run_dir(run: str, logging_dir: str = "runs") -> Path:
    """A run directory from what the user typed: a directory path, or a run name under logging_dir."""
    for candidate in (Path(run), Path(logging_dir) / run):
        if candidate.is_dir() and ((candidate / METRICS_FILE).exists() or (candidate / COMPLETIONS_FILE).exists()):
            return candidate
    raise FileNotFoundError(
        f"no run {run!r}: neither {run} nor {Path(logging_dir) / run} is a run directory (with {METRICS_FILE})"
    )
