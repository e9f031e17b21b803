"""The GRPO loss and the vLLM importance-sampling weights, with exactly TRL 1.16 ``GRPOTrainer`` semantics, as pure
torch functions of typed records.

The learner builds its loss from a `LossConfig` (built once from the run config, in orchestrator/build.py) and calls
``grpo_loss(LossInputs(...), cfg) -> LossOutputs`` on every micro-batch; ``vllm_importance_weights`` freezes the
sampler-vs-learner weights at the first pass. No Ray, no vLLM, no other rayward imports.
``tests/unit/actors/learner/test_loss.py`` checks both against TRL's own code (not against a copy of its formulas).
Citations: ``T:`` = trl/trainer/grpo_trainer.py in TRL 1.16.0 (line numbers).

Shapes: B = rows of one micro-batch, T = its longest completion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

ISMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
ISLevel = Literal["token", "sequence"]
LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"]
CLIP_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # PPO-style clipped surrogate (T:3112)


@dataclass(frozen=True)
class ImportanceSampling:
    """The vLLM importance-sampling correction: TRL's ``vllm_importance_sampling_mode`` / ``_clip_max`` /
    ``_clip_min`` (TIS: truncate the ratio; MIS: drop tokens or sequences out of range)."""

    mode: ISMode = "sequence_mask"
    clip_max: float | None = 3.0
    clip_min: float | None = None


@dataclass(frozen=True)
class LossConfig:
    """The run's loss settings, TRL's GRPOConfig names and meanings; fixed for the whole run."""

    loss_type: LossType = "dapo"
    epsilon: float = 0.2
    epsilon_high: float | None = None  # None: epsilon (also for cispo's cap, T:946)
    delta: float | None = None  # INTELLECT-2 cap on the unclipped ratio (clip losses)
    importance_sampling_level: ISLevel = "token"  # "sequence": GSPO
    beta: float = 0.0  # KL coefficient; 0 loads no reference model
    use_bias_correction_kl: bool = True
    max_completion_length: int | None = None  # dr_grpo's constant normaliser
    steps_per_generation: int | None = None  # None: the micro-batches of the step (rayward's one batch per step)
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vllm_importance_sampling: ImportanceSampling | None = None  # None: no correction
    temperature: float = 1.0  # the sampling temperature: the learner's log-probs are those of logits / temperature


@dataclass
class LossInputs:
    """One micro-batch as the loss sees it."""

    logp: Tensor  # [B, T] the policy's log-probs of the completion tokens, with grad
    old_logp: Tensor | None  # [B, T] frozen at the step's first pass; None: exactly on-policy (ratio 1)
    advantages: Tensor  # [B] or [B, T]
    mask: Tensor  # [B, T] loss tokens (completion mask; truncated rows zeroed with mask_truncated_completions)
    ref_logp: Tensor | None = None  # [B, T] the reference's log-probs; needed iff beta != 0
    is_weights: Tensor | None = None  # [B, T] or [B, 1] from vllm_importance_weights; None: no correction
    num_items_in_batch: Tensor | float | None = None  # loss tokens of the whole generation batch (dapo, cispo)
    grad_accum_steps: int = 1  # micro-batches in this optimizer step (TRL's current_gradient_accumulation_steps)
    # Sequences in this optimizer step, every micro-batch's (grpo, sapo, dr_grpo, luspo normalise by it); None:
    # B x grad_accum_steps, TRL's count when every micro-batch holds B.
    num_sequences: int | None = None


@dataclass
class LossOutputs:
    """The micro-batch's loss, already divided for gradient accumulation, and its metrics under TRL's names
    (per micro-batch: average them over micro-batches; NaN where a micro-batch has no value)."""

    loss: Tensor  # scalar
    metrics: dict[str, Tensor]  # scalars


def vllm_importance_weights(
    old_logp: Tensor, sampling_logp: Tensor, mask: Tensor, correction: ImportanceSampling
) -> Tensor:
    """Trainer-vs-sampler importance weights (TIS/MIS), T:2659-2707. [B, T] for token_*, [B, 1] for sequence_*.

    old_logp: trainer log-probs of the sampled tokens at generation time; sampling_logp: vLLM "processed"
    (post-temperature) log-probs, NaN where vLLM could not score a token (that token then gets ratio 1).
    """
    mode, clip_min, clip_max = correction.mode, correction.clip_min, correction.clip_max
    diff = torch.nan_to_num((old_logp.detach() - sampling_logp) * mask, nan=0.0)  # [B, T]
    if mode.startswith("sequence_"):
        diff = diff.sum(dim=-1, keepdim=True)  # [B, 1]: SUM of log-ratios (product of token ratios), not the mean
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


def grpo_loss(inputs: LossInputs, cfg: LossConfig) -> LossOutputs:
    """One micro-batch's loss, already divided for gradient accumulation, as TRL's ``_compute_loss``
    (T:3020-3290) on one process: rayward's learner ranks keep the single-rank normalisers (TRL's num_processes
    is 1 here).

    Normalisers are the whole step's, so that the summed loss and gradient do not depend on how the step's
    sequences are cut into micro-batches: TRL's per-micro-batch mean over B sequences / GA is written as a sum over
    the micro-batch's sequences / num_sequences (equal when every micro-batch holds B; token-budget micro-batches
    hold different numbers), dapo and cispo divide by the generation batch's loss tokens. bnpo alone depends on
    the cut by definition: each micro-batch's token mean, / GA."""
    logp, mask = inputs.logp, inputs.mask.to(inputs.logp.dtype)
    ga = inputs.grad_accum_steps
    n_seq = inputs.num_sequences if inputs.num_sequences is not None else logp.size(0) * ga
    eps_low = cfg.epsilon
    eps_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high  # the fallback also applies to cispo
    spg = ga if cfg.steps_per_generation is None else cfg.steps_per_generation
    adv = inputs.advantages
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv  # [B, 1] or [B, T]
    old = logp.detach() if inputs.old_logp is None else inputs.old_logp  # TRL skips old logps when on-policy

    log_ratio = logp - old  # [B, T]
    if cfg.importance_sampling_level == "token":
        log_w = log_ratio  # [B, T]
    elif cfg.importance_sampling_level == "sequence":  # GSPO: length-mean of the log-ratio, [B, 1]
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        raise ValueError(f"unknown importance_sampling_level {cfg.importance_sampling_level!r}")
    coef_1 = torch.exp(log_w)  # r; [B, T] or [B, 1]

    if cfg.beta != 0.0:
        if inputs.ref_logp is None:
            raise ValueError("beta != 0 needs ref_logp")
        # k3 estimator; the bias correction multiplies by the NON-detached ratio, so it changes the gradient
        kl = torch.exp(inputs.ref_logp - logp) - (inputs.ref_logp - logp) - 1  # [B, T]
        if cfg.use_bias_correction_kl:
            kl = kl * coef_1

    if cfg.loss_type == "cispo":  # epsilon_high is an absolute cap on the stop-gradient weight
        per_token = -torch.clamp(coef_1, max=eps_high).detach() * adv * logp
    elif cfg.loss_type in CLIP_LOSSES:
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        if cfg.delta is not None:  # INTELLECT-2 cap on the unclipped ratio, applied after coef_2 is formed
            coef_1 = torch.clamp(coef_1, max=cfg.delta)
        per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    elif cfg.loss_type == "sapo":
        tau = torch.where(adv > 0, cfg.sapo_temperature_pos, cfg.sapo_temperature_neg)
        per_token = -(torch.sigmoid(tau * (coef_1 - 1)) * 4 / tau) * adv
    else:
        raise ValueError(f"unsupported loss_type {cfg.loss_type!r}")

    if inputs.is_weights is not None:  # vLLM IS multiplies the policy term only, never the KL term
        per_token = per_token * inputs.is_weights
    if cfg.beta != 0.0:
        per_token = per_token + cfg.beta * kl

    masked = per_token * mask  # [B, T] (a [B, 1] sequence-level loss broadcasts over the tokens)
    if cfg.loss_type in ("grpo", "sapo"):  # mean over the step's sequences of the per-sequence token mean
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / n_seq
    elif cfg.loss_type == "bnpo":  # micro-batch token mean
        loss = masked.sum() / mask.sum().clamp(min=1.0) / ga
    elif cfg.loss_type == "dr_grpo":  # constant normaliser: the step's sequences x L_max
        if cfg.max_completion_length is None:
            raise ValueError("dr_grpo needs max_completion_length")
        loss = masked.sum() / (n_seq * cfg.max_completion_length)
    elif cfg.loss_type in ("dapo", "cispo"):  # generation-batch token count, rescaled to one accumulation window
        if inputs.num_items_in_batch is None:
            raise ValueError(f"{cfg.loss_type} needs num_items_in_batch")
        n_items = torch.as_tensor(inputs.num_items_in_batch, device=logp.device)
        loss = masked.sum() / (n_items.clamp(min=1.0) * ga / spg)
    else:  # luspo: per-sequence token SUM, averaged over the step's sequences
        loss = masked.sum(-1).sum() / n_seq

    def masked_mean(x: Tensor) -> Tensor:  # T:3264-3270 on one rank; [B, 1] counts one per sequence
        if x.shape[1] == 1:
            return x.sum() / max(x.shape[0], 1)
        return (x * mask).sum() / mask.sum().clamp(min=1.0)

    def seq_mean(x: Tensor) -> Tensor:  # [B]; NaN for fully-masked rows, skipped by _nanmin/_nanmax
        return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)

    metrics: dict[str, Tensor] = {}
    with torch.no_grad():
        if cfg.beta != 0.0:
            metrics["kl"] = masked_mean(kl)
        if cfg.loss_type in CLIP_LOSSES:  # uses coef_1 AFTER the delta cap, as TRL does
            low = (coef_1 < 1 - eps_low) & (adv < 0)
            high = (coef_1 > 1 + eps_high) & (adv > 0)
            metrics["clip_ratio/low_mean"] = masked_mean(low.float())
            metrics["clip_ratio/high_mean"] = masked_mean(high.float())
            metrics["clip_ratio/region_mean"] = masked_mean((low | high).float())
            metrics["clip_ratio/low_min"] = _nanmin(seq_mean(low.float()))
            metrics["clip_ratio/high_max"] = _nanmax(seq_mean(high.float()))
        elif cfg.loss_type == "cispo":
            metrics["cispo_clip_ratio"] = masked_mean(((coef_1 > eps_high) & (adv > 0)).float())
    return LossOutputs(loss, metrics)
