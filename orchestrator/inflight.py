"""The pipelined loop: the same phases as `loop.run_sync`, overlapped.

While the learner trains on batch k, the generators produce batches k+1 .. k+max_staleness, and every
group goes to the reward pool the moment its completions exist (generators stream finished groups). The generators execute calls in the order
they were submitted, so a weight sync submitted after step k lands before any generation submitted after it:
a batch's policy_version is known when it is submitted. Admission rule: a batch more than max_staleness steps
behind the learner is dropped, never trained on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import ray

from orchestrator.build import Run
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
from orchestrator.ops.metrics import PhaseTimer


@dataclass
class Part:
    """One generator call of a batch: its prompt rows and the stream of finished groups it yields."""

    rows: list[dict[str, Any]]
    stream: Any  # ray ObjectRefGenerator of Generator.generate_stream
    done: bool = False
    seconds: float = 0.0  # generator-busy seconds so far


@dataclass
class InFlight:
    """One batch on its way: generation streams, and the scoring of every piece they have yielded."""

    policy_version: int
    parts: list[Part]
    # (Rollouts, ObjectRef of pool.score) per piece the generators have yielded
    scored: list[tuple[Any, Any]] = field(default_factory=list)

    def generating(self) -> bool:
        return not all(p.done for p in self.parts)


def submit_batch(run: Run) -> InFlight:
    """Submit one step's generation: rows split over the generators (generation_chunks calls each), every
    call a stream of groups as they finish."""
    g = run.cfg.generation
    rows = run.prompts.next_batch(g.generation_batch_size // g.num_generations)
    handles = run.generators.handles
    n_parts = min(len(rows), len(handles) * run.cfg.loop.generation_chunks)
    bounds = [len(rows) * i // n_parts for i in range(n_parts + 1)]
    parts = []
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        call = handles[i % len(handles)].generate_stream.options(num_returns="streaming")
        parts.append(
            Part(rows[lo:hi], call.remote([r["prompt_ids"] for r in rows[lo:hi]], **sampling_kwargs(run)))
        )
    return InFlight(run.policy_version, parts)


def pump(run: Run, inflight: deque[InFlight], until: Any | None = None) -> None:
    """Send every group the generators have finished to the reward pool; return once `until` is ready (or,
    with until=None, once the oldest batch is fully generated)."""
    while True:
        if until is None and not inflight[0].generating():
            return
        live = {p.stream: (b, p) for b in inflight for p in b.parts if not p.done}
        ready, _ = ray.wait(list(live) + ([until] if until is not None else []), num_returns=1)
        if until is not None and ready[0] is until:
            return
        batch, part = live[ready[0]]
        try:
            out = ray.get(next(part.stream))
        except StopIteration:
            part.done = True
            continue
        part.seconds = out["seconds"]
        rows = [part.rows[i] for i, _ in out["groups"]]
        r = to_rollouts(run, rows, [samples for _, samples in out["groups"]], batch.policy_version)
        batch.scored.append((r, score_request(run, r)))


def collect(batch: InFlight) -> tuple[Any, dict[str, Any]]:
    """The batch's rollouts and scores, joined (in the order the groups finished)."""
    scored = ray.get([ref for _, ref in batch.scored])
    scored[-1]["generate_s"] = sum(p.seconds for p in batch.parts)
    out = (batch.scored[0][0], scored[0])
    for (r, _), s in zip(batch.scored[1:], scored[1:], strict=True):
        out = join(out, (r, s))
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
        # Admission rule (defensive: the schedule keeps it).
        if run.global_step - rollouts.policy_version > lag:
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
