"""The async loop's bookkeeping: generation that never waits for a batch boundary.

The pipelined loop submits whole batches, so each batch's long tail (its few longest completions) runs on engines
that are nearly empty. Here the generators are kept fed instead: small calls of `call_prompts` prompts each, with
no min_version (a call samples with whatever weights its engine holds, and every token records the version that
sampled it: a weight load lands between two engine steps, and the running sequences go on from the same ids, their
KV cache recomputed under the new weights (AReaL) or kept (PipelineRL, prime-rl): generation.kv_after_update).
Finished groups stream to the reward pool as they finish; the learner takes the next batch from the groups that
are scored, oldest first, whatever call they came from.

Admission keeps staleness bounded: at most `capacity` prompts are in flight or waiting (the batch being taken and
`max_staleness // num_iterations` batches ahead), and a group whose oldest token is more than `max_staleness`
optimizer steps behind the learner when it is taken is dropped and counted (a completion that ran across many
updates). A checkpoint keeps the prompt stream's position with every untrained draw (in flight, waiting or not yet
yielded) served again on resume: nothing is lost or trained twice, but which weights sample a replayed prompt
depends on timing, so an async resume is not bit-exact (the sync and pipelined loops' are).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from actors.runtime.group import Pending, Stream
from actors.types import FinishedOuts, Rollouts, Scores
from orchestrator.data.sources import DataPosition, Prompt
from orchestrator.loop.inflight import Part, read_next
from orchestrator.loop.phases import rollouts_of, seeds_of, submit_score
from orchestrator.run.state import Run


@dataclass(frozen=True)
class FeedShape:
    """How the feed keeps the generators busy: `capacity` prompts in flight or waiting (this step's batch and
    max_staleness // num_iterations batches ahead: what is submitted after a sync is trained within max_staleness
    steps), calls of `call_prompts` prompts (a step's prompts over generators x generation_chunks), and at most
    `calls_per_generator` of them on one generator at once (its actor's concurrency: their requests share its
    engine's batch)."""

    capacity: int
    call_prompts: int
    calls_per_generator: int


def feed_shape(prompts_per_step: int, generators: int, generation_chunks: int, max_staleness: int,
               num_iterations: int) -> FeedShape:
    capacity = (1 + max_staleness // num_iterations) * prompts_per_step
    call_prompts = max(1, prompts_per_step // (generators * generation_chunks))
    calls = -(-capacity // call_prompts)  # ceil
    # +1: a generator may be handed one more call while its last one yields its final groups
    return FeedShape(capacity, call_prompts, -(-calls // generators) + 1)


@dataclass(kw_only=True)
class Call(Part):
    """One generator call of the feed (a pipelined batch's Part: its prompts and the stream of its finished groups),
    and which of its draws are not trained yet (a checkpoint replays those)."""

    version: int  # the learner's step when it was submitted: its seeds' (the tokens carry their own versions)
    mark: DataPosition  # the prompt stream's position before its prompts were drawn
    untrained: set[int]  # draw indices neither trained nor dropped

    @property
    def member(self) -> int | None:
        """The generator running it (None: lost with its node; its rest goes to another when read)."""
        return self.stream.member

    @property
    def waiting(self) -> int:
        """Prompts still generating."""
        return 0 if self.done else len(self.prompts) - len(self.yielded)


@dataclass
class Piece:
    """Groups that finished at one engine step of one call, on their way through the reward pool."""

    call: Call
    rollouts: Rollouts
    pending: Pending[Scores] | None
    scores: Scores | None = None

    def result(self) -> Scores:
        if self.scores is None:
            assert self.pending is not None
            self.scores, self.pending = self.pending.result(), None
        return self.scores


@dataclass
class Taken:
    """One step's batch from the feed, and what it says about the generation behind it."""

    rollouts: Rollouts
    scores: Scores
    lags: list[int]  # per sample: optimizer steps between its oldest token's weights and the learner's
    dropped: int  # groups dropped as too stale while this batch was taken


class Feed:
    """The generators kept fed (see the module docstring)."""

    def __init__(self, run: Run, capacity: int, call_prompts: int):
        """capacity, call_prompts: `feed_shape`'s. The call size stays when `rayward scale --generators` resizes the
        fleet: calls of another size would end mid-step, and the rest of a call cut by a step's batch waits for the
        next one, its oldest tokens a sync older each time (dropped as too stale, step after step)."""
        self.run, self.capacity, self.call_prompts = run, capacity, call_prompts
        self.calls: deque[Call] = deque()
        self.pieces: deque[Piece] = deque()
        self.dropped_total = 0
        self.dealt: dict[int, int] = {}  # calls submitted to each generator so far

    # --- what is in flight ----------------------------------------------------------------------------------

    def in_flight(self) -> int:
        """Prompts generating or generated and not yet taken: what admission bounds."""
        return sum(c.waiting for c in self.calls) + sum(p.rollouts.num_groups for p in self.pieces)

    def generating(self) -> bool:
        return any(not c.done for c in self.calls)

    def _load(self, member: int) -> int:
        return sum(c.waiting for c in self.calls if c.member == member)

    # --- feeding ------------------------------------------------------------------------------------------------

    def top_up(self) -> None:
        """Submit calls until `capacity` prompts are in flight (or what the run's remaining steps will train),
        each to the generator with the fewest waiting."""
        run = self.run
        steps_left = -(-(run.cfg.grpo.max_steps - run.progress.global_step) // run.cfg.grpo.num_iterations)
        want = min(self.capacity, steps_left * run.prompts_per_step)
        active = run.generators.active
        self.dealt = {m: n for m, n in self.dealt.items() if m < active}  # a removed engine's index: a new one's
        while (room := want - self.in_flight()) > 0:
            n = min(self.call_prompts, room)
            mark = run.prompts.state()
            prompts = run.prompts.next_batch(n)
            version = run.progress.policy_version
            seeds = seeds_of(run, prompts, version)
            # never a retiring one (orchestrator/loop/fleet.py); of engines equally loaded, the one dealt fewest
            # calls: an engine that joined idle gets work even where the others keep up
            member = min(range(active), key=lambda m: (self._load(m), self.dealt.get(m, 0)))
            self.dealt[member] = self.dealt.get(member, 0) + 1
            self.calls.append(Call(prompts, seeds, self._stream(member, prompts, seeds),
                                   version=version, mark=mark, untrained={p.draw for p in prompts}))

    def _stream(self, member: int, prompts: list[Prompt], seeds: list[int]) -> Stream[FinishedOuts]:
        run = self.run
        return run.rollout.stream(run.generators, member, prompts, seeds, run.sampling, None)  # type: ignore[arg-type]

    def pump(self, *, until: Pending[Any] | None = None, groups: int | None = None) -> float:
        """Send every group the generators finish to the reward pool; return once `until` is done, or once at
        least `groups` groups have finished and wait to be taken (or nothing is generating), with the seconds of
        it in which nothing was generating (every call admitted done: the engines idle)."""
        run = self.run
        while True:
            if groups is not None and (self._waiting_groups() >= groups or not self.generating()):
                return 0.0
            live = {id(c.stream): c for c in self.calls if not c.done}
            if not live:
                t0 = time.monotonic()
                if until is not None:
                    until.result()
                return time.monotonic() - t0
            ready = run.generators.next_ready([c.stream for c in live.values()], until)
            if ready is None:
                return 0.0
            call = live[id(ready)]
            out = read_next(run, call, until is not None, self._stream)
            if out is None:
                continue
            prompts = [call.prompts[o.index] for o in out.groups]
            r = rollouts_of(run, prompts, out.groups, call.version)
            self.pieces.append(Piece(call, r, submit_score(run, r)))

    def busy(self) -> set[int]:
        """The generators whose calls run or whose groups are not trained yet (a retiring one leaves after)."""
        return {c.member for c in self.calls if not c.done or c.untrained}

    def _waiting_groups(self) -> int:
        return sum(p.rollouts.num_groups for p in self.pieces)

    # --- taking a batch -----------------------------------------------------------------------------------------

    def take(self, num_groups: int, global_step: int, max_staleness: int) -> Taken:
        """The next `num_groups` scored groups, oldest first (the feed pumped until there are that many); a group
        more than `max_staleness` steps behind `global_step` is dropped and counted instead."""
        parts: list[tuple[Rollouts, Scores]] = []
        have, dropped = 0, 0
        while have < num_groups:
            if not self.pieces:  # stale groups dropped: more prompts in, and wait for one to finish
                self.top_up()
                self.pump(groups=1)
            if not self.pieces:
                raise RuntimeError("the async feed ran dry: no prompt left in flight (the prompt source is empty?)")
            piece = self.pieces[0]
            scores = piece.result()
            r, g = piece.rollouts, piece.rollouts.group_size
            fresh = [k for k in range(r.num_groups) if global_step - group_version(r, k) <= max_staleness]
            stale = [k for k in range(r.num_groups) if k not in fresh]
            dropped += len(stale)
            self._forget(piece.call, r, stale)
            use = fresh[: num_groups - have]
            if use:
                parts.append((r.take_groups(use), scores.take_groups(use, g)))
                self._forget(piece.call, r, use)
                have += len(use)
            rest = fresh[len(use):]
            if rest:  # the rest of the piece waits for the next step
                piece.rollouts, piece.scores = r.take_groups(rest), scores.take_groups(rest, g)
            else:
                self.pieces.popleft()
        self._retire()
        self.dropped_total += dropped
        rollouts, scores = parts[0]
        for r, s in parts[1:]:
            rollouts, scores = rollouts.concat(r), scores.concat(s)
        lags = [global_step - (i.version if i.version is not None else rollouts.policy_version)
                for i in rollouts.infos]
        return Taken(rollouts, scores, lags, dropped)

    def _forget(self, call: Call, r: Rollouts, groups: list[int]) -> None:
        """These groups' draws are trained or dropped: a checkpoint no longer replays them."""
        if r.prompt_index is not None:
            call.untrained.difference_update(r.prompt_index[k * r.group_size] for k in groups)

    def _retire(self) -> None:
        while self.calls and self.calls[0].done and not self.calls[0].untrained:
            self.calls.popleft()

    def untrained_position(self) -> DataPosition | None:
        """The prompt stream's position a checkpoint keeps: every draw not yet trained served again (None: nothing
        in flight, the stream's own position)."""
        live = [c for c in self.calls if c.untrained]
        if not live:
            return None
        draws = sorted(d for c in live for d in c.untrained)
        return self.run.prompts.untrained_position(live[0].mark, [range(d, d + 1) for d in draws])


def group_version(r: Rollouts, k: int) -> int:
    """The weights of group k's oldest model token (the batch's policy_version where its samples record none)."""
    versions = [i.version for i in r.infos[k * r.group_size:(k + 1) * r.group_size] if i.version is not None]
    return min(versions, default=r.policy_version)
