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
