"""The generator fleet resized while the run trains (`rayward scale --generators`, orchestrator/loop/fleet.py), in
the three loops on the fakes (tests/fixtures/fakes.py): a request reaches the driver through the run's control
mailbox (FakeControl, as NAME/control), is applied at a step boundary, a new engine is brought the current weights
before it samples, a retiring one leaves once every group it made is trained, and every step trains a whole batch
of prompts none of which is trained twice.

Every fake sample says which weights made it (completion_ids [v, j]): a new engine given prompts before the
weights would sample with the initial ones (v = 0), which the staleness checks below see."""

from __future__ import annotations

import json

import pytest

from orchestrator.config.cluster import GeneratorAutoscaleConfig
from orchestrator.loop.feed import Feed
from orchestrator.loop.fleet import FleetAutoscaler, FleetLoad, rescale
from orchestrator.loop.inflight import submit_batch
from orchestrator.loop.loops import LOOPS
from tests.fixtures.fakes import ByteTokenizer, FakeControl, fake_run, messages, rows

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
    assert sum("generators: stays at 1 for now: no room" in m for m in messages(run)) == 1
    assert len(run.generators.engines) == 1 and len(run.generators.pending()) == 2  # still waiting for room


def test_an_engine_that_waits_for_room_joins_once_there_is_some_and_the_run_trains_meanwhile(tmp_path):
    """As on a cluster whose Ray autoscaler adds a node for the waiting engine: the run goes on at its size, the
    engine joins (synced first) at the step boundary after it is up, and a shrink meanwhile cancels it."""
    run = fake_run(tmp_path / "r", ["loop.mode=pipelined", "grpo.max_steps=12"], control=FakeControl({2: 2}),
                   prompt_rows=rows(200))
    run.generators.no_room = "no room for 1 more generator(s)"
    run.learner.hook = lambda step: setattr(run.generators, "no_room", None) if step == 6 else None  # a node came
    history = [h for h in LOOPS["pipelined"](run) if "reward" in h]
    counts = [h["generators/count"] for h in history]
    assert counts[:6] == [1] * 6 and counts[-1] == 2
    said = messages(run)
    assert any("generator-1 waits for room" in m for m in said)
    assert any("generators: 1 -> 2 (fake/generator-1 started and synced" in m for m in said)
    new = run.generators.engines[1]
    assert new.seeds and min(new.seeds) >= 0  # it was given prompts, after the sync (the fakes assert the version)
    served = trained_uids(run)
    assert [len(s) for s in served] == [run.prompts_per_step] * 12

    run = fake_run(tmp_path / "s", ["loop.mode=pipelined"], control=FakeControl({1: 2, 2: 1}))
    run.generators.no_room = "no room"
    rescale(run, busy=())
    assert run.generators.pending() == ["fake/generator-1"]
    rescale(run, busy=())
    assert run.generators.pending() == [] and run.generators.active == 1
    assert any("fake/generator-1 not started after all" in m for m in messages(run))


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


# --- cluster.generator_autoscale ---------------------------------------------------------------------------------


def autoscaler(clock, **over):
    cfg = GeneratorAutoscaleConfig(**{"min_generators": 1, "max_generators": 4, "upscale_delay_s": 30,
                                      "downscale_delay_s": 100, **over})
    return FleetAutoscaler(cfg, clock=lambda: clock[0])


def observe(auto, clock, active, load, steps):
    """`steps` steps of `load` (each advancing the clock by its step_s); the sizes asked for, None for none."""
    out = []
    for _ in range(steps):
        clock[0] += load.step_s
        out.append(auto.decide(active, load))
    return out


def test_the_fleet_grows_once_the_learner_has_waited_upscale_delay_s_and_not_on_the_settling_step():
    clock = [0.0]
    auto = autoscaler(clock)
    starving = FleetLoad(step_s=10, wait_s=4, idle_s=0)
    # the first step after a start or a change is not counted; then 30 s of waiting: steps 2, 3, 4 (t=20..40)
    assert observe(auto, clock, 1, starving, 5) == [None, None, None, None, 2]
    # a step without waiting restarts the clock
    auto = autoscaler(clock)
    ok = FleetLoad(step_s=10, wait_s=0.5, idle_s=0)
    assert observe(auto, clock, 1, starving, 3) + observe(auto, clock, 1, ok, 1) + observe(
        auto, clock, 1, starving, 4) == [None] * 7 + [2]
    # never above max_generators
    auto = autoscaler(clock, max_generators=1)
    assert observe(auto, clock, 1, starving, 20) == [None] * 20


def test_the_fleet_shrinks_only_where_one_engine_fewer_would_keep_up_for_downscale_delay_s():
    clock = [0.0]
    # two engines generating 5 of 10 s: one alone would generate 10 s of 10 (above target 0.8): stays
    auto = autoscaler(clock)
    assert observe(auto, clock, 2, FleetLoad(step_s=10, wait_s=0, idle_s=5), 30) == [None] * 30
    # three engines generating 4 of 10 s: two would generate 6 s (0.6): shrinks after 100 s of it
    auto = autoscaler(clock)
    decided = observe(auto, clock, 3, FleetLoad(step_s=10, wait_s=0, idle_s=6), 13)
    assert decided[:11] == [None] * 11 and decided[11] == 2
    # a learner that waits is no slack, however idle the engines were otherwise
    auto = autoscaler(clock)
    assert observe(auto, clock, 3, FleetLoad(step_s=10, wait_s=3, idle_s=6), 30).count(2) == 0
    # never below min_generators; a fleet outside the bounds is brought into them at once
    auto = autoscaler(clock, min_generators=3)
    assert observe(auto, clock, 3, FleetLoad(step_s=10, wait_s=0, idle_s=9), 30) == [None] * 30
    auto = autoscaler(clock, min_generators=2)
    assert observe(auto, clock, 1, FleetLoad(step_s=10, wait_s=0, idle_s=9), 2) == [None, 2]


def modelled_load(run, gen_s, train_s):
    """FleetLoad.of, for the fakes (whose generation is instant): a batch takes gen_s() seconds over the run's
    engines at the time, against a train step of train_s; the learner waits for the rest where generation is
    longer, the engines idle where it is shorter."""
    def of(timer):
        g = gen_s() / run.generators.active
        return FleetLoad(step_s=max(g, train_s), wait_s=max(g - train_s, 0.0), idle_s=max(train_s - g, 0.0))
    return of


@pytest.mark.parametrize("loop", ["pipelined", "async"])
def test_autoscaling_grows_while_the_learner_starves_and_shrinks_once_generation_outruns_training(
        tmp_path, loop, monkeypatch):
    """A batch that costs 3 engine-steps of generation against a train step of 1: the fleet grows to 3 (not
    past, where the learner stops waiting), up to max 4; then generation becomes 10x cheaper, and the fleet
    shrinks back to min 1, one engine at a time, each leaving once its groups are trained. Every step trains a
    whole batch, no draw twice."""
    steps = 40
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", f"grpo.max_steps={steps}",
                                    "cluster.generator_autoscale.max_generators=4",
                                    "cluster.generator_autoscale.upscale_delay_s=2",
                                    "cluster.generator_autoscale.downscale_delay_s=3"],
                   prompt_rows=rows(200))  # more rows than the run draws: a row trained twice is a draw twice
    clock = [0.0]
    run.fleet_autoscale.clock = lambda: clock[0]
    cost = [3.0]
    of = modelled_load(run, lambda: cost[0], 1.0)

    def load(timer):
        step = run.progress.global_step
        cost[0] = 3.0 if step < 20 else 0.3
        clock[0] += 1.0
        return of(timer)

    monkeypatch.setattr("orchestrator.loop.loops.FleetLoad.of", load)
    history = [h for h in LOOPS[loop](run) if "reward" in h]
    counts = [h["generators/count"] for h in history]
    assert max(counts[:20]) == 3 and 4 not in counts  # grew to what keeps up, not to max_generators
    assert counts[:20] == sorted(counts[:20])  # only grew while starving
    assert counts[-1] == 1  # back to min_generators once generation outran training
    served = trained_uids(run)
    assert [len(s) for s in served] == [run.prompts_per_step] * steps
    flat = [u for s in served for u in s]
    assert len(set(flat)) == len(flat)
    said = messages(run)
    assert any("generators: 1 -> 2" in m for m in said) and any("generators: 3 -> 2" in m for m in said)


def test_autoscaling_on_a_cluster_without_room_says_so_once(tmp_path, monkeypatch):
    run = fake_run(tmp_path / "r", ["loop.mode=pipelined", "grpo.max_steps=12",
                                    "cluster.generator_autoscale.max_generators=2",
                                    "cluster.generator_autoscale.upscale_delay_s=0"])
    run.generators.no_room = "no room for 1 more generator(s) (each needs {'CPU': 0.5})"
    monkeypatch.setattr("orchestrator.loop.loops.FleetLoad.of", modelled_load(run, lambda: 3.0, 1.0))
    history = [h for h in LOOPS["pipelined"](run) if "reward" in h]
    assert all(h["generators/count"] == 1 for h in history)
    assert sum("generators: stays at 1 for now: no room" in m for m in messages(run)) == 1


def test_a_client_request_wins_over_the_autoscaler_and_restarts_its_clocks(tmp_path):
    run = fake_run(tmp_path / "r", ["loop.mode=pipelined", "cluster.generator_autoscale.max_generators=4",
                                    "cluster.generator_autoscale.upscale_delay_s=0"], control=FakeControl({1: 3}))
    starving = FleetLoad(step_s=10, wait_s=5, idle_s=0)
    run.fleet_autoscale.decide(1, starving)  # past its settling step: it would grow now
    rescale(run, busy=(), load=starving)
    # the client's 3, not the autoscaler's 2
    assert run.generators.pending() == ["fake/generator-1", "fake/generator-2"]
    rescale(run, busy=(), load=starving)
    assert run.generators.active == 3 and run.generators.pending() == []  # up: joined
    rescale(run, busy=(), load=starving)
    assert run.generators.pending() == []  # the step after the join is not counted
    rescale(run, busy=(), load=starving)
    assert run.generators.pending() == ["fake/generator-3"]


def test_generator_autoscale_config():
    from orchestrator.config import parse_config
    from tests.fixtures.fakes import CONFIG

    def cfg(**cluster):
        return parse_config({**CONFIG, "loop": {"mode": "pipelined"}, "cluster": {**CONFIG.get("cluster", {}),
                                                                                **cluster}})
    assert cfg(num_generators=1, generator_autoscale={"min_generators": 2, "max_generators": 3}
               ).cluster.generators_at_start == 2
    assert cfg(num_generators=5, generator_autoscale={"max_generators": 3}).cluster.generators_at_start == 3
    with pytest.raises(ValueError, match="min_generators \\(3\\) must not exceed max_generators \\(2\\)"):
        cfg(generator_autoscale={"min_generators": 3, "max_generators": 2})
    with pytest.raises(ValueError, match="cluster.generator_autoscale .* needs loop.mode pipelined or async"):
        parse_config({**CONFIG, "loop": {"mode": "sync"}, "cluster": {"generator_autoscale": {"max_generators": 2}}})


@pytest.mark.parametrize("loop", ["sync", "pipelined", "async"])
def test_a_resumed_run_goes_back_to_the_fleet_size_of_its_checkpoint(tmp_path, loop):
    """A run scaled to 3 generators is stopped; its checkpoint keeps the size, and the resumed run (started with
    cluster.num_generators: 1) grows back to 3 at its first step boundary; a rewind (a lost learner) does not
    resize. With generator_autoscale the size is kept within its bounds."""
    from orchestrator.run import checkpoints

    first, _ = scaled_run(tmp_path, loop, {2: 3})
    assert first.generators.active == 3
    checkpoints.save(first)
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", f"grpo.max_steps={STEPS + 4}"])
    assert checkpoints.resume(run, checkpoints.usable(run.run_dir)) is not None
    assert run.progress.global_step == STEPS and run.progress.fleet_size == 3
    assert any("the checkpoint's fleet had 3 (this start has 1)" in m for m in messages(run))
    history = LOOPS[loop](run)
    steps = [h for h in history if "reward" in h]
    assert steps[-1]["generators/count"] == 3 and run.generators.active == 3
    assert run.progress.fleet_size is None

    rewound = fake_run(tmp_path / "r", [f"loop.mode={loop}", f"grpo.max_steps={STEPS + 4}"])
    assert checkpoints.rewind(rewound, rewound.prompts.state()) is not None
    assert rewound.progress.fleet_size is None

    if loop == "sync":  # generator_autoscale is refused with the sync loop (tests/unit/orchestrator/config)
        return
    bounded = fake_run(tmp_path / "r", [f"loop.mode={loop}", f"grpo.max_steps={STEPS + 4}",
                                        "cluster.generator_autoscale={min_generators: 1, max_generators: 2}"])
    checkpoints.resume(bounded, checkpoints.usable(bounded.run_dir))
    assert bounded.progress.fleet_size == 2


@pytest.mark.parametrize("loop", ["sync", "pipelined", "async"])
def test_a_generator_lost_with_its_node_hands_its_work_to_the_others_and_is_replaced(tmp_path, loop):
    """generator-1 dies with its node in its second call, after one group: the run does not wait for Ray to
    restart it (that needs room, maybe a node's start): the weight group is re-formed without it, the work it had
    goes to generator-0, and a new engine starts in its place and joins (synced first) at a later step boundary.
    Every step trains a whole batch, no draw twice, no sample with weights older than max_staleness."""
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", f"grpo.max_steps={STEPS}", "cluster.num_generators=2"],
                   generators=2)
    run.generators.die(member=1, call=2, after=1, node=True)
    history = LOOPS[loop](run)
    steps = [h for h in history if "reward" in h]
    assert [h["step"] for h in steps] == list(range(1, STEPS + 1))
    served = trained_uids(run)
    assert [len(s) for s in served] == [run.prompts_per_step] * STEPS
    flat = [u for s in served for u in s]
    assert len(set(flat)) == len(flat)
    for t in run.learner.trained:
        assert t.step_before - min(c[0] for c in t.batch.completion_ids) <= run.cfg.loop.max_staleness
    gens = run.generators
    assert len(gens.removed) == 1 and gens.removed[0].seeds, "the lost engine never sampled"
    assert len(gens.engines) == 2 and gens.engines[1].seeds, "its replacement never joined or never sampled"
    said = messages(run)
    assert sum("fake/generator-1 lost with its node: its requests go to the other generators (1 now)" in m
               for m in said) == 1
    assert any("generators: 1 -> 2" in m for m in said) and not any("waiting for Ray" in m for m in said)
    counts = [h["generators/count"] for h in steps]
    assert 1 in counts and counts[-1] == 2
    kinds = [json.loads(line)["kind"] for line in (run.run_dir / "faults.jsonl").read_text().splitlines()]
    assert kinds == ["generator_lost"]


def test_the_last_generator_lost_with_its_node_is_waited_for(tmp_path):
    """With no other generator up, the run waits for Ray's restart (where there is room), as for a crash."""
    run = fake_run(tmp_path / "r", ["loop.mode=pipelined", f"grpo.max_steps={STEPS}"])
    run.generators.die(member=0, call=2, after=1, node=True)
    LOOPS["pipelined"](run)
    assert not run.generators.removed and run.generators.restarts == 1
    assert any("a generator died; waiting for Ray to restart it" in m for m in messages(run))
