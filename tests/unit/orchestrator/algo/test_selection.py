"""Group selection: keep_all, and DAPO dynamic sampling with a real refill callable."""

from __future__ import annotations

import functools

import torch

from orchestrator.algo.selection import Selection, dynamic_sampling, groups_with_spread, keep_all
from tests.fixtures.records import completion_ids, rollouts, scores


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
    assert completion_ids(out_r) == [[0], [1], [100], [101]]
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


def test_groups_whose_payload_was_lost_are_replaced_by_new_prompts_before_selecting():
    """A generator (or its node) went after generating and before scoring: its groups' token data is gone
    (Scores.lost). Their prompts are dropped, new prompts' groups take their place, and the selector never sees
    them; a refill that loses a group too is replaced again."""
    from orchestrator.algo.selection import without_lost

    r, s = rollouts(3), scores(6)
    s.lost = [False, False, True, True, False, False]  # group 1 lost
    asked, seen = [], []

    def refill(n):
        asked.append(n)
        rr, ss = rollouts(n, start=100 * len(asked)), scores(2 * n, start=100 * len(asked))
        if len(asked) == 1:
            ss.lost = [True, True]  # the first refill's group lost as well
        return rr, ss

    def select(rr, ss, refill):
        seen.append(rr.columns["uid"])
        return keep_all(rr, ss, refill)

    out = without_lost(select)(r, s, refill)
    assert asked == [1, 1] and seen == [[0, 1, 4, 5, 200, 201]]
    assert completion_ids(out.rollouts) == [[0], [1], [4], [5], [200], [201]] and not out.scores.lost_groups(2)
    assert out.metrics["data_plane/lost_groups"] == 2
    plain = without_lost(keep_all)(rollouts(2), scores(4), refill=None)  # nothing lost: nothing refilled
    assert plain.metrics["data_plane/lost_groups"] == 0 and plain.rollouts.num_groups == 2
