"""Step metrics: phase timing, reward/advantage statistics with TRL's names, JSON lines and a progress line."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.ops.ray_metrics import RayMetricsExporter


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

    def metrics(self) -> dict[str, float]:
        out = {f"time/{k}": v for k, v in self.seconds.items()}
        out["time/step"] = time.perf_counter() - self._t0
        return out


class MetricsLogger:
    """Writes one JSON object per step to <run_dir>/metrics.jsonl and prints a one-line summary; an eval is a
    row of its own (`step` = the step whose weights it evaluated, keys `eval/...`), in every sink."""

    PROGRESS_KEYS = (
        "reward", "reward_std", "loss", "kl", "entropy", "completions/mean_length",
        "sampling/sampling_logp_difference/max",
    )

    def __init__(
        self, run_dir: Path, *, report_to: list[str], progress: bool, max_steps: int, run_name: str = "",
        config: dict[str, Any] | None = None,
    ):
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(run_dir / "metrics.jsonl", "a") if "jsonl" in report_to else None  # noqa: SIM115
        self._tb = self._wandb = self._mlflow = None
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / "tensorboard"))
        if "wandb" in report_to:
            import wandb

            self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "rayward"), name=run_name, config=config)
            # wandb drops rows whose step goes backwards, and a pipelined run's eval arrives a step or two after
            # the step it evaluated: eval rows are logged at the latest step, charted against their own step.
            self._wandb.define_metric("eval/*", step_metric="eval/policy_version")
        if "mlflow" in report_to:
            import mlflow

            self._mlflow = mlflow
            mlflow.start_run(run_name=run_name)
        self.progress, self.max_steps = progress, max_steps
        # Ray's Prometheus endpoint (dashboard metrics, Grafana); a no-op outside a Ray session.
        self._ray = RayMetricsExporter(run_name or run_dir.name)
        self.history: list[dict[str, Any]] = []  # every row logged: steps and evals
        self._last_step = 0

    def _write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        row = {"step": step, **{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}}
        self.history.append(row)
        if self._jsonl:
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self._tb:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb:
            self._wandb.log(scalars, step=max(step, self._last_step))
        if self._mlflow:
            self._mlflow.log_metrics({k.replace("<-", "_from_"): v for k, v in scalars.items()}, step=step)
        self._last_step = max(step, self._last_step)
        return row

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = self._write(step, metrics)
        self._ray.export(step, metrics)
        if self.progress:
            parts = [f"step {step:>4}/{self.max_steps}"]
            for k in self.PROGRESS_KEYS:
                if isinstance(row.get(k), (int, float)):
                    parts.append(f"{k.split('/')[-1] if k.count('/') < 2 else 'logp_gap'} {row[k]:.4g}")
            t = {k[5:]: v for k, v in row.items() if k.startswith("time/") and k != "time/step"}
            parts.append("time " + " ".join(f"{k} {v:.2f}s" for k, v in t.items()))
            print(" | ".join(parts), file=sys.stdout, flush=True)

    def log_eval(self, step: int, metrics: dict[str, Any]) -> None:
        """An eval of the weights of `step` (keys `eval/...`): its own row and progress line."""
        row = self._write(step, metrics)
        self._ray.export(step, metrics, with_step=False)  # the step gauge is the learner's, never set back
        if self.progress:
            parts = [f"eval {step:>4}/{self.max_steps}"]
            for k, v in row.items():
                if k.startswith(("eval/reward", "eval/pass@", "eval/mean_length")) and isinstance(v, (int, float)):
                    parts.append(f"{k.removeprefix('eval/').removeprefix('rewards/')} {v:.4g}")
            parts.append(f"prompts {row.get('eval/prompts')} | time {row.get('eval/seconds', 0.0):.2f}s")
            print(" | ".join(parts), file=sys.stdout, flush=True)

    def note(self, text: str) -> None:
        """A line in the progress output (when progress is on)."""
        if self.progress:
            print(f"rayward: {text}", file=sys.stdout, flush=True)

    def close(self) -> None:
        if self._jsonl:
            self._jsonl.close()
        if self._tb:
            self._tb.close()
        if self._wandb:
            self._wandb.finish()
        if self._mlflow:
            self._mlflow.end_run()
