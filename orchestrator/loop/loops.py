"""The three training loops: one call per phase on the run's named groups (orchestrator/loop/phases.py), each timed.
Which loop runs is chosen once, when the run starts (loop.mode). The loop writes the run's progress as it trains
(its steps, its weights' version, the resume position); the few other writers are in `Progress`'s docstring."""

from __future__ import annotations

from collections import deque
from typing import Any

from orchestrator.loop import phases
from orchestrator.loop.feed import Feed, feed_shape
from orchestrator.loop.fleet import FleetLoad, rescale
from orchestrator.loop.inflight import InFlight, busy, collect, pump, submit_batch, untrained_position
from orchestrator.run import checkpoints
from orchestrator.run.state import Run
from orchestrator.telemetry.metrics import PhaseTimer


def run_sync(run: Run) -> list[dict[str, Any]]:
    """Synchronous GRPO: generate -> score -> select -> advantages -> train -> sync, one step at a time; held-out
    evals between steps (orchestrator/eval/evaluator.py)."""
    progress = run.progress
    run.evaluate.start(progress.global_step)
    while not phases.done(run):
        timer = PhaseTimer()
        prompts = run.prompts.next_batch(run.prompts_per_step)
        with timer("generate"):
            rollouts = phases.generate(run, prompts)
        with timer("reward"):
            scores = phases.score(run, rollouts)
        step = phases.to_train_batch(run, run.select(rollouts, scores, phases.refill(run, timer)))
        with timer("train"):
            step, trained = phases.train(run, step, phases.refill(run, timer))
        progress.global_step = trained.global_step
        with timer("sync"):
            synced = phases.sync(run)
        progress.policy_version = progress.global_step
        phases.log_step(run, timer, step, trained, synced)
        rescale(run, busy=())  # `rayward scale --generators`, between two syncs: nothing in flight here
        checkpoints.save_periodic(run)
        run.evaluate.after_step(progress.global_step)  # the synced weights, on the idle generators
    return phases.finish(run)


def run_pipelined(run: Run) -> list[dict[str, Any]]:
    """Pipelined GRPO: batches generated (and scored, group by group) ahead of the one being trained. Admission
    rule: a batch is at most max_staleness optimizer steps behind the learner when it is trained on. The schedule
    keeps it: a batch is trained on num_iterations times, so `ahead` = max_staleness // num_iterations batches are
    generated ahead, and batch k is submitted once batch k - ahead - 1 is trained, behind that step's sync. A
    checkpoint keeps the prompt stream's position of the next batch to train: a resumed run generates the batches
    that were ahead again, and trains every prompt once."""
    progress = run.progress
    per_batch = run.cfg.grpo.num_iterations
    ahead, batches = run.cfg.loop.max_staleness // per_batch, run.cfg.grpo.max_steps // per_batch
    inflight: deque[InFlight] = deque()
    submitted = progress.global_step // per_batch
    run.evaluate.start(progress.global_step)  # queued on the generators ahead of the first batches
    while not phases.done(run):
        timer = PhaseTimer()
        while len(inflight) <= ahead and submitted < batches:
            inflight.append(submit_batch(run))
            submitted += 1
        with timer("wait_rollouts"):  # learner idle: the next batch is not generated and scored yet
            pump(run, inflight)
            generated = collect(inflight.popleft())
        step = phases.to_train_batch(run, run.select(generated.rollouts, generated.scores, phases.refill(run, timer)))
        staleness = progress.global_step - generated.rollouts.policy_version
        with timer("train"):
            training = phases.submit_train(run, step.batch)
            timer.add("generators_idle", pump(run, inflight, until=training))  # scoring what they finish meanwhile
            step, trained = phases.retrained(run, step, training.result(), phases.refill(run, timer))
        progress.global_step = trained.global_step
        with timer("sync"):  # submitted, not awaited: it queues behind generation already submitted
            synced = phases.sync_async(run)
        progress.policy_version = progress.global_step
        progress.resume_data = untrained_position(run, inflight)  # what a checkpoint keeps: the next batch's rows
        phases.log_step(run, timer, step, trained, synced, staleness=staleness, generate_busy_s=generated.generate_s)
        rescale(run, busy(inflight), FleetLoad.of(timer))  # the fleet's size, between two syncs (loop/fleet.py)
        checkpoints.save_periodic(run)
        run.evaluate.after_step(progress.global_step)  # queued behind the sync: the new weights; finished later
    return phases.finish(run)


def run_async(run: Run) -> list[dict[str, Any]]:
    """Async GRPO: the generators never wait for a batch boundary (orchestrator/loop/feed.py). Small calls keep
    every engine fed up to `capacity` prompts (this batch and max_staleness // num_iterations batches ahead); each
    group is scored as it finishes; the learner trains on the next batch of scored groups, oldest first, dropping a
    group more than max_staleness steps stale; its weights load into the engines between two engine steps while
    they sample (each token keeps the version that sampled it). Unlike the pipelined loop, the learner never waits
    for a batch's long tail: groups still running are trained at a later step (or dropped, too stale), and the
    groups of later calls that finished first are trained now."""
    progress, cfg, per_step = run.progress, run.cfg, run.prompts_per_step
    shape = feed_shape(per_step, len(run.generators), cfg.loop.generation_chunks, cfg.loop.max_staleness,
                       cfg.grpo.num_iterations)
    feed = Feed(run, shape.capacity, shape.call_prompts)
    run.evaluate.start(progress.global_step)
    while not phases.done(run):
        timer = PhaseTimer()
        feed.top_up()  # after the last sync: what it submits is trained within max_staleness steps
        with timer("wait_rollouts"):  # learner idle: not enough groups finished and scored yet
            feed.pump(groups=per_step)
            taken = feed.take(per_step, progress.global_step, cfg.loop.max_staleness)
        step = phases.to_train_batch(run, run.select(taken.rollouts, taken.scores, phases.refill(run, timer)))
        with timer("train"):
            training = phases.submit_train(run, step.batch)
            timer.add("generators_idle", feed.pump(until=training))  # scoring what they finish meanwhile
            step, trained = phases.retrained(run, step, training.result(), phases.refill(run, timer))
        progress.global_step = trained.global_step
        loads_in_flight = int(feed.generating())
        with timer("sync"):  # lands between engine steps, beside the calls in flight
            synced = phases.sync_async(run)
        progress.policy_version = progress.global_step
        progress.resume_data = feed.untrained_position()
        step.metrics.update(phases.async_metrics(taken.lags, taken.dropped, feed.in_flight(), loads_in_flight))
        phases.log_step(run, timer, step, trained, synced, staleness=max(taken.lags))
        rescale(run, feed.busy(), FleetLoad.of(timer))  # the fleet's size, between two syncs (loop/fleet.py)
        checkpoints.save_periodic(run)
        run.evaluate.after_step(progress.global_step)
    return phases.finish(run)


# loop.mode -> the loop (orchestrator/run/train.py picks one when the run starts)
LOOPS = {"sync": run_sync, "pipelined": run_pipelined, "async": run_async}
