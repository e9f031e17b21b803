"""GRPO math with exactly TRL 1.16 ``GRPOTrainer`` semantics, as pure torch functions.

No Ray, no vLLM, no other rayward imports: the learner and the driver both call these, and
``tests/unit/orchestrator/test_grpo.py`` checks them against TRL's own code (not against a copy of its formulas).
Citations: ``T:`` = trl/trainer/grpo_trainer.py, ``U:`` = trl/trainer/utils.py in TRL 1.16.0 (line numbers).

Shapes: N = rows of the whole generation batch (G contiguous rows per prompt), K = reward functions,
B = rows of one micro-batch, T = padded completion length.
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
ISMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"]
CLIP_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # PPO-style clipped surrogate (T:3112)


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


def vllm_importance_weights(
    old_logp: Tensor,
    sampling_logp: Tensor,
    mask: Tensor,
    mode: ISMode = "sequence_mask",
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
) -> Tensor:
    """Trainer-vs-sampler importance weights (TIS/MIS), T:2659-2707. [B, T] for token_*, [B, 1] for sequence_*.

    old_logp: trainer log-probs of the sampled tokens at generation time; sampling_logp: vLLM "processed"
    (post-temperature) log-probs, NaN where vLLM could not score a token (that token then gets ratio 1).
    """
    diff = torch.nan_to_num((old_logp.detach() - sampling_logp) * mask, nan=0.0)  # [B, T]
    if mode.startswith("sequence_"):
        diff = diff.sum(
            dim=-1, keepdim=True
        )  # [B, 1]: SUM of log-ratios (product of token ratios), not the mean
    elif not mode.startswith("token_"):
        raise ValueError(f"unknown vLLM importance sampling mode {mode!r}")
    ratio = torch.exp(diff)
    if mode.endswith("_truncate"):
        # TIS; TRL's torch.clamp would raise with both bounds None, here that is a no-op.
        return ratio if clip_min is None and clip_max is None else ratio.clamp(min=clip_min, max=clip_max)
    if not mode.endswith("_mask"):
        raise ValueError(f"unknown vLLM importance sampling mode {mode!r}")
    lo = -math.inf if clip_min is None else clip_min
    hi = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)  # MIS: drop out-of-range tokens/sequences


def _nanmin(x: Tensor) -> Tensor:
    return x[~torch.isnan(x)].min() if not torch.isnan(x).all() else x.new_tensor(math.nan)


def _nanmax(x: Tensor) -> Tensor:
    return x[~torch.isnan(x)].max() if not torch.isnan(x).all() else x.new_tensor(math.nan)


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_type: LossType = "dapo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    importance_sampling_level: Literal["token", "sequence"] = "token",
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    use_bias_correction_kl: bool = True,
    is_weights: Tensor | None = None,
    num_items_in_batch: Tensor | float | None = None,
    max_completion_length: int | None = None,
    grad_accum_steps: int = 1,
    steps_per_generation: int | None = None,
    num_processes: int = 1,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
) -> tuple[Tensor, dict[str, Tensor]]:
    """One micro-batch's loss, already divided for gradient accumulation, as TRL's ``_compute_loss`` (T:3020-3290).

    logp [B, T] (with grad), old_logp [B, T] or None (on-policy: ratio 1), advantages [B] or [B, T],
    mask [B, T] (completion_mask * tool_mask), ref_logp [B, T] (needed iff beta != 0), is_weights [B, T] or
    [B, 1] from ``vllm_importance_weights``. ``num_items_in_batch``: global loss-token count of the whole
    generation batch (dapo/cispo). ``grad_accum_steps``: micro-batches in this optimizer step (TRL's
    current_gradient_accumulation_steps; 1 in eval); ``steps_per_generation`` defaults to it, as in TRL.
    Returns (loss, metrics) with TRL's metric names, per micro-batch (average them over micro-batches).
    """
    eps_low = epsilon
    eps_high = epsilon if epsilon_high is None else epsilon_high  # the fallback also applies to cispo (T:946)
    spg = grad_accum_steps if steps_per_generation is None else steps_per_generation
    mask = mask.to(logp.dtype)
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # [B, 1] or [B, T]
    old = logp.detach() if old_logp is None else old_logp  # TRL skips old logps when exactly on-policy

    log_ratio = logp - old  # [B, T]
    if importance_sampling_level == "token":
        log_w = log_ratio  # [B, T]
    elif importance_sampling_level == "sequence":  # GSPO: length-mean of the log-ratio, [B, 1]
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        raise ValueError(f"unknown importance_sampling_level {importance_sampling_level!r}")
    coef_1 = torch.exp(log_w)  # r; [B, T] or [B, 1]

    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta != 0 needs ref_logp")
        # k3 estimator; the bias correction multiplies by the NON-detached ratio, so it changes the gradient
        kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1  # [B, T]
        if use_bias_correction_kl:
            kl = kl * coef_1

    if loss_type == "cispo":  # epsilon_high is an absolute cap on the stop-gradient weight
        per_token = -torch.clamp(coef_1, max=eps_high).detach() * adv * logp
    elif loss_type in CLIP_LOSSES:
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        if delta is not None:  # INTELLECT-2 cap on the unclipped ratio, applied after coef_2 is formed
            coef_1 = torch.clamp(coef_1, max=delta)
        per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    elif loss_type == "sapo":
        tau = torch.where(adv > 0, sapo_temperature_pos, sapo_temperature_neg)
        per_token = -(torch.sigmoid(tau * (coef_1 - 1)) * 4 / tau) * adv
    else:
        raise ValueError(f"unsupported loss_type {loss_type!r}")

    if is_weights is not None:  # vLLM IS multiplies the policy term only, never the KL term
        per_token = per_token * is_weights
    if beta != 0.0:
        per_token = per_token + beta * kl

    masked = per_token * mask  # [B, T] (a [B, 1] sequence-level loss broadcasts over the tokens)
    if loss_type in ("grpo", "sapo"):  # mean over sequences of the per-sequence token mean
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / grad_accum_steps
    elif loss_type == "bnpo":  # micro-batch token mean
        loss = masked.sum() / mask.sum().clamp(min=1.0) / grad_accum_steps
    elif loss_type == "dr_grpo":  # constant normaliser B * L_max
        if max_completion_length is None:
            raise ValueError("dr_grpo needs max_completion_length")
        loss = masked.sum() / (per_token.size(0) * max_completion_length) / grad_accum_steps
    elif loss_type in ("dapo", "cispo"):  # generation-batch token count, rescaled to one accumulation window
        if num_items_in_batch is None:
            raise ValueError(f"{loss_type} needs num_items_in_batch")
        n_items = torch.as_tensor(num_items_in_batch, device=logp.device)
        normalizer = n_items.clamp(min=1.0) / num_processes * grad_accum_steps / spg
        loss = masked.sum() / normalizer
    else:  # luspo: per-sequence token SUM, averaged over sequences
        loss = masked.sum(-1).mean() / grad_accum_steps

    def masked_mean(x: Tensor) -> Tensor:  # T:3264-3270 on one rank; [B, 1] counts one per sequence
        if x.shape[1] == 1:
            return x.sum() / max(x.shape[0], 1)
        return (x * mask).sum() / mask.sum().clamp(min=1.0)

    def seq_mean(x: Tensor) -> Tensor:  # [B]; NaN for fully-masked rows, skipped by _nanmin/_nanmax
        return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)

    metrics: dict[str, Tensor] = {}
    with torch.no_grad():
        if beta != 0.0:
            metrics["kl"] = masked_mean(kl)
        if loss_type in CLIP_LOSSES:  # uses coef_1 AFTER the delta cap, as TRL does
            low = (coef_1 < 1 - eps_low) & (adv < 0)
            high = (coef_1 > 1 + eps_high) & (adv > 0)
            metrics["clip_ratio/low_mean"] = masked_mean(low.float())
            metrics["clip_ratio/high_mean"] = masked_mean(high.float())
            metrics["clip_ratio/region_mean"] = masked_mean((low | high).float())
            metrics["clip_ratio/low_min"] = _nanmin(seq_mean(low.float()))
            metrics["clip_ratio/high_max"] = _nanmax(seq_mean(high.float()))
        elif loss_type == "cispo":
            metrics["cispo_clip_ratio"] = masked_mean(((coef_1 > eps_high) & (adv > 0)).float())
    return loss, metrics
