"""EnvPool: the named actor that owns a run's environment workers and routes every session to one of them.

One per run, `<run>/env-pool` in the run's namespace, workers `<run>/env-<i>` (actors/envs/worker.py). The
machinery is the pool base's, shared with the reward pool (actors/runtime/pool.py): live-worker tracking, replacement,
`rayward scale --env-workers N` / `--pool env --min/--max`, autoscaling on the same policy, Ray metrics, stats.
What is this pool's own:

* **Placement.** A session goes to the least-loaded live worker (fewest sessions, then fewest calls in flight)
  and stays there until it closes: its environment instance lives in that worker. A worker holds at most
  SESSIONS_PER_WORKER sessions; an `open` waits until the live workers have room for all of its requests at
  once (so two opens never hold each other's half), or, for more requests than the whole pool holds, until the
  pool is empty (they then share it over capacity): the wait is the pool's queue, which autoscaling reads.
* **Routing, one call at a time per worker.** Every open, call and close goes through here to the session's
  worker, so the pool sees the load, the time each worker call takes, and the deaths. A worker runs one call at a
  time (its user code runs on its main thread, as TRL runs it: actors/envs/worker.py), and the pool keeps each
  worker's queue itself: it sends a worker its next call once the previous one has answered (a lock per worker,
  first come first served). So a call's bound starts when the worker starts it, not while it waits behind
  another session's call, and the wait is the pool's to see (`rayward_env_call_wait_s`). A worker that dies, or
  does not answer a call within the call's own bound (agent.tool_timeout_s per tool call and per open, the
  environment reward's timeout per session at close) plus `grace_s`, is killed and replaced; its sessions are
  lost: their calls (those waiting for it too) raise EnvSessionLost, their closes report it in EnvClosed.error,
  and they are counted. An open whose worker died is re-sent to another worker (nothing of its sessions existed
  yet; they reset from the same seed), counted under `retries`.
* **Retiring** a worker (scaling down) waits until its sessions have closed, at most `drain_timeout_s` (the
  trajectory deadline plus grace: a trajectory past it has ended anyway); sessions still open then are lost.

**Autoscaling load.** A worker counts as busy while it runs a call (an open, a tool turn, a close) or has calls
waiting for it, or while it is full: calls queued behind a worker keep it busy all the time they wait, so a
worker whose sessions' tools keep it running shows as fully used, and the policy grows the pool (new sessions go
to the least-loaded workers, those already open stay where their instance lives). Open sessions alone are not
load: a session waits on the model most of its life and costs memory, not time, so a pool sized by sessions
would grow with the batch size even when tools are instant. Calls in flight are the environments' own work, as
chunks are the reward pool's, so the same policy and target utilisation mean the same thing: the fraction of the
time a worker is running something. A full worker is busy too, so opens waiting for room grow the pool. The
policy caps its wish at the most sessions open or waiting at once (a worker per session is all the parallelism
there is) and sees a batch arrival at every `open`.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util import metrics as ray_metrics  # the sessions gauge and call-wait histogram, the env pool's own

from actors.agents.agent_worker import RETURN_GRACE_S, AgentWorker
from actors.envs.client import EnvSessionLost
from actors.envs.spec import EnvSpec
from actors.envs.worker import EnvWorker
from actors.runtime.autoscale import AutoscaleSettings
from actors.runtime.pool import TAGS, WAIT_BOUNDS, PoolKind, PoolUnits, Slot, WorkerPool
from actors.types import (
    AgentDone,
    AgentRun,
    EnvClosed,
    EnvOpened,
    EnvPoolStats,
    EnvRequest,
    ToolCall,
    ToolResult,
)

# Sessions one worker holds. A session costs its environment's memory and nothing while the model writes, so
# the bound is about what one worker's death takes with it: at most this many trajectories, one default batch
# (generation.generation_batch_size 32). Two default workers hold a default pipelined step's two batches. A
# worker runs their calls one at a time, as TRL runs a whole batch's sync tools on one thread: the sessions of a
# worker wait on the model most of their lives, so with tools that answer fast they seldom wait for each
# other; with slow ones the worker is busy, autoscaling sees it (module docstring), and the wait is measured
# (rayward_env_call_wait_s). A smaller bound would make trajectories wait to start instead, even with fast tools.
SESSIONS_PER_WORKER = 32
# Agents an agent worker (an async actor) runs at once: the sessions it holds, and its pid pings.
AGENT_CONCURRENCY = SESSIONS_PER_WORKER + 4
# Ray runs an actor's sync methods on its main thread (where SIGALRM works, for the user's alarms and rayward's
# deadline) only with max_concurrency=1 and no concurrency groups; with more, in threads of its own.
WORKER_CONCURRENCY = 1
# Beyond a call's own bound, how long the pool waits before it presumes the worker hung (SIGSTOPped, deadlocked,
# a tool holding the GIL in C code) and replaces it: Ray's dispatch and a loaded node fit in it many times over.
# Sessions go to live workers only, so it need not cover imports at start-up (the reward pool's grace does).
CALL_GRACE_S = 30.0

ENV_POOL = PoolKind(
    noun="environment pool", pin_flag="--env-workers", bounds_flag="--pool env --min/--max", metrics="env",
    units=PoolUnits(
        unit="call", workers="environment workers", queued="session opens waiting for room on a worker",
        inflight="environment worker calls in flight (opens, tool turns, closes), running or waiting for their "
                 "worker",
        latency="seconds of one environment worker call (an open, a tool turn, a close), from when it was sent",
        events="tool errors and timeouts, unknown tools, failed resets and rewards, lost sessions, hung workers, "
               "re-sent opens",
        wait="seconds an open waited for room on the workers",
    ),
)
COUNTERS = ("retries", "timeouts", "sessions_opened", "sessions_closed", "sessions_lost", "tool_calls", "tool_errors",
            "tool_timeouts", "unknown_tools", "reset_errors", "reward_errors", "instances_created", "instances_reused",
            "agent_runs", "agent_errors", "agent_timeouts")
# ToolResult.status -> the counter it adds to.
STATUS_COUNTERS = {"error": "tool_errors", "timeout": "tool_timeouts", "unknown_tool": "unknown_tools"}


@dataclass
class _EnvSlot(Slot):
    sessions: set[int] = field(default_factory=set)  # placed here: open, or opening
    opening: set[int] = field(default_factory=set)  # of those, the ones whose open is in flight
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)  # held by the call the worker is running
    gone: str | None = None  # why it was killed ("died", ...): what the calls still waiting for it are told


class _WorkerLost(Exception):
    """The worker died or hung during a call (it has been killed and replaced)."""


class EnvPool(WorkerPool[_EnvSlot, EnvPoolStats]):
    KIND = ENV_POOL
    STATS = EnvPoolStats

    def __init__(
        self,
        spec: EnvSpec,
        *,
        run_name: str,
        num_workers: int,
        worker_options: dict[str, Any],
        sys_path: list[str] | None = None,
        autoscale: AutoscaleSettings | None = None,
        role: str = "env",
        grace_s: float = CALL_GRACE_S,
        drain_timeout_s: float | None = None,
    ):
        """`num_workers` at start (clamped to the autoscaling bounds when `autoscale` is given); workers are
        named `<run_name>/<role>-<i>`. drain_timeout_s: how long a retiring worker's sessions may stay open
        (None: until they close)."""
        self.spec = spec
        self.sys_path = sys_path or []
        self.grace_s = grace_s
        self.drain_timeout_s = drain_timeout_s
        self._where: dict[int, _EnvSlot] = {}  # open (or opening) session -> its worker
        self._lost: set[int] = set()  # sessions whose worker died: their calls raise EnvSessionLost
        self._next_session = 0
        self._sessions_gauge = ray_metrics.Gauge("rayward_env_sessions", "environment sessions open", tag_keys=TAGS)
        self._sessions_gauge.set_default_tags({"run": run_name, "pool": role})
        self._call_wait = ray_metrics.Histogram(
            "rayward_env_call_wait_s", "seconds an environment worker call waited for its worker (running another "
            "session's call)", boundaries=WAIT_BOUNDS, tag_keys=TAGS)
        self._call_wait.set_default_tags({"run": run_name, "pool": role})
        super().__init__(run_name=run_name, role=role, num_workers=num_workers, worker_options=worker_options,
                         autoscale=autoscale, counters=COUNTERS)

    def __repr__(self) -> str:
        # Ray captures an actor's repr once (the dashboard's Repr column): only what never changes.
        return f"EnvPool(run={self.run_name!r}, role={self.role!r}, environments={self.spec.environments})"

    # --- the pool base's hooks ------------------------------------------------------------------------------

    def _new_worker(self, index: int, name: str) -> Any:
        if self.spec.agent_function is not None:  # async: its agents run at once (actors/agents/agent_worker.py)
            return (
                ray.remote(AgentWorker)
                .options(name=name, max_concurrency=AGENT_CONCURRENCY, max_restarts=0, **self.worker_options)
                .remote(self.spec, index=index, sys_path=self.sys_path)
            )
        return (
            ray.remote(EnvWorker)
            .options(name=name, max_concurrency=WORKER_CONCURRENCY, max_restarts=0, **self.worker_options)
            .remote(self.spec, index=index, sys_path=self.sys_path)
        )

    def _new_slot(self, i: int, handle: Any) -> _EnvSlot:
        return _EnvSlot(i, handle, time.monotonic())

    def _is_busy(self, slot: _EnvSlot) -> bool:
        # An agent's run is not counted as a call (it waits on the model most of its life): a worker running
        # agents is busy when it is full.
        return slot.calls > 0 or len(slot.sessions) >= SESSIONS_PER_WORKER

    def _holding(self, slot: _EnvSlot) -> int:
        return len(slot.sessions)

    def _drained(self, slot: _EnvSlot) -> bool:
        return not slot.sessions and slot.calls == 0

    def _outstanding(self) -> int:
        return self.queued + len(self._where)

    def _stats_fields(self) -> dict[str, Any]:
        return {"sessions": len(self._where)}

    def _publish_extra(self) -> None:
        self._sessions_gauge.set(len(self._where))

    async def _retire(self, slot: _EnvSlot) -> None:
        try:
            await asyncio.wait_for(self._wait_drained(slot), self.drain_timeout_s)
        except asyncio.TimeoutError:
            self._lose(slot, f"retired with {len(slot.sessions)} sessions still open after {self.drain_timeout_s:g} s")
            return
        self._drop(slot, replace=False)

    # --- sessions ------------------------------------------------------------------------------------------

    async def open(self, requests: list[EnvRequest]) -> list[EnvOpened]:
        """One session per request, each on the least-loaded live worker, reset with the request's row and seed;
        results in request order. A session whose reset failed has its error in EnvOpened.error (and is not
        open); an open whose worker died is re-sent to another."""
        t0 = time.monotonic()
        self._arrived(len(requests))
        out: dict[int, EnvOpened] = {}
        pending = list(range(len(requests)))  # request indices still to open
        first = True
        while pending:
            placed = await self._place(len(pending))
            if first:
                self.metrics.wait.observe(time.monotonic() - t0)
                first = False
            groups: dict[int, list[tuple[int, int]]] = defaultdict(list)  # worker -> [(request index, session)]
            for i, (sid, slot) in zip(pending, placed, strict=True):
                groups[slot.id].append((i, sid))
            slots = {sid: slot for sid, slot in placed}
            results = await asyncio.gather(*(
                self._open_on(slots[g[0][1]], [(sid, requests[i]) for i, sid in g]) for g in groups.values()
            ))
            pending = []
            for g, opened in zip(groups.values(), results, strict=True):
                if opened is None:  # the worker died: these go again
                    pending += [i for i, _ in g]
                    continue
                for (i, _), o in zip(g, opened, strict=True):
                    out[i] = o
            if pending:
                self.counters["retries"] += 1
                self.metrics.event("retry")
                self.queued += len(pending)
        return [out[i] for i in range(len(requests))]

    async def _place(self, n: int) -> list[tuple[int, _EnvSlot]]:
        """n new sessions, each reserved on the least-loaded live worker once there is room for all of them
        (see the module docstring); their ids and workers."""
        cond = self._cond()
        async with cond:
            await cond.wait_for(lambda: self._room_for(n))
            placed = []
            for _ in range(n):
                slot = min(self._live(), key=lambda s: (len(s.sessions), s.calls))
                sid, self._next_session = self._next_session, self._next_session + 1
                with self._load(slot):
                    slot.sessions.add(sid)
                    slot.opening.add(sid)
                self._where[sid] = slot
                placed.append((sid, slot))
        self.queued -= n
        self._publish()
        return placed

    def _room_for(self, n: int) -> bool:
        live = self._live()
        free = sum(max(SESSIONS_PER_WORKER - len(s.sessions), 0) for s in live)
        return bool(live) and free >= min(n, SESSIONS_PER_WORKER * len(live))

    async def _open_on(self, slot: _EnvSlot, pairs: list[tuple[int, EnvRequest]]) -> list[EnvOpened] | None:
        """Open the sessions on their worker; None if it died or hung meanwhile (they are no longer placed)."""
        sids = [sid for sid, _ in pairs]
        try:
            opened = await self._run(slot, "open", self.spec.tool_timeout_s * len(pairs), pairs)
        except _WorkerLost:
            return None
        finally:
            slot.opening.difference_update(sids)
        for o in opened:
            if o.created:
                self.counters["instances_created"] += 1
            elif o.error is None and self.spec.environments:
                self.counters["instances_reused"] += 1
            if o.error is None:
                self.counters["sessions_opened"] += 1
            else:  # reset failed: the worker holds nothing for it
                self.counters["reset_errors"] += 1
                self.metrics.event("reset_error")
                self._unplace(slot, [o.session])
        await self._notify()
        return opened

    async def call(self, session: int, calls: list[ToolCall]) -> list[ToolResult]:
        """One model turn's tool calls in the session's environment (sync ones one after another, async ones at
        once, each within the tool timeout, so the worker call's bound is the tool timeout per call); results in
        call order. EnvSessionLost if its worker died or hung (now or before)."""
        slot = self._slot_of(session)
        try:
            results = await self._run(slot, "call", self.spec.tool_timeout_s * max(len(calls), 1), session, calls)
        except _WorkerLost as err:
            raise EnvSessionLost(f"session {session}: {err}") from None
        except RayTaskError as err:  # the worker does not hold it (never should): the same for the trajectory
            raise EnvSessionLost(f"session {session}: {getattr(err, 'cause', None) or err}") from None
        self.counters["tool_calls"] += len(calls)
        for r in results:
            if r.status in STATUS_COUNTERS:
                self.counters[STATUS_COUNTERS[r.status]] += 1
                self.metrics.event(STATUS_COUNTERS[r.status].removesuffix("s"))
        return results

    async def close(self, sessions: list[int], keep_state: bool = False) -> list[EnvClosed]:
        """End the sessions: get_reward() where their environment has one, and the pickled environment when
        keep_state; results in order. A session lost before or during the close gets EnvClosed(None, None,
        error="EnvSessionLost: ...") and the others keep their rewards."""
        out: dict[int, EnvClosed] = {}
        groups: dict[int, list[int]] = defaultdict(list)
        slots: dict[int, _EnvSlot] = {}
        for sid in sessions:
            try:
                slot = self._slot_of(sid)
            except EnvSessionLost as err:
                out[sid] = EnvClosed(None, None, error=f"EnvSessionLost: {err}")
                continue
            groups[slot.id].append(sid)
            slots[slot.id] = slot
        results = await asyncio.gather(*(self._close_on(slots[w], sids, keep_state) for w, sids in groups.items()))
        for sids, closed in zip(groups.values(), results, strict=True):
            out.update(zip(sids, closed, strict=True))
        return [out[sid] for sid in sessions]

    async def _close_on(self, slot: _EnvSlot, sids: list[int], keep_state: bool) -> list[EnvClosed]:
        """Close the sessions on their worker (sync get_rewards one after another: the reward timeout each)."""
        try:
            closed = await self._run(slot, "close", self.spec.reward_timeout_s * len(sids), sids, keep_state)
        except _WorkerLost as err:
            return [EnvClosed(None, None, error=f"EnvSessionLost: session {sid}: {err}") for sid in sids]
        self._unplace(slot, sids)
        self.counters["sessions_closed"] += len(sids)
        errors = sum(c.error is not None for c in closed)
        if errors:
            self.counters["reward_errors"] += errors
            self.metrics.event("reward_error", errors)
        await self._notify()
        return closed

    # --- agent functions -----------------------------------------------------------------------------------

    async def run_agent(self, run: AgentRun) -> AgentDone:
        """Run the agent function for one trajectory on the least-loaded live worker (a session of its own there
        while it runs, not a call: the worker runs its agents at once). Bounded by run.timeout_s plus the
        return grace plus `grace_s`: a worker that does not answer by then is killed and replaced, and every
        agent it ran ends with an EnvSessionLost error, as its worker's death does."""
        self._arrived(1)
        ((sid, slot),) = await self._place(1)
        slot.opening.discard(sid)
        self.counters["agent_runs"] += 1
        self.counters["sessions_opened"] += 1
        try:
            done: AgentDone = await self._send(slot, "run_agent", run.timeout_s + RETURN_GRACE_S, run)
        except _WorkerLost as err:
            done = AgentDone(None, error=f"EnvSessionLost: {err}")
        else:
            self._unplace(slot, [sid])
            self.counters["sessions_closed"] += 1
        if done.error is not None:
            timed_out = done.error.startswith("timed out")
            self.counters["agent_timeouts" if timed_out else "agent_errors"] += 1
            self.metrics.event("agent_timeout" if timed_out else "agent_error")
        await self._notify()
        return done

    # --- routing -------------------------------------------------------------------------------------------

    def _slot_of(self, session: int) -> _EnvSlot:
        slot = self._where.get(session)
        if slot is not None and session not in slot.opening:
            return slot
        if session in self._lost:
            raise EnvSessionLost(f"session {session} was lost: its environment worker died or stopped answering")
        raise EnvSessionLost(f"session {session} is not open (never opened, or already closed)")

    async def _run(self, slot: _EnvSlot, method: str, bound_s: float, *args: Any) -> Any:
        """One worker call, counted in the worker's load from when it is asked for; sent once the worker's
        previous call has answered, and bounded from then. _WorkerLost when the worker died or took longer than
        the bound plus grace (it is then killed and replaced: everything it held is lost), or was killed while
        the call waited for it."""
        with self._load(slot):
            slot.calls += 1
        self._publish()
        t0 = time.monotonic()
        try:
            async with slot.turn:
                self._call_wait.observe(time.monotonic() - t0)
                if slot.gone is not None:
                    raise _WorkerLost(f"its environment worker {slot.id} {slot.gone}")
                return await self._send(slot, method, bound_s, *args)
        finally:
            with self._load(slot):
                slot.calls -= 1
            self._publish()
            await self._notify(1)

    async def _send(self, slot: _EnvSlot, method: str, bound_s: float, *args: Any) -> Any:
        t0 = time.monotonic()
        try:
            return await asyncio.wait_for(getattr(slot.handle, method).remote(*args), bound_s + self.grace_s)
        except (RayActorError, asyncio.TimeoutError, GetTimeoutError) as err:
            hung = not isinstance(err, RayActorError)
            why = f"did not answer a call within {bound_s + self.grace_s:g} s" if hung else "died"
            if hung:
                self.counters["timeouts"] += 1
                self.metrics.event("timeout")
            self._lose(slot, why)
            raise _WorkerLost(f"its environment worker {slot.id} {why}") from None
        finally:
            self.metrics.latency.observe(time.monotonic() - t0)

    def _unplace(self, slot: _EnvSlot, sids: list[int]) -> None:
        with self._load(slot):
            slot.sessions.difference_update(sids)
        for sid in sids:
            self._where.pop(sid, None)

    def _lose(self, slot: _EnvSlot, why: str) -> None:
        """Kill a dead, hung or overdue worker (replaced unless it was retiring): its open sessions are lost; the
        ones still opening are left to their open, which sends them elsewhere."""
        if self.slots.get(slot.id) is not slot:
            return  # another call on it already did
        slot.gone = why
        lost = slot.sessions - slot.opening
        for sid in slot.sessions:
            self._where.pop(sid, None)
        self._lost.update(lost)
        self.counters["sessions_lost"] += len(lost)
        if lost:
            self.metrics.event("session_lost", len(lost))
        self._drop(slot, replace=not slot.retiring, why=f"{why}: {len(lost)} sessions lost")
        self._background(self._notify())

    # --- introspection -------------------------------------------------------------------------------------

    def session_workers(self) -> dict[int, int]:
        """Open session -> the worker that holds it."""
        return {sid: slot.id for sid, slot in self._where.items() if sid not in slot.opening}


__all__ = ["EnvPool", "SESSIONS_PER_WORKER", "CALL_GRACE_S"]
