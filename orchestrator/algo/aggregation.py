"""From raw reward scores to advantages: schedules over steps, gates, weights, then GRPO's advantages (pure; no Ray).

The reward pool returns a raw matrix `raw [N, K]` (N completions, K reward functions, NaN = the function
returned None, "no opinion"). This module turns it into what GRPO's advantage code consumes:

    gated [N, K]   raw with gates applied (a closed gate replaces the gated reward by its fill value)
    weights [K]    weight_k * schedule_k(step)

and the advantage math itself (TRL's sum_then_normalize / normalize_then_sum) lives in `grpo.py`.
`advantage_batch` is the whole path, raw -> gated -> weighted total -> advantages, in one call.

Gate semantics, per sample i, for a reward B with `gate: {reward: A, threshold: t, fill: f}`:
    if gated[i, A] < t  then gated[i, B] = f   (else B keeps its raw value, None included)
A gate whose gating value is None (NaN) is not applied: "no opinion" on A says nothing about B.
Gates chain (A gates B, B gates C): they are applied in dependency order, so when A closes B's gate, B takes
its fill value and C's gate is then checked against that fill. Cycles are rejected by the config.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from actors.types import Rollouts, Scores, TrainBatch
from orchestrator.algo.grpo import (
    Aggregation,
    ScaleRewards,
    compute_advantages,
    nan_to_none,
    nanmean_or_nan,
    nanstd_or_nan,
)
from orchestrator.config import RewardConfig, scheduled


@dataclass(frozen=True)
class Gate:
    """Reward column `gated` is replaced by `fill` where column `gating` is below `threshold`."""

    gated: int
    gating: int
    threshold: float
    fill: float


def gate_order(gates: Sequence[Gate]) -> list[Gate]:
    """Gates sorted so that a reward's own gate is applied before it gates another (chains A -> B -> C)."""
    by_gated = {g.gated: g for g in gates}

    def depth(g: Gate) -> int:
        d, node = 0, g.gating
        while node in by_gated:
            d, node = d + 1, by_gated[node].gating
            if d > len(gates):
                raise ValueError("gates form a cycle")
        return d

    return sorted(gates, key=depth)


def apply_gates(raw: torch.Tensor, gates: Sequence[Gate]) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply gates to raw [N, K]; returns (gated [N, K], closed [N, len(gates)] bool, in the given order)."""
    out = raw.clone()
    closed = torch.zeros(raw.shape[0], len(gates), dtype=torch.bool)
    index = {id(g): j for j, g in enumerate(gates)}
    for g in gate_order(gates):
        # NaN < t is False, so a None gating value leaves the gate open (documented above).
        shut = out[:, g.gating] < g.threshold
        out[:, g.gated] = torch.where(shut, torch.full_like(out[:, g.gated], g.fill), out[:, g.gated])
        closed[:, index[id(g)]] = shut
    return out, closed


@dataclass
class Aggregated:
    gated: torch.Tensor  # [N, K] after gates
    weights: torch.Tensor  # [K] at this step
    gate_closed: dict[str, float]  # "gated<-gating" -> fraction of samples whose gate was closed


class RewardAggregator:
    """Weights, schedules and gates of a run's reward list, evaluated at a given optimizer step."""

    def __init__(self, rewards: Sequence[RewardConfig]):
        self.names = [r.name for r in rewards]
        self._rewards = list(rewards)
        col = {n: k for k, n in enumerate(self.names)}
        self._gate_specs = [(col[r.name], col[r.gate.reward], r.gate) for r in rewards if r.gate is not None]

    def weights(self, step: int) -> torch.Tensor:
        w = [r.weight * (scheduled(r.schedule, step) if r.schedule is not None else 1.0) for r in self._rewards]
        return torch.tensor(w, dtype=torch.float32)

    def gates(self, step: int) -> list[Gate]:
        return [Gate(b, a, scheduled(g.threshold, step), g.fill) for b, a, g in self._gate_specs]

    def __call__(self, raw: torch.Tensor, step: int) -> Aggregated:
        gates = self.gates(step)
        gated, closed = apply_gates(raw, gates)
        fractions = {
            f"{self.names[g.gated]}<-{self.names[g.gating]}": closed[:, j].float().mean().item()
            for j, g in enumerate(gates)
        }
        return Aggregated(gated=gated, weights=self.weights(step), gate_closed=fractions)


def raw_matrix(scores: Scores) -> torch.Tensor:
    """The pool's scores [K][N] as the [N, K] matrix the math takes (NaN = None)."""
    return torch.tensor(scores.scores, dtype=torch.float32).T


def weighted_totals(aggregator: RewardAggregator, scores: Scores, group_size: int,
                    step: int | None = None) -> torch.Tensor:
    """The weighted, gated total per sample [N] at `step` (default: the step the batch was scored under; NaN if
    no reward had an opinion): what dynamic sampling looks at, and an eval's total reward."""
    agg = aggregator(raw_matrix(scores), scores.global_step if step is None else step)
    return compute_advantages(agg.gated, agg.weights, group_size, "none", "sum_then_normalize").total


def reward_metrics(
    names: list[str],
    raw: torch.Tensor,
    gated: torch.Tensor,
    weights: torch.Tensor,
    total: torch.Tensor,
    advantages: torch.Tensor,
    zero_std: torch.Tensor,
) -> dict[str, float]:
    """raw/gated [N, K], weights [K], total [N] (weighted sum, NaN if unscorable), advantages [N]; TRL's names."""
    m: dict[str, float] = {
        "reward": nanmean_or_nan(total),
        "reward_std": nanstd_or_nan(total),
        "frac_reward_zero_std": zero_std.float().mean().item(),
        "advantages/mean": advantages.mean().item(),
        "advantages/std": advantages.std().item() if advantages.numel() > 1 else 0.0,
        "advantages/abs_mean": advantages.abs().mean().item(),
    }
    for k, name in enumerate(names):
        m[f"rewards/{name}/mean"] = nanmean_or_nan(raw[:, k])  # TRL: raw, unweighted, None excluded
        m[f"rewards/{name}/std"] = nanstd_or_nan(raw[:, k])
        m[f"rewards/{name}/gated_mean"] = nanmean_or_nan(gated[:, k])
        m[f"rewards/{name}/none_frac"] = torch.isnan(raw[:, k]).float().mean().item()
        m[f"rewards/{name}/weight"] = weights[k].item()
    return m


@dataclass(frozen=True)
class AdvantageBatch:
    """`advantage_batch`'s result."""

    batch: TrainBatch  # the learner's input: advantages [N], the token data by reference
    metrics: dict[str, float]  # the step's reward metrics (TRL's names) and gates' closed fractions
    table: dict[str, list[Any]]  # per sample [N], the completions log's columns: each reward raw and gated, total,
    # advantage


def advantage_batch(
    aggregator: RewardAggregator,
    rollouts: Rollouts,
    scores: Scores,
    *,
    scale_rewards: ScaleRewards,
    aggregation: Aggregation,
) -> AdvantageBatch:
    """raw -> gates and scheduled weights (at the step the batch was scored under) -> GRPO advantages: the
    learner's batch, the step's reward metrics, and per-sample columns for the completions log."""
    raw = raw_matrix(scores)  # [N, K]
    agg = aggregator(raw, scores.global_step)
    adv = compute_advantages(agg.gated, agg.weights, rollouts.group_size, scale_rewards, aggregation)
    metrics = reward_metrics(aggregator.names, raw, agg.gated, agg.weights, adv.total, adv.advantages, adv.zero_std)
    metrics.update({f"gates/{k}/closed_frac": v for k, v in agg.gate_closed.items()})
    # By reference: the token data (ids, sampling log-probs, masks, routes, images) stays with its payloads and the
    # teacher's log-probs with theirs; the learner fetches them (actors/payloads.py resolve_training).
    batch = TrainBatch(prompt_ids=[], completion_ids=[], sampling_logprobs=[], advantages=adv.advantages.tolist(),
                       truncated=rollouts.truncated, payloads=rollouts.payloads, teacher=scores.teacher,
                       group_size=rollouts.group_size)
    table: dict[str, list[Any]] = {"total": nan_to_none(adv.total.tolist()), "advantage": adv.advantages.tolist()}
    for k, name in enumerate(aggregator.names):
        table[f"rewards/{name}"] = nan_to_none(raw[:, k].tolist())
        table[f"gated/{name}"] = nan_to_none(agg.gated[:, k].tolist())
    return AdvantageBatch(batch, metrics, table)
