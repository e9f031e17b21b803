"""Which scored groups a step trains on: all of them, or DAPO's dynamic sampling (pure; no Ray).

A selector takes the step's rollouts and scores and a `refill(num_prompts)` callable (generate and score that
many new prompts; the loop supplies it, timed) and returns a `Selection`: the rollouts and scores to train on,
plus metrics. The run's selector is chosen when the run is built (`build.selector`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from actors.types import Rollouts, Scores
from orchestrator.algo.grpo import nanstd

# A group whose total-reward std is at or below this is "zero spread" (identical rewards up to float noise).
STD_ZERO_TOL = 1e-6


@dataclass
class Selection:
    """The groups a step trains on (rollouts and scores aligned, G contiguous per group), and what selecting
    them logged."""

    rollouts: Rollouts
    scores: Scores
    metrics: dict[str, float] = field(default_factory=dict)


Refill = Callable[[int], tuple[Rollouts, Scores]]
Selector = Callable[[Rollouts, Scores, Refill], Selection]


def keep_all(rollouts: Rollouts, scores: Scores, refill: Refill) -> Selection:
    return Selection(rollouts, scores)


def replace_groups(rollouts: Rollouts, scores: Scores, drop: list[int], refill: Refill) -> tuple[Rollouts, Scores]:
    """The batch without the groups `drop`, refilled with as many new prompts' groups (generated and scored by
    `refill`), the survivors first."""
    keep = [g for g in range(rollouts.num_groups) if g not in set(drop)]
    r, s = rollouts.take_groups(keep), scores.take_groups(keep, rollouts.group_size)
    more_r, more_s = refill(len(drop))
    return r.concat(more_r), s.concat(more_s)


def without_lost(select: Selector) -> Selector:
    """`select` on a batch whose groups with a lost payload (Scores.lost: their generator or node went before
    they were scored) were replaced by new prompts' groups first; `data_plane/lost_groups` counts them. A lost
    group's prompt is dropped, never trained twice."""

    def selecting(rollouts: Rollouts, scores: Scores, refill: Refill) -> Selection:
        lost = 0
        while drop := scores.lost_groups(rollouts.group_size):
            lost += len(drop)
            rollouts, scores = replace_groups(rollouts, scores, drop, refill)
        picked = select(rollouts, scores, refill)
        picked.metrics["data_plane/lost_groups"] = lost
        return picked

    return selecting


def groups_with_spread(totals: torch.Tensor, group_size: int) -> list[int]:
    """Indices of the groups whose total reward has non-zero std (NaN std, fewer than 2 scorable samples, is
    no spread). totals: [N], G contiguous per group."""
    std = nanstd(totals.view(-1, group_size), dim=1)  # [groups]
    return [i for i, s in enumerate(std.tolist()) if not math.isnan(s) and s > STD_ZERO_TOL]


def dynamic_sampling(
    rollouts: Rollouts,
    scores: Scores,
    refill: Refill,
    *,
    totals: Callable[[Scores, int], torch.Tensor],
    target_groups: int,
    max_refill_rounds: int,
) -> Selection:
    """DAPO: keep groups whose total reward has non-zero std; refill with new prompts for at most
    max_refill_rounds extra rounds; never drop an accepted group; train on what there is if still short.
    totals(scores, group_size) -> [N] weighted totals (aggregation.weighted_totals, bound at build time)."""
    g = rollouts.group_size
    kept: tuple[Rollouts, Scores] | None = None
    seen = accepted = rounds = 0
    while True:
        good = groups_with_spread(totals(scores, g), g)[: target_groups - accepted]
        seen, accepted = seen + rollouts.num_groups, accepted + len(good)
        if good:
            part = rollouts.take_groups(good), scores.take_groups(good, g)
            kept = part if kept is None else (kept[0].concat(part[0]), kept[1].concat(part[1]))
        if accepted >= target_groups or rounds >= max_refill_rounds:
            break
        rounds += 1
        rollouts, scores = refill(target_groups - accepted)
    if kept is None:  # nothing had spread: train on the last batch (all advantages 0) so the run moves on
        kept = (rollouts, scores)
    info = {
        "dynamic_sampling/pass_rate": accepted / seen,
        "dynamic_sampling/accepted_groups": accepted,
        "dynamic_sampling/refill_rounds": rounds,
        "dynamic_sampling/filled": float(accepted >= target_groups),
    }
    return Selection(kept[0], kept[1], info)
