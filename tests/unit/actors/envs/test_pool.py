"""EnvPool's own logic in milliseconds: placement, the capacity wait, opens re-sent after a death, lost sessions, the
drain deadline, what counts as load, one call at a time per worker. Its workers are real EnvWorkers in this process
behind handles that obey an actor handle's interface (`handle.method.remote(...)` is awaitable, and a handle runs
its calls one at a time, as a max_concurrency=1 actor does; a killed one raises RayActorError). They run off the
main thread, so their sync user code runs in threads (sync_on="threads"); what only Ray shows (the main thread,
processes dying, hanging, `rayward scale`) is in tests/integration/actors/envs/test_pool.py."""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from ray.exceptions import RayActorError

import actors.envs.pool as pool_module
import actors.runtime.pool as base_module
from actors.envs.client import EnvSessionLost
from actors.envs.pool import EnvPool
from actors.envs.spec import EnvSpec
from actors.envs.worker import EnvWorker
from actors.types import EnvRequest, ToolCall
from tests.fixtures import envs

SPEC = EnvSpec(environments={None: "tests.fixtures.envs:CounterEnv"})


class _Method:
    def __init__(self, handle, name):
        self.handle, self.name = handle, name

    def remote(self, *args, **kwargs):
        self.handle.sent.append(self.name)
        return asyncio.get_running_loop().run_in_executor(self.handle.queue, self.handle.invoke, self.name, args,
                                                          kwargs)


class FakeHandle:
    """An in-process EnvWorker behind an actor handle's interface, running its calls one at a time."""

    def __init__(self, spec, index):
        self.worker = EnvWorker(spec, index=index, sync_on="threads")
        self.queue = ThreadPoolExecutor(1)  # a max_concurrency=1 actor's queue
        self.sent: list[str] = []  # the methods called, in order, as they were sent
        self.running: str | None = None  # the method running now
        self.dead = False
        self.die_on: str | None = None  # the next call of this method kills the worker first
        self.hold_on: str | None = None  # calls of this method wait for envs.RELEASE before they run

    def invoke(self, name, args, kwargs):
        if self.die_on == name:
            self.dead = True
        if self.dead:
            raise RayActorError()
        self.running = name
        if self.hold_on == name:
            envs.RELEASE.wait(envs.HOLD_S)
        try:
            return getattr(self.worker, name)(*args, **kwargs)
        finally:
            self.running = None

    def __getattr__(self, name):
        return _Method(self, name)


class FakePool(EnvPool):
    def _new_worker(self, index, name):
        return FakeHandle(self.spec, index)


@pytest.fixture(autouse=True)
def in_process_kill(monkeypatch):
    monkeypatch.setattr(base_module.ray, "kill", lambda handle, no_restart=True: setattr(handle, "dead", True))
    envs.RELEASE.clear()
    yield
    envs.RELEASE.set()


def run(test):
    """Run `test(pool)` on an event loop, as Ray runs the pool actor's methods."""

    async def main(n, kwargs):
        pool = FakePool(SPEC, run_name="t", num_workers=n, worker_options={}, **kwargs)
        await until(lambda: pool.size() == n)
        return await test(pool)

    return lambda n=2, **kwargs: asyncio.run(main(n, kwargs))


async def until(pred):
    for _ in range(10_000):
        if pred():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


def requests(n, **row):
    return [EnvRequest(None, {"start": i, **row}, 0) for i in range(n)]


def test_sessions_spread_least_loaded_and_results_keep_request_order():
    async def t(pool):
        out = await pool.open(requests(5))
        assert [o.observation for o in out] == [f"The counter starts at {i}." for i in range(5)]
        assert len({o.session for o in out}) == 5
        assert sorted(pool.session_workers().values()) == [0, 0, 0, 1, 1]
        results = await pool.call(out[3].session, [ToolCall("add", {"n": 1})])
        assert results[0].content == "4"
        closed = await pool.close([o.session for o in out])
        assert [c.reward for c in closed] == [0.0, 1.0, 2.0, 4.0, 4.0]
        assert pool.stats().sessions == 0 and pool.stats().sessions_closed == 5
        assert pool.stats().sessions_opened == 5

    run(t)()


def test_an_open_waits_for_room_for_all_its_sessions(monkeypatch):
    monkeypatch.setattr(pool_module, "SESSIONS_PER_WORKER", 2)

    async def t(pool):
        first = await pool.open(requests(3))  # 3 of 4 places taken
        second = asyncio.ensure_future(pool.open(requests(2)))
        await until(lambda: pool.stats().queue_depth == 2)
        assert not second.done() and pool.stats().sessions == 3  # it holds nothing while it waits
        await pool.close([first[0].session])
        out = await second
        assert len(out) == 2 and pool.stats().queue_depth == 0 and pool.stats().sessions == 4

    run(t)()


def test_an_open_bigger_than_the_pool_waits_for_an_empty_pool_then_shares_it(monkeypatch):
    monkeypatch.setattr(pool_module, "SESSIONS_PER_WORKER", 2)

    async def t(pool):
        out = await pool.open(requests(6))  # more than 2 x 2: over capacity rather than never
        assert sorted(pool.session_workers().values()) == [0, 0, 0, 1, 1, 1]
        assert all(o.error is None for o in out)

    run(t)()


def test_an_open_whose_worker_died_goes_to_another():
    async def t(pool):
        pool.slots[0].handle.die_on = "open"
        out = await pool.open(requests(4))
        assert [o.error for o in out] == [None] * 4
        assert [o.observation for o in out] == [f"The counter starts at {i}." for i in range(4)]
        s = pool.stats()
        assert (s.retries, s.replaced, s.sessions_lost, s.sessions_opened) == (1, 1, 0, 4)
        assert set(pool.session_workers().values()) <= {1, 2}  # the survivor and the replacement

    run(t)()


def test_a_dead_worker_loses_exactly_its_sessions():
    async def t(pool):
        out = await pool.open(requests(4))
        where = pool.session_workers()
        victim = where[out[0].session]
        pool.slots[victim].handle.dead = True
        with pytest.raises(EnvSessionLost, match=f"environment worker {victim} died"):
            await pool.call(out[0].session, [ToolCall("add", {"n": 1})])
        lost = [o.session for o in out if where[o.session] == victim]
        kept = [o.session for o in out if where[o.session] != victim]
        assert pool.stats().sessions_lost == len(lost) == 2
        for sid in lost:
            with pytest.raises(EnvSessionLost, match="was lost"):
                await pool.call(sid, [ToolCall("add", {"n": 1})])
        closed = await pool.close([o.session for o in out])
        assert [c.error is None for c in closed] == [o.session in kept for o in out]
        with pytest.raises(EnvSessionLost, match="is not open"):
            await pool.call(12345, [])

    run(t)()


def test_a_reset_that_failed_holds_no_place():
    spec = EnvSpec(environments={None: "tests.fixtures.envs:FailingResetEnv"})

    async def main():
        pool = FakePool(spec, run_name="t", num_workers=1, worker_options={})
        await until(lambda: pool.size() == 1)
        out = await pool.open(requests(2, task="x"))
        assert [o.error for o in out] == ["ValueError: no such task: x"] * 2
        assert pool.stats().sessions == 0 and pool.stats().reset_errors == 2
        with pytest.raises(EnvSessionLost, match="is not open"):
            await pool.call(out[0].session, [])

    asyncio.run(main())


def test_tool_outcomes_are_counted():
    async def t(pool):
        (o,) = await pool.open(requests(1))
        await pool.call(o.session, [ToolCall("boom", {}), ToolCall("nope", {}), ToolCall("add", {"n": 1})])
        s = pool.stats()
        assert (s.tool_calls, s.tool_errors, s.unknown_tools, s.tool_timeouts) == (3, 1, 1, 0)

    run(t)()


def with_pool(spec, test):
    """Run `test(pool)` on a one-worker pool of `spec`."""

    async def main():
        pool = FakePool(spec, run_name="t", num_workers=1, worker_options={})
        await until(lambda: pool.size() == 1)
        return await test(pool)

    return asyncio.run(main())


def test_every_tool_outcome_a_worker_reports_is_counted():
    """The worker reports what went wrong in its results; the pool's stats count it (bad arguments and a tool's
    own TimeoutError are tool errors, a hung sync tool a timeout)."""
    spec = EnvSpec(tools=("tests.fixtures.envs:held",), environments={None: "tests.fixtures.envs:CounterEnv"},
                   tool_timeout_s=0.3)

    async def t(pool):
        (o,) = await pool.open(requests(1))
        bad = [ToolCall("add", {"m": 1}), ToolCall("add", {}), ToolCall("add", {"n": 1, "x": 2}), ToolCall("add", "1")]
        await pool.call(o.session, [ToolCall("ad", {"n": 1}), *bad])
        await pool.call(o.session, [ToolCall("boom", {}), ToolCall("own_timeout", {}), ToolCall("held", {})])
        s = pool.stats()
        assert (s.tool_calls, s.unknown_tools, s.tool_errors, s.tool_timeouts) == (8, 1, 6, 1)

    with_pool(spec, t)


def test_a_reset_past_its_bound_is_a_reset_error():
    spec = EnvSpec(environments={None: "tests.fixtures.envs:HeldResetEnv"}, tool_timeout_s=0.3)

    async def t(pool):
        (o,) = await pool.open(requests(1))
        assert o.error.startswith("TimeoutError: HeldResetEnv() and reset() took more than 0.3 s")
        assert (pool.stats().reset_errors, pool.stats().sessions, pool.stats().sessions_opened) == (1, 0, 0)

    with_pool(spec, t)


@pytest.mark.parametrize(("env", "keep_state", "errors"), [
    ("CounterEnv", True, 0), ("FailingRewardEnv", False, 1), ("StringRewardEnv", False, 1),
    ("HeldRewardEnv", False, 1), ("UnpicklableEnv", True, 1),
])
def test_a_failed_get_reward_or_pickle_is_a_reward_error(env, keep_state, errors):
    spec = EnvSpec(environments={None: f"tests.fixtures.envs:{env}"}, reward_timeout_s=0.3)

    async def t(pool):
        (o,) = await pool.open(requests(1))
        (closed,) = await pool.close([o.session], keep_state=keep_state)
        assert (closed.error is not None) == bool(errors)
        assert (pool.stats().reward_errors, pool.stats().sessions_closed) == (errors, 1)

    with_pool(spec, t)


def test_a_retiring_worker_past_its_drain_deadline_loses_what_is_still_open():
    async def t(pool):
        out = await pool.open(requests(2))
        await pool.scale(1)
        await until(lambda: pool.stats().retiring == 0)
        s = pool.stats()
        assert (s.workers, s.sessions_lost, s.sessions) == (1, 1, 1)
        kept = [o.session for o in out if o.session in pool.session_workers()]
        assert len(kept) == 1 and (await pool.close(kept))[0].error is None

    run(t)(drain_timeout_s=0.05)


def test_load_is_calls_in_flight_or_a_full_worker(monkeypatch):
    """Open sessions alone are not load (they wait on the model); a call in flight is, and so is a full worker."""
    monkeypatch.setattr(pool_module, "SESSIONS_PER_WORKER", 2)

    async def t(pool):
        out = await pool.open(requests(1))
        assert pool._busy == 0
        slot = pool.slots[pool.session_workers()[out[0].session]]
        call = asyncio.ensure_future(pool.call(out[0].session, [ToolCall("hold", {})]))
        await until(lambda: slot.calls == 1)
        assert pool._busy == 1
        envs.RELEASE.set()
        await call
        assert pool._busy == 0
        await pool.open(requests(2))  # both workers: one full (2), one with 1
        assert pool._busy == 1 and pool._outstanding() == 3

    run(t)()


def test_the_pool_is_an_async_actor_and_its_worker_a_threaded_one():
    from ray._private.async_compat import has_async_methods

    assert has_async_methods(EnvPool) and not has_async_methods(EnvWorker)


def test_a_worker_not_started_after_a_minute_is_one_line_naming_both_causes(monkeypatch):
    """A worker whose start-up never finishes (no node for it, or a slow one: the pool cannot tell which) is told
    once, with its resources, while work goes on on the live ones."""
    monkeypatch.setattr(base_module, "STARTING_WARN_S", 0.0)

    class Stuck(FakeHandle):
        def invoke(self, name, args, kwargs):
            if name == "pid":
                envs.RELEASE.wait()  # the start-up that does not finish (until the fixture releases it)
            return super().invoke(name, args, kwargs)

    async def t(pool):
        lines = []
        pool._log = lines.append
        pool._new_worker = lambda i, name: Stuck(pool.spec, i)  # the next worker's start-up hangs
        await pool.scale(3)
        lines.clear()  # the scaling's own line
        pool._warn_starting()
        pool._warn_starting()  # once per worker
        assert len(lines) == 1 and "worker 2 has waited" in lines[0], lines
        assert "no node can place it" in lines[0] and "start-up is slow" in lines[0]
        assert "on the 2 live workers" in lines[0] and pool.size() == 2
        envs.RELEASE.set()

    run(t)()


# --- one call at a time per worker --------------------------------------------------------------------------------


def test_a_worker_gets_one_call_at_a_time_and_a_calls_bound_starts_when_it_is_sent():
    """A session's call waits in the pool while the worker runs another session's (slow) close: it is not sent, its
    bound (tool timeout + grace) does not run meanwhile, and it answers once the close has, on the same worker."""
    spec = EnvSpec(environments={None: "tests.fixtures.envs:CounterEnv"}, tool_timeout_s=0.05, reward_timeout_s=30)

    async def main():
        pool = FakePool(spec, run_name="t", num_workers=1, worker_options={})
        await until(lambda: pool.size() == 1)
        a, b = await pool.open(requests(2))
        pool.grace_s = 0.05  # from now on: the opens had the default
        handle = pool.slots[0].handle
        handle.hold_on = "close"
        closing = asyncio.ensure_future(pool.close([a.session]))
        await until(lambda: handle.running == "close")
        calling = asyncio.ensure_future(pool.call(b.session, [ToolCall("add", {"n": 1})]))
        await until(lambda: pool.slots[0].calls == 2)
        assert handle.sent == ["pid", "open", "close"] and pool._busy == 1  # asked for, not sent; the worker busy
        deadline = time.monotonic() + 4 * (spec.tool_timeout_s + pool.grace_s)
        await until(lambda: time.monotonic() > deadline)  # well past the call's bound, had it started when asked
        assert not calling.done()
        envs.RELEASE.set()
        assert (await closing)[0].reward == 0.0
        assert [r.content for r in await calling] == ["2"]
        assert handle.sent[-2:] == ["close", "call"]
        s = pool.stats()
        assert (s.replaced, s.timeouts, s.sessions_lost) == (0, 0, 0)

    asyncio.run(main())


def test_calls_waiting_for_a_worker_that_hung_are_told_it_was_lost():
    spec = EnvSpec(environments={None: "tests.fixtures.envs:CounterEnv"}, tool_timeout_s=0.05)

    async def main():
        pool = FakePool(spec, run_name="t", num_workers=1, worker_options={})
        await until(lambda: pool.size() == 1)
        a, b = await pool.open(requests(2))
        pool.grace_s = 0.05  # from now on: the opens had the default
        pool.slots[0].handle.hold_on = "call"  # the worker stops answering
        first = asyncio.ensure_future(pool.call(a.session, [ToolCall("add", {"n": 1})]))
        second = asyncio.ensure_future(pool.call(b.session, [ToolCall("add", {"n": 1})]))
        for f in (first, second):
            with pytest.raises(EnvSessionLost, match="environment worker 0 did not answer a call within 0.1 s"):
                await f
        s = pool.stats()
        assert (s.timeouts, s.replaced, s.sessions_lost) == (1, 1, 2)

    asyncio.run(main())


def test_a_turns_bound_is_the_tool_timeout_per_call_and_a_closes_the_reward_timeout_per_session(monkeypatch):
    """Its sync tools (and get_rewards) run one after another in the worker."""
    spec = EnvSpec(environments={None: "tests.fixtures.envs:CounterEnv"}, tool_timeout_s=2.0, reward_timeout_s=3.0)
    bounds = []

    async def t(pool):
        real = pool._send

        async def send(slot, method, bound_s, *args):
            bounds.append((method, bound_s))
            return await real(slot, method, bound_s, *args)

        monkeypatch.setattr(pool, "_send", send)
        a, b = await pool.open(requests(2))
        await pool.call(a.session, [ToolCall("add", {"n": 1})] * 3)
        await pool.close([a.session, b.session])
        assert bounds == [("open", 4.0), ("call", 6.0), ("close", 6.0)]

    with_pool(spec, t)


def test_instances_created_and_reused_are_counted():
    async def t(pool):
        first = await pool.open(requests(3))
        await pool.close([o.session for o in first])
        await pool.open(requests(4))
        s = pool.stats()
        assert (s.instances_created, s.instances_reused) == (4, 3)  # one worker: 3 made, 3 reused, 1 more made
        assert s.step_metrics()["env_pool/instances_created"] == 4

    with_pool(SPEC, t)
