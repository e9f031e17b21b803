"""The micro-batch / FSDP slot plan: every row trained exactly once across the ranks, the same number of slots on every
rank, and on one rank exactly the plan the learner has always drawn."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.learner.micro_batches import Slot, plan_micro_batches

sizes = st.integers(min_value=0, max_value=200)
micro_sizes = st.integers(min_value=1, max_value=17)
worlds = st.integers(min_value=1, max_value=9)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


def plans(n: int, mbs: int, world: int, seed: int):
    """Every rank's plan, each drawn from its own generator seeded alike (as the learner ranks are)."""
    return [plan_micro_batches([(3, 4)] * n, mbs, r, world, random.Random(seed)) for r in range(world)]


@given(sizes, micro_sizes, worlds, seeds)
def test_every_row_is_in_exactly_one_real_slot_across_the_ranks(n, mbs, world, seed):
    ranks = plans(n, mbs, world, seed)
    rows = [i for p in ranks for s in p.slots if not s.padding for i in p.micro_batches[s.micro_batch]]
    assert sorted(rows) == list(range(n))
    real = [s.micro_batch for p in ranks for s in p.slots if not s.padding]
    assert real == list(range(ranks[0].grad_accum_steps))  # rank after rank, contiguous runs in order


@given(sizes, micro_sizes, worlds, seeds)
def test_every_rank_runs_the_same_number_of_slots_over_the_same_micro_batches(n, mbs, world, seed):
    ranks = plans(n, mbs, world, seed)
    m = ranks[0].grad_accum_steps
    assert all(p.micro_batches == ranks[0].micro_batches for p in ranks)  # the same shuffle on every rank
    assert {len(p.slots) for p in ranks} == {-(-m // world)}
    assert all(len(mb) <= mbs for mb in ranks[0].micro_batches) and m == -(-n // mbs)
    for p in ranks:  # a padding slot reruns a real micro-batch, after the rank's real ones
        padding = [s.padding for s in p.slots]
        assert padding == sorted(padding)
        assert all(0 <= s.micro_batch < m for s in p.slots)


@given(sizes, micro_sizes, seeds)
def test_one_rank_is_the_single_learner_plan(n, mbs, seed):
    """What Learner.train_step drew before the plan was its own function: shuffle, cut, every micro-batch in order."""
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    want = [order[i : i + mbs] for i in range(0, n, mbs)]
    plan = plan_micro_batches([(1, 1)] * n, mbs, 0, 1, random.Random(seed))
    assert plan.micro_batches == want
    assert plan.slots == [Slot(j, padding=False) for j in range(len(want))]


def test_successive_steps_draw_new_shuffles_from_the_same_generator():
    rng = random.Random(0)
    first, second = (plan_micro_batches([(2, 5)] * 16, 4, 0, 1, rng).micro_batches for _ in range(2))
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(16))


def test_a_rank_with_fewer_micro_batches_pads():
    """3 micro-batches over 2 ranks: rank 0 trains 1 and pads 1 slot, rank 1 trains 2."""
    r0, r1 = plans(12, 4, 2, 0)
    assert r0.slots == [Slot(0, padding=False), Slot(0, padding=True)]
    assert r1.slots == [Slot(1, padding=False), Slot(2, padding=False)]


def test_bad_arguments_name_the_function():
    with pytest.raises(ValueError, match="plan_micro_batches: micro_batch_size 0"):
        plan_micro_batches([(1, 1)] * 4, 0, 0, 1, random.Random(0))
    with pytest.raises(ValueError, match="rank 2 of 2"):
        plan_micro_batches([(1, 1)] * 4, 2, 2, 2, random.Random(0))
    with pytest.raises(ValueError, match="max_tokens 0"):
        plan_micro_batches([(1, 1)] * 4, 2, 0, 1, random.Random(0), max_tokens=0)


# --------------------------------------------------------------------------------------------- token budget
rows = st.lists(st.tuples(st.integers(1, 40), st.integers(0, 300)), max_size=120)  # (prompt, completion) tokens
budgets = st.integers(min_value=1, max_value=600)


def budget_plans(sizes, budget: int, padded: bool, world: int, seed: int):
    return [plan_micro_batches(sizes, 8, r, world, random.Random(seed), max_tokens=budget, padded=padded)
            for r in range(world)]


def held(sizes, rows_of_bin, padded: bool) -> int:
    """Positions a bin's forward holds: its tokens packed, rows x (longest prompt + longest completion) padded."""
    if padded:
        return len(rows_of_bin) * (max(sizes[i][0] for i in rows_of_bin) + max(sizes[i][1] for i in rows_of_bin))
    return sum(sum(sizes[i]) for i in rows_of_bin)


@given(rows, budgets, st.booleans(), worlds, seeds)
def test_budget_bins_place_every_row_once_within_the_budget_on_equal_slots(sizes, budget, padded, world, seed):
    ranks = budget_plans(sizes, budget, padded, world, seed)
    plan = ranks[0]
    assert all(p.micro_batches == plan.micro_batches and p.oversized == plan.oversized for p in ranks)
    assert sorted(i for b in plan.micro_batches for i in b) == list(range(len(sizes)))  # each row exactly once
    real = sorted(s.micro_batch for p in ranks for s in p.slots if not s.padding)
    assert real == list(range(plan.grad_accum_steps))  # each bin trained by exactly one rank
    for b in plan.micro_batches:  # within the budget, or a row longer than it on its own
        assert held(sizes, b, padded) <= budget or (len(b) == 1 and b[0] in plan.oversized)
    assert sorted(plan.oversized) == [i for i, s in enumerate(sizes) if sum(s) > budget]
    per_rank = -(-plan.grad_accum_steps // world)
    assert {len(p.slots) for p in ranks} == {per_rank}  # the same number of forwards and backwards everywhere
    counts = [sum(not s.padding for s in p.slots) for p in ranks]
    assert max(counts) - min(counts) <= 1
    for p in ranks:
        padding = [s.padding for s in p.slots]
        assert padding == sorted(padding) and all(0 <= s.micro_batch < plan.grad_accum_steps for s in p.slots)


def test_first_fit_decreasing_fills_the_gaps_and_isolates_an_oversized_row():
    """Longest first (32, 14, 10, 7, 5, 3 tokens), each into the first bin it fits: 32 > 20 alone; 14; 10 + 7 + 3;
    5 joins 14. Padded, a bin holds rows x its longest row: 10 + 7 (2 x 10), 5 + 3 (2 x 5)."""
    sizes = [(2, 8), (2, 3), (2, 30), (2, 5), (2, 1), (2, 12)]  # 10, 5, 32, 7, 3, 14 tokens
    plan = plan_micro_batches(sizes, 8, 0, 1, random.Random(0), max_tokens=20)
    assert plan.micro_batches == [[2], [5, 1], [0, 3, 4]] and plan.oversized == [2]
    padded = plan_micro_batches(sizes, 8, 0, 1, random.Random(0), max_tokens=20, padded=True)
    assert padded.micro_batches == [[2], [5], [0, 3], [1, 4]] and padded.oversized == [2]


def test_bins_go_to_the_least_loaded_rank():
    """Bins of 20, 18, 15 and 12 tokens (no two fit in 20) over 2 ranks: 20 -> rank 0, 18 -> rank 1, 15 -> rank 1
    (18 < 20), 12 -> rank 0: loads 32 and 33, where contiguous runs of the bins would give 38 and 27."""
    sizes = [(5, 10), (10, 10), (2, 10), (8, 10)]
    r0, r1 = (plan_micro_batches(sizes, 8, r, 2, random.Random(0), max_tokens=20) for r in range(2))
    load = [sum(sum(sizes[i]) for s in p.slots for i in r0.micro_batches[s.micro_batch]) for p in (r0, r1)]
    assert load == [32, 33] and len(r0.slots) == len(r1.slots) == 2


def test_one_heavy_bin_does_not_leave_its_rank_with_fewer_bins():
    """Bins of 3, 1, 1, 1, 1, 1, 1 tokens over 3 ranks (hypothesis's failing example, grown): the heavy bin's rank
    must take two light ones too. Capped at ceil(7 / 3) = 3 bins alone, the light bins filled ranks 1 and 2 and left
    rank 0 one bin and two padding slots that rerun it (counts 1, 3, 3)."""
    sizes = [(1, 2)] + [(1, 0)] * 6
    ranks = budget_plans(sizes, 1, False, 3, 0)
    counts = [sum(not s.padding for s in p.slots) for p in ranks]
    assert sorted(counts) == [2, 2, 3] and len(ranks[0].slots) == 3
    heavy = next(p for p in ranks if any(ranks[0].micro_batches[s.micro_batch] == [0] for s in p.slots))
    assert sum(not s.padding for s in heavy.slots) == 2  # the heavy bin's rank is one of the lighter-counted
