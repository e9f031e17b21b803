"""The user's code: imported by name, and called within a deadline. Reward functions, tools, environment classes
(and what comes next: judges, agent functions) are imported and called here and nowhere else.

**Import.** `module:attr` or `path/to/file.py:attr` (`import_object`). Every message starts with the config field
that named the object, so a bad name is reported as the user wrote it, before anything is started.
`add_to_sys_path` puts the user's run directory first in a worker, so `my_rewards:fn` imports as with python -m.
Or the object itself, carried in the reference (`by_value`: `pickled:<label>:<data>`): what a Python script hands
`rayward.GRPOTrainer` (functions defined in the script, lambdas, closures, classes), pickled with cloudpickle,
with its own module's code by value, so a worker that cannot import the script (another node, another
directory) runs it all the same.

**Call.** `UserCalls.start(fn, kwargs, deadline_s)` starts a call, `UserCalls.outcome` waits for it and says how it
went as a typed Outcome: `Returned` (its value), `Raised` (its exception, a TimeoutError it raised itself included)
or `TimedOut` (rayward's deadline passed). Where it runs:

* **async** (`is_async_callable`): on one persistent event loop in a thread of its own, as TRL keeps one (async
  user code may hold loop-bound clients); cancelled at the deadline, without waiting for the cancellation. A
  coroutine that blocks the loop (a sync sleep inside `async def`) cannot be cancelled there: its caller stops
  waiting ASYNC_SLACK_S later.
* **sync, `sync_on="threads"`** (the default): in a thread pool, so one turn's or one chunk's calls run at once.
  A call still running at its deadline is abandoned; Python cannot kill a thread, so it holds its thread until it
  returns. Once half the pool's threads are held so, later calls go to a fresh pool (and a line says so).
* **sync, `sync_on="main"`**: on the calling thread, which must be the process's main thread, one call at a
  time. TRL calls sync tools on the trainer's main thread, so a tool that bounds itself with
  `signal.signal(SIGALRM)` and `signal.alarm` works there and nowhere else ("signal only works in main thread").
  A Ray actor runs its sync methods on the process's main thread only when created with max_concurrency=1 and no
  concurrency groups; with more, they run in Ray's threads. The deadline is SIGALRM's too (`_on_main`): rayward
  installs its own handler and arms ITIMER_REAL for the deadline; at the deadline the handler raises a
  BaseException (so the user's `except Exception:` does not swallow it) into the call, which is `TimedOut`. After
  every call, whatever it did, the timer is disarmed and the previous handler and timer (the remaining time of a
  timer that was armed before, pytest-timeout's say) are restored. A call that arms its own alarm (TRL's
  `grpo_agent.py` pattern: its handler, `signal.alarm(n)`, `signal.alarm(0)` when done) replaces rayward's
  handler and timer for the rest of that call, so its own semantics hold: its alarm fires at its own time and its
  exception (its TimeoutError) is `Raised`, as in TRL; rayward's deadline does not apply to that call any more.
  A signal handler runs only between Python bytecodes: a call blocked in C code (a long SQL statement, a C
  extension holding the GIL) is cut only when it returns to Python, and one that never does is for the caller
  to bound from outside the process (a pool kills and replaces a worker that does not answer within its call's
  bound plus grace). A call that swallows the cut (`except BaseException:`) and returns is `TimedOut` all the
  same. Where the process already has a SIGALRM handler installed outside Python, calls run unbounded here.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import importlib
import importlib.util
import inspect
import os
import signal
import sys
import sysconfig
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

# How long past an async call's deadline its caller waits: the loop cancels the call at the deadline, unless a
# coroutine blocks the loop, which only the caller's wait can cut. Long enough for a loaded loop to run the
# cancellation, short against any deadline a user sets.
ASYNC_SLACK_S = 1.0
# setitimer(ITIMER_REAL, 0) disarms the timer: a deadline of zero or less arms it at this instead (it fires at once).
SOONEST_TIMER_S = 1e-6

SyncOn = Literal["threads", "main"]


class UserCodeError(ValueError):
    """The named object cannot be imported; the message starts with the field that named it."""


# --- import ------------------------------------------------------------------------------------------------------


def add_to_sys_path(paths: list[str] | None) -> None:
    """Put `paths` (the directory the user runs rayward from) first on sys.path, in order, once each."""
    for p in reversed(paths or []):
        if p not in sys.path:
            sys.path.insert(0, p)


# A reference that carries its object: BY_VALUE + label + ":" + base64(zlib(cloudpickle)). The label (the object's
# qualified name, no colon) is for people reading a config; base64's alphabet has no colon either.
BY_VALUE = "pickled:"


def _pickled_by_reference_is_unsafe(module: Any) -> bool:
    """Whether a worker may fail to import `module` by name: the user's own code (a script run as __main__, a test
    module, a helper next to the script), as opposed to the installed libraries and rayward itself."""
    name = getattr(module, "__name__", "")
    file = getattr(module, "__file__", None)
    if name == "__main__" or file is None or name.split(".")[0] in ("actors", "orchestrator", "rayward"):
        return False
    path = str(Path(file).resolve())
    return not path.startswith(_installed_roots())


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    """Where the interpreter and the installed libraries live (resolved once: by_value checks every module of the
    process, thousands, and sysconfig.get_paths() re-expands its scheme on each call)."""
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return tuple(str(Path(r).resolve()) for r in roots)


def by_value(obj: Any, label: str | None = None) -> str:
    """A reference to `obj` that carries it (see the module docstring): `import_object` returns an equal object in
    any process. The user's own modules (not the installed libraries) go by value too, so a function's helpers
    from the script's directory travel with it. Raises UserCodeError if it cannot be pickled (a lock, an open
    connection captured by a closure: create it inside the function instead)."""
    import cloudpickle

    own = [m for m in list(sys.modules.values()) if m is not None and _pickled_by_reference_is_unsafe(m)]
    registered = []
    for module in own:
        try:
            cloudpickle.register_pickle_by_value(module)
            registered.append(module)
        except ValueError:  # already registered, or not importable under its name
            pass
    name = label or getattr(obj, "__qualname__", None) or type(obj).__name__
    try:
        data = cloudpickle.dumps(obj)
    except Exception as err:  # noqa: BLE001 - anything unpicklable is the user's to see, with the object named
        raise UserCodeError(f"{name}: cannot be sent to the workers ({type(err).__name__}: {err}); create what it "
                            "holds (clients, locks, files) inside the function instead of capturing it") from None
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)
    clean = "".join(c if c.isalnum() or c in "._-<>" else "_" for c in name)
    return f"{BY_VALUE}{clean}:{base64.b64encode(zlib.compress(data)).decode()}"


def describe(target: str) -> str:
    """A reference as people read it in a message: `'module:attr'` (quoted, as written), or `<label> (by value)`."""
    if target.startswith(BY_VALUE):
        return f"{target[len(BY_VALUE):].partition(':')[0]} (by value)"
    return repr(target)


def import_object(target: str, what: str) -> Any:
    """`module:attr` or `path/to/file.py:attr`, imported, or a `by_value` reference unpickled; UserCodeError names
    `what` (e.g. "tools[0]")."""
    if target.startswith(BY_VALUE):
        import cloudpickle

        try:
            return cloudpickle.loads(zlib.decompress(base64.b64decode(target.rpartition(":")[2])))
        except Exception as err:  # noqa: BLE001 - e.g. a library the pickled code needs is missing on this node
            raise UserCodeError(f"{what} {describe(target)}: cannot be unpickled here ({type(err).__name__}: "
                                f"{err})") from None
    module_name, _, attr = target.rpartition(":")
    if not module_name or not attr:
        raise UserCodeError(f"{what} {target!r} is not of the form module:name")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).resolve()
            spec = importlib.util.spec_from_file_location(f"rayward_user_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any import failure is the user's to see, with the field named
        raise UserCodeError(
            f"{what} {target!r}: cannot import {module_name!r} ({type(err).__name__}: {err}); the module must be "
            f"importable from the directory you run rayward from ({os.getcwd()})"
        ) from None
    if not hasattr(module, attr):
        raise UserCodeError(f"{what} {target!r}: module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


def is_async_callable(fn: Any) -> bool:
    """Whether calling `fn` returns a coroutine to await: an `async def` function or method, an object whose
    class's `__call__` is `async def`, or a functools.partial of either (unwrapped, as TRL's is_async_callable
    does). A class is not: calling it constructs an instance. A sync function that happens to return an awaitable
    is sync (its caller decides what to do with the awaitable)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    if isinstance(fn, type) or inspect.isroutine(fn):
        return False
    return inspect.iscoroutinefunction(type(fn).__call__)  # Python calls an object through its class's __call__


# --- call --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Returned:
    value: Any
    started: float  # time.monotonic() when the call was started (its deadline counts from here)
    ended: float  # when it returned

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass(frozen=True)
class Raised:
    error: Exception  # the user's exception, its traceback intact (see user_frames)
    started: float
    ended: float  # when its caller learned of it

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass(frozen=True)
class TimedOut:
    deadline_s: float
    started: float
    ended: float  # started + deadline_s

    @property
    def seconds(self) -> float:
        return self.ended - self.started


Outcome = Returned | Raised | TimedOut


@dataclass(frozen=True)
class Pending:
    """A started call (UserCalls.start); UserCalls.outcome waits for it."""

    future: futures.Future  # of (value, time it returned)
    started: float
    deadline_s: float
    is_async: bool
    pool: int  # the thread pool a sync call runs in (UserCalls.fresh_pools when it was started)


class _PastDeadline(Exception):
    """A call past its deadline: an async one cancelled on the loop, or a sync one cut on the main thread."""


class _DeadlineSignal(BaseException):
    """Raised into a sync call on the main thread by rayward's SIGALRM handler at the call's deadline. A
    BaseException, as KeyboardInterrupt is, so that the user's `except Exception:` does not swallow it."""


class UserCalls:
    """Calls into the user's code, each within its deadline (see the module docstring). Thread-safe: several
    threads (a Ray actor's concurrent calls) may start and wait for calls at once.

    abandoned: sync calls abandoned at their deadline while running (each held its thread until it returned);
    fresh_pools: thread pools started because abandoned calls held half of one."""

    def __init__(self, name: str, threads: int, *, sync_on: SyncOn = "threads"):
        """name: the threads' prefix and the log lines' subject ("env-call"). threads: the pool's size, sync calls
        that may run at once (more wait for a thread; their deadline counts the wait)."""
        self.name, self.threads, self.sync_on = name, threads, sync_on
        self.abandoned = 0
        self.fresh_pools = 0
        self._held = 0  # threads of the current pool held by abandoned calls still running
        self._lock = threading.Lock()  # the pool, its counts, the loop's start
        self._executor = self._new_executor()
        self._loop: asyncio.AbstractEventLoop | None = None  # started at the first async call

    def _new_executor(self) -> futures.ThreadPoolExecutor:
        return futures.ThreadPoolExecutor(self.threads, thread_name_prefix=self.name)

    def start(self, fn: Callable[..., Any], kwargs: dict[str, Any], deadline_s: float) -> Pending:
        """Start `fn(**kwargs)`: async on the loop, sync in a thread (or, sync_on="main", run now on this thread)."""
        started = time.monotonic()
        if is_async_callable(fn):
            fut = asyncio.run_coroutine_threadsafe(_within(fn, kwargs, deadline_s), self.loop())
            return Pending(fut, started, deadline_s, True, self.fresh_pools)
        if self.sync_on == "main":
            return Pending(self._run_here(fn, kwargs, deadline_s), started, deadline_s, False, self.fresh_pools)
        fut, pool = self._submit(fn, kwargs)
        return Pending(fut, started, deadline_s, False, pool)

    def outcome(self, p: Pending) -> Outcome:
        """Wait for the call until its deadline (async: plus ASYNC_SLACK_S); one still running then is abandoned."""
        wait_s = p.deadline_s + (ASYNC_SLACK_S if p.is_async else 0.0)
        done, _ = futures.wait([p.future], timeout=max(p.started + wait_s - time.monotonic(), 0.0))
        if not done:
            self._abandon(p)
            return TimedOut(p.deadline_s, p.started, p.started + p.deadline_s)
        err = p.future.exception()
        if isinstance(err, _PastDeadline):
            return TimedOut(p.deadline_s, p.started, p.started + p.deadline_s)
        if err is not None:
            if not isinstance(err, Exception):
                raise err  # SystemExit, KeyboardInterrupt: not the call's outcome to report
            return Raised(err, p.started, time.monotonic())
        value, ended = p.future.result()
        return Returned(value, p.started, ended)

    def call(self, fn: Callable[..., Any], kwargs: dict[str, Any], deadline_s: float) -> Outcome:
        """start, then outcome."""
        return self.outcome(self.start(fn, kwargs, deadline_s))

    def loop(self) -> asyncio.AbstractEventLoop:
        """The persistent event loop async calls run on (started in its own thread on first use)."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, daemon=True, name=f"{self.name}-loop").start()
            return self._loop

    def await_here(self, awaitable: Any) -> Any:
        """Await `awaitable` on the loop and return its result, blocking this thread (never the loop's) with no
        deadline of its own: for an awaitable a sync call returned (an `async def reset`), within that call's (cut
        there, the awaitable is cancelled)."""
        fut = asyncio.run_coroutine_threadsafe(_awaited(awaitable), self.loop())
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    # --- sync calls ------------------------------------------------------------------------------------------

    def _run_here(self, fn: Callable[..., Any], kwargs: dict[str, Any], deadline_s: float) -> futures.Future:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                f"{self.name}: sync_on='main' runs sync calls on the calling thread, which must be the process's "
                f"main thread (a Ray actor's methods run there only with max_concurrency=1); called from "
                f"{threading.current_thread().name}"
            )
        fut: futures.Future = futures.Future()
        try:
            fut.set_result(_on_main(fn, kwargs, deadline_s))
        except Exception as err:  # noqa: BLE001 - the user's exception (or _PastDeadline) is the call's outcome
            fut.set_exception(err)
        return fut

    def _submit(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[futures.Future, int]:
        fresh = False
        with self._lock:
            if self._held >= max(self.threads // 2, 1):  # abandoned calls hold threads until they return
                self._executor.shutdown(wait=False)  # its idle threads end; the held ones when their call returns
                self._executor, self._held, fresh = self._new_executor(), 0, True
                self.fresh_pools += 1
            fut, pool = self._executor.submit(_timed, fn, kwargs), self.fresh_pools
        if fresh:
            print(f"rayward: {self.name}: half of the {self.threads} threads are held by sync calls still running "
                  "past their deadline; later calls go to a fresh thread pool", flush=True)
        return fut, pool

    def _abandon(self, p: Pending) -> None:
        """Stop waiting for a call past its deadline: async ones are cancelled (when the loop next runs), sync ones
        that had not started are dropped, and a running one is counted as holding its thread until it returns."""
        if p.future.cancel() or p.is_async:
            return
        with self._lock:
            self.abandoned += 1
            if p.pool != self.fresh_pools:
                return  # its pool was replaced already: nothing counts its threads any more
            self._held += 1
        p.future.add_done_callback(functools.partial(self._returned, p.pool))

    def _returned(self, pool: int, _: futures.Future) -> None:
        """An abandoned call returned at last: its thread is free again."""
        with self._lock:
            if pool == self.fresh_pools:
                self._held -= 1


def _timed(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[Any, float]:
    """Where rayward calls the user's sync code (user_frames starts below the innermost frame of this file)."""
    return fn(**kwargs), time.monotonic()


class _Alarm:
    """rayward's SIGALRM handler for one call on the main thread: raises _DeadlineSignal while the call runs,
    and remembers that it did."""

    def __init__(self) -> None:
        self.armed = False
        self.rang = False

    def ring(self, signum: int, frame: Any) -> None:
        if self.armed:  # a signal that lands after the call returned is ignored
            self.rang = True
            raise _DeadlineSignal


def _on_main(fn: Callable[..., Any], kwargs: dict[str, Any], deadline_s: float) -> tuple[Any, float]:
    """`_timed` on the main thread, cut by SIGALRM at `deadline_s` (see the module docstring): its result, the
    user's exception, or _PastDeadline."""
    previous = signal.getsignal(signal.SIGALRM)
    if previous is None:  # a handler installed outside Python: it cannot be put back, so it is left alone
        return _timed(fn, kwargs)
    alarm = _Alarm()
    previous_timer, armed_at = signal.getitimer(signal.ITIMER_REAL), time.monotonic()
    signal.signal(signal.SIGALRM, alarm.ring)
    try:
        try:
            alarm.armed = True
            signal.setitimer(signal.ITIMER_REAL, max(deadline_s, SOONEST_TIMER_S))  # it may ring at once
            out = _timed(fn, kwargs)
        finally:
            try:
                alarm.armed = False
            finally:  # nested: the cut may land as the call returns, and this must run whatever happens
                _restore_alarm(previous, previous_timer, armed_at)
    except (_DeadlineSignal, Exception):
        if alarm.rang:
            raise _PastDeadline from None
        raise
    if alarm.rang:  # the call swallowed the cut and returned anyway
        raise _PastDeadline
    return out


def _restore_alarm(handler: Any, timer: tuple[float, float], armed_at: float) -> None:
    """Disarm the timer, then put back the SIGALRM handler and timer that were there before the call (a timer
    that was running goes on with what it had left)."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, handler)
    delay, interval = timer
    if delay > 0:
        signal.setitimer(signal.ITIMER_REAL, max(delay - (time.monotonic() - armed_at), SOONEST_TIMER_S), interval)


async def _within(fn: Callable[..., Any], kwargs: dict[str, Any], deadline_s: float) -> tuple[Any, float]:
    """Where rayward calls the user's async code, on the loop: its result, or _PastDeadline once it has run
    deadline_s (it is cancelled then, and not waited for: a coroutine that ignores its cancellation cannot hold
    its caller). A TimeoutError it raises itself stays its own."""
    task = asyncio.ensure_future(fn(**kwargs))
    done, _ = await asyncio.wait({task}, timeout=deadline_s)
    if not done:
        task.cancel()
        raise _PastDeadline
    return task.result(), time.monotonic()


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


# --- what the user sees of an exception ----------------------------------------------------------------------------

_STDLIB = sysconfig.get_paths()["stdlib"]
_THIS_FILE = os.path.abspath(__file__)


def _is_library(filename: str) -> bool:
    """Python's own files and installed packages: not the user's code."""
    return (
        filename.startswith(("<frozen", _STDLIB)) or f"{os.sep}site-packages{os.sep}" in filename
        or f"{os.sep}dist-packages{os.sep}" in filename
    )


def user_frames(err: BaseException) -> list[traceback.FrameSummary]:
    """The frames of `err` below rayward's call into the user's code (this file's _timed / _within) that are the
    user's, not the standard library's or an installed package's; the innermost one if there are none (the
    user named a library function). Innermost last."""
    frames = traceback.extract_tb(err.__traceback__)
    call_site = max((i for i, f in enumerate(frames) if os.path.abspath(f.filename) == _THIS_FILE), default=-1)
    below = frames[call_site + 1 :]
    return [f for f in below if not _is_library(f.filename)] or below[-1:]


__all__ = [
    "ASYNC_SLACK_S", "SOONEST_TIMER_S", "Outcome", "Pending", "Raised", "Returned", "SyncOn", "TimedOut", "UserCalls",
    "UserCodeError", "add_to_sys_path", "import_object", "is_async_callable", "user_frames",
]
