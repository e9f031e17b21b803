"""`logging:` metrics, completions and logs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.config.base import _Section


class LoggingConfig(_Section):
    dir: str = "runs"
    """Root directory; each run writes metrics.jsonl (and checkpoints) under `<dir>/<run name>/`."""
    report_to: list[Literal["jsonl", "tensorboard", "wandb", "mlflow", "trackio", "all"]] = ["jsonl"]
    """Metric sinks: `jsonl` (metrics.jsonl, always useful), `tensorboard`, `wandb` (Weights & Biases), `mlflow`,
    `trackio` (Hugging Face's local-first tracker); `all`: jsonl and every one of the others that is installed (as
    transformers reads it). A named tracker needs its package installed. A resumed or restarted run logs into the
    same tracker run (its id kept in the run directory)."""
    run_name: str | None = None
    """The run's name in the trackers (TRL's `run_name`); default the run's name."""
    project: str | None = None
    """The trackers' project (TRL's `project`; W&B project, MLflow experiment, trackio project); default
    `rayward`, or the tracker's own environment variable (WANDB_PROJECT, MLFLOW_EXPERIMENT_NAME) where set."""
    progress: bool = True
    """Print one progress line per step on the driver."""
    check_logprob_parity: bool = True
    """After the first weight sync, compare generator and learner logprobs of a fixed sequence and print the
    max abs difference (the alarm for a broken sync); above `max_logprob_parity_gap` the run stops."""
    max_logprob_parity_gap: float | None = Field(None, gt=0)
    """The largest generator-learner logprob gap (nats, max over the parity sequence's tokens) the run starts
    with; above it the run stops before its first step, saying what the gap means. None: 1e-3 in float32 (the
    same weights in vLLM and torch differ by ~1e-5: more is a sync that did not land, or an engine that computes
    another function), 0.5 in bfloat16/float16 (every layer rounds to 8 or 11 bits)."""
    log_completions: bool = True
    """Write every trained sample to `<dir>/<run name>/completions.jsonl` (TRL's name): step, prompt, completion,
    each reward raw and gated, total, advantage, and the reward functions' log_extra columns."""
    token_samples: int = Field(4, ge=0)
    """Completions per step recorded token by token in `<dir>/<run name>/tokens.jsonl` for `rayward view` (each
    token's id, text, sampling and learner log-probs, loss mask, policy version), spread over the step's groups;
    0: none. Needs log_completions."""
