"""Held-out eval, the pure part: pass@k against exact enumeration, the schedule, the metrics, the best value."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

from orchestrator.config import parse_config
from orchestrator.eval.metrics import Best, EvalSchedule, eval_metrics, pass_at_k

NAN = math.nan


def enumerated_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """pass@k by definition: of all k-subsets of n samples (the first c of which pass), the fraction that hold
    at least one pass."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_is_the_exact_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(enumerated_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_special_cases_and_large_n():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the pass rate
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 0, 4) == 0.0  # k = n: any pass
    # n = 200, where C(200, 100) ~ 9e58: the product form matches the exact binomials.
    exact = 1 - Fraction(math.comb(190, 100), math.comb(200, 100))
    assert pass_at_k(200, 10, 100) == pytest.approx(float(exact), rel=1e-12)
    for bad in ((4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)):
        with pytest.raises(ValueError, match="pass@k"):
            pass_at_k(*bad)


def test_schedule_every_n_steps_and_the_last_step():
    s = EvalSchedule(every_n_steps=10, at_start=True, max_steps=25)
    assert [t for t in range(1, 26) if s.due(t)] == [10, 20, 25]
    assert [t for t in range(1, 26) if EvalSchedule(None, False, 25).due(t)] == [25]


def test_eval_metrics_on_two_prompts():
    # 2 prompts x 3 completions, rewards a (weight 1) and b; totals given (the caller aggregates).
    raw = torch.tensor([[1.0, 0.0], [0.0, NAN], [1.0, 1.0], [0.0, 0.0], [0.5, NAN], [NAN, NAN]])
    total = torch.tensor([1.0, 0.0, 2.0, 0.0, 0.5, NAN])
    m = eval_metrics(["a", "b"], raw, total, [4, 2, 6, 1, 1, 1], [False, False, True, False, False, False],
                     group_size=3, pass_threshold=1.0)
    assert m["eval/reward"] == pytest.approx(3.5 / 5)  # the unscorable completion is left out
    assert m["eval/rewards/a/mean"] == pytest.approx(2.5 / 5) and m["eval/rewards/b/mean"] == pytest.approx(1 / 3)
    # prompt 0: 2 of 3 pass, prompt 1: none (NaN never passes)
    assert m["eval/pass@1"] == pytest.approx((2 / 3 + 0) / 2)
    assert m["eval/pass@3"] == pytest.approx((1 + 0) / 2)
    assert m["eval/mean_length"] == pytest.approx(15 / 6) and m["eval/clipped_ratio"] == pytest.approx(1 / 6)
    assert m["eval/prompts"] == 2
    with pytest.raises(ValueError, match="groups of 4"):
        eval_metrics(["a", "b"], raw, total, [1] * 6, [False] * 6, group_size=4, pass_threshold=1.0)


def test_eval_metrics_k1_has_pass_at_1_only():
    m = eval_metrics(["a"], torch.tensor([[1.0], [0.0]]), torch.tensor([1.0, 0.0]), [1, 1], [False, False], 1, 0.5)
    assert m["eval/pass@1"] == 0.5 and not any(k.startswith("eval/pass@") and k != "eval/pass@1" for k in m)


@pytest.mark.parametrize(("k", "own_rewards"), [(1, False), (4, False), (4, True)])
def test_the_config_names_exactly_the_metrics_eval_produces(k, own_rewards):
    """grpo.save_best is checked against EvalConfig.metric_names: they must be what eval_metrics returns."""
    rewards = [{"name": "letter", "function": "letter_fraction"}, {"name": "short", "function": "brevity"}]
    block = {"data": {"path": "toy"}, "num_generations": k, **({"rewards": rewards[1:]} if own_rewards else {})}
    cfg = parse_config({"rewards": rewards, "eval": block})
    names = [r.name for r in (cfg.eval.rewards or cfg.rewards)]
    n = 2 * k
    m = eval_metrics(names, torch.zeros(n, len(names)), torch.zeros(n), [1] * n, [False] * n, k, 1.0)
    produced = cfg.eval.metric_names([r.name for r in cfg.rewards])
    assert set(produced) <= set(m)
    assert set(m) - set(produced) == {"eval/reward_std", "eval/clipped_ratio", "eval/prompts"}  # not to optimise


def test_best_value_so_far():
    b = Best("eval/reward", "max")
    assert not b.improves(NAN) and not b.improves(None)
    assert b.improves(0.1)
    b.value = 0.1
    assert b.improves(0.2) and not b.improves(0.1) and not b.improves(0.05)
    low = Best("eval/mean_length", "min", value=10.0)
    assert low.improves(9.0) and not low.improves(11.0)
