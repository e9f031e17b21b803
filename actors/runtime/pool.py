"""WorkerPool: what every pool of worker actors shares: the reward pool (actors/rewards/pool.py), the environment
pool (actors/envs/pool.py: its workers run environments, or users' agent functions), and the engine pools of
judges and of a distillation teacher (actors/engines/pool.py), alike.

A pool is one named async actor (`<run>/<role>-pool`) owning workers `<run>/<role>-<i>`. This base keeps:

* **membership**: spawning a worker (the subclass says how: `_new_worker`), counting it as capacity only once
  its constructor has run (on an autoscaling cluster it may wait for a node meanwhile; work goes on on the live
  workers), retrying a worker that failed to start, killing and replacing a dead or hung one (`_drop`), and
  retiring surplus workers once they are drained (`_drained`);
* **sizing**: `scale(n)` pins the count (autoscaling paused), `set_bounds(min, max)` resumes it, and the
  autoscaling policy (actors/runtime/autoscale.py: pure) is sampled by a periodic task and at every batch
  arrival; every change of the target is printed with its reason and kept in `decision_log()`;
* **load accounting**: the integrals of live and busy workers over time (the policy's input and the
  `worker_s` metric); a subclass says when a worker is busy (`_is_busy`) and changes a worker's load inside
  `with self._load(slot):`, which keeps the busy count right;
* **metrics and stats**: Ray gauges, histograms and counters (`pool_metrics`: the same set for every pool, named
  `rayward_<prefix>_...` and described in the pool's own units of work), tagged with the run and the role, and
  `stats()`.

The base is generic in its slot type (a subclass's Slot with fields of its own) and its stats record.

What a unit of work is (a chunk of completions, an environment session) and how it is routed is the
subclass's: it calls `_cond("free")` waiters through `_notify` when capacity appears.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Generic, TypeVar

import ray
from ray.exceptions import RayActorError
from ray.util import metrics as ray_metrics

from actors.runtime.autoscale import AutoscalePolicy, AutoscaleSettings, Decision, PoolSample
from actors.types import PoolStats

# Gauges are refreshed at most this often: setting them costs serial pool time, and on every acquire/release
# that cost grew with the chunk rate until it capped scaling (bench/README.md, reward_scaling). Ray exports
# metrics every 10 s anyway.
PUBLISH_EVERY_S = 0.5
# How often the autoscaling policy samples the pool (it also samples at every batch arrival): far below any
# useful delay, and a sample is a few additions.
AUTOSCALE_TICK_S = 0.25
# A worker still waiting for a node after this long gets one log line (on a cluster without an autoscaler, or
# with no node type offering its resources, it waits forever; work goes on without it).
STARTING_WARN_S = 60.0
# After a worker failed to start (its constructor raised, its node died), wait this long before the
# replacement, so a worker that can never start is retried a few times a minute, not in a tight loop.
START_RETRY_S = 5.0
# Scaling decisions kept for decision_log() (stats and logs carry the rest).
DECISIONS_KEPT = 50


@dataclass
class Slot:
    """One worker as its pool sees it."""

    id: int
    handle: Any
    spawned_at: float
    calls: int = 0  # worker calls in flight
    retiring: bool = False
    alive: bool = False  # constructor done: counted as capacity, given work
    warned: bool = False  # the "still waiting for a node" line was printed


S = TypeVar("S", bound=Slot)  # a pool's slot type
St = TypeVar("St", bound=PoolStats)  # a pool's stats record


@dataclass(frozen=True)
class PoolUnits:
    """A pool's unit of work, as its metrics name and describe it."""

    unit: str  # "chunk": rayward_<prefix>_inflight_chunks, rayward_<prefix>_chunk_latency_s
    workers: str  # "reward workers"
    queued: str  # what the queue gauge counts: "chunks waiting for a worker"
    inflight: str  # what the in-flight gauge counts: "chunks being scored"
    latency: str  # what the latency histogram measures: "seconds to score one chunk"
    events: str  # the events counted, by kind: "timeouts, errors, retries"
    wait: str  # what the queue-wait histogram measures


@dataclass(frozen=True)
class PoolKind:
    """How a pool names itself in logs, in what `scale` prints and in its metrics."""

    noun: str  # "reward pool", in log lines
    pin_flag: str  # the `rayward scale` option that pins the pool: "--reward-workers"
    bounds_flag: str  # the one that sets its autoscaling bounds: "--min/--max"
    metrics: str  # its Ray metrics' names: rayward_<metrics>_... ("reward")
    units: PoolUnits  # what its metrics count


# Every pool metric carries the run and the pool's role.
TAGS = ("run", "pool")
# Latency and queue-wait histogram boundaries, in seconds.
LATENCY_BOUNDS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
WAIT_BOUNDS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300]


# PoolMetrics field -> (Ray metric class, name after `rayward_<prefix>_`; {unit}: the pool's unit of work).
# These are the names users' dashboards read (cluster/grafana-dashboard.json, docs/agents.md): keep them.
METRICS = {
    "alive": ("Gauge", "workers_alive"),
    "queue": ("Gauge", "queue_depth"),
    "inflight": ("Gauge", "inflight_{unit}s"),
    "latency": ("Histogram", "{unit}_latency_s"),
    "events": ("Counter", "events_total"),
    "target": ("Gauge", "workers_target"),
    "starting": ("Gauge", "workers_starting"),
    "utilization": ("Gauge", "utilization"),
    "wait": ("Histogram", "queue_wait_s"),
    "decisions": ("Counter", "scale_decisions_total"),
}
# The histograms' boundaries, and the counters' tag beyond TAGS.
BOUNDARIES = {"latency": LATENCY_BOUNDS, "wait": WAIT_BOUNDS}
COUNTER_TAG = {"events": "kind", "decisions": "direction"}


def pool_metric_names(prefix: str, unit: str) -> dict[str, tuple[str, str]]:
    """PoolMetrics field -> (Ray metric class, its name), for a pool whose metrics are `rayward_<prefix>_...`
    and whose unit of work is `unit`. Prometheus shows each with `ray_` in front (and a histogram as its
    `_bucket`, `_sum` and `_count` series)."""
    return {f: (cls, f"rayward_{prefix}_{name.format(unit=unit)}") for f, (cls, name) in METRICS.items()}


def pool_metrics(prefix: str, units: PoolUnits) -> PoolMetrics:
    """A pool's Ray metrics (see PoolMetrics), named by `prefix` and described in its `units` of work."""
    help_text = {
        "alive": f"live {units.workers}", "queue": units.queued, "inflight": units.inflight,
        "latency": units.latency, "events": units.events,
        "target": f"{units.workers} alive or starting (the pool's target)",
        "starting": f"{units.workers} waiting for a node or starting up",
        "utilization": f"busy fraction of the live {units.workers} over the autoscaler's window",
        "wait": units.wait, "decisions": f"changes of the target number of {units.workers}",
    }
    made = {}
    for f, (cls, name) in pool_metric_names(prefix, units.unit).items():
        tags = (*TAGS, COUNTER_TAG[f]) if f in COUNTER_TAG else TAGS
        extra = {"boundaries": BOUNDARIES[f]} if f in BOUNDARIES else {}
        made[f] = getattr(ray_metrics, cls)(name, help_text[f], tag_keys=tags, **extra)
    return PoolMetrics(**made)


@dataclass
class PoolMetrics:
    """A pool's Ray metrics, exported live between steps and tagged with the run and the pool's role: gauges
    (workers alive, starting and targeted, queue, work in flight, utilisation), histograms (latency per unit
    of work, queue wait) and counters (events such as timeouts, errors and retries; scaling decisions). Every
    pool has the same set (pool_metrics); `tag(run, role)` sets the default tags."""

    alive: Any  # Gauge: live workers
    queue: Any  # Gauge: units of work waiting for a worker
    inflight: Any  # Gauge: units of work in flight
    latency: Any  # Histogram: seconds per unit of work
    events: Any  # Counter, tags + "kind": timeouts, errors, retries, ...
    target: Any  # Gauge: workers alive or starting
    starting: Any  # Gauge: workers waiting for a node or starting up
    utilization: Any  # Gauge: busy fraction over the autoscaler's window
    wait: Any  # Histogram: seconds waiting for a worker
    decisions: Any  # Counter, tags + "direction": scaling decisions
    tags: dict[str, str] = field(default_factory=dict)
    _published_at: float = 0.0

    def tag(self, run_name: str, role: str) -> PoolMetrics:
        self.tags = {"run": run_name, "pool": role}
        for m in (self.alive, self.queue, self.inflight, self.latency, self.target, self.starting,
                  self.utilization, self.wait):
            m.set_default_tags(self.tags)
        return self

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
        """An event of `kind` (`timeout`, `error`, `retry`, ...), counted."""
        self.events.inc(n, tags={**self.tags, "kind": kind})

    def decision(self, direction: str) -> None:
        self.decisions.inc(1, tags={**self.tags, "direction": direction})


class WorkerPool(Generic[S, St]):
    """The shared machinery (see the module docstring). A subclass sets `KIND` and `STATS` (its stats record),
    implements `_new_worker` and `_new_slot`; it may override `_is_busy`, `_holding`, `_drained`, `_outstanding`,
    `_inflight_units` and `_stats_fields`."""

    KIND: PoolKind
    STATS: type[St]

    def __init__(
        self,
        *,
        run_name: str,
        role: str,
        num_workers: int,
        worker_options: dict[str, Any],
        autoscale: AutoscaleSettings | None,
        counters: tuple[str, ...],
    ):
        """`num_workers` at start (clamped to the autoscaling bounds when `autoscale` is given). role: the
        workers are named `<run_name>/<role>-<i>`, and the pool's Ray metrics carry it as the `pool` tag, so
        two pools of one run stay apart. counters: the subclass's event counters (in `stats()`), besides the
        base's own."""
        self.run_name = run_name
        self.role = role
        self.worker_options = worker_options
        self.slots: dict[int, S] = {}
        self._next_id = 0
        self._conds: dict[str, asyncio.Condition] | None = None  # made on first use, in the actor's event loop
        self.queued = 0  # units of work waiting for a worker
        self._published_load = (0.0, 0.0)  # (worker_s, busy_s) at the last utilisation published without a policy
        self.counters = dict.fromkeys((*counters, "replaced", "start_failures", "scale_ups", "scale_downs"), 0)
        # Load integrals for the autoscaling policy and the worker-seconds metric, advanced by _account()
        # before every change of the live or busy worker counts.
        self._t_account = time.monotonic()
        self._alive = 0  # live workers (retiring ones included until they are killed)
        self._busy = 0  # live workers that _is_busy
        self.worker_s = 0.0  # integral of _alive
        self.busy_s = 0.0  # integral of _busy
        self.idle_s = 0.0  # integral of the time with nothing to do (no unit outstanding, no worker busy)
        self._arrived_idle = False  # the latest batch found the pool with nothing to do
        self.batches = 0  # arrivals of work: the autoscaling policy's windows start at them
        self._peak = 0  # most units outstanding at once since the policy's last sample
        self.policy = AutoscalePolicy(autoscale) if autoscale else None
        self.pinned = False  # `rayward scale --<kind>-workers N` pauses autoscaling
        self.decisions: deque[Decision] = deque(maxlen=DECISIONS_KEPT)
        self._tasks: set[asyncio.Task] = set()  # strong references: asyncio keeps only weak ones
        self.metrics = pool_metrics(self.KIND.metrics, self.KIND.units).tag(run_name, role)
        for _ in range(autoscale.clamp(num_workers) if autoscale else num_workers):
            self._spawn()
        self._background(self._tick_loop())

    # --- what a subclass provides ------------------------------------------------------------------------

    def _new_worker(self, index: int, name: str) -> Any:
        """Start worker `index` as the actor `name` (options: self.worker_options); returns its handle, whose
        `pid()` answers once the constructor has run."""
        raise NotImplementedError

    def _new_slot(self, i: int, handle: Any) -> S:
        """The slot of a worker just spawned (Slot's fields: `i`, `handle`, spawned now)."""
        raise NotImplementedError

    def _is_busy(self, slot: S) -> bool:
        """Whether a live worker counts as busy in the load integral the autoscaler reads."""
        return slot.calls > 0

    def _holding(self, slot: S) -> int:
        """How much work a worker holds: the one holding least is retired first."""
        return slot.calls

    def _drained(self, slot: S) -> bool:
        """Whether a retiring worker may be killed now."""
        return slot.calls == 0

    def _outstanding(self) -> int:
        """Units of work waiting or in flight: the policy caps the workers it asks for at their peak."""
        return self.queued + self._inflight_units()

    def _inflight_units(self) -> int:
        """Units of work in flight (the in-flight gauge): worker calls, unless a call carries several units."""
        return sum(s.calls for s in self.slots.values())

    def _stats_fields(self) -> dict[str, Any]:
        """Fields of the subclass's stats record beyond PoolStats' own and its counters."""
        return {}

    # --- membership -------------------------------------------------------------------------------------

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a coroutine on the actor's event loop (Ray runs __init__ and every method on it)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _log(self, msg: str) -> None:
        print(f"rayward: {self.KIND.noun} {self.run_name}: {msg}", flush=True)

    def _account(self) -> None:
        now = time.monotonic()
        dt, self._t_account = now - self._t_account, now
        self.worker_s += self._alive * dt
        self.busy_s += self._busy * dt
        if self._busy == 0 and self._outstanding() == 0:
            self.idle_s += dt

    @contextmanager
    def _load(self, slot: S) -> Iterator[S]:
        """Change `slot`'s load (its calls, what it holds) inside the block: the busy-worker count the autoscaler
        integrates follows, however the block ends."""
        was_busy = self._is_busy(slot)
        try:
            yield slot
        finally:
            now = self._is_busy(slot)
            if slot.alive and now != was_busy:
                self._account()
                self._busy += 1 if now else -1

    def _spawn(self) -> S:
        i = self._next_id
        self._next_id += 1
        handle = self._new_worker(i, f"{self.run_name}/{self.role}-{i}")
        slot = self.slots[i] = self._new_slot(i, handle)
        self._background(self._await_alive(slot))
        self._publish(force=True)
        return slot

    async def _await_alive(self, slot: S) -> None:
        """Count a new worker as capacity once its constructor has run: until then it may be waiting for a node
        (the cluster autoscaler starts one for its resources) and is given no work."""
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
        self._busy += self._is_busy(slot)
        waited = time.monotonic() - slot.spawned_at
        if slot.warned:
            self._log(f"worker {slot.id} is alive after {waited:.0f} s")
        self._publish(force=True)
        await self._notify()

    def worker_name(self, slot: S) -> str:
        """The worker's actor name, as messages give it."""
        return f"{self.run_name}/{self.role}-{slot.id}"

    def _drop(self, slot: S, *, replace: bool, why: str | None = None) -> None:
        """Kill a worker (and start a replacement when `replace`). why: what it did (it died, it did not answer
        in time), said in one line naming it."""
        if self.slots.pop(slot.id, None) is None:
            return
        if why is not None:
            self._log(f"worker {self.worker_name(slot)} {why}: killed" + ("; replacing it" if replace else ""))
        if slot.alive:
            self._account()
            self._alive -= 1
            self._busy -= self._is_busy(slot)
            slot.alive = False
        ray.kill(slot.handle, no_restart=True)
        if replace:
            self.counters["replaced"] += 1
            self._spawn()
        self._publish(force=True)

    def size(self) -> int:
        """Live workers taking new work: the capacity work is spread over."""
        return sum(s.alive and not s.retiring for s in self.slots.values())

    def target(self) -> int:
        """Workers alive or starting, not retiring: the size the pool is heading to."""
        return sum(not s.retiring for s in self.slots.values())

    def _set_target(self, num_workers: int) -> None:
        """Spawn up to `num_workers`, or retire the surplus: workers still starting first (they hold no work,
        and killing one withdraws its resource request from the cluster autoscaler), then the least loaded,
        each once it is drained."""
        active = [s for s in self.slots.values() if not s.retiring]
        for _ in range(num_workers - len(active)):
            self._spawn()
        surplus = sorted(active, key=lambda s: (s.alive, self._holding(s), -s.id))[: max(len(active) - num_workers, 0)]
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

    async def scale(self, num_workers: int) -> St:
        """Pin the pool at `num_workers` (autoscaling, if on, pauses until set_bounds); shrinking retires the
        surplus once they are drained."""
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        before = self.target()
        why = f"pinned by `rayward scale {self.KIND.pin_flag}`" + (
            f"; autoscaling paused until `rayward scale {self.KIND.bounds_flag}`" if self.policy else ""
        )
        self.pinned = self.policy is not None
        if num_workers != before:
            self._apply(Decision(time.monotonic(), before, num_workers, why))
        elif self.pinned:
            self._log(f"workers {before}: {why}")
        await self._notify()
        return self.stats()

    async def set_bounds(self, min_workers: int | None = None, max_workers: int | None = None, *,
                         fresh: AutoscaleSettings | None = None) -> St:
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

    async def restore_scaling(self, state: dict[str, Any]) -> St:
        """`scaling_state` back: the same bounds, or the same pinned count."""
        if state["autoscale"] is not None:
            a = state["autoscale"]
            await self.set_bounds(a["min_workers"], a["max_workers"], fresh=AutoscaleSettings(**a))
        if state["pinned"] or state["autoscale"] is None:
            await self.scale(state["target"])
        return self.stats()

    async def _retire(self, slot: S) -> None:
        await self._wait_drained(slot)
        self._drop(slot, replace=False)

    async def _wait_drained(self, slot: S) -> None:
        drained = self._cond("drained")
        async with drained:
            await drained.wait_for(lambda: self._drained(slot))

    # --- autoscaling --------------------------------------------------------------------------------------

    def _arrived(self, units: int) -> None:
        """A batch of `units` units of work arrived: counted in `queued`, and the policy samples at arrivals."""
        self._account()  # the time up to now, idle or not, before the queue changes
        self._arrived_idle = self._busy == 0 and self._outstanding() == 0
        self.batches += 1
        self._joined(units)
        self._autoscale()  # a sample at the arrival itself: the policy's windows start at batch arrivals

    def _joined(self, units: int) -> None:
        """`units` more units of work of the batch that arrived last (a caller that sends one batch in parts, as
        the reward pool sends its judges each scored chunk): queued, but no new batch for the policy's cycles.
        `_arrived`'s queueing too."""
        self._account()
        self.queued += units
        self._peak = max(self._peak, self._outstanding())
        self._publish()

    def _sample(self) -> PoolSample:
        self._account()
        s = PoolSample(time.monotonic(), self.batches, self.worker_s, self.busy_s, self._peak, self.target(),
                       self.size(), self.idle_s, self._outstanding(), self._arrived_idle)
        self._peak = self._outstanding()
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
            except Exception as err:  # noqa: BLE001 - the loop must outlive a bad tick; the work does not need it
                self._log(f"autoscaling tick failed: {type(err).__name__}: {err}")

    def _warn_starting(self) -> None:
        now = time.monotonic()
        for s in self.slots.values():
            if not s.alive and not s.retiring and not s.warned and now - s.spawned_at > STARTING_WARN_S:
                s.warned = True
                self._log(
                    f"worker {s.id} has waited {now - s.spawned_at:.0f} s to start (resources "
                    f"{self.worker_options.get('resources') or {}}, num_cpus {self.worker_options.get('num_cpus')}): "
                    f"either no node can place it yet (an autoscaling cluster starts one, otherwise it waits) or "
                    f"its start-up is slow (imports, a runtime env). Work goes on on the {self.size()} live workers"
                )

    # --- waiting for capacity -----------------------------------------------------------------------------

    def _cond(self, which: str = "free") -> asyncio.Condition:
        """"free": capacity appeared (work waiting for a worker waits on it); "drained": a retiring worker may
        be idle."""
        if self._conds is None:
            self._conds = {"free": asyncio.Condition(), "drained": asyncio.Condition()}
        return self._conds[which]

    async def _notify(self, n: int | None = None) -> None:
        """Wake `n` waiters for capacity (all if None), and every retirement waiting for a drain. Releasing one
        unit of capacity wakes one waiter: waking all of them on every release re-ran every waiter's check
        (hundreds of chunks x workers) and made dispatch quadratic in the batch size."""
        free, drained = self._cond("free"), self._cond("drained")
        async with free:
            if n is None:
                free.notify_all()
            else:
                free.notify(n)
        async with drained:
            drained.notify_all()

    def _live(self) -> list[S]:
        """Live workers taking new work."""
        return [s for s in self.slots.values() if s.alive and not s.retiring]

    # --- introspection ------------------------------------------------------------------------------------

    def _publish(self, force: bool = False) -> None:
        if not self.metrics.due(force):
            return
        self.metrics.set_sizes(self.size(), self.target(), self.queued, self._inflight_units())
        self._publish_extra()
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

    def _publish_extra(self) -> None:
        """Gauges of the subclass's own, set with the others."""

    def stats(self) -> St:
        """The pool's state now (its STATS record)."""
        self._account()
        load = self.policy.load if self.policy else None
        if self.policy is None:
            mode = "off"
        else:
            st = self.policy.settings
            mode = f"pinned (bounds {st.min_workers}..{st.max_workers})" if self.pinned else (
                f"{st.min_workers}..{st.max_workers}")
        return self.STATS(
            workers=self.size(),
            target_workers=self.target(),
            starting=self.target() - self.size(),
            retiring=sum(s.retiring for s in self.slots.values()),
            calls_inflight=sum(s.calls for s in self.slots.values()),
            queue_depth=self.queued,
            worker_s=self.worker_s,
            utilization=load.utilization if load is not None else math.nan,
            decisions=self._decided(),
            autoscale=mode,
            **self._stats_fields(),
            **self.counters,
        )

    def decision_log(self) -> list[dict[str, Any]]:
        """The latest scaling decisions (t: the pool's monotonic clock), oldest first."""
        return [asdict(d) for d in self.decisions]

    def worker_handles(self) -> dict[int, Any]:
        return {i: s.handle for i, s in self.slots.items() if not s.retiring}


__all__ = [
    "LATENCY_BOUNDS", "METRICS", "PoolKind", "PoolMetrics", "PoolUnits", "Slot", "TAGS", "WAIT_BOUNDS", "WorkerPool",
    "pool_metric_names", "pool_metrics",
]
