"""Cross-check orchestrator.algo.grpo (advantages, nanstd) against TRL 1.16's OWN GRPOTrainer code (not a copy of its
formulas): ``GRPOTrainer._generate_and_score_completions`` on stubs (tests/fixtures/trl_grpo.py). The loss and the
vLLM importance weights are the learner's: tests/unit/actors/learner/test_loss.py.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from orchestrator.algo.grpo import compute_advantages, nanstd
from tests.fixtures.trl_grpo import cpu_accelerator, trl_score

trl_utils = pytest.importorskip("trl.trainer.utils")

# Ours and TRL's compute the same group means, standard deviations and weighted sums of at most a few dozen rewards
# (tensors this small are never split over threads): a few float32 roundings of each result, which RTOL (many float32
# eps) covers on any machine. ATOL: for advantages that are 0 in both (zero-std groups, unscorable rows).
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def accel():
    return cpu_accelerator()


def _random_rewards(gen: torch.Generator, n: int, k: int) -> torch.Tensor:
    kind = torch.randint(0, 3, (1,), generator=gen).item()
    if kind == 0:  # continuous
        r = torch.randn(n, k, generator=gen)
    elif kind == 1:  # binary: many zero-std groups
        r = torch.randint(0, 2, (n, k), generator=gen).float()
    else:  # few levels, scaled
        r = torch.randint(-2, 3, (n, k), generator=gen).float() * 0.5
    r[torch.rand(n, k, generator=gen) < 0.25] = math.nan  # None from a reward function
    r[torch.rand(n, generator=gen) < 0.15] = math.nan  # unscorable rows (every function None)
    return r


def _check_advantages(accel, rewards, weights, g, scale, agg):
    t, out = trl_score(accel, rewards, weights, g, scale, agg)
    res = compute_advantages(rewards, weights, g, scale, agg)
    torch.testing.assert_close(res.advantages, out["advantages"], rtol=RTOL, atol=ATOL)
    m = t._metrics["train"]
    assert res.zero_std.float().mean().item() == pytest.approx(m["frac_reward_zero_std"][0], rel=RTOL)
    assert torch.nanmean(res.total).item() == pytest.approx(m["reward"][0], rel=RTOL, abs=ATOL, nan_ok=True)
    assert nanstd(res.total).item() == pytest.approx(m["reward_std"][0], rel=RTOL, abs=ATOL, nan_ok=True)
    return res


def test_advantages_match_trl_random(accel):
    gen = torch.Generator().manual_seed(0)
    for case in range(40):
        g = [2, 4, 8][case % 3]
        k = 1 + case % 3
        n = g * (1 + case % 4)
        rewards = _random_rewards(gen, n, k)
        weights = torch.rand(k, generator=gen) * 2 - 0.5
        for scale, agg in itertools.product(
            ["group", "batch", "none"], ["sum_then_normalize", "normalize_then_sum"]
        ):
            _check_advantages(accel, rewards, weights, g, scale, agg)


def test_advantages_edge_cases(accel):
    w = torch.tensor([1.0, 0.5])
    for scale, agg in itertools.product(
        ["group", "batch", "none"], ["sum_then_normalize", "normalize_then_sum"]
    ):
        # identical rewards within every group -> 0 advantage, zero std (sum path: group std; GDPO: batch of zeros)
        r = torch.tensor([[1.0, 2.0]] * 4 + [[0.0, -1.0]] * 4)
        res = _check_advantages(accel, r, w, 4, scale, agg)
        assert torch.all(res.advantages == 0)
        # all-NaN rows: advantage 0, total NaN; a group with 1 scorable row gets 0 too (NaN std or own mean)
        r = torch.tensor(
            [
                [1.0, 0.0],
                [math.nan, math.nan],
                [0.0, 1.0],
                [math.nan, 2.0],
                [math.nan, math.nan],
                [math.nan, math.nan],
                [3.0, math.nan],
                [math.nan, math.nan],
            ]
        )
        res = _check_advantages(accel, r, w, 4, scale, agg)
        unscorable = torch.isnan(r).all(1)
        assert torch.all(res.advantages[unscorable] == 0) and torch.all(torch.isnan(res.total[unscorable]))
        # G = 1 (TRL allows it in eval): every advantage is 0
        r = torch.tensor([[1.0, 2.0], [3.0, math.nan], [0.5, 0.0]])
        res = _check_advantages(accel, r, w, 1, scale, agg)
        assert torch.all(res.advantages == 0)


def test_nanstd_matches_trl():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 5, generator=gen)
    x[torch.rand(3, 4, 5, generator=gen) < 0.4] = math.nan
    x[0, 0] = math.nan
    x[1, 1, 1:] = math.nan
    for dim, keepdim in itertools.product([None, 0, 1, -1, (0, 2)], [False, True]):
        if dim is None and keepdim:
            continue
        torch.testing.assert_close(
            nanstd(x, dim=dim, keepdim=keepdim), trl_utils.nanstd(x, dim=dim, keepdim=keepdim), equal_nan=True
        )
