"""The driver's GRPO math with exactly TRL 1.16 ``GRPOTrainer`` semantics, as pure torch functions: group-relative
advantages and the NaN-aware statistics the reward metrics use. The loss and the vLLM importance weights are the
learner's (actors/learner/loss.py).

No Ray, no vLLM, no other rayward imports; ``tests/unit/orchestrator/algo/test_grpo.py`` checks them against TRL's own
code (not against a copy of its formulas). Citations: ``T:`` = trl/trainer/grpo_trainer.py, ``U:`` =
trl/trainer/utils.py in TRL 1.16.0 (line numbers).

Shapes: N = rows of the whole generation batch (G contiguous rows per prompt), K = reward functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

STD_EPS = 1e-4  # TRL adds 1e-4 to sigma, not to the variance (T:2786, T:2795, T:2799)

ScaleRewards = Literal["group", "batch", "none"]
Aggregation = Literal["sum_then_normalize", "normalize_then_sum"]


def nanstd(x: Tensor, dim: int | tuple[int, ...] | None = None, keepdim: bool = False) -> Tensor:
    """Unbiased (Bessel n-1) std ignoring NaN; NaN where fewer than 2 values (== trl.trainer.utils.nanstd)."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, math.nan))
    std = torch.sqrt(var * correction)
    if keepdim:
        return std
    if dim is None:
        return std.squeeze()
    dims = [dim] if isinstance(dim, int) else list(dim)
    for d in sorted((d % std.ndim for d in dims), reverse=True):
        std = std.squeeze(d)
    return std


def nan_to_none(xs: list[float]) -> list[float | None]:
    """NaN (a reward that did not score) as None: JSON has no NaN, the completions log and reports want null."""
    return [None if math.isnan(x) else x for x in xs]


def nanmean_or_nan(x: Tensor) -> float:
    """Mean of the non-NaN values of x, NaN if there are none."""
    v = x[~torch.isnan(x)]
    return v.mean().item() if v.numel() else math.nan


def nanstd_or_nan(x: Tensor) -> float:
    """nanstd of all of x as a float (NaN with fewer than 2 values)."""
    return nanstd(x).item() if (~torch.isnan(x)).sum() > 1 else math.nan


@dataclass
class AdvantageResult:
    advantages: Tensor  # [N] what the loss sees; NaN -> 0
    total: Tensor  # [N] raw weighted nansum of rewards, NaN for unscorable rows (TRL's logged `reward`)
    zero_std: Tensor  # [N] bool, isclose(std, 0) (TRL's frac_reward_zero_std is its mean)
    std: Tensor  # [N] the std TRL tests for zero: group std (group/none), batch std (batch / GDPO)


def compute_advantages(
    rewards: Tensor,
    weights: Tensor,
    num_generations: int,
    scale_rewards: ScaleRewards = "group",
    aggregation: Aggregation = "sum_then_normalize",
) -> AdvantageResult:
    """Group-relative advantages from a [N, K] reward matrix (NaN = reward function returned None). T:2750-2810."""
    n, k = rewards.shape
    g = num_generations
    if n % g != 0:
        raise ValueError(f"{n} rows are not a whole number of groups of {g}")
    w = weights.to(device=rewards.device, dtype=rewards.dtype).unsqueeze(0)  # [1, K]
    # A row where every function returned None carries no signal: NaN keeps it out of the nan-aware baseline.
    unscorable = torch.isnan(rewards).all(dim=1)  # [N]
    total = (rewards * w).nansum(dim=1).masked_fill(unscorable, math.nan)  # [N], a None term counts as 0

    if aggregation == "sum_then_normalize":
        grouped = total.view(-1, g)  # [N/G, G]
        baseline = torch.nanmean(grouped, dim=1).repeat_interleave(
            g
        )  # the GROUP mean, whatever scale_rewards
        if scale_rewards in ("group", "none"):  # "none" still needs the group std for zero_std
            std = nanstd(grouped, dim=1).repeat_interleave(g) if g > 1 else torch.zeros_like(total)
        elif scale_rewards == "batch":  # only sigma is batch-wide, the baseline stays per group
            std = nanstd(total).expand_as(total) if n > 1 else torch.zeros_like(total)
        else:
            raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', not {scale_rewards!r}")
        adv = total - baseline
        if scale_rewards != "none":
            adv = adv / (std + STD_EPS)
    elif aggregation == "normalize_then_sum":  # GDPO: z-score each function per group, then whiten the sum
        grouped_k = rewards.view(-1, g, k)  # [N/G, G, K]
        mean_k = torch.nanmean(grouped_k, dim=1, keepdim=True)  # [N/G, 1, K]; None excluded per function
        std_k = nanstd(grouped_k, dim=1, keepdim=True) if g > 1 else torch.zeros_like(mean_k)
        z = ((grouped_k - mean_k) / (std_k + STD_EPS)).view(-1, k)  # [N, K]; NaN z (std NaN) is dropped below
        summed = (z * w).nansum(dim=1).masked_fill(unscorable, math.nan)  # [N]
        std = nanstd(summed).expand_as(summed) if n > 1 else torch.zeros_like(summed)  # scale_rewards ignored
        adv = (summed - torch.nanmean(summed)) / (std + STD_EPS)
    else:
        raise ValueError(f"unknown aggregation {aggregation!r}")

    zero_std = torch.isclose(std, torch.zeros_like(std))  # NaN std (group of < 2 scorable) is NOT zero
    return AdvantageResult(torch.nan_to_num(adv, nan=0.0), total, zero_std, std)
