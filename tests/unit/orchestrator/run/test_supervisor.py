"""The supervisor (orchestrator/run/supervisor.py) on fake groups (tests/fixtures/fakes.py): a lost learner is rebuilt
and the run rewound to its latest checkpoint (or its start), the steps since it trained again on the same prompts, the
pipelined loop's batches generated ahead dropped, each recovery recorded; the budget (cluster.max_failures); an
error that is not a lost learner; a preemption notice that checkpoints and moves the learner, losing nothing.
(The real thing, with Ray killing real actors: tests/integration/runs/faults/test_recovery.py.)"""

from __future__ import annotations

import json

import pytest
from ray.exceptions import RayActorError

from orchestrator.loop.loops import run_pipelined, run_sync
from orchestrator.run.state import FAULTS_FILE
from orchestrator.run.supervisor import Supervisor
from tests.fixtures.fakes import ByteTokenizer, fake_rebuild, fake_run, messages

LOOPS = {"sync": run_sync, "pipelined": run_pipelined}


def supervised(run, loop):
    return Supervisor(run, LOOPS[loop], rebuild=fake_rebuild(run), start=run.prompts.state())


def lineage(learners, group_size=2):
    """Per trained step, its prompts (uids, sorted), across the learners a run had: a rebuilt learner retrains the steps
    after its checkpoint, replacing the lost learner's."""
    steps = {}
    for learner in learners:
        for t in learner.trained:
            steps[t.step_before + 1] = sorted(ByteTokenizer.uid_of(p) for p in t.batch.prompt_ids[::group_size])
    return [steps[k] for k in sorted(steps)]


def records(run):
    path = run.run_dir / FAULTS_FILE
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("loop", LOOPS)
def test_a_lost_learner_comes_back_from_the_last_checkpoint(tmp_path, loop):
    """The learner dies in the train step to step 6 (checkpoint-4 is the latest): steps 5 and 6 are trained again on
    uids 16..23, nothing is skipped or trained twice in the run's lineage, the reward pool scores step 5 under
    step 4's trainer_state, the new learner's weights reach the generators."""
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", "grpo.max_steps=8", "grpo.save_steps=2",
                                    "loop.max_staleness=2"])
    first = run.learner
    first.die_at = 6
    history = supervised(run, loop)()
    assert [h["step"] for h in history] == list(range(1, 9)) and run.progress.global_step == 8
    assert run.learner is not first and run.learner.trained[0].step_before == 4
    assert lineage([first, run.learner]) == [list(range(4 * k, 4 * k + 4)) for k in range(8)]
    assert history[4]["reward_global_step"] == 4 and history[4]["policy_version"] == 4
    assert 4 in run.weights.pushes[:1]  # the rebuilt learner's first sync: the checkpoint's weights
    (rec,) = records(run)
    assert rec["kind"] == "learner_recovered" and rec["cause"] == "r/learner died: scripted"
    assert (rec["failed_at_step"], rec["restored_step"], rec["steps_lost"], rec["checkpoint"]) == (5, 4, 1,
                                                                                                  "checkpoint-4")
    assert "rayward: r/learner died: scripted: rebuilding the learner (1/3)" in messages(run)
    assert any(m.startswith("rayward: learner back at step 4 from checkpoint-4 after ") and m.endswith("1 step(s) lost")
               for m in messages(run))


def test_without_a_checkpoint_the_learner_starts_over_from_the_initial_model(tmp_path):
    run = fake_run(tmp_path / "r", ["grpo.max_steps=4"])
    first = run.learner
    first.die_at = 3
    history = supervised(run, "sync")()
    assert [h["step"] for h in history] == [1, 2, 3, 4]
    assert [t.step_before for t in run.learner.trained] == [0, 1, 2, 3]
    assert lineage([run.learner]) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]  # from the start
    (rec,) = records(run)
    assert (rec["restored_step"], rec["steps_lost"], rec["checkpoint"]) == (0, 2, None)


@pytest.mark.parametrize("max_failures", [0, 1])
def test_past_max_failures_the_run_ends_with_the_last_loss(tmp_path, max_failures):
    run = fake_run(tmp_path / "r", ["grpo.max_steps=6", "grpo.save_steps=1", f"cluster.max_failures={max_failures}"])
    run.learner.die_at = 3
    rebuild = fake_rebuild(run)

    def rebuild_a_mortal_one():
        rebuild()
        run.learner.die_at = 4  # the new learner dies too

    with pytest.raises(RayActorError):
        Supervisor(run, run_sync, rebuild=rebuild_a_mortal_one, start=run.prompts.state())()
    assert len(records(run)) == max_failures
    assert messages(run)[-1] == (f"rayward: the learner is lost again (r/learner died: scripted); cluster.max_failures "
                                 f"({max_failures}) is spent: the run ends")


def test_an_error_that_is_not_a_lost_learner_ends_the_run(tmp_path):
    """A generator out of restarts: the learner answers, so nothing is rebuilt."""
    run = fake_run(tmp_path / "r", ["loop.mode=pipelined", "cluster.generator_max_restarts=0"])
    run.generators.die(member=0, call=2, after=2)
    learner = run.learner
    with pytest.raises(RayActorError):
        supervised(run, "pipelined")()
    assert run.learner is learner and records(run) == []


@pytest.mark.parametrize("loop", LOOPS)
def test_a_preemption_notice_checkpoints_at_the_step_boundary_and_moves_the_learner_losing_nothing(tmp_path, loop):
    """The watchdog's notice arrives during step 3: step 3 is trained and checkpointed, the learner moves (a new one
    from checkpoint-3), steps 4.. go on; no step is lost or trained twice, no failure is counted."""
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", "grpo.max_steps=6", "cluster.max_failures=0"])
    first = run.learner

    def notice(step):
        if step == 3:
            run.progress.move_learner = "r/learner's node abc was drained (preemption)"

    first.hook = notice
    sup = supervised(run, loop)
    history = sup()
    assert [h["step"] for h in history] == [1, 2, 3, 4, 5, 6] and sup.failures == 0
    assert first.saved == ["checkpoint-3"] and [t.step_before for t in first.trained] == [0, 1, 2]
    assert [t.step_before for t in run.learner.trained] == [3, 4, 5]
    assert lineage([first, run.learner]) == [list(range(4 * k, 4 * k + 4)) for k in range(6)]
    (rec,) = records(run)
    assert rec["kind"] == "learner_moved" and rec["steps_lost"] == 0 and rec["checkpoint"] == "checkpoint-3"
    assert run.progress.move_learner is None and not run.progress.stop_requested
