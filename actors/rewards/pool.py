"""RewardPool: the named actor that owns a run's reward workers and spreads scoring over them.

One per run, named `<run>/reward-pool` in the run's namespace, so `rayward scale` (or any driver) can find it
and resize it while the run trains (a run whose eval has rewards of its own has a second one,
`<run>/eval-reward-pool`, with role "eval-reward": workers `<run>/eval-reward-<i>`). A batch is cut into chunks of whole groups; each chunk goes to the
least-loaded live worker; results come back in batch order. A worker that dies mid-chunk is replaced and its
chunks are re-run elsewhere, so every sample is scored exactly once (the dead worker's result never arrives).
Retiring a worker (scale down) waits for its in-flight chunks before killing it.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util import metrics as ray_metrics

from actors.rewards.worker import RewardSpec, RewardWorker
from actors.types import RewardBatch, Scores, TrainerState

# Chunks a worker holds at once: 2 hides the dispatch round-trip without hoarding work a new worker could take.
CHUNKS_PER_WORKER = 2
# Worker calls per worker slot a batch is cut into (see RewardPool.chunks_per_call): 2 rounds leave the last
# round for load balancing (a slow worker's second call goes to whoever is free) at a quarter of the calls.
CALLS_PER_SLOT = 2
# Beyond the rewards' own timeouts, how long a chunk may take before its worker is presumed hung and replaced
# (covers a worker still importing at start-up, or one stuck in C code holding the GIL).
CHUNK_GRACE_S = 120.0
# Gauges are refreshed at most this often: setting them on every acquire/release was ~0.25 ms of serial
# pool time per chunk, which caps scaling at 16 workers. Ray exports metrics every 10 s anyway.
PUBLISH_EVERY_S = 0.5


@dataclass
class _Slot:
    id: int
    handle: Any
    inflight: int = 0
    retiring: bool = False


class RewardPool:
    def __init__(
        self,
        specs: list[RewardSpec],
        *,
        run_name: str,
        num_workers: int,
        worker_options: dict[str, Any],
        sys_path: list[str] | None = None,
        trainer_state: TrainerState | None = None,
        role: str = "reward",
    ):
        """role: the workers are named `<run_name>/<role>-<i>`, and the pool's Ray metrics carry it as the
        `pool` tag, so two pools of one run stay apart."""
        self.specs = specs
        self.run_name = run_name
        self.role = role
        self.worker_options = worker_options
        self.sys_path = sys_path or []
        self.state = trainer_state or TrainerState()
        self.slots: dict[int, _Slot] = {}
        self._next_id = 0
        self._conds: dict[str, asyncio.Condition] | None = None  # made on first use, in the actor's event loop
        self.queued = 0  # chunks of all batches not yet sent to a worker
        self._published_at = 0.0
        self.counters = {"chunks": 0, "retries": 0, "replaced": 0, "timeouts": 0, "errors": 0}
        # The chunk timeout: every reward's own bound (they run concurrently) plus grace.
        self.chunk_timeout_s = max(s.timeout_s for s in specs) + CHUNK_GRACE_S
        self._tags = {"run": run_name, "pool": role}
        self._m_alive = ray_metrics.Gauge(
            "rayward_reward_workers_alive", "live reward workers", tag_keys=("run", "pool")
        )
        self._m_queue = ray_metrics.Gauge(
            "rayward_reward_queue_depth", "chunks waiting for a worker", tag_keys=("run", "pool")
        )
        self._m_inflight = ray_metrics.Gauge(
            "rayward_reward_inflight_chunks", "chunks being scored", tag_keys=("run", "pool")
        )
        self._m_latency = ray_metrics.Histogram(
            "rayward_reward_chunk_latency_s",
            "seconds to score one chunk",
            boundaries=[0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
            tag_keys=("run", "pool"),
        )
        self._m_events = ray_metrics.Counter(
            "rayward_reward_events_total", "timeouts, errors, retries", tag_keys=("run", "pool", "kind")
        )
        for m in (self._m_alive, self._m_queue, self._m_inflight, self._m_latency):
            m.set_default_tags(self._tags)
        for _ in range(num_workers):
            self._spawn()

    def __repr__(self) -> str:
        # Ray captures an actor's repr once (the dashboard's Repr column): only what never changes.
        return f"RewardPool(run={self.run_name!r}, role={self.role!r}, rewards={[s.name for s in self.specs]})"

    # --- membership -------------------------------------------------------------------------------------

    def _spawn(self) -> _Slot:
        i = self._next_id
        self._next_id += 1
        handle = (
            ray.remote(RewardWorker)
            .options(
                name=f"{self.run_name}/{self.role}-{i}",
                max_concurrency=CHUNKS_PER_WORKER,
                max_restarts=0,
                **self.worker_options,
            )
            .remote(self.specs, index=i, trainer_state=self.state, sys_path=self.sys_path)
        )
        slot = self.slots[i] = _Slot(i, handle)
        self._publish(force=True)
        return slot

    def _drop(self, slot: _Slot, *, replace: bool) -> None:
        if self.slots.pop(slot.id, None) is None:
            return
        ray.kill(slot.handle, no_restart=True)
        if replace:
            self.counters["replaced"] += 1
            self._spawn()
        self._publish(force=True)

    def size(self) -> int:
        return sum(not s.retiring for s in self.slots.values())

    async def scale(self, num_workers: int) -> dict[str, Any]:
        """Grow or shrink to `num_workers`; shrinking retires the least-loaded workers after their chunks finish."""
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        active = sorted((s for s in self.slots.values() if not s.retiring), key=lambda s: s.inflight)
        for _ in range(num_workers - len(active)):
            self._spawn()
        for slot in active[: max(len(active) - num_workers, 0)]:
            slot.retiring = True
            asyncio.get_running_loop().create_task(self._retire(slot))
        await self._notify()
        return self.stats()

    async def _retire(self, slot: _Slot) -> None:
        drained = self._cond("drained")
        async with drained:
            await drained.wait_for(lambda: slot.inflight == 0)
        self._drop(slot, replace=False)

    # --- scoring ----------------------------------------------------------------------------------------

    def _cond(self, which: str = "free") -> asyncio.Condition:
        """"free": capacity for a chunk appeared (acquirers wait); "drained": a retiring worker may be idle."""
        if self._conds is None:
            self._conds = {"free": asyncio.Condition(), "drained": asyncio.Condition()}
        return self._conds[which]

    async def _notify(self, n: int | None = None) -> None:
        """Wake `n` senders waiting for a worker (all if None), and every retirement waiting for a drain.
        Releasing one chunk slot wakes one waiter: waking all of them on every release re-ran every waiter's
        check (hundreds of chunks x workers) and made dispatch quadratic in the batch size."""
        free, drained = self._cond("free"), self._cond("drained")
        async with free:
            if n is None:
                free.notify_all()
            else:
                free.notify(n)
        async with drained:
            drained.notify_all()

    def _has_room(self) -> bool:
        return any(not s.retiring and s.inflight < CHUNKS_PER_WORKER for s in self.slots.values())

    async def _acquire(self, wanted: Callable[[], bool]) -> _Slot | None:
        """The least-loaded live worker with room for a call, or None once `wanted()` turns false (the batch
        has no chunks left to send)."""
        cond = self._cond()
        async with cond:
            await cond.wait_for(lambda: not wanted() or self._has_room())
            if not wanted():
                return None
            slot = min((s for s in self.slots.values() if not s.retiring), key=lambda s: s.inflight)
            slot.inflight += 1
        self._publish()
        return slot

    async def _release(self, slot: _Slot) -> None:
        slot.inflight -= 1
        self._publish()
        await self._notify(1)

    def chunks_per_call(self, remaining: int) -> int:
        """How many of a batch's `remaining` chunks the next worker call carries: about remaining / (worker
        slots x CALLS_PER_SLOT), so a batch goes out in a few calls per slot and calls shrink as it drains.
        A Ray actor call costs the pool ~0.5-1 ms of serial CPU; at one call per chunk, 16 workers finishing
        together queued behind each other's dispatch (efficiency 0.67-0.78 at 16 workers). Small tail calls
        keep load balancing, and workers added mid-batch still get work. A worker scores one chunk per slot at
        a time either way, so its concurrency does not change."""
        slots = max(self.size(), 1) * CHUNKS_PER_WORKER
        return max(1, math.ceil(remaining / (slots * CALLS_PER_SLOT)))

    async def _send(
        self, queue: deque[int], chunks: list[RewardBatch], results: list[Any], state: TrainerState
    ) -> None:
        """One of a batch's senders: while chunks are queued, take the next few and score them on a worker.
        A worker that dies or hangs is replaced and its chunks go back to the front of the queue."""
        while queue:
            slot = await self._acquire(lambda: bool(queue))
            if slot is None:
                return
            take = [queue.popleft() for _ in range(min(self.chunks_per_call(len(queue)), len(queue)))]
            self.queued -= len(take)
            if not queue:
                await self._notify()  # this batch's idle senders may stop waiting for a worker
            t0 = time.monotonic()
            try:
                out = await asyncio.wait_for(
                    slot.handle.score_chunks.remote([chunks[i] for i in take], state),
                    self.chunk_timeout_s * len(take),
                )
            except (RayActorError, asyncio.TimeoutError, GetTimeoutError):
                # Its results, if they ever came, are dropped with the killed actor: nothing is scored twice.
                self.counters["retries"] += 1
                self._m_events.inc(1, tags={**self._tags, "kind": "retry"})
                queue.extendleft(reversed(take))
                self.queued += len(take)
                await self._release(slot)
                self._drop(slot, replace=not slot.retiring)
                await self._notify()
                continue
            await self._release(slot)
            self._m_latency.observe((time.monotonic() - t0) / len(take))
            for i, r in zip(take, out, strict=True):
                results[i] = r

    async def score(self, batch: RewardBatch, chunk_groups: int = 1, state: TrainerState | None = None) -> Scores:
        """Score a batch in chunks of `chunk_groups` whole groups; the scores come back in batch order.
        state: the trainer_state the reward functions see (an eval: the evaluated step); default the pool's."""
        state = state or self.state  # every chunk of this batch sees the step current at dispatch
        t0 = time.monotonic()
        chunks = batch.chunks(batch.group_size * chunk_groups)
        queue, results = deque(range(len(chunks))), [None] * len(chunks)
        self.queued += len(chunks)
        self._publish()
        # One sender per chunk at most; senders that find the queue empty stop (each holds a worker slot only
        # while its call runs).
        await asyncio.gather(*(self._send(queue, chunks, results, state) for _ in chunks))
        self.counters["chunks"] += len(chunks)
        merged = functools.reduce(Scores.concat, results)
        for name in merged.names:
            for kind, counts in (("timeout", merged.timeouts), ("error", merged.errors)):
                self.counters[f"{kind}s"] += counts[name]
                if counts[name]:
                    self._m_events.inc(counts[name], tags={**self._tags, "kind": kind})
        merged.busy_s = time.monotonic() - t0  # the pool's wall time on this batch
        merged.pool = self.stats()
        return merged

    # --- curriculum ---------------------------------------------------------------------------------------

    async def set_state(self, state: TrainerState) -> int:
        """The learner's push after each optimizer step: stored (for the next batch and new workers) and
        forwarded to every live worker."""
        self.state = state
        refs = [s.handle.set_state.remote(self.state) for s in list(self.slots.values())]
        for ref in refs:
            try:
                await ref
            except RayActorError:
                pass  # a dead worker is replaced on its next chunk; the replacement starts from self.state
        return state.global_step

    # --- introspection ------------------------------------------------------------------------------------

    def _publish(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._published_at < PUBLISH_EVERY_S:
            return
        self._published_at = now
        self._m_alive.set(self.size())
        self._m_queue.set(self.queued)
        self._m_inflight.set(sum(s.inflight for s in self.slots.values()))

    def stats(self) -> dict[str, Any]:
        return {
            "workers": self.size(),
            "retiring": sum(s.retiring for s in self.slots.values()),
            "inflight": sum(s.inflight for s in self.slots.values()),
            "queue_depth": self.queued,
            "global_step": self.state.global_step,
            **self.counters,
        }

    def worker_handles(self) -> dict[int, Any]:
        return {i: s.handle for i, s in self.slots.items() if not s.retiring}


__all__ = ["RewardPool", "CHUNKS_PER_WORKER"]
