"""The distillation term against TRL 1.16's own server-distillation functions (`_add_tail_bucket`,
`_jsd_divergence` with beta 1 on a top-1 support, reduced as `_reduce_divergence_loss` with num_items_in_batch),
values and gradients; and what it must be: 0 where the models agree, positive where they do not, its gradient
moving the student towards the teacher."""

from __future__ import annotations

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
