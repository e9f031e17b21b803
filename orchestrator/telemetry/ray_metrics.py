"""Step metrics on Ray's Prometheus endpoint (ray.util.metrics), next to the reward pool's own gauges.

`RayMetricsExporter(run_name).export(step, metrics)` takes the per-step dict the loop logs (keys as
orchestrator/loop/phases.py's `log_step` assembles them) and sets a few Gauges, with the run name and the reward /
gate / phase names as tag values (never in metric names: Ray silently drops metrics whose name is not
^[a-zA-Z_:][a-zA-Z0-9_:]*$). Each node's metrics agent serves them with Ray's `ray_` prefix on its
metrics export port (`ray start --metrics-export-port`), e.g. `ray_rayward_global_step{run="demo"}`;
cluster/grafana-dashboard.json charts them. Exports every ~10 s (Ray's metrics_report_interval_ms).

Outside a Ray session export() does nothing, so MetricsLogger can call it unconditionally. It never raises:
a metrics problem must not stop training.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

logger = logging.getLogger(__name__)

METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")

# gauge name -> (description, tag keys besides "run")
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "rayward_global_step": ("optimizer steps done by the learner", ()),
    "rayward_policy_version": ("learner step whose weights generated the step's batch", ()),
    "rayward_reward": ("mean weighted total reward of the step's batch", ()),
    "rayward_reward_std": ("std of the weighted total reward of the step's batch", ()),
    "rayward_reward_fn_mean": ("mean raw score per reward function (None excluded)", ("reward",)),
    "rayward_reward_fn_latency_s": ("slowest chunk's seconds in each reward function this step", ("reward",)),
    "rayward_reward_fn_timeouts": ("reward calls past timeout_s this step", ("reward",)),
    "rayward_reward_fn_errors": ("reward calls that raised this step", ("reward",)),
    "rayward_gate_closed_frac": ("fraction of samples whose gate was closed (gate = gated<-gating)", ("gate",)),
    "rayward_phase_seconds": ("wall seconds per loop phase this step (generate, reward, train, sync, step)",
                              ("phase",)),
    "rayward_tokens_per_s": ("completion tokens generated per second of the generate phase", ()),
    "rayward_weight_sync_s": ("seconds to push the learner's weights to the generators", ()),
    "rayward_weight_sync_part_s": ("seconds of the weight sync's parts (gather, transfer, load)", ("part",)),
    "rayward_weight_sync_bytes": ("bytes sent by the weight sync", ()),
    "rayward_weight_sync_gb_per_s": ("weight sync throughput (bytes / sync seconds)", ()),
    "rayward_logprob_gap_max": ("max |logp_generator - logp_learner| over the batch's tokens", ()),
    "rayward_logprob_gap_mean": ("mean per-sequence |logp_generator - logp_learner|", ()),
    "rayward_loss": ("training loss of the step", ()),
    "rayward_kl": ("KL to the reference policy (beta > 0)", ()),
    "rayward_entropy": ("mean token entropy of the policy on the batch", ()),
    "rayward_completion_mean_length": ("mean completion length in tokens", ()),
    "rayward_completion_clipped_ratio": ("fraction of completions cut at max_completion_length", ()),
    "rayward_reward_pool_workers": ("live reward workers when the step's batch was scored", ()),
    "rayward_reward_pool_target_workers": ("reward workers alive or starting (the pool's target) at that time", ()),
    "rayward_reward_pool_queue_wait_s": ("mean seconds the step's chunks waited for a reward worker", ()),
    "rayward_reward_pool_utilization": ("busy fraction of the reward workers over the autoscaler's window", ()),
    "rayward_learner_tokens_per_s": ("real (non-pad) tokens per second through the learner's step", ()),
    "rayward_learner_padding_frac": ("fraction of the learner's positions that were padding this step", ()),
    "rayward_learner_micro_batches": ("micro-batches in the learner's step", ()),
    "rayward_multiturn_turns": ("agentic: mean model turns per conversation", ()),
    "rayward_multiturn_tool_calls": ("agentic: mean tool calls per conversation", ()),
    "rayward_multiturn_tool_failures": ("agentic: mean failed tool calls per conversation", ()),
    "rayward_multiturn_env_s": ("agentic: mean seconds per conversation in tools and environments", ()),
    "rayward_multiturn_tokens": ("agentic: mean tokens per conversation by who wrote them (model, tool)", ("kind",)),
    "rayward_multiturn_template_mismatch_frac": ("agentic: fraction of conversations whose tokens differ from "
                                                 "the chat template's", ()),
    "rayward_multiturn_stop_reason": ("agentic: fraction of conversations ended for each reason", ("reason",)),
    "rayward_agent_requests": ("agent function: mean chat requests per trajectory", ()),
    "rayward_agent_branches": ("agent function: mean branches per trajectory (requests that rewrote the history "
                               "start one)", ()),
    "rayward_agent_endpoint_ms_per_request": ("agent function: mean milliseconds the endpoint added to a request "
                                              "beyond the engine", ()),
    "rayward_eval_reward": ("held-out eval: mean weighted total reward", ()),
    "rayward_eval_reward_fn_mean": ("held-out eval: mean raw score per reward function", ("reward",)),
    "rayward_eval_pass_at": ("held-out eval: unbiased pass@k (k = tag)", ("k",)),
    "rayward_eval_mean_length": ("held-out eval: mean completion length in tokens", ()),
    "rayward_eval_policy_version": ("held-out eval: learner step whose weights were evaluated", ()),
}

# step-dict key -> gauge (untagged besides run)
SCALARS: dict[str, str] = {
    "policy_version": "rayward_policy_version",
    "reward": "rayward_reward",
    "reward_std": "rayward_reward_std",
    "tokens_per_s": "rayward_tokens_per_s",
    "time/sync": "rayward_weight_sync_s",
    "sampling/sampling_logp_difference/max": "rayward_logprob_gap_max",
    "sampling/sampling_logp_difference/mean": "rayward_logprob_gap_mean",
    "loss": "rayward_loss",
    "kl": "rayward_kl",
    "entropy": "rayward_entropy",
    "completions/mean_length": "rayward_completion_mean_length",
    "completions/clipped_ratio": "rayward_completion_clipped_ratio",
    "sync/bytes": "rayward_weight_sync_bytes",
    "sync/gb_per_s": "rayward_weight_sync_gb_per_s",
    "reward_pool/workers": "rayward_reward_pool_workers",
    "reward_pool/target_workers": "rayward_reward_pool_target_workers",
    "reward_pool/queue_wait_s": "rayward_reward_pool_queue_wait_s",
    "reward_pool/utilization": "rayward_reward_pool_utilization",
    "learner/tokens_per_s": "rayward_learner_tokens_per_s",
    "learner/padding_frac": "rayward_learner_padding_frac",
    "learner/micro_batches": "rayward_learner_micro_batches",
    "multiturn/turns": "rayward_multiturn_turns",
    "multiturn/tool_calls": "rayward_multiturn_tool_calls",
    "multiturn/tool_failures": "rayward_multiturn_tool_failures",
    "multiturn/env_s": "rayward_multiturn_env_s",
    "multiturn/template_mismatch_frac": "rayward_multiturn_template_mismatch_frac",
    "agent/requests": "rayward_agent_requests",
    "agent/branches": "rayward_agent_branches",
    "agent/endpoint_ms_per_request": "rayward_agent_endpoint_ms_per_request",
    "eval/reward": "rayward_eval_reward",
    "eval/mean_length": "rayward_eval_mean_length",
    "eval/policy_version": "rayward_eval_policy_version",
}

# step-dict key pattern -> (gauge, tag key); the pattern's group is the tag value
PATTERNS: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"^rewards/(.+)/mean$"), "rayward_reward_fn_mean", "reward"),
    (re.compile(r"^rewards/(.+)/latency_s$"), "rayward_reward_fn_latency_s", "reward"),
    (re.compile(r"^rewards/(.+)/timeouts$"), "rayward_reward_fn_timeouts", "reward"),
    (re.compile(r"^rewards/(.+)/errors$"), "rayward_reward_fn_errors", "reward"),
    (re.compile(r"^gates/(.+)/closed_frac$"), "rayward_gate_closed_frac", "gate"),
    (re.compile(r"^time/(.+)$"), "rayward_phase_seconds", "phase"),
    (re.compile(r"^sync/(gather|transfer|load)_s$"), "rayward_weight_sync_part_s", "part"),
    (re.compile(r"^multiturn/tokens/(.+)$"), "rayward_multiturn_tokens", "kind"),
    (re.compile(r"^multiturn/stop_reason/(.+)$"), "rayward_multiturn_stop_reason", "reason"),
    (re.compile(r"^eval/rewards/(.+)/mean$"), "rayward_eval_reward_fn_mean", "reward"),
    (re.compile(r"^eval/pass@(\d+)$"), "rayward_eval_pass_at", "k"),
]

# Metrics the reward pool actor exports itself (declared in actors/runtime/pool.py `pool_metrics`), live between steps:
# workers alive, starting and targeted, queue depth and wait, chunk latency, utilisation, events and scaling decisions.
REWARD_POOL_METRICS = (
    "rayward_reward_workers_alive",
    "rayward_reward_queue_depth",
    "rayward_reward_inflight_chunks",
    "rayward_reward_chunk_latency_s",
    "rayward_reward_events_total",
    "rayward_reward_workers_target",
    "rayward_reward_workers_starting",
    "rayward_reward_utilization",
    "rayward_reward_queue_wait_s",
    "rayward_reward_scale_decisions_total",
)


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def map_step_metrics(
    run_name: str, step: int, metrics: dict[str, Any], with_step: bool = True
) -> list[tuple[str, float, dict[str, str]]]:
    """(gauge name, value, tags) for one step's metrics dict (or an eval's: with_step=False leaves the
    global-step gauge alone); non-numeric, None and NaN values are skipped."""
    out: list[tuple[str, float, dict[str, str]]] = []
    if with_step:
        out.append(("rayward_global_step", float(step), {"run": run_name}))
    for key, raw in metrics.items():
        v = _number(raw)
        if v is None:
            continue
        if key in SCALARS:
            out.append((SCALARS[key], v, {"run": run_name}))
        for pattern, gauge, tag in PATTERNS:
            m = pattern.match(key)
            if m:
                out.append((gauge, v, {"run": run_name, tag: m.group(1)}))
                break
    return out


class RayMetricsExporter:
    """Sets rayward's Gauges from the loop's per-step metrics dict (in the process that calls export)."""

    _gauges: dict[str, Any] = {}  # per process: one Gauge object per name, shared by exporters
    _warned: set[str] = set()  # runs whose export failure was logged (once per run, not per step)

    def __init__(self, run_name: str):
        self.run_name = run_name

    @classmethod
    def _gauge(cls, name: str) -> Any:
        if name not in cls._gauges:
            from ray.util.metrics import Gauge

            desc, tags = GAUGES[name]
            cls._gauges[name] = Gauge(name, description=desc, tag_keys=("run", *tags))
        return cls._gauges[name]

    def export(self, step: int, metrics: dict[str, float], with_step: bool = True) -> None:
        try:
            import ray

            if not ray.is_initialized():
                return
            for name, value, tags in map_step_metrics(self.run_name, step, metrics, with_step):
                self._gauge(name).set(value, tags=tags)
        except Exception as err:  # noqa: BLE001 - metrics must never stop a run
            if self.run_name not in self._warned:
                logger.warning("rayward: exporting Ray metrics failed (%s); continuing without them", err)
                self._warned.add(self.run_name)
