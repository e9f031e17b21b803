"""The async loop (orchestrator/loop/loops.py run_async, orchestrator/loop/feed.py) on fake groups that obey the real
groups' interfaces (tests/fixtures/fakes.py): every step trains a whole batch, no prompt twice, no sample staler
than max_staleness (checked against the versions the fake samples carry, not the loop's own claim), and a SIGTERM's
checkpoint replays exactly the draws not trained yet. `Feed.take` on hand-made pieces: oldest first, split pieces,
too-stale groups dropped and counted and never replayed."""

from __future__ import annotations

import dataclasses
import os
import signal

import pytest

from actors.types import SampleInfo
from orchestrator.loop.feed import Call, Feed, Piece, group_version
from orchestrator.loop.loops import run_async
from orchestrator.run import checkpoints
from orchestrator.run.signals import Signals
from tests.fixtures.fakes import ByteTokenizer, fake_run
from tests.fixtures.records import rollouts, scores

PROMPTS_PER_STEP = 4  # the fakes' config: generation_batch_size 8, num_generations 2


def trained_uids(run) -> list[list[int]]:
    g = run.cfg.generation.num_generations
    return [[ByteTokenizer.uid_of(p) for p in t.batch.prompt_ids][::g] for t in run.learner.trained]


@pytest.mark.parametrize("generators", [1, 2])
@pytest.mark.parametrize("max_staleness,num_iterations", [(0, 1), (1, 1), (2, 1), (2, 2)])
def test_every_step_a_whole_batch_no_prompt_twice_none_staler_than_allowed(tmp_path, generators, max_staleness,
                                                                        num_iterations):
    run = fake_run(tmp_path / "r", ["loop.mode=async", "grpo.max_steps=8", f"loop.max_staleness={max_staleness}",
                                    f"grpo.num_iterations={num_iterations}"], generators=generators)
    history = run_async(run)
    assert [h["step"] for h in history] == list(range(num_iterations, 9, num_iterations))
    batches = trained_uids(run)  # one train call a batch (num_iterations optimizer steps)
    assert all(len(b) == PROMPTS_PER_STEP for b in batches)
    flat = [u for b in batches for u in b]
    assert len(flat) == len(set(flat))  # no prompt trained twice
    assert sum(len(e.seeds) for e in run.generators.engines) == len(flat)  # none generated past the last step
    trained = run.learner.trained
    lags = [t.step_before - c[0] for t in trained for c in t.batch.completion_ids]  # ids [v, j]: v sampled it
    assert max(lags) <= max_staleness
    assert [h["async/version_lag/max"] for h in history] == [
        max(t.step_before - c[0] for c in t.batch.completion_ids) for t in trained]
    assert all(h["async/dropped_stale"] == 0 for h in history)
    if max_staleness >= num_iterations:  # batches generated ahead: the learner's batch was sampled before the sync
        assert max(lags) > 0


@pytest.mark.parametrize("generators,after", [(1, 1), (2, 0)])
def test_a_generator_dying_mid_call_loses_no_group(tmp_path, generators, after):
    """Generator 0 dies in its second call after `after` groups: one restart, however many calls it cut; their
    remaining groups are generated again on the restarted generator, which got the learner's weights first."""
    run = fake_run(tmp_path / "r", ["loop.mode=async", "grpo.max_steps=6", f"cluster.num_generators={generators}"],
                   generators=generators)
    run.generators.die(member=0, call=2, after=after)
    history = run_async(run)
    assert [h["step"] for h in history] == [1, 2, 3, 4, 5, 6] and run.generators.restarts == 1
    flat = [u for b in trained_uids(run) for u in b]
    assert all(len(b) == PROMPTS_PER_STEP for b in trained_uids(run)) and sorted(flat) == list(range(24))
    lags = [t.step_before - c[0] for t in run.learner.trained for c in t.batch.completion_ids]
    assert max(lags) <= run.cfg.loop.max_staleness  # no initial weights after the restart


def test_a_sigterm_checkpoint_replays_the_untrained_draws_and_nothing_else(tmp_path):
    flags = ["loop.mode=async", "grpo.max_steps=8", "loop.max_staleness=2"]
    stopped = fake_run(tmp_path / "r", flags, generators=2)
    signals = Signals("r", lambda text: None)
    signals.looping(lambda: setattr(stopped.progress, "stop_requested", True))
    stopped.learner.hook = lambda step: os.kill(os.getpid(), signal.SIGTERM) if step == 3 else None
    try:
        run_async(stopped)
    finally:
        signals.restore()
    assert stopped.progress.global_step == 3
    again = fake_run(tmp_path / "r", flags, generators=2)
    checkpoints.resume(again, checkpoints.usable(again.run_dir))
    resumed = run_async(again)
    assert [h["step"] for h in resumed] == [4, 5, 6, 7, 8]
    flat = [u for b in trained_uids(stopped) + trained_uids(again) for u in b]
    assert len(flat) == len(set(flat)) == 8 * PROMPTS_PER_STEP  # nothing trained twice, nothing lost
    assert set(flat) == set(range(8 * PROMPTS_PER_STEP))  # the draws in flight at the stop were served again


# --- Feed.take on hand-made pieces -------------------------------------------------------------------------------


def piece(groups: int, start: int, versions: list[int], untrained: set[int]) -> Piece:
    """`groups` groups of 2 (rows start...), group k's samples sampled by weights versions[k]; draws start // 2 + k."""
    r = rollouts(groups, g=2, start=start, version=min(versions))
    r.infos = [dataclasses.replace(i, version=versions[n // 2]) for n, i in enumerate(r.infos)]
    r.prompt_index = [(start + n) // 2 for n in range(len(r.infos))]
    call = Call([], [], None, done=True, version=0, mark=None, untrained=untrained)  # type: ignore[arg-type]
    return Piece(call, r, None, scores(2 * groups, start=start))


def test_take_is_oldest_first_splits_a_piece_and_drops_what_is_too_stale():
    feed = Feed(run=None, capacity=8, call_prompts=2)  # type: ignore[arg-type]
    a = piece(3, 0, [5, 2, 5], untrained={0, 1, 2})  # group 1 was sampled 5 steps before the learner's 7
    b = piece(2, 6, [6, 6], untrained={3, 4})
    feed.pieces.extend([a, b])
    feed.calls.extend([a.call, b.call])
    taken = feed.take(3, global_step=7, max_staleness=2)
    assert taken.dropped == 1 and feed.dropped_total == 1
    assert taken.rollouts.columns["uid"] == [0, 1, 4, 5, 6, 7]  # a's groups 0 and 2, then b's first
    assert taken.scores.scores[0] == [0.0, 1.0, 4.0, 5.0, 6.0, 7.0]  # the scores follow their groups
    assert taken.lags == [2, 2, 2, 2, 1, 1]
    assert a.call not in feed.calls  # all its draws trained or dropped: a checkpoint replays none of them
    assert b.call.untrained == {4} and feed.pieces[0].rollouts.columns["uid"] == [8, 9]  # the rest waits


def test_group_version_is_its_oldest_sample():
    r = rollouts(2, g=2, version=9)
    r.infos = [dataclasses.replace(i, version=v) for i, v in zip(r.infos, [4, 3, None, None], strict=True)]
    assert [group_version(r, 0), group_version(r, 1)] == [3, 9]  # none recorded: the call's version
    assert isinstance(r.infos[0], SampleInfo)
