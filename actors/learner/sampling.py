"""The sampler-learner mismatch at a step's first pass: the gap between the engine's log-probs and the
learner's (always measured: the alarm for stale or garbage weights after a sync), and the vLLM
importance-sampling correction (`LossConfig.vllm_importance_sampling`, TRL's TIS / MIS) where the run asks for
it. One part, chosen when the learner is built (`sampling_correction`): `NoCorrection` or
`ImportanceCorrection`, both answering `first_pass`.

Shapes: B = rows of one micro-batch, T = its longest completion.
"""

from __future__ import annotations

import torch
from torch import Tensor

from actors.learner.loss import ImportanceSampling, LossConfig, vllm_importance_weights


def mask_turns(mask: Tensor) -> Tensor:
    """[B, T] loss mask -> [B, T] model turn of each loss token, -1 elsewhere. A multi-turn completion's model
    turns are the runs of 1s in its mask (a tool result, never empty, separates two turns), counted from 0."""
    on = (mask > 0).long()
    starts = on.clone()
    starts[:, 1:] = on[:, 1:] * (1 - on[:, :-1])
    return torch.where(on > 0, starts.cumsum(-1) - 1, torch.full_like(on, -1))


def sampler_logps(like: Tensor, sampling: list[list[float]]) -> Tensor:
    """[B, T] each row's vLLM log-probs laid out as the learner's (`like`), NaN past a row's end."""
    samp = torch.full_like(like, float("nan"))
    for r, lp in enumerate(sampling):
        samp[r, : len(lp)] = torch.tensor(lp, dtype=samp.dtype)
    return samp


def logp_gap(old: Tensor, samp: Tensor, mask: Tensor, by_turn: bool = False) -> dict[str, float]:
    """|learner - sampler| log-prob over the loss tokens the sampler scored: its mean and max; by_turn
    (multi-turn completions): the max also per model turn (`.../max/turn_<k>`): a gap that grows with the turn
    is the sign of ids that drifted from what the engine saw. old: [B, T] the learner's log-probs; samp: [B,
    T] the sampler's (sampler_logps); mask: [B, T] loss tokens. {} where no token has both."""
    metrics: dict[str, float] = {}
    valid = (mask > 0) & ~torch.isnan(samp)
    if valid.any():
        gaps = (old - samp).abs()
        gap = gaps[valid]
        metrics["sampling/sampling_logp_difference/mean"] = gap.mean().item()
        metrics["sampling/sampling_logp_difference/max"] = gap.max().item()
        if by_turn:
            turns = mask_turns(mask)
            for k in range(int(turns.max().item()) + 1):
                here = valid & (turns == k)
                if here.any():
                    metrics[f"sampling/sampling_logp_difference/max/turn_{k}"] = gaps[here].max().item()
    return metrics


class NoCorrection:
    """No importance-sampling correction: the gap's metrics only."""

    def first_pass(self, old: Tensor, sampling: list[list[float]], mask: Tensor, by_turn: bool
                   ) -> tuple[Tensor | None, dict[str, float]]:
        """(None, logp_gap's metrics)."""
        return None, logp_gap(old, sampler_logps(old, sampling), mask, by_turn)


class ImportanceCorrection:
    """vLLM importance weights for the sampler-learner mismatch, frozen at the step's first pass (TRL's)."""

    def __init__(self, correction: ImportanceSampling) -> None:
        self.correction = correction

    def first_pass(self, old: Tensor, sampling: list[list[float]], mask: Tensor, by_turn: bool
                   ) -> tuple[Tensor | None, dict[str, float]]:
        """The weights ([B, T] token-level, [B, 1] sequence-level) and logp_gap's metrics with the weights'
        min, mean and max over the loss tokens (or sequences). old: [B, T] the learner's log-probs at the
        first pass."""
        samp = sampler_logps(old, sampling)
        metrics = logp_gap(old, samp, mask, by_turn)
        w = vllm_importance_weights(old, samp, mask, self.correction)
        wv = w[mask > 0] if w.shape == mask.shape else w.flatten()
        if wv.numel():
            metrics["sampling/importance_sampling_ratio/min"] = wv.min().item()
            metrics["sampling/importance_sampling_ratio/mean"] = wv.mean().item()
            metrics["sampling/importance_sampling_ratio/max"] = wv.max().item()
        return w, metrics


def sampling_correction(cfg: LossConfig) -> NoCorrection | ImportanceCorrection:
    """The part for the run's loss: a correction where `vllm_importance_sampling` is set, none otherwise."""
    if cfg.vllm_importance_sampling is None:
        return NoCorrection()
    return ImportanceCorrection(cfg.vllm_importance_sampling)
