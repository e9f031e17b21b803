"""EnginePool: a named actor that owns one second model's engines (a judge's, a teacher's) and spreads requests
over them: JudgePool (judge rewards) and TeacherPool (on-policy distillation).

One per judge model of a run, named `<run>/judge-<reward>-pool` (the first judge reward using that model),
its engines `<run>/judge-<reward>-<i>`. The reward pool sends it the samples of a chunk whose judge rewards
must be computed (a lazily gated judge's open samples only) as soon as the chunk's functions are scored, so
requests of many chunks and groups arrive while others run; each engine call carries a slice of the queue
to the least-loaded live engine with room (at most `max_inflight` requests per engine), and the engine batches
it with what it already runs. An engine that dies or hangs is killed and replaced, and the requests of its
call go back to the front of the queue: every request is answered exactly once (a dead engine's late answer
never arrives). Requests that find no live engine for `queue_timeout_s` (every engine failing to start) are
answered "timeout", and the reward's error policy takes over.

Sizing is the pool base's (actors/runtime/pool.py): `scale(n)` pins the engine count (`rayward scale RUN
--judge-engines N`), `set_bounds` autoscales it from its load like the reward pool. A request is the unit of
work of its metrics (`rayward_judge_*`).

The teacher pool (`<run>/teacher-pool`, engines `<run>/teacher-<i>`) is the same machinery over TeacherEngines:
the reward pool sends it each chunk's samples as the chunk arrives (`rayward scale RUN --teacher-engines N`,
metrics `rayward_teacher_*`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from actors.engines.judge import JudgeAnswer, JudgeEngine, JudgeRequest
from actors.engines.teacher import TeacherAnswer, TeacherEngine, TeacherRequest
from actors.runtime.autoscale import AutoscaleSettings
from actors.runtime.pool import PoolKind, PoolUnits, Slot, WorkerPool
from actors.types import JudgePoolStats, TeacherPoolStats

# Engine calls running at once on one engine actor (its Ray max_concurrency): each call's requests are added to
# the engine's batch on arrival, so a few calls keep it fed while earlier ones finish.
CALLS_PER_ENGINE = 4
# Engine calls per engine slot a batch of requests is cut into (as the reward pool's CALLS_PER_SLOT): the last
# round balances load, a call per request would cost a Ray call each.
CALLS_PER_SLOT = 2
# Beyond the judge's own timeout_s, how long an engine call may take before the engine is presumed hung.
CALL_GRACE_S = 120.0

JUDGE_POOL = PoolKind(
    noun="judge pool", pin_flag="--judge-engines", bounds_flag="--judge-min/--judge-max", metrics="judge",
    units=PoolUnits(
        unit="request", workers="judge engines", queued="judge requests waiting for an engine",
        inflight="judge requests being answered", latency="seconds to answer one judge request (its engine call)",
        events="timeouts, errors, retries", wait="seconds a judge request waited for an engine",
    ),
)
TEACHER_POOL = PoolKind(
    noun="teacher pool", pin_flag="--teacher-engines", bounds_flag="--teacher-min/--teacher-max", metrics="teacher",
    units=PoolUnits(
        unit="request", workers="teacher engines", queued="teacher requests waiting for an engine",
        inflight="teacher requests being scored", latency="seconds to score one teacher request (its engine call)",
        events="timeouts, errors, retries", wait="seconds a teacher request waited for an engine",
    ),
)


@dataclass
class EngineSlot(Slot):
    """One engine as its pool sees it: `calls` engine calls carrying `requests` requests."""

    requests: int = 0


class EnginePool(WorkerPool[EngineSlot, Any]):
    """The machinery of a pool of engines; a subclass names its engine's method (CALL) and answer type."""

    ENGINE: Any = None  # the engine class (JudgeEngine, TeacherEngine)
    CALL = ""  # the engine's method: requests -> answers
    ANSWER: Any = None  # the answer record (status, error, seconds)

    def __init__(
        self,
        spec: Any,
        *,
        run_name: str,
        role: str,
        num_engines: int,
        engine_options: dict[str, Any],
        engine_kwargs: dict[str, Any] | None = None,
        autoscale: AutoscaleSettings | None = None,
        max_inflight: int = 64,
        queue_timeout_s: float = 600.0,
        call_grace_s: float = CALL_GRACE_S,
        sys_path: list[str] | None = None,
        engine_cls: Any = None,
    ):
        """spec: the engines' (JudgeSpec, TeacherSpec: model, timeout_s). engine_options: Ray options of an engine
        actor (num_cpus, num_gpus, resources); engine_kwargs: the engine's (dtype, max_model_len, kv_cache_gib,
        ...). max_inflight: requests one engine holds at once. engine_cls: what an engine is (default the pool's
        ENGINE; tests: one over a scripted engine)."""
        self.spec = spec
        self.engine_kwargs = dict(engine_kwargs or {})
        self.max_inflight = max_inflight
        self.queue_timeout_s = queue_timeout_s
        self.call_timeout_s = spec.timeout_s + call_grace_s
        self.sys_path = sys_path or []
        self.engine_cls = engine_cls or self.ENGINE
        self.inflight_requests = 0
        super().__init__(run_name=run_name, role=role, num_workers=num_engines, worker_options=engine_options,
                         autoscale=autoscale, counters=("requests", "retries", "timeouts", "errors"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(run={self.run_name!r}, role={self.role!r}, model={self.spec.model!r})"

    def _new_worker(self, index: int, name: str) -> Any:
        return (
            ray.remote(self.engine_cls)
            .options(name=name, max_concurrency=CALLS_PER_ENGINE, max_restarts=0, **self.worker_options)
            .remote(self.spec, sys_path=self.sys_path, **self.engine_kwargs)
        )

    def _new_slot(self, i: int, handle: Any) -> EngineSlot:
        return EngineSlot(i, handle, time.monotonic())

    def _is_busy(self, slot: EngineSlot) -> bool:
        return slot.requests > 0

    def _holding(self, slot: EngineSlot) -> int:
        return slot.requests

    def _inflight_units(self) -> int:
        return self.inflight_requests

    def _stats_fields(self) -> dict[str, Any]:
        return {"requests_inflight": self.inflight_requests}

    # --- answering ----------------------------------------------------------------------------------------

    def _room(self, slot: EngineSlot) -> int:
        return min(self.max_inflight - slot.requests, (CALLS_PER_ENGINE - slot.calls) * self.max_inflight)

    async def _acquire(self, wanted: Any, deadline: float) -> EngineSlot | None:
        """The least-loaded live engine with room, or None once `wanted()` turns false or the deadline passes."""
        cond = self._cond()
        async with cond:
            try:
                await asyncio.wait_for(
                    cond.wait_for(lambda: not wanted() or any(self._room(s) > 0 for s in self._live())),
                    max(deadline - time.monotonic(), 0.0))
            except asyncio.TimeoutError:
                return None
            if not wanted():
                return None
            return min((s for s in self._live() if self._room(s) > 0), key=lambda s: s.requests)

    def per_call(self, remaining: int) -> int:
        """Requests the next engine call carries: about remaining / (engines x CALLS_PER_SLOT)."""
        return max(1, math.ceil(remaining / (max(self.target(), 1) * CALLS_PER_SLOT)))

    async def _send(self, requests: list[Any], queue: deque[int], answers: list[Any], deadline: float) -> None:
        while queue:
            slot = await self._acquire(lambda: bool(queue), deadline)
            if slot is None:
                return
            take = [queue.popleft() for _ in range(min(self.per_call(len(queue)), len(queue), self._room(slot)))]
            self.queued -= len(take)
            self.inflight_requests += len(take)
            with self._load(slot):
                slot.calls += 1
                slot.requests += len(take)
            self._publish()
            if not queue:
                await self._notify()
            t0 = time.monotonic()
            try:
                out = await asyncio.wait_for(getattr(slot.handle, self.CALL).remote([requests[i] for i in take]),
                                             self.call_timeout_s)
            except (RayActorError, asyncio.TimeoutError, GetTimeoutError) as err:
                why = "died" if isinstance(err, RayActorError) else (
                    f"did not answer {len(take)} request(s) within {self.call_timeout_s:g} s (hung)")
                self.counters["retries"] += 1
                self.metrics.event("retry")
                queue.extendleft(reversed(take))
                self.queued += len(take)
                self._release(slot, len(take))
                self._drop(slot, replace=not slot.retiring, why=why)
                await self._notify()
                continue
            self._release(slot, len(take))
            await self._notify(1)
            self.metrics.latency.observe(time.monotonic() - t0)
            for i, a in zip(take, out, strict=True):
                answers[i] = a

    def _release(self, slot: EngineSlot, n: int) -> None:
        self.inflight_requests -= n
        with self._load(slot):
            slot.calls -= 1
            slot.requests -= n
        self._publish()

    async def begin_batch(self) -> None:
        """A batch of requests starts (the reward pool's: a step's batch, whose chunks' requests follow with
        `judge(..., part=True)`): the autoscaler's batch cycles run from one to the next, so a step whose chunks
        arrive one by one is one cycle, as the reward pool's batch is."""
        self._arrived(0)

    async def _answer(self, requests: list[Any], part: bool) -> list[Any]:
        """Answer every request once (in order): ok, or timeout / error with the reason. part: the requests belong
        to the batch `begin_batch` started (else they are a batch of their own)."""
        if not requests:
            return []
        t0 = time.monotonic()
        queue: deque[int] = deque(range(len(requests)))
        answers: list[Any] = [None] * len(requests)
        if part:
            self._joined(len(requests))
        else:
            self._arrived(len(requests))
        deadline = t0 + self.queue_timeout_s
        await asyncio.gather(*(self._send(requests, queue, answers, deadline) for _ in requests))
        if queue:  # no engine took them before the deadline
            self.queued -= len(queue)
            for i in queue:
                answers[i] = self.ANSWER("timeout", error=f"no {self.KIND.units.workers[:-1]} took the request "
                                         f"within {self.queue_timeout_s:g} s ({self.size()} live)")
            queue.clear()
        done = [a for a in answers if a is not None]
        assert len(done) == len(requests)
        self.metrics.wait.observe(time.monotonic() - t0 - max((a.seconds for a in done), default=0.0))
        self.counters["requests"] += len(done)
        for kind in ("timeout", "error"):
            n = sum(a.status == kind for a in done)
            self.counters[f"{kind}s"] += n
            if n:
                self.metrics.event(kind, n)
        return done




class JudgePool(EnginePool):
    """One judge model's engines (a judge reward's)."""

    KIND = JUDGE_POOL
    STATS = JudgePoolStats
    ENGINE = JudgeEngine
    CALL = "judge"
    ANSWER = JudgeAnswer

    async def judge(self, requests: list[JudgeRequest], part: bool = False) -> list[JudgeAnswer]:
        """Judge every request once (in order): ok with a score, or timeout / error with the reason. part: the
        requests belong to the batch `begin_batch` started (else they are a batch of their own)."""
        return await self._answer(requests, part)


class TeacherPool(EnginePool):
    """The run's distillation teacher's engines."""

    KIND = TEACHER_POOL
    STATS = TeacherPoolStats
    ENGINE = TeacherEngine
    CALL = "logprobs"
    ANSWER = TeacherAnswer

    async def logprobs(self, requests: list[TeacherRequest], part: bool = False) -> list[TeacherAnswer]:
        """The teacher's log-probs of every request's completion tokens, once each (in order), or timeout /
        error with the reason. part: as JudgePool.judge's."""
        return await self._answer(requests, part)


__all__ = ["JUDGE_POOL", "TEACHER_POOL", "EnginePool", "JudgePool", "TeacherPool"]
