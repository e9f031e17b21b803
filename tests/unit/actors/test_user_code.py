"""actors/user_code.py's runner: which callables are async, the typed outcome of a call, the deadline on sync and
async calls, hung sync calls abandoned and their pool replaced, and sync calls on the main thread (where a tool's
own signal.alarm works, as in TRL, and rayward's deadline is a SIGALRM that leaves the previous handler and timer as
it found them). Every held call waits on an Event the fixture releases."""

import asyncio
import functools
import signal
import threading
import time

import pytest

import actors.user_code as user_code
from actors.user_code import Raised, Returned, TimedOut, UserCalls, is_async_callable, user_frames
from tests.fixtures import envs
from tests.fixtures.waiting import WAIT_S, wait_until

RELEASE = threading.Event()


@pytest.fixture(autouse=True)
def release_held_calls():
    RELEASE.clear()
    yield
    RELEASE.set()


def held() -> str:
    RELEASE.wait(WAIT_S)
    return "released"


def add(a: int, b: int) -> int:
    return a + b


async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


def fails(message: str) -> None:
    raise ValueError(message)


def own_timeout() -> None:
    raise TimeoutError("upstream took too long")


async def async_own_timeout() -> None:
    raise TimeoutError("upstream took too long")


# --- which callables are async -----------------------------------------------------------------------------------


class AsyncCallable:
    async def __call__(self, a: int, b: int) -> int:
        return a + b

    async def method(self) -> None:
        pass

    def sync_method(self) -> None:
        pass


class SyncCallable:
    def __call__(self) -> None:
        pass


def returns_a_coroutine() -> object:
    return async_add(1, 2)


@pytest.mark.parametrize(("fn", "is_async"), [
    (async_add, True),
    (add, False),
    (AsyncCallable(), True),  # TRL's case: the `async` is on the class's __call__
    (AsyncCallable().method, True),
    (AsyncCallable().sync_method, False),
    (SyncCallable(), False),
    (functools.partial(async_add, 1), True),
    (functools.partial(functools.partial(AsyncCallable(), 1), b=2), True),  # a partial of an async callable object
    (functools.partial(add, 1), False),
    (AsyncCallable, False),  # a class: calling it constructs an instance
    (returns_a_coroutine, False),  # sync: what it returns is its caller's to await
    (len, False),
    (lambda: None, False),
])
def test_is_async_callable(fn, is_async):
    assert is_async_callable(fn) is is_async


# --- outcomes ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [add, async_add, AsyncCallable(), functools.partial(async_add, 1)])
def test_a_call_returns_its_value(fn):
    kwargs = {"b": 2} if isinstance(fn, functools.partial) else {"a": 1, "b": 2}
    out = UserCalls("t", 2).call(fn, kwargs, WAIT_S)
    assert isinstance(out, Returned) and out.value == 3 and out.started <= out.ended


@pytest.mark.parametrize("fn", [own_timeout, async_own_timeout])
def test_the_users_own_timeout_error_is_raised_not_a_timeout(fn):
    out = UserCalls("t", 2).call(fn, {}, WAIT_S)
    assert isinstance(out, Raised) and isinstance(out.error, TimeoutError)
    assert str(out.error) == "upstream took too long"


def test_a_raised_error_keeps_the_users_frames():
    out = UserCalls("t", 2).call(fails, {"message": "boom"}, WAIT_S)
    assert isinstance(out, Raised) and str(out.error) == "boom"
    assert [f.name for f in user_frames(out.error)] == ["fails"]  # not the runner's, not concurrent.futures'


def test_async_code_runs_on_one_persistent_loop_off_the_callers_thread():
    calls = UserCalls("t", 2)

    async def where() -> tuple[object, threading.Thread]:
        return asyncio.get_running_loop(), threading.current_thread()

    (loop1, t1), (loop2, _) = (calls.call(where, {}, WAIT_S).value for _ in range(2))
    assert loop1 is loop2 is calls.loop() and t1 is not threading.current_thread()
    assert calls.await_here(async_add(2, 3)) == 5  # an awaitable a sync call returned, on the same loop


# --- the deadline ------------------------------------------------------------------------------------------------


def test_a_sync_call_past_its_deadline_times_out_and_holds_its_thread():
    calls = UserCalls("t", 4)
    out = calls.call(held, {}, 0.05)
    assert isinstance(out, TimedOut) and out.deadline_s == 0.05 and out.ended == out.started + 0.05
    assert calls.abandoned == 1


def test_a_call_that_never_started_is_dropped_not_counted():
    calls = UserCalls("t", 1)
    first, second = calls.start(held, {}, 0.05), calls.start(add, {"a": 1, "b": 1}, 0.05)  # second waits for a thread
    assert isinstance(calls.outcome(first), TimedOut)
    assert isinstance(calls.outcome(second), TimedOut) and second.future.cancelled()
    assert calls.abandoned == 1


def test_hung_sync_calls_are_replaced_by_a_fresh_pool_and_counted():
    calls = UserCalls("t", 2)
    hung = [calls.start(held, {}, 0.05) for _ in range(2)]  # every thread held
    assert all(isinstance(calls.outcome(p), TimedOut) for p in hung)
    assert (calls.abandoned, calls.fresh_pools) == (2, 0)
    out = calls.call(add, {"a": 1, "b": 1}, WAIT_S)  # no thread left in the old pool: it runs in a fresh one
    assert isinstance(out, Returned) and out.value == 2 and calls.fresh_pools == 1
    # the new pool's count is its own
    assert isinstance(calls.call(held, {}, 0.05), TimedOut) and calls.fresh_pools == 1


def test_a_late_call_that_returned_frees_its_thread():
    calls = UserCalls("t", 2)
    late = calls.start(held, {}, 0.05)
    assert isinstance(calls.outcome(late), TimedOut)
    RELEASE.set()
    wait_until(late.future.done, "the late call to return")
    assert isinstance(calls.call(add, {"a": 1, "b": 1}, WAIT_S), Returned)
    assert (calls.abandoned, calls.fresh_pools) == (1, 0)  # its thread came back: no fresh pool was needed


def test_an_async_call_past_its_deadline_is_cancelled():
    cancelled = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(WAIT_S)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    calls = UserCalls("t", 2)
    out = calls.call(slow, {}, 0.05)
    assert isinstance(out, TimedOut) and out.deadline_s == 0.05
    wait_until(cancelled.is_set, "the coroutine to be cancelled")
    assert calls.abandoned == 0  # no thread is held by a coroutine


def test_an_async_call_that_blocks_the_loop_is_cut_by_the_callers_wait(monkeypatch):
    monkeypatch.setattr(user_code, "ASYNC_SLACK_S", 0.05)

    async def blocks_the_loop() -> str:
        RELEASE.wait(WAIT_S)  # a sync wait inside `async def`: the loop cannot cancel it
        return "released"

    calls = UserCalls("t", 2)
    assert isinstance(calls.call(blocks_the_loop, {}, 0.05), TimedOut)
    RELEASE.set()
    assert isinstance(calls.call(async_add, {"a": 1, "b": 1}, WAIT_S), Returned)  # the loop goes on once it returns


# --- sync calls on the main thread ---------------------------------------------------------------------------------


def alarmed() -> str:
    """A tool that bounds itself as many do under TRL (which calls sync tools on the main thread)."""

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError("the tool's own alarm")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    try:
        time.sleep(WAIT_S)  # interrupted by the alarm
        return "no alarm"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_main_thread_mode_runs_sync_calls_where_the_users_alarm_works():
    assert threading.current_thread() is threading.main_thread()  # pytest runs tests there (xdist workers too)
    main = UserCalls("t", 2, sync_on="main")
    out = main.call(threading.current_thread, {}, WAIT_S)
    assert isinstance(out, Returned) and out.value is threading.main_thread()
    out = main.call(alarmed, {}, WAIT_S)
    assert isinstance(out, Raised) and str(out.error) == "the tool's own alarm"
    out = UserCalls("t", 2).call(alarmed, {}, WAIT_S)  # in the thread pool, as Ray's threads would run it
    assert isinstance(out, Raised) and "signal only works in main thread" in str(out.error)


def spins() -> str:
    """Pure Python without end (no sleep, no I/O): only a signal can cut it."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        pass
    return "no cut"


def swallows_everything() -> str:
    try:
        held()
    except BaseException:  # noqa: BLE001 - a call that swallows even rayward's cut
        return "swallowed"
    return "released"


def catches_exceptions() -> str:
    try:
        held()
    except Exception:  # noqa: BLE001 - the usual broad catch: rayward's cut is not an Exception
        return "caught"
    return "released"


def trl_alarmed() -> str:
    """TRL's grpo_agent.py pattern (its own handler, left installed; its alarm cancelled when done), around a call
    that does not end before its alarm rings."""
    with envs.timeout(1):
        return held()


@pytest.fixture
def previous_alarm():
    """A SIGALRM handler and a running timer of someone else's (as pytest-timeout's would be): a call on the main
    thread must leave both as it found them."""

    def theirs(signum: int, frame: object) -> None:
        raise AssertionError("the previous timer rang during the test")

    old_handler = signal.signal(signal.SIGALRM, theirs)
    old_timer = signal.setitimer(signal.ITIMER_REAL, 10 * WAIT_S)
    yield theirs
    signal.setitimer(signal.ITIMER_REAL, *old_timer)
    signal.signal(signal.SIGALRM, old_handler)


@pytest.mark.parametrize("fn", [held, spins, catches_exceptions, swallows_everything])
def test_main_thread_mode_cuts_a_call_at_its_deadline_with_sigalrm(fn, previous_alarm):
    main = UserCalls("t", 2, sync_on="main")
    out = main.call(fn, {}, 0.05)
    assert isinstance(out, TimedOut) and out.deadline_s == 0.05 and main.abandoned == 0  # cut, not abandoned
    assert signal.getsignal(signal.SIGALRM) is previous_alarm  # the previous handler is back
    remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    assert 0 < remaining <= 10 * WAIT_S  # and the previous timer goes on
    assert isinstance(main.call(add, {"a": 1, "b": 1}, 0.05), Returned)  # nothing rings later


def test_main_thread_mode_a_deadline_of_zero_cuts_at_once(previous_alarm):
    main = UserCalls("t", 2, sync_on="main")
    assert isinstance(main.call(held, {}, 0.0), TimedOut)
    assert signal.getsignal(signal.SIGALRM) is previous_alarm


def test_main_thread_mode_a_call_that_arms_its_own_alarm_keeps_its_semantics(previous_alarm):
    """Its alarm replaces rayward's for that call: it rings at the call's own time (after rayward's deadline here),
    its exception is the call's, as in TRL; the handler it left installed is replaced by the previous one."""
    main = UserCalls("t", 2, sync_on="main")
    out = main.call(trl_alarmed, {}, 0.5)
    assert isinstance(out, Raised) and str(out.error) == "Operation timed out after 1 seconds"
    assert signal.getsignal(signal.SIGALRM) is previous_alarm


def test_main_thread_mode_still_runs_async_code_on_the_loop():
    main = UserCalls("t", 2, sync_on="main")

    async def where() -> threading.Thread:
        return threading.current_thread()

    out = main.call(where, {}, WAIT_S)
    assert isinstance(out, Returned) and out.value is not threading.main_thread()


def test_main_thread_mode_cancels_an_awaitable_cut_while_awaited_here():
    main = UserCalls("t", 2, sync_on="main")
    cancelled = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(WAIT_S)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def awaits() -> None:  # a sync call that got an awaitable (an `async def reset`)
        main.await_here(slow())

    assert isinstance(main.call(awaits, {}, 0.05), TimedOut)
    wait_until(cancelled.is_set, "the awaited coroutine to be cancelled")


def test_main_thread_mode_refuses_another_thread():
    main = UserCalls("t", 2, sync_on="main")
    box: list[BaseException] = []

    def from_a_thread() -> None:
        try:
            main.start(add, {"a": 1, "b": 1}, WAIT_S)
        except RuntimeError as err:
            box.append(err)

    t = threading.Thread(target=from_a_thread)
    t.start()
    t.join(WAIT_S)
    assert len(box) == 1 and "must be the process's main thread" in str(box[0])
