"""RewardPool: the named actor that owns a run's reward workers and spreads scoring over them.

One per run, named `<run>/reward-pool` in the run's namespace, so `rayward scale` (or any driver) can find it
and resize it while the run trains (a run whose eval has rewards of its own has a second one,
`<run>/eval-reward-pool`, with role "eval-reward": workers `<run>/eval-reward-<i>`). A batch is cut into chunks of whole
groups; each chunk goes to the least-loaded live worker; results come back in batch order. A worker that dies mid-chunk
is replaced and its chunks are re-run elsewhere, so every sample is scored exactly once (the dead worker's result never
arrives). Retiring a worker (scale down) waits for its in-flight chunks before killing it.

A new worker counts as capacity only once it is alive: on an autoscaling Ray cluster a worker that asks for
resources no node has yet (`cluster.reward_worker.resources`) waits for the cluster autoscaler to start a node,
and meanwhile scoring goes on on the live workers. With `autoscale` settings the pool sizes itself
(actors/runtime/autoscale.py: a pure policy, sampled by a periodic task here and at every batch arrival);
`scale(n)` pins the count (autoscaling paused), `set_bounds(min, max)` resumes it. Every change of the
target is printed with its reason (the driver shows the pool's output) and kept in `decision_log()`. That
machinery (membership, replacement, scaling, metrics, stats) is the pool base's, shared with the environment
pool: actors/runtime/pool.py.

Judge rewards and the distillation teacher are stages beside the workers (actors/rewards/stages.py), chosen
when the pool is built: a batch's chunks go out to the workers, each stage hears of the batch, its chunks and
their scores, and adds its own to the merged scores.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from actors.rewards.stages import StageRun, reward_stages
from actors.rewards.worker import RewardSpec, RewardWorker
from actors.runtime.autoscale import AutoscaleSettings
from actors.runtime.pool import PoolKind, PoolUnits, Slot, WorkerPool
from actors.types import RewardBatch, RewardPoolStats, Scores, TrainerState

# Chunks a worker holds at once: 2 hides the dispatch round-trip without hoarding work a new worker could take.
CHUNKS_PER_WORKER = 2
# Worker calls per worker slot a batch is cut into (see RewardPool.chunks_per_call): 2 rounds leave the last
# round for load balancing (a slow worker's second call goes to whoever is free) at a quarter of the calls.
CALLS_PER_SLOT = 2
# Beyond the rewards' own timeouts, how long a chunk may take before its worker is presumed hung and replaced
# (covers a worker still importing at start-up, or one stuck in C code holding the GIL).
CHUNK_GRACE_S = 120.0

REWARD_POOL = PoolKind(
    noun="reward pool", pin_flag="--reward-workers", bounds_flag="--min/--max", metrics="reward",
    units=PoolUnits(
        unit="chunk", workers="reward workers", queued="chunks waiting for a worker", inflight="chunks being scored",
        latency="seconds to score one chunk", events="timeouts, errors, retries",
        wait="seconds a chunk waited for a worker (mean of one worker call's chunks)",
    ),
)


@dataclass
class _Batch:
    """One `score` call while its chunks go out: the chunks, the state they are scored under, when the batch
    arrived, the indices of chunks not sent yet (in order; a failed call's go back to the front), per chunk
    its result and the seconds it waited for a worker, and the pool's stages' runs over it."""

    chunks: list[RewardBatch]
    state: TrainerState
    arrived: float
    queue: deque[int] = field(init=False)
    results: list[Scores | None] = field(init=False)
    waits: list[float] = field(init=False)
    stages: list[StageRun] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.queue = deque(range(len(self.chunks)))
        self.results = [None] * len(self.chunks)
        self.waits = [0.0] * len(self.chunks)


class RewardPool(WorkerPool[Slot, RewardPoolStats]):
    KIND = REWARD_POOL
    STATS = RewardPoolStats

    def __init__(
        self,
        specs: list[RewardSpec],
        *,
        run_name: str,
        num_workers: int,
        worker_options: dict[str, Any],
        sys_path: list[str] | None = None,
        trainer_state: TrainerState | None = None,
        autoscale: AutoscaleSettings | None = None,
        role: str = "reward",
        chunk_grace_s: float = CHUNK_GRACE_S,
        judges: dict[str, Any] | None = None,
        teacher: Any = None,
    ):
        """`num_workers` at start (clamped to the autoscaling bounds when `autoscale` is given). role: the
        workers are named `<run_name>/<role>-<i>`, and the pool's Ray metrics carry it as the `pool` tag, so
        two pools of one run stay apart. chunk_grace_s: how long past its rewards' timeouts a chunk may take
        before its worker counts as hung (the run's cluster.hang_timeout_s). judges: per judge reward (a spec
        with `judge`), the handle of its judge pool (actors/engines/pool.py). teacher: the distillation teacher's
        pool (a TeacherPool's handle): the chunks of a batch that carries prompt_ids (a training batch; an eval's
        carries none) go to it as they arrive, and the scores carry its log-probs."""
        self.specs = specs
        self.sys_path = sys_path or []
        self.state = trainer_state or TrainerState()
        self.inflight_chunks = 0
        self.stages = reward_stages(specs, judges, teacher)
        # The chunk timeout: every worker reward's own bound (they run concurrently) plus grace.
        self.chunk_timeout_s = max((s.timeout_s for s in specs if s.judge is None), default=0.0) + chunk_grace_s
        super().__init__(run_name=run_name, role=role, num_workers=num_workers, worker_options=worker_options,
                         autoscale=autoscale, counters=("chunks", "retries", "timeouts", "errors"))

    def __repr__(self) -> str:
        # Ray captures an actor's repr once (the dashboard's Repr column): only what never changes.
        return f"RewardPool(run={self.run_name!r}, role={self.role!r}, rewards={[s.name for s in self.specs]})"

    def _new_worker(self, index: int, name: str) -> Any:
        return (
            ray.remote(RewardWorker)
            .options(name=name, max_concurrency=CHUNKS_PER_WORKER, max_restarts=0, **self.worker_options)
            .remote(self.specs, index=index, trainer_state=self.state, sys_path=self.sys_path)
        )

    def _new_slot(self, i: int, handle: Any) -> Slot:
        return Slot(i, handle, time.monotonic())

    def _inflight_units(self) -> int:
        return self.inflight_chunks

    def _stats_fields(self) -> dict[str, Any]:
        return {"global_step": self.state.global_step}

    # --- scoring ----------------------------------------------------------------------------------------

    def _has_room(self) -> bool:
        return any(s.calls < CHUNKS_PER_WORKER for s in self._live())

    async def _acquire(self, wanted: Callable[[], bool]) -> Slot | None:
        """The least-loaded live worker with room for a call, or None once `wanted()` turns false (the batch
        has no chunks left to send)."""
        cond = self._cond()
        async with cond:
            await cond.wait_for(lambda: not wanted() or self._has_room())
            if not wanted():
                return None
            slot = min(self._live(), key=lambda s: s.calls)
            with self._load(slot):
                slot.calls += 1
        self._publish()
        return slot

    async def _release(self, slot: Slot) -> None:
        with self._load(slot):
            slot.calls -= 1
        self._publish()
        await self._notify(1)

    def chunks_per_call(self, remaining: int) -> int:
        """How many of a batch's `remaining` chunks the next worker call carries: about remaining / (worker
        slots x CALLS_PER_SLOT), so a batch goes out in a few calls per slot and calls shrink as it drains.
        Every Ray actor call costs the pool serial CPU; at one call per chunk, many workers finishing together
        queued behind each other's dispatch (bench/README.md, reward_scaling). Small tail calls keep load
        balancing, and workers added mid-batch still get work. A worker scores one chunk per slot at
        a time either way, so its concurrency does not change. Workers still starting count: sized by the live
        ones alone, the first live worker of a growing pool would take a quarter of a batch in one call and
        leave the others little to do once they are up."""
        slots = max(self.target(), 1) * CHUNKS_PER_WORKER
        return max(1, math.ceil(remaining / (slots * CALLS_PER_SLOT)))

    async def _send(self, batch: _Batch) -> None:
        """One of a batch's senders: while chunks are queued, take the next few and score them on a worker.
        A worker that dies or hangs is replaced and its chunks go back to the front of the queue."""
        queue = batch.queue
        while queue:
            slot = await self._acquire(lambda: bool(queue))
            if slot is None:
                return
            take = [queue.popleft() for _ in range(min(self.chunks_per_call(len(queue)), len(queue)))]
            self.queued -= len(take)
            self.inflight_chunks += len(take)
            if not queue:
                await self._notify()  # this batch's idle senders may stop waiting for a worker
            t0 = time.monotonic()
            try:
                out = await asyncio.wait_for(
                    slot.handle.score_chunks.remote([batch.chunks[i] for i in take], batch.state),
                    self.chunk_timeout_s * len(take),
                )
            except (RayActorError, asyncio.TimeoutError, GetTimeoutError) as err:
                # Its results, if they ever came, are dropped with the killed actor: nothing is scored twice.
                why = "died" if isinstance(err, RayActorError) else (
                    f"did not answer {len(take)} chunk(s) within {self.chunk_timeout_s * len(take):g} s (hung)")
                self.counters["retries"] += 1
                self.metrics.event("retry")
                queue.extendleft(reversed(take))
                self.inflight_chunks -= len(take)
                self.queued += len(take)
                self._peak = max(self._peak, self._outstanding())
                await self._release(slot)
                self._drop(slot, replace=not slot.retiring, why=why)
                await self._notify()
                continue
            self.inflight_chunks -= len(take)
            await self._release(slot)
            self.metrics.latency.observe((time.monotonic() - t0) / len(take))
            # A call's chunks run one after another on the worker: each waited for the ones before it too.
            before = 0.0
            for i, r in zip(take, out, strict=True):
                batch.results[i] = r
                batch.waits[i] = t0 - batch.arrived + before
                before += max(r.latency_s.values(), default=0.0)
                for stage in batch.stages:
                    stage.scored(batch.chunks[i], r)
            self.metrics.wait.observe(sum(batch.waits[i] for i in take) / len(take))

    async def score(self, batch: RewardBatch, chunk_groups: int = 1, state: TrainerState | None = None) -> Scores:
        """Score a batch in chunks of `chunk_groups` whole groups; the scores come back in batch order.
        state: the trainer_state the reward functions see (an eval: the evaluated step); default the pool's."""
        # Every chunk of this batch sees the step current at dispatch.
        b = _Batch(batch.chunks(batch.group_size * chunk_groups), state or self.state, time.monotonic())
        self._arrived(len(b.chunks))
        # The stages' pools start their batch with this one (a stage with no work in it has no run: the
        # teacher on an eval's batch).
        b.stages = [r for r in await asyncio.gather(*(s.begin(batch) for s in self.stages)) if r is not None]
        for stage in b.stages:
            stage.arrived(b.chunks)
        # One sender per chunk at most; senders that find the queue empty stop (each holds a worker slot only
        # while its call runs).
        try:
            await asyncio.gather(*(self._send(b) for _ in b.chunks))
            for stage in b.stages:
                await stage.wait()
        except BaseException:  # the batch failed, or a judge raised (on_error: raise)
            for stage in b.stages:
                stage.cancel()
            raise
        return await self._merge(b)

    async def _merge(self, b: _Batch) -> Scores:
        """The batch's scores in batch order, its stages' results added, and the pool's accounts of it."""
        self.counters["chunks"] += len(b.chunks)
        merged = functools.reduce(Scores.concat, b.results)
        for stage in b.stages:
            await stage.merge(merged)
        merged.queue_wait_s = sum(b.waits) / len(b.waits)
        for name in merged.names:
            for kind, counts in (("timeout", merged.timeouts), ("error", merged.errors)):
                self.counters[f"{kind}s"] += counts[name]
                if counts[name]:
                    self.metrics.event(kind, counts[name])
        merged.busy_s = time.monotonic() - b.arrived  # the pool's wall time on this batch
        merged.pool = self.stats()
        return merged

    # --- curriculum ---------------------------------------------------------------------------------------

    async def set_state(self, state: TrainerState) -> int:
        """The learner's push after each optimizer step: stored, so every chunk dispatched from now on carries it
        (a worker scores with its chunk's state) and workers started later begin from it. Live workers are sent
        it too but not waited for: a hung worker (stopped, or stuck in a reward) must not hold the learner up;
        it is found, killed and replaced when a chunk it holds is overdue."""
        self.state = state
        for slot in list(self.slots.values()):
            if slot.alive:
                slot.handle.set_state.remote(state)
        return state.global_step


__all__ = ["RewardPool", "CHUNKS_PER_WORKER"]
