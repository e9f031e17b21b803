"""The two training loops: one call per phase on the run's named groups (orchestrator/phases.py), each timed.
Which loop runs is chosen once, when the run starts (loop.mode)."""

from __future__ import annotations

from collections import deque
from typing import Any

import ray

from orchestrator import phases
from orchestrator.build import Run
from orchestrator.inflight import InFlight, collect, pump, submit_batch
from orchestrator.telemetry.metrics import PhaseTimer


def run_sync(run: Run) -> list[dict[str, Any]]:
    """Synchronous GRPO: generate -> score -> advantages -> train -> sync, one step at a time; held-out evals
    between steps (orchestrator/evaluator.py)."""
    run.evaluate.start(run.global_step)
    while not phases.done(run):
        timer = PhaseTimer()
        rows = run.prompts.next_batch(run.prompts_per_step)
        with timer("generate"):
            rollouts = phases.generate(run, rows)
        with timer("reward"):
            scores = phases.score(run, rollouts)
        rollouts, scores, select_m = run.select(rollouts, scores, phases.refill(run, timer))
        batch, reward_m, table = phases.advantages(run, rollouts, scores)
        with timer("train"):
            train_m = phases.train(run, batch)
        with timer("sync"):
            sync_m = phases.sync(run)
        phases.log_step(run, timer, rollouts, scores, table, {**reward_m, **select_m, **train_m, **sync_m})
        phases.maybe_checkpoint(run)
        run.evaluate.after_step(run.global_step)  # the synced weights, on the idle generators
    return phases.finish(run)


def run_pipelined(run: Run) -> list[dict[str, Any]]:
    """Pipelined GRPO: up to max_staleness batches generated (and scored, group by group) ahead of the one being
    trained. Admission rule: a batch more than max_staleness steps behind the learner is never trained on."""
    lag, per_batch = run.cfg.loop.max_staleness, run.cfg.grpo.num_iterations
    batches = run.cfg.grpo.max_steps // per_batch
    inflight: deque[InFlight] = deque()
    submitted, dropped = run.global_step // per_batch, 0
    run.evaluate.start(run.global_step)  # queued on the generators ahead of the first batches
    while not phases.done(run):
        timer = PhaseTimer()
        while len(inflight) <= lag and submitted < batches:
            inflight.append(submit_batch(run))
            submitted += 1
        with timer("wait_rollouts"):  # learner idle: the next batch is not generated and scored yet
            pump(run, inflight)
            rollouts, scores, generate_s = collect(run, inflight.popleft())
        if run.global_step - rollouts.policy_version > lag:  # defensive: the schedule above keeps the rule
            dropped += 1
            continue
        rollouts, scores, select_m = run.select(rollouts, scores, phases.refill(run, timer))
        batch, reward_m, table = phases.advantages(run, rollouts, scores)
        staleness = run.global_step - rollouts.policy_version
        with timer("train"):
            train_ref = phases.submit_train(run, batch)
            pump(run, inflight, until=train_ref)  # keep scoring what the generators finish meanwhile
            result = ray.get(train_ref)
        run.global_step, train_m = result.global_step, phases.train_metrics(result)
        with timer("sync"):  # submitted, not awaited: it queues behind generation already submitted
            sync_m = phases.sync_async(run)
        m = {**reward_m, **select_m, **train_m, **sync_m, "policy_staleness": staleness,
             "time/generate_busy": generate_s, "pipeline/dropped_stale_batches": dropped}
        phases.log_step(run, timer, rollouts, scores, table, m)
        phases.maybe_checkpoint(run)
        run.evaluate.after_step(run.global_step)  # queued behind the sync: the new weights; finished later
    return phases.finish(run)
