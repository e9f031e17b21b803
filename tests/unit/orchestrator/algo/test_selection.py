"""Group selection: keep_all, and DAPO dynamic sampling with a real refill callable."""

from __future__ import annotations

import functools

import torch

from orchestrator.algo.selection import Selection, dynamic_sampling, groups_with_spread, keep_all
from tests.fixtures.records import rollouts, scores


def totals_from_column_a(s, group_size):
    return torch.tensor(s.scores[0])


def with_totals(r, values):
    s = scores(len(r))
    s.scores[0] = list(values)
    return s


def test_groups_with_spread_ignores_zero_std_and_nan_groups():
    t = torch.tensor([1.0, 1.0, 0.0, 1.0, float("nan"), 2.0, 3.0, 3.0 + 1e-9])
    assert groups_with_spread(t, 2) == [1]


def test_keep_all_passes_everything():
    r = rollouts(2)
    s = scores(4)
    assert keep_all(r, s, refill=None) == Selection(r, s, {})


def select(target, rounds):
    return functools.partial(dynamic_sampling, totals=totals_from_column_a, target_groups=target,
                             max_refill_rounds=rounds)


def test_dynamic_sampling_refills_until_the_batch_is_full():
    r = rollouts(2)  # group 0 has spread, group 1 does not
    s = with_totals(r, [0.0, 1.0, 5.0, 5.0])
    asked = []

    def refill(n):
        asked.append(n)
        rr = rollouts(n, start=100)
        return rr, with_totals(rr, [0.0, 2.0] * n)  # every refilled group has spread

    out = select(2, 3)(r, s, refill)
    out_r, out_s, info = out.rollouts, out.scores, out.metrics
    assert asked == [1] and out_r.num_groups == 2 and len(out_s) == 4
    assert out_r.completion_ids == [[0], [1], [100], [101]]
    assert info["dynamic_sampling/accepted_groups"] == 2 and info["dynamic_sampling/refill_rounds"] == 1
    assert info["dynamic_sampling/pass_rate"] == 2 / 3 and info["dynamic_sampling/filled"] == 1.0


def test_dynamic_sampling_gives_up_after_max_rounds_and_keeps_what_it_accepted():
    r = rollouts(2)
    s = with_totals(r, [0.0, 1.0, 5.0, 5.0])

    def refill(n):
        rr = rollouts(n, start=100)
        return rr, with_totals(rr, [7.0, 7.0] * n)  # never any spread

    out = select(2, 2)(r, s, refill)
    out_r, info = out.rollouts, out.metrics
    assert out_r.num_groups == 1 and info["dynamic_sampling/refill_rounds"] == 2
    assert info["dynamic_sampling/filled"] == 0.0


def test_dynamic_sampling_with_no_spread_at_all_trains_on_the_last_batch():
    r = rollouts(2)
    s = with_totals(r, [1.0, 1.0, 5.0, 5.0])
    out = select(2, 0)(r, s, refill=None)
    out_r, out_s, info = out.rollouts, out.scores, out.metrics
    assert out_r is r and out_s is s and info["dynamic_sampling/accepted_groups"] == 0
