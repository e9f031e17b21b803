"""RewardPool: the named actor that owns a run's reward workers and spreads scoring over them.

One per run, named `<run>/reward-pool` in the run's namespace, so `rayward scale` (or any driver) can find it
and resize it while the run trains (a run whose eval has rewards of its own has a second one,
`<run>/eval-reward-pool`, with role "eval-reward": workers `<run>/eval-reward-<i>`). A batch is cut into chunks of whole groups; each chunk goes to the
least-loaded live worker; results come back in batch order. A worker that dies mid-chunk is replaced and its
chunks are re-run elsewhere, so every sample is scored exactly once (the dead worker's result never arrives).
Retiring a worker (scale down) waits for its in-flight chunks before killing it.

A new worker counts as capacity only once it is alive: on an autoscaling Ray cluster a worker that asks for
resources no node has yet (`cluster.reward_worker.resources`) waits for the cluster autoscaler to start a node,
and meanwhile scoring goes on on the live workers. With `autoscale` settings the pool sizes itself
(actors/rewards/autoscale.py: a pure policy, sampled by a periodic task here and at every batch arrival);
`scale(n)` pins the count (autoscaling paused), `set_bounds(min, max)` resumes it. Every change of the
target is printed with its reason (the driver shows the pool's output) and kept in `decision_log()`.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util import metrics as ray_metrics

from actors.rewards.autoscale import AutoscalePolicy, AutoscaleSettings, Decision, PoolSample
from actors.rewards.worker import RewardSpec, RewardWorker
from actors.types import PoolStats, RewardBatch, Scores, TrainerState

# Chunks a worker holds at once: 2 hides the dispatch round-trip without hoarding work a new worker could take.
CHUNKS_PER_WORKER = 2
# Worker calls per worker slot a batch is cut into (see RewardPool.chunks_per_call): 2 rounds leave the last
# round for load balancing (a slow worker's second call goes to whoever is free) at a quarter of the calls.
CALLS_PER_SLOT = 2
# Beyond the rewards' own timeouts, how long a chunk may take before its worker is presumed hung and replaced
# (covers a worker still importing at start-up, or one stuck in C code holding the GIL).
CHUNK_GRACE_S = 120.0
# Gauges are refreshed at most this often: setting them costs serial pool time, and on every acquire/release
# that cost grew with the chunk rate until it capped scaling (bench/README.md, reward_scaling). Ray exports
# metrics every 10 s anyway.
PUBLISH_EVERY_S = 0.5
# How often the autoscaling policy samples the pool (it also samples at every batch arrival): far below any
# useful delay, and a sample is a few additions.
AUTOSCALE_TICK_S = 0.25
# A worker still waiting for a node after this long gets one log line (on a cluster without an autoscaler, or
# with no node type offering its resources, it waits forever; scoring goes on without it).
STARTING_WARN_S = 60.0
# After a worker failed to start (its constructor raised, its node died), wait this long before the
# replacement, so a worker that can never start is retried a few times a minute, not in a tight loop.
START_RETRY_S = 5.0
# Scaling decisions kept for decision_log() (stats and logs carry the rest).
DECISIONS_KEPT = 50


@dataclass
class _Slot:
    id: int
    handle: Any
    spawned_at: float
    inflight: int = 0  # worker calls (each of one or more chunks) in flight
    retiring: bool = False
    alive: bool = False  # constructor done: counted as capacity, given chunks
    warned: bool = False  # the "still waiting for a node" line was printed


class PoolMetrics:
    """The pool's Ray metrics, exported live between steps and tagged with the run and the pool's role:
    gauges (workers alive, starting and targeted, queue, chunks in flight, utilisation), histograms (chunk
    latency, queue wait) and counters (timeouts, errors and retries; scaling decisions)."""

    def __init__(self, run_name: str, role: str):
        self.tags = {"run": run_name, "pool": role}
        self.alive = ray_metrics.Gauge(
            "rayward_reward_workers_alive", "live reward workers", tag_keys=("run", "pool")
        )
        self.queue = ray_metrics.Gauge(
            "rayward_reward_queue_depth", "chunks waiting for a worker", tag_keys=("run", "pool")
        )
        self.inflight = ray_metrics.Gauge(
            "rayward_reward_inflight_chunks", "chunks being scored", tag_keys=("run", "pool")
        )
        self.latency = ray_metrics.Histogram(
            "rayward_reward_chunk_latency_s",
            "seconds to score one chunk",
            boundaries=[0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
            tag_keys=("run", "pool"),
        )
        self.events = ray_metrics.Counter(
            "rayward_reward_events_total", "timeouts, errors, retries", tag_keys=("run", "pool", "kind")
        )
        self.target = ray_metrics.Gauge(
            "rayward_reward_workers_target", "reward workers alive or starting (the pool's target)", tag_keys=("run", "pool")
        )
        self.starting = ray_metrics.Gauge(
            "rayward_reward_workers_starting", "reward workers waiting for a node or starting up", tag_keys=("run", "pool")
        )
        self.utilization = ray_metrics.Gauge(
            "rayward_reward_utilization", "busy fraction of the live reward workers over the autoscaler's window",
            tag_keys=("run", "pool"),
        )
        self.wait = ray_metrics.Histogram(
            "rayward_reward_queue_wait_s",
            "seconds a chunk waited for a worker (mean of one worker call's chunks)",
            boundaries=[0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
            tag_keys=("run", "pool"),
        )
        self.decisions = ray_metrics.Counter(
            "rayward_reward_scale_decisions_total", "changes of the reward pool's target size",
            tag_keys=("run", "pool", "direction"),
        )
        for m in (self.alive, self.queue, self.inflight, self.latency, self.target, self.starting,
                  self.utilization, self.wait):
            m.set_default_tags(self.tags)
        self._published_at = 0.0

    def due(self, force: bool = False) -> bool:
        """Whether the gauges should be set now (at most every PUBLISH_EVERY_S unless forced)."""
        now = time.monotonic()
        if not force and now - self._published_at < PUBLISH_EVERY_S:
            return False
        self._published_at = now
        return True

    def set_sizes(self, alive: int, target: int, queued: int, inflight: int) -> None:
        self.alive.set(alive)
        self.target.set(target)
        self.starting.set(target - alive)
        self.queue.set(queued)
        self.inflight.set(inflight)

    def event(self, kind: str, n: int = 1) -> None:
        """`timeout`, `error` or `retry`, counted."""
        self.events.inc(n, tags={**self.tags, "kind": kind})

    def decision(self, direction: str) -> None:
        self.decisions.inc(1, tags={**self.tags, "direction": direction})


@dataclass
class _Batch:
    """One `score` call while its chunks go out: the chunks, the state they are scored under, when the batch
    arrived, the indices of chunks not sent yet (in order; a failed call's go back to the front), and per chunk
    its result and the seconds it waited for a worker."""

    chunks: list[RewardBatch]
    state: TrainerState
    arrived: float
    queue: deque[int] = field(init=False)
    results: list[Scores | None] = field(init=False)
    waits: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.queue = deque(range(len(self.chunks)))
        self.results = [None] * len(self.chunks)
        self.waits = [0.0] * len(self.chunks)


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
        autoscale: AutoscaleSettings | None = None,
        role: str = "reward",
        chunk_grace_s: float = CHUNK_GRACE_S,
    ):
        """`num_workers` at start (clamped to the autoscaling bounds when `autoscale` is given). role: the
        workers are named `<run_name>/<role>-<i>`, and the pool's Ray metrics carry it as the `pool` tag, so
        two pools of one run stay apart. chunk_grace_s: how long past its rewards' timeouts a chunk may take
        before its worker counts as hung (the run's cluster.hang_timeout_s)."""
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
        self._published_load = (0.0, 0.0)  # (worker_s, busy_s) at the last utilisation published without a policy
        self.counters = {
            "chunks": 0, "retries": 0, "replaced": 0, "timeouts": 0, "errors": 0, "start_failures": 0,
            "scale_ups": 0, "scale_downs": 0,
        }
        # Load integrals for the autoscaling policy and the worker-seconds metric, advanced by _account()
        # before every change of the live or busy worker counts.
        self._t_account = time.monotonic()
        self._alive = 0  # live workers (retiring ones included until they are killed)
        self._busy = 0  # live workers holding at least one call
        self.worker_s = 0.0  # integral of _alive
        self.busy_s = 0.0  # integral of _busy
        self.batches = 0
        self.inflight_chunks = 0
        self._peak = 0  # most chunks outstanding at once since the policy's last sample
        self.policy = AutoscalePolicy(autoscale) if autoscale else None
        self.pinned = False  # `rayward scale --reward-workers N` pauses autoscaling
        self.decisions: deque[Decision] = deque(maxlen=DECISIONS_KEPT)
        self._tasks: set[asyncio.Task] = set()  # strong references: asyncio keeps only weak ones
        # The chunk timeout: every reward's own bound (they run concurrently) plus grace.
        self.chunk_timeout_s = max(s.timeout_s for s in specs) + chunk_grace_s
        self.metrics = PoolMetrics(run_name, role)
        for _ in range(autoscale.clamp(num_workers) if autoscale else num_workers):
            self._spawn()
        self._background(self._tick_loop())

    def __repr__(self) -> str:
        # Ray captures an actor's repr once (the dashboard's Repr column): only what never changes.
        return f"RewardPool(run={self.run_name!r}, role={self.role!r}, rewards={[s.name for s in self.specs]})"

    # --- membership -------------------------------------------------------------------------------------

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a coroutine on the actor's event loop (Ray runs __init__ and every method on it)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _log(self, msg: str) -> None:
        print(f"rayward: reward pool {self.run_name}: {msg}", flush=True)

    def _account(self) -> None:
        now = time.monotonic()
        dt, self._t_account = now - self._t_account, now
        self.worker_s += self._alive * dt
        self.busy_s += self._busy * dt

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
        slot = self.slots[i] = _Slot(i, handle, time.monotonic())
        self._background(self._await_alive(slot))
        self._publish(force=True)
        return slot

    async def _await_alive(self, slot: _Slot) -> None:
        """Count a new worker as capacity once its constructor has run: until then it may be waiting for a node
        (the cluster autoscaler starts one for its resources) and is given no chunks."""
        try:
            await slot.handle.pid.remote()
        except RayActorError as err:
            if self.slots.get(slot.id) is not slot:
                return  # retired or replaced while starting: killed on purpose
            self.counters["start_failures"] += 1
            self._log(f"worker {slot.id} failed to start ({type(err).__name__}: {err}); "
                      f"replacing it in {START_RETRY_S:g} s")
            want, decided = self.target(), self._decided()
            self._drop(slot, replace=False)
            await asyncio.sleep(START_RETRY_S)
            if self.target() < want and self._decided() == decided:  # nobody resized the pool meanwhile
                self._spawn()
            await self._notify()
            return
        if self.slots.get(slot.id) is not slot:
            return
        self._account()
        slot.alive = True
        self._alive += 1
        waited = time.monotonic() - slot.spawned_at
        if slot.warned:
            self._log(f"worker {slot.id} is alive after {waited:.0f} s")
        self._publish(force=True)
        await self._notify()

    def _drop(self, slot: _Slot, *, replace: bool) -> None:
        if self.slots.pop(slot.id, None) is None:
            return
        if slot.alive:
            self._account()
            self._alive -= 1
            self._busy -= slot.inflight > 0
            slot.alive = False
        ray.kill(slot.handle, no_restart=True)
        if replace:
            self.counters["replaced"] += 1
            self._spawn()
        self._publish(force=True)

    def size(self) -> int:
        """Live workers taking new chunks: the capacity a batch is spread over."""
        return sum(s.alive and not s.retiring for s in self.slots.values())

    def target(self) -> int:
        """Workers alive or starting, not retiring: the size the pool is heading to."""
        return sum(not s.retiring for s in self.slots.values())

    def _set_target(self, num_workers: int) -> None:
        """Spawn up to `num_workers`, or retire the surplus: workers still starting first (they hold no chunks,
        and killing one withdraws its resource request from the cluster autoscaler), then the least loaded,
        each after its chunks finish."""
        active = [s for s in self.slots.values() if not s.retiring]
        for _ in range(num_workers - len(active)):
            self._spawn()
        surplus = sorted(active, key=lambda s: (s.alive, s.inflight, -s.id))[: max(len(active) - num_workers, 0)]
        for slot in surplus:
            slot.retiring = True
            self._background(self._retire(slot))

    def _decided(self) -> int:
        return self.counters["scale_ups"] + self.counters["scale_downs"]

    def _apply(self, d: Decision) -> None:
        self.decisions.append(d)
        self.counters["scale_ups" if d.direction == "up" else "scale_downs"] += 1
        self.metrics.decision(d.direction)
        self._log(f"workers {d.before} -> {d.after}: {d.reason}")
        self._set_target(d.after)
        self._publish(force=True)

    async def scale(self, num_workers: int) -> PoolStats:
        """Pin the pool at `num_workers` (autoscaling, if on, pauses until set_bounds); shrinking retires the
        surplus after their chunks finish."""
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        before = self.target()
        why = "pinned by `rayward scale --reward-workers`" + (
            "; autoscaling paused until `rayward scale --min/--max`" if self.policy else ""
        )
        self.pinned = self.policy is not None
        if num_workers != before:
            self._apply(Decision(time.monotonic(), before, num_workers, why))
        elif self.pinned:
            self._log(f"workers {before}: {why}")
        await self._notify()
        return self.stats()

    async def set_bounds(self, min_workers: int | None = None, max_workers: int | None = None, *,
                         fresh: AutoscaleSettings | None = None) -> PoolStats:
        """Autoscale between new bounds (either may be kept as it is); resumes autoscaling if it was pinned. A
        pool with autoscaling off turns it on with `fresh` (`rayward scale --min/--max` sends the config's
        defaults with both bounds). A target outside the bounds moves into them at once."""
        if self.policy is None:
            if fresh is None:
                raise ValueError("autoscaling is off for this run: give both --min and --max to turn it on")
            settings = fresh
        else:
            old = self.policy.settings
            settings = replace(old, min_workers=old.min_workers if min_workers is None else min_workers,
                               max_workers=old.max_workers if max_workers is None else max_workers)
        # A fresh window: history from a pinned or differently bounded pool would mislead the first decisions.
        self.policy, self.pinned = AutoscalePolicy(settings), False
        self._log(f"autoscaling between {settings.min_workers} and {settings.max_workers} workers "
                  f"(target utilisation {settings.target_utilization:g})")
        before = self.target()
        if settings.clamp(before) != before:
            self._apply(Decision(time.monotonic(), before, settings.clamp(before),
                                 f"bounds set to {settings.min_workers}..{settings.max_workers}"))
        await self._notify()
        return self.stats()

    def scaling_state(self) -> dict[str, Any]:
        """How the pool is sized (kept in a run's checkpoints, so a resumed run keeps what `rayward scale` set):
        the target, whether it is pinned, the autoscaling settings (None: off)."""
        return {"target": self.target(), "pinned": self.pinned,
                "autoscale": asdict(self.policy.settings) if self.policy else None}

    async def restore_scaling(self, state: dict[str, Any]) -> PoolStats:
        """`scaling_state` back: the same bounds, or the same pinned count."""
        if state["autoscale"] is not None:
            a = state["autoscale"]
            await self.set_bounds(a["min_workers"], a["max_workers"], fresh=AutoscaleSettings(**a))
        if state["pinned"] or state["autoscale"] is None:
            await self.scale(state["target"])
        return self.stats()

    async def _retire(self, slot: _Slot) -> None:
        drained = self._cond("drained")
        async with drained:
            await drained.wait_for(lambda: slot.inflight == 0)
        self._drop(slot, replace=False)

    # --- autoscaling --------------------------------------------------------------------------------------

    def _sample(self) -> PoolSample:
        self._account()
        s = PoolSample(time.monotonic(), self.batches, self.worker_s, self.busy_s, self._peak, self.target(),
                       self.size())
        self._peak = self.queued + self.inflight_chunks
        return s

    def _autoscale(self) -> None:
        if self.policy is None or self.pinned:
            return
        d = self.policy.observe(self._sample())
        if d is not None:
            self._apply(d)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(AUTOSCALE_TICK_S)
            try:
                self._autoscale()
                self._warn_starting()
                self._publish()
            except Exception as err:  # noqa: BLE001 - the loop must outlive a bad tick; scoring does not need it
                self._log(f"autoscaling tick failed: {type(err).__name__}: {err}")

    def _warn_starting(self) -> None:
        now = time.monotonic()
        for s in self.slots.values():
            if not s.alive and not s.retiring and not s.warned and now - s.spawned_at > STARTING_WARN_S:
                s.warned = True
                self._log(
                    f"worker {s.id} has waited {now - s.spawned_at:.0f} s to start (resources "
                    f"{self.worker_options.get('resources') or {}}, num_cpus {self.worker_options.get('num_cpus')}): "
                    f"no node can place it yet; an autoscaling cluster starts one, otherwise it waits. "
                    f"Scoring goes on on the {self.size()} live workers"
                )

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
        return any(s.alive and not s.retiring and s.inflight < CHUNKS_PER_WORKER for s in self.slots.values())

    async def _acquire(self, wanted: Callable[[], bool]) -> _Slot | None:
        """The least-loaded live worker with room for a call, or None once `wanted()` turns false (the batch
        has no chunks left to send)."""
        cond = self._cond()
        async with cond:
            await cond.wait_for(lambda: not wanted() or self._has_room())
            if not wanted():
                return None
            slot = min((s for s in self.slots.values() if s.alive and not s.retiring), key=lambda s: s.inflight)
            if slot.inflight == 0:
                self._account()
                self._busy += 1
            slot.inflight += 1
        self._publish()
        return slot

    async def _release(self, slot: _Slot) -> None:
        slot.inflight -= 1
        if slot.inflight == 0 and slot.alive:
            self._account()
            self._busy -= 1
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
            except (RayActorError, asyncio.TimeoutError, GetTimeoutError):
                # Its results, if they ever came, are dropped with the killed actor: nothing is scored twice.
                self.counters["retries"] += 1
                self.metrics.event("retry")
                queue.extendleft(reversed(take))
                self.inflight_chunks -= len(take)
                self.queued += len(take)
                self._peak = max(self._peak, self.queued + self.inflight_chunks)
                await self._release(slot)
                self._drop(slot, replace=not slot.retiring)
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
            self.metrics.wait.observe(sum(batch.waits[i] for i in take) / len(take))

    async def score(self, batch: RewardBatch, chunk_groups: int = 1, state: TrainerState | None = None) -> Scores:
        """Score a batch in chunks of `chunk_groups` whole groups; the scores come back in batch order.
        state: the trainer_state the reward functions see (an eval: the evaluated step); default the pool's."""
        # Every chunk of this batch sees the step current at dispatch.
        b = _Batch(batch.chunks(batch.group_size * chunk_groups), state or self.state, time.monotonic())
        self.queued += len(b.chunks)
        self.batches += 1
        self._peak = max(self._peak, self.queued + self.inflight_chunks)
        self._autoscale()  # a sample at the arrival itself: the policy's windows start at batch arrivals
        self._publish()
        # One sender per chunk at most; senders that find the queue empty stop (each holds a worker slot only
        # while its call runs).
        await asyncio.gather(*(self._send(b) for _ in b.chunks))
        self.counters["chunks"] += len(b.chunks)
        merged = functools.reduce(Scores.concat, b.results)
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
        """The learner's push after each optimizer step: stored (for the next batch and new workers) and
        forwarded to every live worker (not to starting ones: one waiting for a node would hold the learner
        up; every chunk carries the state anyway)."""
        self.state = state
        refs = [s.handle.set_state.remote(self.state) for s in list(self.slots.values()) if s.alive]
        for ref in refs:
            try:
                await ref
            except RayActorError:
                pass  # a dead worker is replaced on its next chunk; the replacement starts from self.state
        return state.global_step

    # --- introspection ------------------------------------------------------------------------------------

    def _publish(self, force: bool = False) -> None:
        if not self.metrics.due(force):
            return
        self.metrics.set_sizes(self.size(), self.target(), self.queued, self.inflight_chunks)
        if self.policy is not None:
            if self.policy.load is not None:
                self.metrics.utilization.set(self.policy.load.utilization)
            return
        # A fixed pool has no policy window; its utilisation since the last publish tells the user whether
        # `rayward scale` would help.
        self._account()
        worker_s, busy_s = self._published_load
        if self.worker_s > worker_s:
            self.metrics.utilization.set((self.busy_s - busy_s) / (self.worker_s - worker_s))
            self._published_load = (self.worker_s, self.busy_s)

    def stats(self) -> PoolStats:
        """The pool's state now (see PoolStats)."""
        self._account()
        load = self.policy.load if self.policy else None
        if self.policy is None:
            mode = "off"
        else:
            st = self.policy.settings
            mode = f"pinned (bounds {st.min_workers}..{st.max_workers})" if self.pinned else (
                f"{st.min_workers}..{st.max_workers}")
        return PoolStats(
            workers=self.size(),
            target_workers=self.target(),
            starting=self.target() - self.size(),
            retiring=sum(s.retiring for s in self.slots.values()),
            inflight=sum(s.inflight for s in self.slots.values()),
            queue_depth=self.queued,
            global_step=self.state.global_step,
            worker_s=self.worker_s,
            utilization=load.utilization if load is not None else math.nan,
            decisions=self._decided(),
            autoscale=mode,
            **self.counters,
        )

    def decision_log(self) -> list[dict[str, Any]]:
        """The latest scaling decisions (t: the pool's monotonic clock), oldest first."""
        return [asdict(d) for d in self.decisions]

    def worker_handles(self) -> dict[int, Any]:
        return {i: s.handle for i, s in self.slots.items() if not s.retiring}


__all__ = ["RewardPool", "CHUNKS_PER_WORKER"]
