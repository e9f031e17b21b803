"""The pipelined loop's bookkeeping: batches on their way from the generators to the reward pool.

While the learner trains on batch k, the generators produce batches k+1 .. k+max_staleness, and every group goes
to the reward pool the moment its completions exist (generators stream finished groups). The generators execute
calls in the order they were submitted, so a weight sync submitted after step k lands before any generation
submitted after it: a batch's policy_version is known when it is submitted.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors.types import FinishedGroups, Rollouts, Scores
from orchestrator.build import Run
from orchestrator.phases import restart_generators, rollouts_of, sampling_kwargs, score_request


@dataclass
class Part:
    """One generator call of a batch: its prompt rows and the stream of finished groups it yields."""

    rows: list[dict[str, Any]]
    stream: Any  # ray ObjectRefGenerator of Generator.generate_stream
    generator: int  # index of the generator it runs on
    epoch: int  # run.generator_restarts when it was submitted
    done: bool = False
    seconds: float = 0.0  # generator-busy seconds so far
    yielded: set[int] = field(default_factory=set)  # indices into rows of the groups it has yielded


def _stream(run: Run, generator: int, rows: list[dict[str, Any]]) -> Any:
    call = run.generators.handles[generator].generate_stream.options(num_returns="streaming")
    return call.remote([r["prompt_ids"] for r in rows], **sampling_kwargs(run.cfg))


@dataclass
class InFlight:
    """One batch on its way: generation streams, and the scoring of every piece they have yielded."""

    policy_version: int
    parts: list[Part]
    # (Rollouts, ObjectRef of its Scores) per piece the generators have yielded
    scored: list[tuple[Rollouts, Any]] = field(default_factory=list)

    def generating(self) -> bool:
        return not all(p.done for p in self.parts)


def submit_batch(run: Run) -> InFlight:
    """Submit one step's generation: rows split over the generators (generation_chunks calls each), every
    call a stream of groups as they finish."""
    rows = run.prompts.next_batch(run.prompts_per_step)
    handles = run.generators.handles
    n_parts = min(len(rows), len(handles) * run.cfg.loop.generation_chunks)
    bounds = [len(rows) * i // n_parts for i in range(n_parts + 1)]
    parts = []
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        g = i % len(handles)
        parts.append(Part(rows[lo:hi], _stream(run, g, rows[lo:hi]), g, run.generator_restarts))
    return InFlight(run.policy_version, parts)


def _resume(run: Run, part: Part) -> None:
    """A part whose generator died: once the generator is back (restarted and re-synced, once per death however
    many parts it cuts), its groups not yet yielded are generated again on it."""
    if part.epoch == run.generator_restarts:
        restart_generators(run)
    part.rows = [r for i, r in enumerate(part.rows) if i not in part.yielded]
    part.yielded, part.epoch = set(), run.generator_restarts
    part.stream = _stream(run, part.generator, part.rows)


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
            out: FinishedGroups = ray.get(next(part.stream))
        except StopIteration:
            part.done = True
            continue
        except RayActorError:
            if run.cfg.cluster.generator_max_restarts == 0:
                raise
            _resume(run, part)
            continue
        part.yielded.update(i for i, _ in out.groups)
        part.seconds = out.seconds
        rows = [part.rows[i] for i, _ in out.groups]
        r = rollouts_of(run.cfg, rows, [samples for _, samples in out.groups], batch.policy_version)
        batch.scored.append((r, score_request(run, r)))


def collect(run: Run, batch: InFlight) -> tuple[Rollouts, Scores, float]:
    """The batch's rollouts and scores, joined in the order the groups finished, and the generators' busy
    seconds on it."""
    scores = ray.get([ref for _, ref in batch.scored])
    rollouts = functools.reduce(Rollouts.concat, [r for r, _ in batch.scored])
    return rollouts, functools.reduce(Scores.concat, scores), sum(p.seconds for p in batch.parts)
