"""On-policy distillation from an engine-served teacher, as pure torch functions, in the two forms peers ship
(`LossConfig.distill_mode`, actors/learner/loss.py; the teacher pool fills `LossInputs.teacher_logp`):

- "advantage" (slime's OPD, `docs/en/advanced/on-policy-distillation.md`; Thinking Machines' / Tinker's on-policy
  distillation; Trinity-RFT, ms-swift): the per-token reverse-KL estimate log p_student - log p_teacher of each
  sampled token is subtracted from that token's GRPO advantage, after the group normalisation:

      A_t = A - coef * (log p_student(y_t) - log p_teacher(y_t))        (`token_advantages`)

  and the policy-gradient surrogate (clipping, IS correction) trains on it: a REINFORCE estimator of the gradient
  of the sequence's reverse KL, whose signal on a token the student rarely samples is not scaled down by that
  token's probability.
- "loss" (TRL 1.16's ServerDistillationTrainer), the rest of this docstring:

A teacher on a vLLM engine returns the log-probability of each token the student sampled (prompt log-probs of the
whole sequence, one forward), not a distribution. TRL's ServerDistillationTrainer
(trl/experimental/server_distillation) trains on exactly that: with `beta` 1 (reverse KL), `loss_top_k` 1 and
`reverse_kl_top_1_mode` "sampled", the support of each position is the sampled token, plus a tail bucket holding
the rest of the probability (`loss_add_tail`, default on; without it a one-token support is normalised to
probability 1 for both models and the divergence is always 0). Per token (s = student's log-prob of the sampled
token, t = the teacher's):

    KL = e^s (s - t) + (1 - e^s) (log(1 - e^s) - log(1 - e^t))

a reverse KL between two-bucket distributions: 0 when the two agree on the sampled token, always >= 0, and its
gradient moves the student's probability of the token towards the teacher's. It is a loss term (TRL's choice),
added beside the GRPO surrogate and not importance-weighted; the advantages stay the rewards'.
``tests/unit/actors/learner/test_distill.py`` checks it against TRL's own `_add_tail_bucket` and `_jsd_divergence`.

Shapes: B = rows of one micro-batch, T = its longest completion.
"""

from __future__ import annotations

import torch
from torch import Tensor

# TRL's `_add_tail_bucket` clamps the support's log-mass below 0 so the tail's log(1 - e^s) stays finite.
TAIL_LOG_MASS_MAX = -1e-7


def _tail(logp: Tensor) -> Tensor:
    """log(1 - e^logp): the log-mass of every token but the sampled one."""
    return torch.log(-torch.expm1(logp.clamp(max=TAIL_LOG_MASS_MAX)))


def sampled_token_reverse_kl(logp: Tensor, teacher_logp: Tensor) -> Tensor:
    """[B, T] student and teacher log-probs of the sampled tokens -> [B, T] reverse KL(student || teacher) on the
    {sampled token, tail} support (TRL: `_jsd_divergence(beta=1)` on `_add_tail_bucket`'s, summed over the two
    buckets). Positions to leave out are the caller's mask."""
    s = logp.clamp(max=TAIL_LOG_MASS_MAX)
    t = teacher_logp.clamp(max=TAIL_LOG_MASS_MAX)
    s_tail, t_tail = _tail(logp), _tail(teacher_logp)
    return s.exp() * (s - t) + s_tail.exp() * (s_tail - t_tail)


def distill_loss(logp: Tensor, teacher_logp: Tensor, mask: Tensor, num_tokens: float | Tensor) -> Tensor:
    """The distillation term of one micro-batch: the masked sum of `sampled_token_reverse_kl` over `num_tokens`,
    the step's completion tokens (TRL's `num_items_in_batch`: a token mean over the whole step whatever the
    micro-batching). mask [B, T]: 1 on the model's own sampled tokens (not padding, not tool results)."""
    kl = sampled_token_reverse_kl(logp, teacher_logp)
    return torch.where(mask.bool(), kl, torch.zeros_like(kl)).sum() / num_tokens


def reverse_kl_estimate(logp: Tensor, teacher_logp: Tensor, mask: Tensor) -> Tensor:
    """The metric `distill/reverse_kl`: the mean of log p_student - log p_teacher over the sampled tokens, an
    unbiased estimate of the per-token KL(student || teacher) on the full vocabulary (the tokens are the student's
    samples), unlike the two-bucket loss, which bounds it from below."""
    m = mask.bool()
    return (logp - teacher_logp)[m].mean() if m.any() else logp.new_zeros(())


def token_advantages(advantages: Tensor, old_logp: Tensor, teacher_logp: Tensor, scored: Tensor, coef: float
                     ) -> Tensor:
    """[B] or [B, T] GRPO advantages -> [B, T] the "advantage" form's: minus coef x (old_logp - teacher_logp) on
    the `scored` tokens ([B, T] bool: loss tokens the teacher scored), the advantage alone elsewhere. old_logp:
    the student's log-probs frozen at the step's first pass (the policy that sampled, on-policy), detached: the
    penalty is a reward, not a path for the gradient."""
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    gap = torch.where(scored, old_logp.detach() - teacher_logp, torch.zeros_like(old_logp))
    return adv - coef * gap


__all__ = ["distill_loss", "reverse_kl_estimate", "sampled_token_reverse_kl", "token_advantages"]
