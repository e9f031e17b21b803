"""RewardPool: the named actor that owns a run's reward workers and spreads scoring over them.

One per run, named `<run>/reward-pool` in the run's namespace, so `rayward scale` (or any driver) can find it
and resize it while the run trains. A batch is cut into chunks of whole groups; each chunk goes to the
least-loaded live worker; results come back in batch order. A worker that dies mid-chunk is replaced and its
chunks are re-run elsewhere, so every sample is scored exactly once (the dead worker's result never arrives).
Retiring a worker (scale down) waits for its in-flight chunks before killing it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util import metrics as ray_metrics

from actors.reward import RewardSpec, RewardWorker

# Chunks a worker holds at once: 2 hides the dispatch round-trip without hoarding work a new worker could take.
CHUNKS_PER_WORKER = 2
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
        trainer_state: dict[str, Any] | None = None,
    ):
        self.specs = specs
        self.run_name = run_name
        self.worker_options = worker_options
        self.sys_path = sys_path or []
        self.state = dict(trainer_state or {"global_step": 0, "max_steps": 0, "epoch": 0.0})
        self.slots: dict[int, _Slot] = {}
        self._next_id = 0
        self._changed: asyncio.Condition | None = None  # created on first use inside the actor's event loop
        self.waiting = 0
        self._published_at = 0.0
        self.counters = {"chunks": 0, "retries": 0, "replaced": 0, "timeouts": 0, "errors": 0}
        # The chunk timeout: every reward's own bound (they run concurrently) plus grace.
        self.chunk_timeout_s = max(s.timeout_s for s in specs) + CHUNK_GRACE_S
        tags = {"run": run_name}
        self._m_alive = ray_metrics.Gauge(
            "rayward_reward_workers_alive", "live reward workers", tag_keys=("run",)
        )
        self._m_queue = ray_metrics.Gauge(
            "rayward_reward_queue_depth", "chunks waiting for a worker", tag_keys=("run",)
        )
        self._m_inflight = ray_metrics.Gauge(
            "rayward_reward_inflight_chunks", "chunks being scored", tag_keys=("run",)
        )
        self._m_latency = ray_metrics.Histogram(
            "rayward_reward_chunk_latency_s",
            "seconds to score one chunk",
            boundaries=[0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
            tag_keys=("run",),
        )
        self._m_events = ray_metrics.Counter(
            "rayward_reward_events_total", "timeouts, errors, retries", tag_keys=("run", "kind")
        )
        for m in (self._m_alive, self._m_queue, self._m_inflight, self._m_latency):
            m.set_default_tags(tags)
        for _ in range(num_workers):
            self._spawn()

    def __repr__(self) -> str:
        return (
            f"RewardPool(run={self.run_name!r}, workers={self.size()}, step={self.state.get('global_step')})"
        )

    # --- membership -------------------------------------------------------------------------------------

    def _spawn(self) -> _Slot:
        i = self._next_id
        self._next_id += 1
        handle = (
            ray.remote(RewardWorker)
            .options(
                name=f"{self.run_name}/reward-{i}",
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
        cond = self._cond()
        async with cond:
            await cond.wait_for(lambda: slot.inflight == 0)
        self._drop(slot, replace=False)

    # --- scoring ----------------------------------------------------------------------------------------

    def _cond(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _notify(self) -> None:
        cond = self._cond()
        async with cond:
            cond.notify_all()

    async def _acquire(self) -> _Slot:
        cond = self._cond()
        self.waiting += 1
        self._publish()
        async with cond:
            await cond.wait_for(
                lambda: any(not s.retiring and s.inflight < CHUNKS_PER_WORKER for s in self.slots.values())
            )
            slot = min((s for s in self.slots.values() if not s.retiring), key=lambda s: s.inflight)
            slot.inflight += 1
        self.waiting -= 1
        self._publish()
        return slot

    async def _release(self, slot: _Slot) -> None:
        slot.inflight -= 1
        self._publish()
        await self._notify()

    async def _run_chunk(self, chunk: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        while True:
            slot = await self._acquire()
            t0 = time.monotonic()
            try:
                result = await asyncio.wait_for(slot.handle.score.remote(chunk, state), self.chunk_timeout_s)
            except (RayActorError, asyncio.TimeoutError, GetTimeoutError):
                # Dead or hung worker: replace it and score the chunk elsewhere. Its result, if it ever
                # came, would be dropped with the killed actor, so nothing is scored twice.
                self.counters["retries"] += 1
                self._m_events.inc(1, tags={"run": self.run_name, "kind": "retry"})
                await self._release(slot)
                self._drop(slot, replace=not slot.retiring)
                await self._notify()
                continue
            await self._release(slot)
            self._m_latency.observe(time.monotonic() - t0)
            return result

    async def score(self, batch: dict[str, Any], chunk_groups: int = 1) -> dict[str, Any]:
        """Score a batch: prompts, completions, completion_ids, columns {name: [...]}, group_size (G).
        Returns scores [K][N] (NaN = None) in batch order, and per-reward counters, latencies and user metrics."""
        state = dict(self.state)  # every chunk of this batch sees the step current at dispatch
        t0 = time.monotonic()
        n, g = len(batch["completions"]), int(batch["group_size"])
        size = g * chunk_groups
        chunks = []
        for lo in range(0, n, size):
            hi = min(lo + size, n)
            chunks.append(
                {
                    "prompts": batch["prompts"][lo:hi],
                    "completions": batch["completions"][lo:hi],
                    "completion_ids": batch["completion_ids"][lo:hi],
                    "columns": {c: v[lo:hi] for c, v in batch.get("columns", {}).items()},
                    "group_size": g,
                    "offset": lo,
                }
            )
        results = await asyncio.gather(*(self._run_chunk(c, state) for c in chunks))
        self.counters["chunks"] += len(chunks)
        merged = self._merge(results, state)
        merged["busy_s"] = time.monotonic() - t0  # the pool's wall time on this batch
        return merged

    def _merge(self, results: list[dict[str, Any]], state: dict[str, Any]) -> dict[str, Any]:
        k = len(self.specs)
        scores: list[list[float]] = [[] for _ in range(k)]
        timeouts = dict.fromkeys((s.name for s in self.specs), 0)
        errors = dict.fromkeys((s.name for s in self.specs), 0)
        latency = dict.fromkeys((s.name for s in self.specs), 0.0)
        user: dict[str, list[float]] = {}
        extra: dict[str, list[Any]] = {}
        for r in results:
            for j in range(k):
                scores[j].extend(r["scores"][j])
            for name in timeouts:
                timeouts[name] += r["timeouts"][name]
                errors[name] += r["errors"][name]
                latency[name] = max(latency[name], r["latency_s"][name])
            for m, vals in r["metrics"].items():
                user.setdefault(m, []).extend(vals)
            for c, vals in r["extra"].items():
                extra.setdefault(c, []).extend(vals)
        for name in timeouts:
            self.counters["timeouts"] += timeouts[name]
            self.counters["errors"] += errors[name]
            if timeouts[name]:
                self._m_events.inc(timeouts[name], tags={"run": self.run_name, "kind": "timeout"})
            if errors[name]:
                self._m_events.inc(errors[name], tags={"run": self.run_name, "kind": "error"})
        return {
            "scores": scores,
            "timeouts": timeouts,
            "errors": errors,
            "latency_s": latency,
            "metrics": {m: sum(v) / len(v) for m, v in user.items() if v},
            "extra": extra,
            "global_step": int(state.get("global_step", 0)),
            "workers": sorted({r["worker"] for r in results}),
            "scored_at_step": [r["global_step"] for r in results],
            "pool": self.stats(),
        }

    # --- curriculum ---------------------------------------------------------------------------------------

    async def set_state(self, state: dict[str, Any]) -> int:
        """The learner's push after each optimizer step: stored (for the next batch and new workers) and
        forwarded to every live worker."""
        self.state = dict(state)
        refs = [s.handle.set_state.remote(self.state) for s in list(self.slots.values())]
        for ref in refs:
            try:
                await ref
            except RayActorError:
                pass  # a dead worker is replaced on its next chunk; the replacement starts from self.state
        return int(self.state.get("global_step", 0))

    # --- introspection ------------------------------------------------------------------------------------

    def _publish(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._published_at < PUBLISH_EVERY_S:
            return
        self._published_at = now
        self._m_alive.set(self.size())
        self._m_queue.set(self.waiting)
        self._m_inflight.set(sum(s.inflight for s in self.slots.values()))

    def stats(self) -> dict[str, Any]:
        return {
            "workers": self.size(),
            "retiring": sum(s.retiring for s in self.slots.values()),
            "inflight": sum(s.inflight for s in self.slots.values()),
            "queue_depth": self.waiting,
            "global_step": self.state.get("global_step", 0),
            **self.counters,
        }

    def worker_handles(self) -> dict[int, Any]:
        return {i: s.handle for i, s in self.slots.items() if not s.retiring}


__all__ = ["RewardPool", "CHUNKS_PER_WORKER"]
