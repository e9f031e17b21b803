"""On-policy distillation's two forms. "loss": the term against TRL 1.16's own server-distillation functions
(`_add_tail_bucket`, `_jsd_divergence` with beta 1 on a top-1 support, reduced as `_reduce_divergence_loss` with
num_items_in_batch), values and gradients; and what it must be: 0 where the models agree, positive where they do
not, its gradient moving the student towards the teacher. "advantage" (slime's OPD): the surrogate trained on the
per-token advantages A - coef (log p_student - log p_teacher), exactly. Both: tokens the teacher has no log-prob for
(off the mask: padding, tool results; a sample it failed on) are out of the term, with finite gradients."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from trl.experimental.server_distillation.server_distillation_trainer import _add_tail_bucket, _jsd_divergence

from actors.learner.distill import (
    distill_loss,
    reverse_kl_estimate,
    sampled_token_reverse_kl,
    token_advantages,
)


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


@pytest.mark.parametrize("mode", ["loss", "advantage"])
def test_coef_zero_leaves_the_loss_bitwise(mode):
    from actors.learner.loss import LossConfig, grpo_loss

    for loss_type in ("dapo", "grpo", "bnpo"):
        logp, inputs = micro_batch(3)
        base = grpo_loss(replace(inputs, teacher_logp=None), LossConfig(loss_type=loss_type))
        (g_base,) = torch.autograd.grad(base.loss, logp)
        off = grpo_loss(inputs, LossConfig(loss_type=loss_type, distill_coef=0.0, distill_mode=mode))
        (g_off,) = torch.autograd.grad(off.loss, logp)
        assert torch.equal(base.loss, off.loss) and torch.equal(g_base, g_off)
        assert not any(k.startswith("distill/") for k in off.metrics)


def test_the_loss_form_adds_trls_term_over_the_steps_tokens():
    from actors.learner.loss import LossConfig, grpo_loss

    for loss_type in ("dapo", "grpo", "bnpo"):
        logp, inputs = micro_batch(3)
        base = grpo_loss(replace(inputs, teacher_logp=None), LossConfig(loss_type=loss_type))
        on = grpo_loss(inputs, LossConfig(loss_type=loss_type, distill_coef=0.5, distill_mode="loss"))
        term = trl_term(logp, inputs.teacher_logp, inputs.mask, 9.0)
        torch.testing.assert_close(on.loss, base.loss + 0.5 * term)
        assert on.metrics["distill/loss"] > 0
        # the estimate at the step's first-pass policy (old_logp), on the loss tokens
        torch.testing.assert_close(on.metrics["distill/reverse_kl"],
                                   reverse_kl_estimate(inputs.old_logp, inputs.teacher_logp, inputs.mask))


def test_the_advantage_form_is_the_surrogate_on_per_token_advantages():
    from actors.learner.loss import LossConfig, grpo_loss

    for loss_type in ("dapo", "grpo", "cispo"):
        logp, inputs = micro_batch(5)
        on = grpo_loss(inputs, LossConfig(loss_type=loss_type, distill_coef=0.7))
        (g_on,) = torch.autograd.grad(on.loss, logp)
        # A - 0.7 (old - teacher) on the loss tokens, A elsewhere; then no teacher at all
        per_token = inputs.advantages[:, None] - 0.7 * (inputs.old_logp - inputs.teacher_logp) * inputs.mask
        by_hand = grpo_loss(replace(inputs, advantages=per_token, teacher_logp=None), LossConfig(loss_type=loss_type))
        (g_hand,) = torch.autograd.grad(by_hand.loss, logp)
        torch.testing.assert_close(on.loss, by_hand.loss, rtol=0, atol=0)
        torch.testing.assert_close(g_on, g_hand, rtol=0, atol=0)
        assert "distill/loss" not in on.metrics
        torch.testing.assert_close(on.metrics["distill/reverse_kl"],
                                   reverse_kl_estimate(inputs.old_logp, inputs.teacher_logp, inputs.mask))
    # a teacher that agrees with the sampling policy changes nothing
    logp, inputs = micro_batch(6)
    same = grpo_loss(replace(inputs, teacher_logp=inputs.old_logp), LossConfig(distill_coef=1.0))
    base = grpo_loss(replace(inputs, teacher_logp=None), LossConfig())
    torch.testing.assert_close(same.loss, base.loss, rtol=0, atol=0)


def test_token_advantages_raise_what_the_teacher_prefers_and_carry_no_gradient():
    adv = torch.tensor([1.0, -1.0])
    old = torch.log(torch.tensor([[0.5, 0.5], [0.1, 0.9]])).requires_grad_()
    teacher = torch.log(torch.tensor([[0.9, 0.1], [0.1, 0.9]]))
    scored = torch.tensor([[True, True], [True, False]])
    out = token_advantages(adv, old, teacher, scored, coef=2.0)
    assert out[0, 0] > 1.0 > out[0, 1]  # the teacher prefers the first token, not the second
    assert out[1, 0] == -1.0 and out[1, 1] == -1.0  # agreement, and an unscored token: the advantage alone
    assert not out.requires_grad


@pytest.mark.parametrize("mode", ["loss", "advantage"])
def test_tokens_without_a_teacher_log_prob_are_out_of_the_term_with_finite_gradients(mode):
    """NaN off the mask (padding, tool results) and on a whole row (the teacher timed out on that sample): the
    term is the one of the remaining tokens, and those rows train on their GRPO advantage alone."""
    from actors.learner.loss import LossConfig, grpo_loss

    logp, inputs = micro_batch(4, teacher_nan_off_mask=True)
    failed = inputs.teacher_logp.clone()
    failed[1] = float("nan")  # no answer for sample 1
    out = grpo_loss(replace(inputs, teacher_logp=failed), LossConfig(distill_coef=1.0, distill_mode=mode))
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all() and grad[inputs.mask == 0].abs().sum() == 0
    scored = inputs.mask.clone()
    scored[1] = 0
    torch.testing.assert_close(out.metrics["distill/reverse_kl"],
                               reverse_kl_estimate(inputs.old_logp, inputs.teacher_logp, scored))
    if mode == "advantage":  # row 1 as if there were no teacher
        alone = grpo_loss(replace(inputs, teacher_logp=None), LossConfig())
        (g_alone,) = torch.autograd.grad(alone.loss, logp)
        torch.testing.assert_close(grad[1], g_alone[1], rtol=0, atol=0)
    with pytest.raises(ValueError, match="distill_coef != 0 needs teacher_logp"):
        grpo_loss(replace(inputs, teacher_logp=None), LossConfig(distill_coef=1.0, distill_mode=mode))


# --- the teacher's log-probs in the learner's layouts ----------------------------------------------------------


@pytest.mark.parametrize("padding_free", [True, False])
def test_the_learner_lines_the_teachers_log_probs_up_with_its_own(tiny_model_path, padding_free):
    """A teacher that is the policy (its log-probs of each completion token, from the learner's own forward of the
    whole sequence) is zero reverse KL, packed or padded, over ragged rows and tool tokens; shifted by 0.5 it is
    0.5; a sample the teacher missed ([]) is left out. An off-by-one or a row mix-up shows at once."""
    from actors.learner.learner import Learner
    from tests.fixtures.learner import spec
    from tests.gpu.smoke import ragged_batch

    lr = Learner(spec(tiny_model_path, optim="sgd", learning_rate=0.0, max_grad_norm=None, micro_batch_size=3,
                      padding_free=padding_free, distill_coef=1.0, max_completion_length=8))
    b = ragged_batch()
    own = [lr.sequence_logprobs(p + c)[len(p) - 1:] for p, c in zip(b.prompt_ids, b.completion_ids, strict=True)]
    same = lr.train_step(replace(b, teacher_logprobs=own)).metrics
    assert abs(same["distill/reverse_kl"]) < 1e-5, same["distill/reverse_kl"]
    shifted = [[x - 0.5 for x in row] for row in own]
    shifted[2] = []
    moved = lr.train_step(replace(b, teacher_logprobs=shifted)).metrics
    assert abs(moved["distill/reverse_kl"] - 0.5) < 1e-5, moved["distill/reverse_kl"]
