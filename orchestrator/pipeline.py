"""The pipelined loop: the same phases as `loop.run_sync`, overlapped.

While the learner trains on batch k, the generators produce batches k+1 .. k+max_staleness, and every
generated sub-batch goes to the reward pool the moment it exists. The generators execute calls in the order
they were submitted, so a weight sync submitted after step k lands before any generation submitted after it:
a batch's policy_version is known when it is submitted. Admission rule: a batch more than max_staleness steps
behind the learner is dropped, never trained on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import ray

from orchestrator.loop import (
    advantages,
    join,
    log_step,
    maybe_checkpoint,
    reward_state,
    sampling_kwargs,
    score_request,
    to_rollouts,
)
from orchestrator.metrics import PhaseTimer
from orchestrator.run import Run


@dataclass
class InFlight:
    """One batch on its way: generation sub-batches, then their scoring, in submission order."""

    policy_version: int
    parts: list[tuple[list[dict[str, Any]], Any]]  # (rows, ObjectRef of generate output)
    rollouts: dict[int, Any] = field(default_factory=dict)  # part index -> Rollouts
    scores: dict[int, Any] = field(default_factory=dict)  # part index -> ObjectRef of pool.score
    generate_s: float = 0.0  # generator-busy seconds summed over the parts

    def unscored(self) -> list[Any]:
        return [ref for i, (_, ref) in enumerate(self.parts) if i not in self.rollouts]


def submit_batch(run: Run) -> InFlight:
    """Submit one step's generation, cut into sub-batches spread round-robin over the generators."""
    g = run.cfg.generation
    rows = run.prompts.next_batch(g.generation_batch_size // g.num_generations)
    handles = run.generators.handles
    n_parts = min(len(rows), len(handles) * run.cfg.loop.generation_chunks)
    bounds = [len(rows) * i // n_parts for i in range(n_parts + 1)]
    parts = []
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        ref = handles[i % len(handles)].generate_timed.remote([r["prompt_ids"] for r in rows[lo:hi]], **sampling_kwargs(run))
        parts.append((rows[lo:hi], ref))
    return InFlight(run.policy_version, parts)


def pump(run: Run, inflight: deque[InFlight], until: Any | None = None) -> None:
    """Send every finished generation sub-batch to the reward pool; return once `until` is ready (or, with
    until=None, once the oldest batch is fully generated)."""
    while True:
        waiting = {ref: (b, i) for b in inflight for i, (_, ref) in enumerate(b.parts) if i not in b.rollouts}
        if until is None and not inflight[0].unscored():
            return
        targets = list(waiting) + ([until] if until is not None else [])
        ready, _ = ray.wait(targets, num_returns=1)
        if until is not None and ready[0] is until:
            return
        batch, i = waiting[ready[0]]
        out = ray.get(ready[0])
        batch.generate_s += out["seconds"]
        r = to_rollouts(run, batch.parts[i][0], out["groups"], batch.policy_version)
        batch.rollouts[i] = r
        batch.scores[i] = score_request(run, r)


def collect(batch: InFlight) -> tuple[Any, dict[str, Any]]:
    """The batch's rollouts and scores, joined in submission order."""
    scored = ray.get([batch.scores[i] for i in range(len(batch.parts))])
    scored[-1]["generate_s"] = batch.generate_s
    out = (batch.rollouts[0], scored[0])
    for i in range(1, len(batch.parts)):
        out = join(out, (batch.rollouts[i], scored[i]))
    return out


def run_pipelined(run: Run) -> list[dict[str, Any]]:
    """Pipelined GRPO: up to max_staleness batches generated ahead of the one being trained."""
    lag, max_steps = run.cfg.loop.max_staleness, run.cfg.grpo.max_steps
    per_batch = run.cfg.grpo.num_iterations
    inflight: deque[InFlight] = deque()
    submitted = run.global_step // per_batch
    while run.global_step < max_steps and not run.stop_requested:
        timer = PhaseTimer()
        while len(inflight) <= lag and submitted < max_steps // per_batch:
            inflight.append(submit_batch(run))
            submitted += 1
        with timer("wait_rollouts"):  # learner idle: the next batch is not generated and scored yet
            pump(run, inflight)
            rollouts, scored = collect(inflight.popleft())
        if run.global_step - rollouts.policy_version > lag:  # admission rule (defensive: the schedule keeps it)
            run.extras["dropped_stale"] = run.extras.get("dropped_stale", 0) + 1
            continue
        rollouts, scored, filter_m = run.select_groups(run, rollouts, scored, timer)
        batch, reward_m = advantages(run, rollouts, scored)
        reward_m.update(filter_m)
        reward_m["policy_staleness"] = run.global_step - rollouts.policy_version
        with timer("train"):
            (learner,) = run.learner.handles
            train_ref = learner.train_step.remote(batch, reward_state=reward_state(run))
            pump(run, inflight, until=train_ref)  # keep scoring what the generators finish meanwhile
            train_m = ray.get(train_ref)
        run.global_step = int(train_m["global_step"])
        with timer("sync"):  # submitted, not awaited: it queues behind generation already submitted
            blob = learner.export_weights.remote()
            run.extras["last_sync"] = [g.load_weights.remote(blob) for g in run.generators.handles]
            run.policy_version = run.global_step
        reward_m["time/generate_busy"] = scored.get("generate_s", 0.0)
        log_step(run, timer, rollouts, reward_m, train_m)
        maybe_checkpoint(run)
    ray.get(run.extras.get("last_sync", []))
    if not run.stop_requested:
        maybe_checkpoint(run, final=True)
    return run.logger.history
