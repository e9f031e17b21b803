"""Cross-check actors/learner/loss.py (the GRPO loss and its gradient over the full grid of options, the vLLM
importance weights) against TRL 1.16's OWN GRPOTrainer code (not a copy of its formulas):
``GRPOTrainer._compute_loss(self, model, inputs)`` on a bare trainer whose ``_get_per_token_logps_and_entropies``
returns a leaf tensor, so loss AND d loss / d logp are compared; the IS ratio from
``_generate_and_score_completions`` on stubs (tests/fixtures/trl_grpo.py).
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from actors.learner.loss import ImportanceSampling, LossConfig, LossInputs, grpo_loss, vllm_importance_weights
from orchestrator.algo.grpo import compute_advantages
from tests.fixtures.trl_grpo import EOS, PAD, bare_trainer, cpu_accelerator, trl_score

# Ours and TRL's run the same elementwise formulas on the same [B, T] tensors and sum the same rows in the same order
# (tensors this small are never split over threads); only the normalisers' last divisions may round differently
# (TRL's mean over B, then / GA, against a sum / (B x GA)): a few roundings of the result, which RTOL (many
# float32 eps) covers on any machine. ATOL: for values that are 0 in both.
RTOL, ATOL = 1e-5, 1e-6
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"]
IS_MODES = [None, "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
METRIC_NAMES = [
    "kl",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "cispo_clip_ratio",
]


@pytest.fixture(scope="module")
def accel():
    return cpu_accelerator()


# --------------------------------------------------------------------------------------------- vLLM IS ratio
def _rollout(gen, n, t_max, vocab=20):
    """Completion id lists of random length (some truncated: last token not EOS) and padded [n, T] tensors."""
    lens = torch.randint(1, t_max + 1, (n,), generator=gen).tolist()
    lens[0] = t_max
    ids = []
    for i, ln in enumerate(lens):
        row = torch.randint(2, vocab, (ln,), generator=gen).tolist()
        if i % 3 != 2:  # every third completion is truncated
            row[-1] = EOS
        ids.append(row)
    mask = torch.zeros(n, t_max, dtype=torch.long)
    for i, ln in enumerate(lens):
        mask[i, :ln] = 1
    old = -torch.rand(n, t_max, generator=gen) * 3
    sampling = old + 0.3 * torch.randn(n, t_max, generator=gen)
    sampling[1, 0] = math.nan  # a token vLLM could not score -> ratio 1 for that token
    return ids, mask, old, sampling


@pytest.mark.parametrize("mode", IS_MODES[1:])
@pytest.mark.parametrize("clip", [(3.0, None), (1.5, 0.5), (None, 0.8)])
def test_vllm_importance_weights_match_trl(accel, mode, clip):
    gen = torch.Generator().manual_seed(2)
    n, g = 8, 4
    ids, mask, old, sampling = _rollout(gen, n, 6)
    rewards = torch.randn(n, 1, generator=gen)
    _, out = trl_score(
        accel,
        rewards,
        torch.ones(1),
        g,
        completion_ids=ids,
        old_logp=old,
        sampling_logp=sampling,
        is_mode=mode,
        clip_max=clip[0],
        clip_min=clip[1],
    )
    ours = vllm_importance_weights(old, out["sampling_per_token_logps"], mask,
                                   ImportanceSampling(mode, clip[0], clip[1]))
    assert ours.shape == out["importance_sampling_ratio"].shape
    torch.testing.assert_close(ours, out["importance_sampling_ratio"], rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------------------- loss + gradient
def _trl_loss(
    accel,
    logp,
    inputs,
    *,
    loss_type,
    epsilon,
    epsilon_high,
    delta,
    level,
    beta,
    use_vllm,
    ga,
    spg,
    max_len,
    bias_kl=True,
):
    t = bare_trainer(accel)
    t.args = SimpleNamespace(
        use_bias_correction_kl=bias_kl,
        delta=delta,
        steps_per_generation=spg,
        sapo_temperature_pos=1.0,
        sapo_temperature_neg=1.05,
    )
    t.aux_loss_enabled, t.top_entropy_quantile, t.off_policy_mask_threshold = False, 1.0, None
    t._entropy_bonus_enabled = False
    t.importance_sampling_level, t.beta, t.loss_type = level, beta, loss_type
    t.epsilon_low = epsilon
    t.epsilon_high = epsilon_high if epsilon_high is not None else epsilon  # as GRPOTrainer.__init__ (T:946)
    t.use_vllm = t.vllm_importance_sampling_correction = use_vllm
    t.current_gradient_accumulation_steps, t.max_completion_length = ga, max_len
    t._get_per_token_logps_and_entropies = lambda *a, **kw: (logp, torch.zeros_like(logp), None)
    loss = t._compute_loss(t.model, inputs)
    return loss, {k: v[-1] for k, v in t._metrics["train"].items()}


def _micro_batch(gen, b=6, t_max=7):
    """Random micro-batch: ragged lengths, a tool-mask hole, and a fully-masked (truncated-like) row."""
    lengths = torch.randint(1, t_max + 1, (b,), generator=gen)
    completion_mask = (torch.arange(t_max)[None] < lengths[:, None]).long()
    completion_mask[2] = 0  # mask_truncated_completions: the whole row is dropped from the loss
    tool_mask = torch.ones_like(completion_mask)
    tool_mask[0, 1:3] = 0  # tool-result tokens
    logp = -torch.rand(b, t_max, generator=gen) * 3
    old = logp + 0.25 * torch.randn(b, t_max, generator=gen)
    return {
        "prompt_ids": torch.full((b, 2), 7),
        "prompt_mask": torch.ones(b, 2, dtype=torch.long),
        "completion_ids": torch.randint(2, 20, (b, t_max), generator=gen),
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.randn(b, generator=gen),
        "num_items_in_batch": (completion_mask * tool_mask).sum() * 3
        + 5,  # whole generation batch > this one
        "old_per_token_logps": old,
        "ref_per_token_logps": logp + 0.2 * torch.randn(b, t_max, generator=gen),
        "sampling_per_token_logps": old + 0.2 * torch.randn(b, t_max, generator=gen),
        "_logp": logp,
    }


def _compare(
    accel,
    batch,
    *,
    loss_type,
    epsilon=0.2,
    epsilon_high=None,
    delta=None,
    level="token",
    beta=0.0,
    is_mode=None,
    ga=1,
    spg=1,
    off_policy=True,
    bias_kl=True,
    max_len=9,
):
    mask = batch["completion_mask"] * batch["tool_mask"]
    inputs = {k: v for k, v in batch.items() if not k.startswith("_") and k != "sampling_per_token_logps"}
    if not off_policy:
        del inputs["old_per_token_logps"]
    is_w = None
    if is_mode is not None:
        is_w = vllm_importance_weights(
            batch["old_per_token_logps"], batch["sampling_per_token_logps"], mask, ImportanceSampling(is_mode)
        )
        inputs["importance_sampling_ratio"] = is_w
    kw = dict(loss_type=loss_type, epsilon=epsilon, epsilon_high=epsilon_high, delta=delta)
    lp_trl = batch["_logp"].clone().requires_grad_()
    loss_trl, m_trl = _trl_loss(
        accel,
        lp_trl,
        inputs,
        **kw,
        level=level,
        beta=beta,
        use_vllm=is_mode is not None,
        ga=ga,
        spg=spg,
        max_len=max_len,
        bias_kl=bias_kl,
    )
    loss_trl.backward()
    lp = batch["_logp"].clone().requires_grad_()
    cfg = LossConfig(
        **kw,
        importance_sampling_level=level,
        beta=beta,
        use_bias_correction_kl=bias_kl,
        max_completion_length=max_len,
        steps_per_generation=spg,
    )
    out = grpo_loss(
        LossInputs(
            lp,
            inputs.get("old_per_token_logps"),
            batch["advantages"],
            mask,
            ref_logp=batch["ref_per_token_logps"],
            is_weights=is_w,
            num_items_in_batch=batch["num_items_in_batch"],
            grad_accum_steps=ga,
        ),
        cfg,
    )
    loss, m = out.loss, out.metrics
    loss.backward()
    torch.testing.assert_close(loss, loss_trl, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(lp.grad, lp_trl.grad, rtol=RTOL, atol=ATOL)
    for name in METRIC_NAMES:
        assert (name in m) == (name in m_trl), name
        if name in m:
            assert m[name].item() == pytest.approx(m_trl[name], rel=RTOL, abs=ATOL, nan_ok=True), name


@pytest.mark.parametrize("is_mode", IS_MODES)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_and_grad_match_trl_grid(accel, loss_type, is_mode):
    gen = torch.Generator().manual_seed(LOSS_TYPES.index(loss_type) * 10 + IS_MODES.index(is_mode))
    batch = _micro_batch(gen)
    for eps_high, delta, beta, level, (ga, spg), off_policy in itertools.product(
        [None, 0.28], [None, 1.5], [0.0, 0.04], ["token", "sequence"], [(1, 1), (2, 2), (2, 4)], [False, True]
    ):
        if is_mode is not None and not off_policy:
            continue  # with vLLM IS TRL always has old logps
        _compare(
            accel,
            batch,
            loss_type=loss_type,
            epsilon_high=eps_high,
            delta=delta,
            beta=beta,
            level=level,
            is_mode=is_mode,
            ga=ga,
            spg=spg,
            off_policy=off_policy,
        )


def test_loss_misc_options_match_trl(accel):
    gen = torch.Generator().manual_seed(3)
    batch = _micro_batch(gen)
    for loss_type in LOSS_TYPES:
        _compare(accel, batch, loss_type=loss_type, beta=0.04, bias_kl=False)  # KL without the ratio factor
        _compare(accel, batch, loss_type=loss_type, epsilon_high=5.0, delta=1.1)  # cispo's intended cap
        per_token_adv = dict(batch, advantages=torch.randn(6, 7, generator=gen))  # (B, T) advantages
        _compare(accel, per_token_adv, loss_type=loss_type, level="sequence", beta=0.04, is_mode="token_mask")


# --------------------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("is_mode", IS_MODES[1:])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "cispo"])
def test_off_policy_vllm_end_to_end_matches_trl(accel, loss_type, is_mode):
    """num_iterations=2-style step: TRL scores a rollout (advantages, vLLM IS ratio, truncated rows masked), the
    policy has drifted since (logp != old_logp), and the batch is split into spg=GA=2 micro-batches."""
    gen = torch.Generator().manual_seed(4)
    n, g, t_max = 8, 4, 6
    ids, mask, old, sampling = _rollout(gen, n, t_max)
    rewards = torch.randint(0, 2, (n, 2), generator=gen).float()
    rewards[3] = math.nan
    weights = torch.tensor([1.0, 0.3])
    _, out = trl_score(
        accel,
        rewards,
        weights,
        g,
        "group",
        "sum_then_normalize",
        completion_ids=ids,
        old_logp=old,
        sampling_logp=sampling,
        is_mode=is_mode,
        mask_truncated=True,
    )
    # rayward side: the driver masks truncated completions itself (last token not EOS/pad -> whole row 0)
    truncated = torch.tensor([row[-1] not in (EOS, PAD) for row in ids])
    our_mask = mask * (~truncated).long().unsqueeze(1)
    torch.testing.assert_close(out["completion_mask"], our_mask)
    adv = compute_advantages(rewards, weights, g).advantages
    is_w = vllm_importance_weights(old, out["sampling_per_token_logps"], our_mask, ImportanceSampling(is_mode))
    logp_now = old + 0.3 * torch.randn(n, t_max, generator=gen)
    for rows in (slice(0, 4), slice(4, 8)):
        inputs = {k: (v[rows] if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in out.items()}
        lp_trl = logp_now[rows].clone().requires_grad_()
        loss_trl, _ = _trl_loss(
            accel,
            lp_trl,
            inputs,
            loss_type=loss_type,
            epsilon=0.2,
            epsilon_high=0.28,
            delta=None,
            level="token",
            beta=0.0,
            use_vllm=True,
            ga=2,
            spg=2,
            max_len=t_max,
        )
        loss_trl.backward()
        lp = logp_now[rows].clone().requires_grad_()
        loss = grpo_loss(
            LossInputs(
                lp,
                old[rows],
                adv[rows],
                our_mask[rows],
                is_weights=is_w[rows],
                num_items_in_batch=our_mask.sum(),
                grad_accum_steps=2,
            ),
            LossConfig(loss_type=loss_type, epsilon_high=0.28, steps_per_generation=2),
        ).loss
        loss.backward()
        torch.testing.assert_close(loss, loss_trl, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(lp.grad, lp_trl.grad, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------------------- the dispatcher
def test_every_loss_type_has_one_surrogate_and_one_normaliser():
    from typing import get_args

    from actors.learner.loss import LOG_WEIGHTS, NORMALISERS, SURROGATES, ISLevel, LossType

    assert set(SURROGATES) == set(NORMALISERS) == set(get_args(LossType)) == set(LOSS_TYPES)
    assert set(LOG_WEIGHTS) == set(get_args(ISLevel))


@pytest.mark.parametrize(
    ("cfg", "names"),
    [
        (LossConfig(loss_type="dr_grpo"), "max_completion_length"),
        (LossConfig(loss_type="ppo"), "'ppo'"),  # type: ignore[arg-type]
        (LossConfig(importance_sampling_level="group"), "'group'"),  # type: ignore[arg-type]
    ],
)
def test_loss_fn_refuses_a_bad_config_when_built(cfg, names):
    from actors.learner.loss import loss_fn

    with pytest.raises(ValueError, match=names):
        loss_fn(cfg)

