"""The generator fleet resized while the run trains (`rayward scale --generators`, orchestrator/loop/fleet.py), in
the three loops on the fakes (tests/fixtures/fakes.py): a request reaches the driver through the run's control
mailbox (FakeControl, as NAME/control), is applied at a step boundary, a new engine is brought the current weights
before it samples, a retiring one leaves once every group it made is trained, and every step trains a whole batch
of prompts none of which is trained twice.

Every fake sample says which weights made it (completion_ids [v, j]): a new engine given prompts before the
weights would sample with the initial ones (v = 0), which the staleness checks below see."""

from __future__ import annotations

import pytest

from orchestrator.loop.feed import Feed
from orchestrator.loop.fleet import rescale
from orchestrator.loop.inflight import submit_batch
from orchestrator.loop.loops import LOOPS
from tests.fixtures.fakes import ByteTokenizer, FakeControl, fake_run, messages

STEPS = 10


def trained_uids(run):
    """The prompt rows trained on, step by step (each group's G samples share a prompt; the fakes' 64 rows are more
    than the run draws, so a row trained twice is a draw trained twice)."""
    g = run.cfg.generation.num_generations
    return [[ByteTokenizer.uid_of(p) for p in t.batch.prompt_ids][::g] for t in run.learner.trained]


def scaled_run(tmp_path, loop, requests, generators=1):
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", f"grpo.max_steps={STEPS}",
                                    f"cluster.num_generators={generators}"],
                   generators=generators, control=FakeControl(requests))
    return run, LOOPS[loop](run)


@pytest.mark.parametrize("loop", ["sync", "pipelined", "async"])
def test_scaling_one_to_two_to_one_mid_run_trains_whole_batches_and_no_draw_twice(tmp_path, loop):
    run, history = scaled_run(tmp_path, loop, {2: 2, 5: 1})
    steps = [h for h in history if "reward" in h]
    assert [h["step"] for h in steps] == list(range(1, STEPS + 1))
    per_step = run.prompts_per_step
    served = trained_uids(run)
    assert [len(s) for s in served] == [per_step] * STEPS  # every step a whole batch
    flat = [u for s in served for u in s]
    assert len(set(flat)) == len(flat)  # no prompt draw trained twice
    # the new engine sampled, with the learner's weights: none of its samples is older than max_staleness allows
    new = run.generators.dropped
    assert len(new) == 1 and new[0].seeds, "the engine that joined was never given a prompt"
    for t in run.learner.trained:
        assert t.step_before - min(c[0] for c in t.batch.completion_ids) <= run.cfg.loop.max_staleness
    if loop == "async":
        assert all(h["async/dropped_stale"] == 0 for h in steps)
    # the metric, the driver's lines, the answer to the client
    counts = [h["generators/count"] for h in steps]
    assert counts[:2] == [1, 1] and 2 in counts and counts[-1] == 1 and steps[-1]["generators/retiring"] == 0
    said = messages(run)
    assert any("generators: 1 -> 2" in m for m in said) and any("generators: 2 -> 1" in m for m in said)
    assert any("generator-1 left" in m for m in said)
    assert len(run.generators.engines) == 1 and run.control.reports[-1] == (1, 0)


@pytest.mark.parametrize("loop", ["pipelined", "async"])
def test_a_cluster_without_room_says_so_and_the_run_goes_on(tmp_path, loop):
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", f"grpo.max_steps={STEPS}"], control=FakeControl({2: 3}))
    run.generators.no_room = "no room for 2 more generator(s)"
    history = LOOPS[loop](run)
    steps = [h for h in history if "reward" in h]
    assert len(steps) == STEPS and all(h["generators/count"] == 1 for h in steps)
    assert sum("generators: stays at 1: no room" in m for m in messages(run)) == 1
    assert len(run.generators.engines) == 1


def test_a_retiring_generator_leaves_only_once_nothing_of_it_is_in_flight_or_untrained(tmp_path):
    run = fake_run(tmp_path / "r", ["cluster.num_generators=2"], generators=2, control=FakeControl({1: 1}))
    pushes = len(run.weights.pushes)
    rescale(run, busy={1})  # the request taken: generator-1 takes no new work, but its groups are not trained
    assert run.generators.active == 1 and run.generators.retiring() == [1] and len(run.generators.engines) == 2
    assert run.generators.shards(8) == [(0, slice(0, 8))]  # new work only on generator-0
    rescale(run, busy={0})
    assert len(run.generators.engines) == 1  # nothing of generator-1 left: it goes
    assert len(run.weights.pushes) == pushes + 1  # the weight group re-formed without it, the weights pushed
    assert run.control.reports == [(1, 1), (1, 0)]


def test_growing_back_first_reuses_a_retiring_generator(tmp_path):
    run = fake_run(tmp_path / "r", ["cluster.num_generators=2"], generators=2, control=FakeControl({1: 1, 2: 2}))
    rescale(run, busy={1})
    retiring = run.generators.engines[1]
    rescale(run, busy={1})
    assert run.generators.active == 2 and run.generators.engines[1] is retiring  # no engine started or lost
    assert run.generators.retiring() == []


def test_new_work_goes_only_to_the_generators_that_take_it(tmp_path):
    """After a shrink is taken, the async feed's calls and the pipelined loop's batch shares all go to the
    generators that stay (the fake raises on a call to a retiring one)."""
    run = fake_run(tmp_path / "r", ["loop.mode=async", "cluster.num_generators=2"], generators=2)
    run.generators.retire(1)
    feed = Feed(run, capacity=8, call_prompts=2)
    feed.top_up()
    # the call size stays: calls that end with a step's batch (tests/integration/runs/test_fleet.py: calls resized to
    # the fleet left half a call behind every other step, dropped as too stale)
    assert [c.member for c in feed.calls] == [0] * 4 and [len(c.prompts) for c in feed.calls] == [2] * 4
    batch = submit_batch(run)
    assert {p.stream.member for p in batch.parts} == {0}
