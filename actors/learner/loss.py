"""The GRPO loss and the vLLM importance-sampling weights, with exactly TRL 1.16 ``GRPOTrainer`` semantics, as pure
torch functions of typed records.

The learner builds its loss once, ``loss_fn(cfg)`` of a `LossConfig` (built from the run config in
orchestrator/run/build.py), and calls it on every micro-batch: ``LossInputs -> LossOutputs``. The loss is three picks
made there, each a table keyed by the config: the importance-sampling level (token or sequence: `LOG_WEIGHTS`), the
surrogate of the loss family (clipped, cispo, sapo: `SURROGATES`) and the normaliser (`NORMALISERS`, one per
loss_type); the vLLM IS weight and the KL term are the same for every family. ``vllm_importance_weights`` freezes
the sampler-vs-learner weights at the first pass. The distillation term (`distill_coef`) is
actors/learner/distill.py's. No Ray, no vLLM, no other rayward imports.
``tests/unit/actors/learner/test_loss.py`` checks both against TRL's own code (not against a copy of its formulas).
Citations: ``T:`` = trl/trainer/grpo_trainer.py in TRL 1.16.0 (line numbers).

Shapes: B = rows of one micro-batch, T = its longest completion.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from actors.learner.distill import sampled_token_reverse_kl, token_advantages

ISMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
ISLevel = Literal["token", "sequence"]
LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"]
DistillMode = Literal["advantage", "loss"]


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
    distill_coef: float = 0.0  # on-policy distillation's weight (actors/learner/distill.py); 0: no teacher term
    distill_mode: DistillMode = "advantage"  # the teacher's signal as a per-token advantage term, or a loss term


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
    teacher_logp: Tensor | None = None  # [B, T] the teacher's log-probs of the sampled tokens (NaN where it has
    # none: off the mask, or a sample it did not score); needed iff distill_coef != 0


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


class _Masked:
    """Reductions over one micro-batch's loss tokens, for the metrics (T:3264-3270 on one rank)."""

    def __init__(self, mask: Tensor):
        self.mask = mask  # [B, T]

    def mean(self, x: Tensor) -> Tensor:
        """Token mean of [B, T]; a [B, 1] sequence-level value counts once per sequence."""
        if x.shape[1] == 1:
            return x.sum() / max(x.shape[0], 1)
        return (x * self.mask).sum() / self.mask.sum().clamp(min=1.0)

    def seq_mean(self, x: Tensor) -> Tensor:
        """[B]: each sequence's token mean; NaN for fully-masked rows, skipped by _nanmin/_nanmax."""
        return x.squeeze(1) if x.shape[1] == 1 else (x * self.mask).sum(-1) / self.mask.sum(-1)


def _nanmin(x: Tensor) -> Tensor:
    return x[~torch.isnan(x)].min() if not torch.isnan(x).all() else x.new_tensor(math.nan)


def _nanmax(x: Tensor) -> Tensor:
    return x[~torch.isnan(x)].max() if not torch.isnan(x).all() else x.new_tensor(math.nan)


def _eps_high(cfg: LossConfig) -> float:
    return cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high  # the fallback also applies to cispo


# --------------------------------------------------------------------------------------------- IS level
# The importance weight's log, from the per-token log-ratio [B, T] and the loss mask: token level (PPO, [B, T]) or
# sequence level (GSPO: the length-mean of the log-ratio, [B, 1]). T:3083-3093.
LogWeight = Callable[[Tensor, Tensor], Tensor]


def _token_log_weight(log_ratio: Tensor, mask: Tensor) -> Tensor:
    return log_ratio


def _sequence_log_weight(log_ratio: Tensor, mask: Tensor) -> Tensor:
    return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)


LOG_WEIGHTS: dict[str, LogWeight] = {"token": _token_log_weight, "sequence": _sequence_log_weight}


# --------------------------------------------------------------------------------------------- surrogates
# One per loss family: the per-token policy loss [B, T] (or [B, 1] at sequence level) from the ratio r = coef_1
# ([B, T] or [B, 1]), the live log-probs [B, T] and the advantages ([B, 1] or [B, T]), and the family's metrics
# (no grad), under TRL's names. The vLLM IS weight, the KL term and the normaliser are the same for every family.
Surrogate = Callable[[Tensor, Tensor, Tensor, LossConfig, _Masked], tuple[Tensor, dict[str, Tensor]]]


def clipped_surrogate(
    coef_1: Tensor, logp: Tensor, adv: Tensor, cfg: LossConfig, masked: _Masked
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped surrogate (grpo, bnpo, dr_grpo, dapo, luspo; T:3112-3120), with the INTELLECT-2 cap `delta`
    on the unclipped ratio, applied after the clipped one is formed."""
    eps_low, eps_high = cfg.epsilon, _eps_high(cfg)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    if cfg.delta is not None:
        coef_1 = torch.clamp(coef_1, max=cfg.delta)
    per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    with torch.no_grad():  # the ratio AFTER the delta cap, as TRL does
        low = (coef_1 < 1 - eps_low) & (adv < 0)
        high = (coef_1 > 1 + eps_high) & (adv > 0)
        metrics = {
            "clip_ratio/low_mean": masked.mean(low.float()),
            "clip_ratio/high_mean": masked.mean(high.float()),
            "clip_ratio/region_mean": masked.mean((low | high).float()),
            "clip_ratio/low_min": _nanmin(masked.seq_mean(low.float())),
            "clip_ratio/high_max": _nanmax(masked.seq_mean(high.float())),
        }
    return per_token, metrics


def cispo_surrogate(
    coef_1: Tensor, logp: Tensor, adv: Tensor, cfg: LossConfig, masked: _Masked
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (T:3109-3111): REINFORCE on the log-probs, weighted by the stop-gradient ratio capped at epsilon_high
    (an absolute cap, not 1 + epsilon_high)."""
    eps_high = _eps_high(cfg)
    per_token = -torch.clamp(coef_1, max=eps_high).detach() * adv * logp
    with torch.no_grad():
        metrics = {"cispo_clip_ratio": masked.mean(((coef_1 > eps_high) & (adv > 0)).float())}
    return per_token, metrics


def sapo_surrogate(
    coef_1: Tensor, logp: Tensor, adv: Tensor, cfg: LossConfig, masked: _Masked
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO (T:3121-3124): a sigmoid gate on the ratio instead of a hard clip, with its own temperature for
    positive and negative advantages; no metrics."""
    tau = torch.where(adv > 0, cfg.sapo_temperature_pos, cfg.sapo_temperature_neg)
    return -(torch.sigmoid(tau * (coef_1 - 1)) * 4 / tau) * adv, {}


SURROGATES: dict[str, Surrogate] = {
    **dict.fromkeys(("grpo", "bnpo", "dr_grpo", "dapo", "luspo"), clipped_surrogate),
    "cispo": cispo_surrogate,
    "sapo": sapo_surrogate,
}


# --------------------------------------------------------------------------------------------- normalisers
# The micro-batch's loss from its masked per-token loss [B, T] and mask [B, T] (T:3152-3184). Normalisers are the
# whole step's, so that the summed loss and gradient do not depend on how the step's sequences are cut into
# micro-batches: TRL's per-micro-batch mean over B sequences / GA is written as a sum over the micro-batch's
# sequences / num_sequences (equal when every micro-batch holds B; token-budget micro-batches hold different
# numbers), dapo and cispo divide by the generation batch's loss tokens. bnpo alone depends on the cut by
# definition: each micro-batch's token mean, / GA.
Normaliser = Callable[[Tensor, Tensor, LossInputs, LossConfig], Tensor]


def _num_sequences(inputs: LossInputs) -> int:
    """The step's sequences; TRL's B x GA when the micro-batch does not say."""
    if inputs.num_sequences is not None:
        return inputs.num_sequences
    return inputs.logp.size(0) * inputs.grad_accum_steps


def _sequence_mean(masked: Tensor, mask: Tensor, inputs: LossInputs, cfg: LossConfig) -> Tensor:
    """grpo, sapo: the mean over the step's sequences of each sequence's token mean."""
    return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / _num_sequences(inputs)


def _micro_batch_token_mean(masked: Tensor, mask: Tensor, inputs: LossInputs, cfg: LossConfig) -> Tensor:
    """bnpo: the micro-batch's token mean, / GA."""
    return masked.sum() / mask.sum().clamp(min=1.0) / inputs.grad_accum_steps


def _constant_length(masked: Tensor, mask: Tensor, inputs: LossInputs, cfg: LossConfig) -> Tensor:
    """dr_grpo: a constant normaliser, the step's sequences x max_completion_length."""
    return masked.sum() / (_num_sequences(inputs) * cfg.max_completion_length)


def _generation_tokens(masked: Tensor, mask: Tensor, inputs: LossInputs, cfg: LossConfig) -> Tensor:
    """dapo, cispo: the generation batch's loss tokens, rescaled to one accumulation window."""
    if inputs.num_items_in_batch is None:
        raise ValueError(f"{cfg.loss_type} needs num_items_in_batch")
    ga = inputs.grad_accum_steps
    spg = ga if cfg.steps_per_generation is None else cfg.steps_per_generation
    n_items = torch.as_tensor(inputs.num_items_in_batch, device=masked.device)
    return masked.sum() / (n_items.clamp(min=1.0) * ga / spg)


def _sequence_sum(masked: Tensor, mask: Tensor, inputs: LossInputs, cfg: LossConfig) -> Tensor:
    """luspo: each sequence's token SUM, averaged over the step's sequences."""
    return masked.sum(-1).sum() / _num_sequences(inputs)


NORMALISERS: dict[str, Normaliser] = {
    "grpo": _sequence_mean,
    "sapo": _sequence_mean,
    "bnpo": _micro_batch_token_mean,
    "dr_grpo": _constant_length,
    "dapo": _generation_tokens,
    "cispo": _generation_tokens,
    "luspo": _sequence_sum,
}


# --------------------------------------------------------------------------------------------- the loss
LossFn = Callable[[LossInputs], LossOutputs]


def loss_fn(cfg: LossConfig) -> LossFn:
    """The run's loss, built once: `cfg`'s IS level, surrogate and normaliser, picked and checked here (a bad
    setting fails at construction, not at the first step). Calling it on a micro-batch is TRL's ``_compute_loss``
    (T:3020-3290) on one process: rayward's learner ranks keep the single-rank normalisers (TRL's num_processes is
    1 here)."""
    if cfg.importance_sampling_level not in LOG_WEIGHTS:
        raise ValueError(f"unknown importance_sampling_level {cfg.importance_sampling_level!r}")
    if cfg.loss_type not in SURROGATES:
        raise ValueError(f"unsupported loss_type {cfg.loss_type!r}")
    if cfg.loss_type == "dr_grpo" and cfg.max_completion_length is None:
        raise ValueError("dr_grpo needs max_completion_length")
    return functools.partial(
        _loss, cfg=cfg, log_weight=LOG_WEIGHTS[cfg.importance_sampling_level],
        surrogate=SURROGATES[cfg.loss_type], normalise=NORMALISERS[cfg.loss_type],
    )


def grpo_loss(inputs: LossInputs, cfg: LossConfig) -> LossOutputs:
    """One micro-batch's loss under `cfg`: ``loss_fn(cfg)(inputs)``, for a caller that does not keep the loss."""
    return loss_fn(cfg)(inputs)


def _loss(
    inputs: LossInputs, *, cfg: LossConfig, log_weight: LogWeight, surrogate: Surrogate, normalise: Normaliser
) -> LossOutputs:
    """One micro-batch's loss, already divided for gradient accumulation, and its metrics."""
    logp, mask = inputs.logp, inputs.mask.to(inputs.logp.dtype)
    adv = inputs.advantages
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv  # [B, 1] or [B, T]
    old = logp.detach() if inputs.old_logp is None else inputs.old_logp  # TRL skips old logps when on-policy
    scored = _teacher_scored(mask, inputs, cfg)  # [B, T] loss tokens with the teacher's log-prob, or None
    if scored is not None and cfg.distill_mode == "advantage":
        adv = token_advantages(adv, old, inputs.teacher_logp, scored, cfg.distill_coef)  # [B, T]
    coef_1 = torch.exp(log_weight(logp - old, mask))  # r; [B, T] or [B, 1]
    # The KL term is formed before the surrogate, in TRL's order: autograd sums the paths into d loss / d logp in
    # the reverse order of their creation, so another order changes the gradient's last bits.
    kl = _kl(logp, inputs.ref_logp, coef_1, cfg) if cfg.beta != 0.0 else None
    masked = _Masked(mask)
    per_token, family_metrics = surrogate(coef_1, logp, adv, cfg, masked)
    if inputs.is_weights is not None:  # vLLM IS multiplies the policy term only, never the KL term
        per_token = per_token * inputs.is_weights
    metrics: dict[str, Tensor] = {}
    if kl is not None:
        per_token = per_token + cfg.beta * kl
        with torch.no_grad():
            metrics["kl"] = masked.mean(kl)
    metrics.update(family_metrics)
    # [B, T] (a [B, 1] sequence-level loss broadcasts over the tokens)
    loss = normalise(per_token * mask, mask, inputs, cfg)
    if scored is not None:
        with torch.no_grad():  # the reverse-KL estimate on the sampled tokens, at the step's first-pass policy
            metrics["distill/reverse_kl"] = _Masked(scored.to(mask.dtype)).mean(
                old - torch.where(scored, inputs.teacher_logp, old))
        if cfg.distill_mode == "loss":
            loss = loss + cfg.distill_coef * _distill(logp, mask, scored, inputs, cfg, metrics)
    return LossOutputs(loss, metrics)


def _teacher_scored(mask: Tensor, inputs: LossInputs, cfg: LossConfig) -> Tensor | None:
    """[B, T] bool, the loss tokens the teacher scored (its log-prob finite: elsewhere it is NaN, off the mask or on
    a sample it gave none, a timeout or an error); None without distillation."""
    if cfg.distill_coef == 0.0:
        return None
    if inputs.teacher_logp is None:
        raise ValueError("distill_coef != 0 needs teacher_logp")
    return mask.bool() & torch.isfinite(inputs.teacher_logp)


def _distill(logp: Tensor, mask: Tensor, scored: Tensor, inputs: LossInputs, cfg: LossConfig,
             metrics: dict[str, Tensor]) -> Tensor:
    """The "loss" form (TRL's server distillation): beside the surrogate, not importance-weighted, a token mean over
    the generation batch's loss tokens whatever the loss_type (TRL's num_items_in_batch). A sample the teacher
    missed weighs nothing; the normaliser stays the step's loss tokens, so the others weigh as always."""
    # Where the teacher has no log-prob the student's own stand in: a zero term with a zero gradient (a NaN would
    # reach the gradient through torch.where's other branch).
    teacher = torch.where(scored, inputs.teacher_logp, logp.detach())
    term = sampled_token_reverse_kl(logp, teacher)
    with torch.no_grad():
        metrics["distill/loss"] = _Masked(scored.to(mask.dtype)).mean(term)
    return _generation_tokens(term * scored, mask, inputs, cfg)


def _kl(logp: Tensor, ref_logp: Tensor | None, coef_1: Tensor, cfg: LossConfig) -> Tensor:
    """[B, T] the k3 estimator of KL(policy || reference); the bias correction multiplies by the NON-detached ratio,
    so it changes the gradient (T:3098-3105)."""
    if ref_logp is None:
        raise ValueError("beta != 0 needs ref_logp")
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    return kl * coef_1 if cfg.use_bias_correction_kl else kl
