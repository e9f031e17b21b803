"""Both loops, in process, on fake groups that obey the real groups' interfaces (tests/fixtures/fakes.py): the
accounting of every step, dynamic sampling's refills, the max_staleness rule, a generator dying mid-stream,
SIGTERM at a step boundary and the resume from its checkpoint, the periodic checkpoints, the eval schedule.

Every fake sample says which weights made it (completion_ids [v, j]), so the tests check what the loop claims
(policy_version, staleness) against what really happened."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from actors.learner.checkpoint import STATE_FILE
from orchestrator.loop.loops import run_pipelined, run_sync
from orchestrator.run import checkpoints
from orchestrator.run.errors import RunStopped
from orchestrator.run.signals import Signals
from tests.fixtures.accounting import sync_accounting
from tests.fixtures.fakes import ByteTokenizer, fake_run, messages, rows
from tests.fixtures.waiting import wait_until

LOOPS = {"sync": run_sync, "pipelined": run_pipelined}


def steps(history):
    return [h for h in history if "reward" in h]


def evals(history):
    return [h for h in history if "eval/reward" in h]


def trained_uids(run):
    """The prompt rows trained on, step by step (each group's G samples share a prompt)."""
    out = []
    for t in run.learner.trained:
        ids = [ByteTokenizer.uid_of(p) for p in t.batch.prompt_ids]
        out.append(ids[:: run.cfg.generation.num_generations])
    return out


def versions(t):
    """The learner step whose weights generated each sample of a trained batch."""
    return [c[0] for c in t.batch.completion_ids]


@pytest.mark.parametrize("loop", LOOPS)
def test_every_step_trains_each_served_prompt_once_and_logs_the_same_metrics(tmp_path, loop):
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}"])
    history = LOOPS[loop](run)
    assert [h["step"] for h in history] == [1, 2, 3, 4] and run.progress.global_step == 4
    assert [sorted(s) for s in trained_uids(run)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    row = history[-1]
    for key in ("global_step", "num_tokens", "time/train_compute", "loss", "learning_rate", "reward",
                "reward_pool/workers", "completions/mean_length", "sync/bytes", "roles/learner/busy_s",
                "roles/bottleneck", "tokens_per_s", "time/step"):
        assert key in row, key
    assert row["global_step"] == 4 and row["time/train_compute"] == 0.01 and row["num_tokens"] == 16.0
    assert "pipeline/dropped_stale_batches" not in row
    assert ("policy_staleness" in row and "time/generate_busy" in row) == (loop == "pipelined")
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4]


def test_sync_loop_trains_on_the_weights_of_the_previous_step(tmp_path):
    run = fake_run(tmp_path / "r")
    sync_accounting(run_sync(run), groups=4)
    assert all(set(versions(t)) == {t.step_before} for t in run.learner.trained)  # the labels are the truth


@pytest.mark.parametrize("max_staleness,num_iterations", [(0, 1), (1, 1), (2, 1), (1, 2), (2, 2), (3, 2)])
def test_pipelined_never_trains_on_samples_older_than_max_staleness(tmp_path, max_staleness, num_iterations):
    """Batches are generated ahead, max_staleness // num_iterations of them: each is num_iterations steps."""
    run = fake_run(tmp_path / "r", ["loop.mode=pipelined", "grpo.max_steps=12", f"loop.max_staleness={max_staleness}",
                                    f"grpo.num_iterations={num_iterations}"])
    history = run_pipelined(run)
    assert [h["step"] for h in history] == list(range(num_iterations, 13, num_iterations))
    ahead = max_staleness // num_iterations
    for i, (h, t) in enumerate(zip(history, run.learner.trained, strict=True)):
        assert t.step_before - min(versions(t)) <= max_staleness  # the admission rule, on the real weights
        assert h["policy_staleness"] == t.step_before - h["policy_version"] == t.step_before - min(versions(t))
        assert h["policy_staleness"] == min(i, ahead) * num_iterations  # it overlaps as far as the rule allows
    if max_staleness == 0:
        sync_accounting(history, groups=4)


def test_dynamic_sampling_refills_zero_spread_groups_and_keeps_every_accepted_one(tmp_path):
    """Every 4th prompt's group has no spread. 4 groups per step: 3 accepted, refill one prompt at a time."""
    run = fake_run(tmp_path / "r", ["grpo.dynamic_sampling=true", "grpo.max_refill_rounds=6"],
                   prompt_rows=rows(flat=lambda i: i % 4 == 0))
    history = run_sync(run)
    assert [h["dynamic_sampling/refill_rounds"] for h in history] == [2, 1, 1, 2]  # uid 4 and 20 are flat too
    assert trained_uids(run) == [[1, 2, 3, 5], [6, 7, 9, 10], [11, 13, 14, 15], [17, 18, 19, 21]]
    for h in history:
        assert h["dynamic_sampling/accepted_groups"] == h["batch/groups"] == 4
        assert h["dynamic_sampling/filled"] == 1.0 and h["frac_reward_zero_std"] == 0.0
    assert [h["dynamic_sampling/pass_rate"] for h in history] == [4 / 6, 4 / 5, 4 / 5, 4 / 6]
    assert history[0]["time/generate"] > 0 and history[0]["policy_version"] == 0


def test_dynamic_sampling_trains_on_the_accepted_groups_when_refills_run_out(tmp_path):
    run = fake_run(tmp_path / "r", ["grpo.dynamic_sampling=true", "grpo.max_refill_rounds=1", "grpo.max_steps=2"],
                   prompt_rows=rows(flat=lambda i: i % 4 != 3))
    history = run_sync(run)
    assert [h["step"] for h in history] == [1, 2]  # every step completed
    assert trained_uids(run) == [[3], [7, 11]]  # 4 prompts, then one refill of the 3 missing: every 4th has spread
    assert [h["batch/groups"] for h in history] == [h["dynamic_sampling/accepted_groups"] for h in history] == [1, 2]
    assert [h["dynamic_sampling/pass_rate"] for h in history] == [1 / 7, 2 / 7]
    assert all(h["dynamic_sampling/filled"] == 0 and h["dynamic_sampling/refill_rounds"] == 1 for h in history)


def test_dynamic_sampling_in_the_pipelined_loop(tmp_path):
    run = fake_run(tmp_path / "r", ["loop.mode=pipelined", "grpo.dynamic_sampling=true"],
                   prompt_rows=rows(flat=lambda i: i % 4 == 0))
    history = run_pipelined(run)
    assert all(h["batch/groups"] == 4 and h["frac_reward_zero_std"] == 0.0 for h in history)
    served = [u for s in trained_uids(run) for u in s]
    assert len(set(served)) == len(served) and not any(u % 4 == 0 for u in served)


@pytest.mark.parametrize("generators,chunks,after", [(1, 1, 2), (2, 2, 0)])
def test_a_generator_dying_mid_stream_loses_no_group(tmp_path, generators, chunks, after):
    """Generator 0 dies in its second streaming call (batch 1), after `after` groups. With 2 generators x 2 chunks
    its death cuts every later part on it: one restart, however many parts; the cut parts' remaining groups are
    generated again on the restarted generator, which got the learner's weights first."""
    run = fake_run(tmp_path / "r", ["loop.mode=pipelined", "grpo.max_steps=6", f"cluster.num_generators={generators}",
                                    f"loop.generation_chunks={chunks}"], generators=generators)
    run.generators.die(member=0, call=2, after=after)
    history = run_pipelined(run)
    assert [h["step"] for h in history] == [1, 2, 3, 4, 5, 6]
    assert run.generators.restarts == 1
    assert sum("a generator died" in m for m in messages(run)) == 1
    served = [sorted(s) for s in trained_uids(run)]
    assert served == [list(range(4 * k, 4 * k + 4)) for k in range(6)]  # each batch whole, nothing twice
    for h, t in zip(history, run.learner.trained, strict=True):
        assert t.step_before - min(versions(t)) <= run.cfg.loop.max_staleness  # no initial weights after the restart
        assert h["policy_staleness"] <= run.cfg.loop.max_staleness


def test_a_generator_dying_in_the_sync_loop_is_restarted_and_synced(tmp_path):
    run = fake_run(tmp_path / "r", ["grpo.max_steps=3"])
    run.generators.die(member=0, call=2)
    history = run_sync(run)
    assert [h["step"] for h in history] == [1, 2, 3] and run.generators.restarts == 1
    assert all(set(versions(t)) == {t.step_before} for t in run.learner.trained)  # the restarted engine was synced
    sync_accounting(history, groups=4)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("where", ["reward", "learner"])
def test_groups_whose_token_data_is_lost_are_replaced_and_none_is_trained_twice(tmp_path, loop, where):
    """A generator (or its node) went with the payloads it held, before its groups were scored (the workers flag
    them: Scores.lost) or after (the learner cannot fetch them: TrainResult.lost, nothing trained). Their prompts
    are dropped and new prompts' groups take their place: every step trains a whole batch, no prompt twice, the
    lost one never, and data_plane/lost_groups counts it."""
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", "grpo.max_steps=3"])
    if where == "reward":
        run.reward_pool.lose = {2: [1]}  # the second scoring call's second group
    else:
        run.learner.lose = {2: [0]}  # the second train step's first group
    history = LOOPS[loop](run)
    assert [h["step"] for h in history] == [1, 2, 3] and run.progress.global_step == 3
    served = trained_uids(run)
    flat = [u for s in served for u in s]
    assert all(len(s) == 4 for s in served) and len(set(flat)) == len(flat)
    assert sum(h["data_plane/lost_groups"] for h in history) == 1
    if loop == "sync":  # prompts are served in order: the lost one is step 2's, the next prompt takes its place
        lost = 5 if where == "reward" else 4
        assert lost not in flat and sorted(served[1]) == sorted({4, 5, 6, 7, 8} - {lost})
        assert [h["data_plane/lost_groups"] for h in history] == [0, 1, 0]


def test_no_restart_allowed_fails_the_run(tmp_path):
    from ray.exceptions import RayActorError

    run = fake_run(tmp_path / "r", ["loop.mode=pipelined", "cluster.generator_max_restarts=0"])
    run.generators.die(member=0, call=2, after=2)
    with pytest.raises(RayActorError):
        run_pipelined(run)


@pytest.mark.parametrize("loop", LOOPS)
def test_sigterm_stops_at_the_step_boundary_with_a_checkpoint_and_resume_continues(tmp_path, loop):
    """SIGTERM (the real handler) during step 2: step 2 is trained, logged and checkpointed, step 3 never starts;
    a resumed run continues from that checkpoint: the learner's step, the generators' weights, the data order."""
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", "grpo.max_steps=4"])
    signals = Signals("r", lambda text: None)
    signals.looping(lambda: setattr(run.progress, "stop_requested", True))
    run.learner.hook = lambda step: os.kill(os.getpid(), signal.SIGTERM) if step == 2 else None
    try:
        history = LOOPS[loop](run)
    finally:
        signals.restore()
    assert [h["step"] for h in history] == [1, 2] and run.progress.stop_requested
    assert run.learner.saved == ["checkpoint-2"]  # no save_steps: the SIGTERM checkpoint alone
    state = json.loads((tmp_path / "r" / "checkpoint-2" / STATE_FILE).read_text())
    assert state["global_step"] == 2 and state["trainer_state"]["global_step"] == 2
    assert set(state) >= {"data", "trainer_state", "eval", "reward_pool", "files"}

    again = fake_run(tmp_path / "r", [f"loop.mode={loop}", "grpo.max_steps=4"])
    found = checkpoints.find(again.run_dir, checkpoints.RESUME_REQUIRED, 4, again.display.message)
    assert checkpoints.resume(again, found) == tmp_path / "r" / "checkpoint-2"
    assert again.progress.global_step == again.progress.policy_version == again.learner.global_step == 2
    assert again.generators.engines[0].version == 2  # the generators got the checkpoint's weights
    assert again.reward_pool.state.global_step == 2  # and the reward pool the trainer_state
    resumed = LOOPS[loop](again)
    assert [h["step"] for h in resumed] == [3, 4] and resumed[0]["policy_version"] == 2
    assert resumed[0]["reward_global_step"] == 2
    assert {u for s in trained_uids(run) for u in s} == set(range(8))
    # The data position is that of the next batch to TRAIN: the pipelined loop had drawn the prompts of the batch
    # generated ahead (uids 8-11, never trained); the resumed run draws them again, skipping nothing.
    assert {u for s in trained_uids(again) for u in s} == set(range(8, 16))


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("sampler", ["uniform", "difficulty"])
def test_a_stopped_and_resumed_run_trains_what_the_uninterrupted_one_does(tmp_path, loop, dynamic, sampler):
    """Stopped (SIGTERM) at step 3 and resumed: steps 4..8 train the same prompts, requested with the same seeds,
    as in a run that never stopped; with dynamic sampling (refills drawn while batches are generated ahead) and
    max_staleness 2 the resume position skips the draws trained already and replays the ones generated ahead. With
    the difficulty sampler (its draws decided by the per-prompt statistics of the steps before), the statistics
    and its random state come back from the checkpoint, and the batches generated ahead are replayed by row."""
    flags = [f"loop.mode={loop}", "grpo.max_steps=8", "loop.max_staleness=2", f"data.sampler={sampler}"]
    flags += ["grpo.dynamic_sampling=true", "grpo.max_refill_rounds=6"] if dynamic else []
    prompts = rows(flat=lambda i: dynamic and i % 3 == 0)
    whole = fake_run(tmp_path / "whole", flags, prompt_rows=prompts)
    full = LOOPS[loop](whole)

    stopped = fake_run(tmp_path / "r", flags, prompt_rows=prompts)
    signals = Signals("r", lambda text: None)
    signals.looping(lambda: setattr(stopped.progress, "stop_requested", True))
    stopped.learner.hook = lambda step: os.kill(os.getpid(), signal.SIGTERM) if step == 3 else None
    try:
        LOOPS[loop](stopped)
    finally:
        signals.restore()
    again = fake_run(tmp_path / "r", flags, prompt_rows=prompts)
    checkpoints.resume(again, checkpoints.usable(again.run_dir))
    resumed = LOOPS[loop](again)
    assert [h["step"] for h in resumed] == [4, 5, 6, 7, 8]
    assert trained_uids(stopped) + trained_uids(again) == trained_uids(whole)
    if loop == "sync":  # the sync loop asks for exactly the same requests again (the pipelined one, its schedule's)
        seeds = whole.generators.engines[0].seeds
        assert again.generators.engines[0].seeds == seeds[len(seeds) - len(again.generators.engines[0].seeds):]
        same = ("reward", "loss", "batch/groups", "reward_global_step", "policy_version")
        assert [{k: h[k] for k in same} for h in resumed] == [{k: h[k] for k in same} for h in full[3:]]


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("max_steps,saved", [(5, ["checkpoint-2", "checkpoint-4", "checkpoint-5"]),
                                             (4, ["checkpoint-2", "checkpoint-4"])])
def test_periodic_checkpoints_every_save_steps_and_a_final_one(tmp_path, loop, max_steps, saved):
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", f"grpo.max_steps={max_steps}", "grpo.save_steps=2"])
    LOOPS[loop](run)
    assert run.learner.saved == saved  # the last step's periodic checkpoint is not written twice
    assert checkpoints.latest(tmp_path / "r") == tmp_path / "r" / saved[-1]
    assert checkpoints.saved_step(tmp_path / "r" / saved[-1]) == max_steps


def test_no_save_steps_writes_no_checkpoint(tmp_path):
    run = fake_run(tmp_path / "r")
    run_sync(run)
    assert run.learner.saved == [] and checkpoints.latest(tmp_path / "r") is None


EVAL = ['eval={"data": {"path": "toy"}, "every_n_steps": 2, "at_start": true, "num_generations": 2, '
        '"max_samples": 4}', "grpo.max_steps=5", "grpo.save_best=eval/reward", "logging.log_completions=true"]


@pytest.mark.parametrize("loop", LOOPS)
def test_evals_run_on_schedule_with_the_weights_they_name_and_keep_the_best(tmp_path, loop):
    """At the start, every 2 steps and after the last. Sync: between steps, in order. Pipelined: queued behind the
    step's weight sync and recorded at a later boundary, still on the weights of the step it names (and its
    checkpoint-best candidate holds them). The fake reward rises with the weights' step: the best is the last."""
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", *EVAL])
    history = LOOPS[loop](run)
    assert [h["step"] for h in steps(history)] == [1, 2, 3, 4, 5]
    assert sorted(h["step"] for h in evals(history)) == [0, 2, 4, 5]
    assert all(h["eval/policy_version"] == h["step"] and h["eval/prompts"] == 4 for h in evals(history))
    if loop == "sync":  # each eval right after its step
        order = [("eval" if "eval/reward" in h else "step", h["step"]) for h in history]
        assert order == [("eval", 0), ("step", 1), ("step", 2), ("eval", 2), ("step", 3), ("step", 4), ("eval", 4),
                         ("step", 5), ("eval", 5)]
    samples = [json.loads(x) for x in (tmp_path / "r" / "eval_completions.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 4 * 2
    assert all(s["completion"] == f"v{s['step']}" for s in samples)  # generated by the weights of that step
    best = json.loads((tmp_path / "r" / checkpoints.BEST / STATE_FILE).read_text())
    assert best["global_step"] == 5 and best["best"]["step"] == 5 and best["best"]["metric"] == "eval/reward"
    assert not (tmp_path / "r" / checkpoints.BEST_CANDIDATE).exists()
    assert any(m.startswith("rayward: checkpoint-best: step 5 ") for m in messages(run))


def test_an_eval_at_the_start_only_when_asked(tmp_path):
    run = fake_run(tmp_path / "r",
                   [*EVAL[1:], 'eval={"data": {"path": "toy"}, "num_generations": 2, "max_samples": 4}'])
    assert [h["step"] for h in evals(run_sync(run))] == [5]  # no every_n_steps: the last step only


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")  # and no traceback of the dropped one
def test_a_sigterm_while_ray_starts_is_never_lost():
    """ray.init installs a SIGTERM handler that raises SystemExit; a signal that lands where Python drops
    exceptions (here a finalizer, as logging's at-fork hook is while Ray spawns its processes) lost the stop, and
    the run trained on to exit 0. Through ray.init rayward's handler stays (and the signal is blocked in the
    thread that starts Ray's processes): the request is recorded, and the start stops."""
    import ray._private.utils as ray_utils

    class SignalledInAFinalizer:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # handled here (its exception dropped), or when the block ends

    signals = Signals("r", lambda text: None)
    try:
        with pytest.raises(RunStopped):
            with signals.starting_ray():
                ray_utils.set_sigterm_handler(lambda signum, frame: sys.exit(signum))  # what ray.init does first
                SignalledInAFinalizer()
            # Another thread of this process (pytest-xdist's) may take the signal: its handler then runs on the main
            # thread at some later bytecode, here or while waiting.
            wait_until(lambda: signals.received, "the SIGTERM to be handled")
            signals.check()
        assert signals.received == "SIGTERM"
    finally:
        signals.restore()
    assert ray_utils.set_sigterm_handler.__name__ == "set_sigterm_handler"  # Ray's own again


def test_processes_started_while_ray_starts_ignore_the_signals_meant_for_the_driver():
    """`timeout`, a terminal's Ctrl-C and SLURM signal every process of the job: an embedded cluster's processes
    (the learner among them) must not die of it before the driver checkpoints. They inherit the signal mask of
    the thread that starts them: SIGTERM and SIGINT blocked while Ray starts, and the driver's own mask is back
    afterwards."""
    import subprocess

    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    signals = Signals("r", lambda text: None)
    try:
        with signals.starting_ray():
            child = subprocess.run(["grep", "^SigBlk", "/proc/self/status"], capture_output=True, text=True)
    finally:
        signals.restore()
    blocked = int(child.stdout.split()[1], 16)
    assert blocked & (1 << (signal.SIGTERM - 1)) and blocked & (1 << (signal.SIGINT - 1)), child.stdout
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before


@pytest.mark.parametrize("loop", LOOPS)
def test_the_first_ctrl_c_stops_at_the_step_boundary_with_a_checkpoint_and_the_second_quits(tmp_path, loop):
    """Ctrl-C (SIGINT, the real handler) during step 2: step 2 is trained, logged and checkpointed, as for
    SIGTERM, and the stop says Ctrl-C (the CLI exits 130); a second Ctrl-C quits at once, with no checkpoint."""
    run = fake_run(tmp_path / "r", [f"loop.mode={loop}", "grpo.max_steps=4"])
    said = []
    signals = Signals("r", said.append)
    signals.looping(lambda: setattr(run.progress, "stop_requested", True))
    run.learner.hook = lambda step: os.kill(os.getpid(), signal.SIGINT) if step == 2 else None
    try:
        history = LOOPS[loop](run)
        assert [h["step"] for h in history] == [1, 2] and run.learner.saved == ["checkpoint-2"]
        stopped = signals.stopped(2, run.run_dir / "checkpoint-2")
        assert stopped.signal == "SIGINT" and "(Ctrl-C)" in str(stopped)
        wait_until(lambda: said, "the stop's message")
        assert said == ["rayward: Ctrl-C: stopping at the end of this step, with a checkpoint (Ctrl-C again quits "
                        "at once, without one)"]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs at the next bytecode: well inside this
    finally:
        signals.restore()


