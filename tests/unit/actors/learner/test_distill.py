"""The distillation term against TRL 1.16's own server-distillation functions (`_add_tail_bucket`,
`_jsd_divergence` with beta 1 on a top-1 support, reduced as `_reduce_divergence_loss` with num_items_in_batch),
values and gradients; and what it must be: 0 where the models agree, positive where they do not, its gradient
moving the student towards the teacher."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from trl.experimental.server_distillation.server_distillation_trainer import _add_tail_bucket, _jsd_divergence

from actors.learner.distill import distill_loss, reverse_kl_estimate, sampled_token_reverse_kl


def trl_term(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, num_items: float) -> torch.Tensor:
    """TRL's `_compute_server_mixed_loss` for beta 1 (reverse_kl_top_1_mode "sampled", loss_add_tail), from the
    gathered log-probs of the sampled tokens on."""
    support_mask = torch.ones(*student.shape, 1, dtype=torch.bool)
    s, full_mask = _add_tail_bucket(student.unsqueeze(-1), support_mask)
    t, _ = _add_tail_bucket(teacher.unsqueeze(-1), support_mask)
    jsd = _jsd_divergence(s, t, 1.0, full_mask)
    return jsd[mask.bool()].sum() / num_items


def logps(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.log(torch.rand(*shape, generator=g).clamp(1e-4, 1 - 1e-4))


def test_the_term_is_trls_in_value_and_gradient():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1], [0, 0, 0, 0]])
    for seed in range(5):
        student, teacher = logps(3, 4, seed=seed).requires_grad_(), logps(3, 4, seed=seed + 100)
        ours = distill_loss(student, teacher, mask, 7.0)
        (g_ours,) = torch.autograd.grad(ours, student)
        theirs = trl_term(student, teacher, mask, 7.0)
        (g_theirs,) = torch.autograd.grad(theirs, student)
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-7)
        assert ours > 0 and g_ours[mask == 0].abs().sum() == 0


def test_zero_where_the_models_agree_and_the_gradient_moves_the_student_to_the_teacher():
    p = logps(2, 5, seed=1)
    assert sampled_token_reverse_kl(p, p).abs().max() < 1e-6
    student = torch.log(torch.tensor([[0.2, 0.9]])).requires_grad_()
    teacher = torch.log(torch.tensor([[0.6, 0.5]]))
    (grad,) = torch.autograd.grad(sampled_token_reverse_kl(student, teacher).sum(), student)
    assert grad[0, 0] < 0 and grad[0, 1] > 0  # descent raises the first token's probability, lowers the second's
    # a token the student is sure of (log-prob 0) stays finite, as TRL's clamp keeps it
    assert torch.isfinite(sampled_token_reverse_kl(torch.zeros(1, 1), torch.log(torch.tensor([[0.5]])))).all()


def test_the_reverse_kl_metric_is_the_mean_log_ratio_of_the_sampled_tokens():
    student, teacher = torch.tensor([[-1.0, -2.0, -0.5]]), torch.tensor([[-1.5, -1.0, -9.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert reverse_kl_estimate(student, teacher, mask).item() == (0.5 - 1.0) / 2
    assert reverse_kl_estimate(student, teacher, torch.zeros_like(mask)).item() == 0.0


# --- the term in the learner's loss ---------------------------------------------------------------------------


def micro_batch(seed: int, teacher_nan_off_mask: bool = False):
    from actors.learner.loss import LossInputs

    logp = logps(3, 4, seed=seed).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 0, 0]])
    teacher = logps(3, 4, seed=seed + 50)
    if teacher_nan_off_mask:
        teacher = torch.where(mask.bool(), teacher, torch.full_like(teacher, float("nan")))
    adv = torch.tensor([0.5, -1.0, 0.25])
    return logp, LossInputs(logp=logp, old_logp=logp.detach() + 0.01, advantages=adv, mask=mask,
                            num_items_in_batch=9.0, teacher_logp=teacher)


def test_coef_zero_leaves_the_loss_bitwise_and_coef_adds_trls_term_over_the_steps_tokens():
    from actors.learner.loss import LossConfig, grpo_loss

    for loss_type in ("dapo", "grpo", "bnpo"):
        logp, inputs = micro_batch(3)
        base = grpo_loss(replace(inputs, teacher_logp=None), LossConfig(loss_type=loss_type))
        (g_base,) = torch.autograd.grad(base.loss, logp)
        off = grpo_loss(inputs, LossConfig(loss_type=loss_type, distill_coef=0.0))
        (g_off,) = torch.autograd.grad(off.loss, logp)
        assert torch.equal(base.loss, off.loss) and torch.equal(g_base, g_off) and "distill/loss" not in off.metrics
        on = grpo_loss(inputs, LossConfig(loss_type=loss_type, distill_coef=0.5))
        term = trl_term(logp, inputs.teacher_logp, inputs.mask, 9.0)
        torch.testing.assert_close(on.loss, base.loss + 0.5 * term)
        assert on.metrics["distill/loss"] > 0
        torch.testing.assert_close(on.metrics["distill/reverse_kl"],
                                   reverse_kl_estimate(logp.detach(), inputs.teacher_logp, inputs.mask))


def test_a_teacher_without_values_off_the_mask_gives_finite_gradients():
    from actors.learner.loss import LossConfig, grpo_loss

    logp, inputs = micro_batch(4, teacher_nan_off_mask=True)
    out = grpo_loss(inputs, LossConfig(distill_coef=1.0))
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all() and grad[inputs.mask == 0].abs().sum() == 0
    with pytest.raises(ValueError, match="distill_coef != 0 needs teacher_logp"):
        grpo_loss(replace(inputs, teacher_logp=None), LossConfig(distill_coef=1.0))
