"""The pipelined loop's bookkeeping: batches on their way from the generators to the reward pool.

While the learner trains on batch k, the generators produce batches k+1 .. k+max_staleness, and every group goes
to the reward pool the moment its completions exist (generators stream finished groups). The generators execute
calls in the order they were submitted, so a weight sync submitted after step k lands before any generation
submitted after it: a batch's policy_version is known when it is submitted. Agentic rollouts carry it as their
min_version (weight loads run between engine steps, not behind the call), and their batch's policy_version is
then the oldest model token's (orchestrator/data/sources.py to_rollouts).
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ray.exceptions import RayActorError

from actors.runtime.group import Pending, Stream
from actors.types import FinishedOuts, Rollouts, Scores
from orchestrator.data.sources import DataPosition, Prompt
from orchestrator.loop.phases import recover_generators, rollouts_of, seeds_of, submit_score
from orchestrator.run.state import Run


@dataclass
class Part:
    """One generator call of a batch: its prompts and the stream of finished groups it yields."""

    prompts: list[Prompt]
    seeds: list[int]  # one per prompt
    stream: Stream[FinishedOuts]
    done: bool = False
    seconds: float = 0.0  # generator-busy seconds so far
    yielded: set[int] = field(default_factory=set)  # indices into prompts of the groups it has yielded


def _stream(run: Run, batch_version: int, member: int, prompts: list[Prompt],
            seeds: list[int]) -> Stream[FinishedOuts]:
    return run.rollout.stream(run.generators, member, prompts, seeds, run.sampling, batch_version)


@dataclass
class InFlight:
    """One batch on its way: generation streams, and the scoring of every piece they have yielded."""

    policy_version: int
    parts: list[Part]
    mark: DataPosition  # the prompt stream's position before this batch drew its prompts
    draws: range  # the draw indices of its prompts
    scored: list[tuple[Rollouts, Pending[Scores]]] = field(default_factory=list)  # per piece yielded so far

    def generating(self) -> bool:
        return not all(p.done for p in self.parts)


@dataclass
class Generated:
    """A batch, generated and scored: its groups in the order they finished."""

    rollouts: Rollouts
    scores: Scores
    generate_s: float  # the generators' busy seconds on it


def submit_batch(run: Run) -> InFlight:
    """Submit one step's generation: prompts split over the generators (loop.generation_chunks calls each), every
    call a stream of groups as they finish."""
    mark = run.prompts.state()
    prompts = run.prompts.next_batch(run.prompts_per_step)
    version = run.progress.policy_version
    seeds = seeds_of(run, prompts, version)
    shards = run.generators.shards(len(prompts), parts=run.generators.active * run.cfg.loop.generation_chunks)
    parts = [Part(prompts[s], seeds[s], _stream(run, version, m, prompts[s], seeds[s])) for m, s in shards]
    return InFlight(version, parts, mark, range(mark.served, run.prompts.served))


def busy(inflight: deque[InFlight]) -> set[int]:
    """The generators that run a part of a batch in flight or made groups of one not trained yet."""
    return {p.stream.member for b in inflight for p in b.parts}


def untrained_position(run: Run, inflight: deque[InFlight]) -> DataPosition | None:
    """The prompt stream's position a checkpoint keeps: that of the next batch to train, the oldest in flight (a
    resumed run generates it and the batches after it again), or None when none is in flight (the stream's own)."""
    if not inflight:
        return None
    return run.prompts.untrained_position(inflight[0].mark, [b.draws for b in inflight])


def read_next(run: Run, part: Part, training: bool,
              restream: Callable[[int, list[Prompt], list[int]], Stream[FinishedOuts]]) -> FinishedOuts | None:
    """The part's next finished groups (recorded as yielded), or None: its stream ended (part.done), or its
    generator died, and once the generators are back (restarted and re-synced, once per death however many parts
    it cut) its groups not yet yielded were submitted again on the same generator (`restream(member, prompts,
    seeds)`), or on another where it was lost with its node (phases.go_on_without). training: a train step is in
    flight (the learner's weights are the step after it)."""
    try:
        out = part.stream.next()
    except StopIteration:
        part.done = True
        return None
    except RayActorError:
        if run.cfg.cluster.generator_max_restarts == 0:
            raise
        if part.stream.epoch == run.generators.restarts:
            recover_generators(run, training)
        left = [i for i in range(len(part.prompts)) if i not in part.yielded]
        part.prompts, part.seeds = [part.prompts[i] for i in left], [part.seeds[i] for i in left]
        part.yielded = set()
        member = part.stream.member  # None: its generator was lost with its node, the work goes to another
        part.stream = restream(member if member is not None else run.generators.substitute(), part.prompts,
                               part.seeds)
        return None
    part.yielded.update(o.index for o in out.groups)
    part.seconds = out.seconds
    run.engines.observe(part.stream.member, out.engine)
    return out


def pump(run: Run, inflight: deque[InFlight], until: Pending[Any] | None = None) -> float:
    """Send every group the generators have finished to the reward pool; return once `until` is done (or, with
    until=None, once the oldest batch is fully generated), with the seconds of it in which nothing was generating
    (every batch in flight generated: the generators idle)."""
    idle_from = None
    while True:
        if until is None and not inflight[0].generating():
            return 0.0
        owner = {id(p.stream): (b, p) for b in inflight for p in b.parts if not p.done}
        if not owner and idle_from is None:
            idle_from = time.monotonic()
        ready = run.generators.next_ready([p.stream for _, p in owner.values()], until)
        if ready is None:
            return time.monotonic() - idle_from if idle_from is not None else 0.0
        batch, part = owner[id(ready)]
        out = read_next(run, part, until is not None, functools.partial(_stream, run, batch.policy_version))
        if out is None:
            continue
        prompts = [part.prompts[o.index] for o in out.groups]
        r = rollouts_of(run, prompts, out.groups, batch.policy_version)
        batch.scored.append((r, submit_score(run, r)))


def collect(batch: InFlight) -> Generated:
    """The batch's rollouts and scores, joined in the order the groups finished."""
    scores = [p.result() for _, p in batch.scored]
    rollouts = functools.reduce(Rollouts.concat, [r for r, _ in batch.scored])
    return Generated(rollouts, functools.reduce(Scores.concat, scores), sum(p.seconds for p in batch.parts))
