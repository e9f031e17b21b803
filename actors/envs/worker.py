"""EnvWorker: holds environment sessions and runs their tools, each call within a time bound.

A plain class (no Ray import): actors/envs/pool.py makes it a Ray actor. A **session** is one trajectory's
environment for its whole life: TRL's `environment_factory()` instance, reset with the dataset row, its public
methods the tools (with the standalone `tools` functions); in a run with `tools` only, a session holds just the
functions. The pool routes every open, call and close of a session here.

* **open**: construct, then `reset(**row)`, TRL's way: every column of the row is a keyword argument, but for
  the `environment` column when environment_factory is a mapping (a control column, as in TRL). A GRPO group's
  G sessions share the request's seed: Python's `random` (and numpy's global generator, when numpy is installed)
  is seeded with it around the constructor and reset, under a lock, and restored after; `reset` receives
  `seed=` too when it declares a `seed` parameter and the row has no `seed` column. An environment that draws
  its state from its own generator should seed it in reset (from the `seed` argument, or a row column); one that
  draws it at random elsewhere (a remote service) is not reproducible by the group. The constructor and reset
  together are bounded by the tool timeout; failing, they end the trajectory `env_error` (EnvOpened.error).
* **call**: the calls of one model turn run concurrently, each within `tool_timeout_s` of its start: sync tools
  in threads, `async def` tools on the worker's event loop. A stateful environment whose tools are called
  together in one turn should guard its state as for threads. What goes wrong is a ToolResult the model reads,
  never an error of the call, written as TRL 1.16 writes a failed tool (`str({"error": str(exception)})`):

      raised           {'error': '<str(exception)>'}                     (TRL: the same)
      unknown tool     {'error': 'Tool <name> not found.'}               (TRL: the same)
      bad arguments    {'error': '<name>() got an unexpected keyword argument ...' / 'missing a required
                        argument ...'} (checked against the signature, the tool is not run; TRL calls it and
                        passes Python's TypeError on)
      timed out        {'error': 'Tool <name> timed out after <t> s.'}   (TRL has no timeout)

  A result is passed on whole, as `str(result)` (TRL: the same, but for multimodal content lists, which rayward
  does not support); the agent loop budgets tool-result tokens.
* **close**: `get_reward()` (sync or async, within the environment reward's timeout; None where the environment
  has none, NaN where it returned None, None and an error when it raised, timed out or returned a non-number),
  and when asked the instance pickled with cloudpickle (for reward functions that declare `environments`).
  The instance is then dropped.

A hung sync call holds its thread forever (Python cannot kill a thread): once half the thread pool is held
so, later calls go to a fresh pool, as actors/rewards/worker.py does; the held threads are counted.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import math
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import Any

from actors.envs.spec import EnvSpec, is_async_callable, load_environment, load_tool, tool_method_names
from actors.types import ENVIRONMENT_COLUMN, EnvClosed, EnvOpened, EnvRequest, ToolCall, ToolResult

# Threads for sync work (constructors + resets, sync tools, sync get_reward): every session of a full worker
# (actors/envs/pool.py SESSIONS_PER_WORKER, 32) can run two sync calls of one turn at once; a call beyond that
# waits for a thread, and its timeout counts the wait.
ENV_CALL_THREADS = 64
# How long past an async call's own bound its caller waits: asyncio.wait_for cancels it at the bound, unless a
# coroutine blocks the event loop (a sync sleep inside `async def`), which only the caller's wait can cut.
ASYNC_SLACK_S = 1.0

COUNTERS = (
    "sessions_opened",  # sessions that reset and are (or were) open
    "sessions_closed",
    "reset_errors",  # the constructor or reset raised, timed out or returned something other than text or None
    "tool_calls",
    "tool_errors",  # the tool raised
    "bad_arguments",  # arguments that do not fit the tool's signature (the tool is not run)
    "tool_timeouts",
    "unknown_tools",
    "reward_errors",  # get_reward() raised, timed out or returned a non-number
    "state_errors",  # the instance could not be pickled for the `environments` reward functions
    "stuck_threads",  # sync calls abandoned at their timeout that still hold their thread
    "thread_pools",  # fresh thread pools started because stuck threads held half of one
)


@dataclass
class _Session:
    env: str | None
    instance: Any | None  # None: tools only
    tools: dict[str, Callable[..., Any]]  # tool name -> callable (the instance's bound methods included)


def tool_error(message: str) -> str:
    """The tool message for a failed call, as TRL writes it."""
    return str({"error": message})


class EnvWorker:
    """Sessions of one run's environments. Thread-safe: the pool sends it several calls at once (Ray
    max_concurrency > 1), for different sessions (one session's turns come one at a time)."""

    def __init__(self, spec: EnvSpec, *, index: int = 0, sys_path: list[str] | None = None):
        for p in reversed(sys_path or []):  # the user's run directory: `my_envs:Env` imports as with python -m
            if p not in sys.path:
                sys.path.insert(0, p)
        self.spec, self.index = spec, index
        self.tools = {fn.__name__: fn for fn in (load_tool(t, f"tools[{i}]") for i, t in enumerate(spec.tools))}
        self.classes = {name: load_environment(t, "environment_factory") for name, t in spec.environments.items()}
        self.methods = {name: tool_method_names(cls) for name, cls in self.classes.items()}
        self._reset_takes_seed = {
            name: "seed" in inspect.signature(cls.reset).parameters for name, cls in self.classes.items()
        }
        self._numpy = importlib.util.find_spec("numpy") is not None
        # One persistent event loop for async tools and get_reward (they may hold loop-bound clients), as TRL.
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True, name="env-loop").start()
        self._executor = _executor()
        self._stuck = 0  # stuck sync calls in the current thread pool
        self._seed_lock = threading.Lock()  # global random state is seeded around one reset at a time
        self._lock = threading.Lock()  # sessions, counters, the thread pool
        self.sessions: dict[int, _Session] = {}
        self.counters = dict.fromkeys(COUNTERS, 0)

    def __repr__(self) -> str:
        # Ray captures an actor's repr once (the dashboard's Repr column): only what never changes.
        envs = {n: c.__name__ for n, c in self.classes.items()}
        return f"EnvWorker(index={self.index}, environments={envs}, tools={sorted(self.tools)})"

    def pid(self) -> int:
        return os.getpid()

    def stats(self) -> dict[str, int]:
        """The counters (COUNTERS) and the sessions open now."""
        with self._lock:
            return {**self.counters, "sessions": len(self.sessions)}

    # --- sessions -------------------------------------------------------------------------------------------

    def open(self, requests: list[tuple[int, EnvRequest]]) -> list[EnvOpened]:
        """Open a session per (pool's session id, request), one after another (their resets seed the same
        global generators); results in order."""
        return [self._open(sid, req) for sid, req in requests]

    def call(self, session: int, calls: list[ToolCall]) -> list[ToolResult]:
        """One model turn's tool calls in `session`, concurrently; results in call order. KeyError for a
        session that is not open here."""
        with self._lock:
            s = self.sessions[session]
        started = [self._start_call(s, c) for c in calls]
        return [self._finish_call(c, st) for c, st in zip(calls, started, strict=True)]

    def close(self, sessions: list[int], keep_state: bool) -> list[EnvClosed]:
        """End the sessions: every get_reward() at once, then (keep_state) each instance pickled; the instances
        are dropped. A session that is not open here gets an EnvClosed with its error."""
        with self._lock:
            popped = [(sid, self.sessions.pop(sid, None)) for sid in sessions]
        t0 = time.monotonic()
        started = [self._start_reward(s) if s is not None else None for _, s in popped]
        out = []
        for (sid, s), st in zip(popped, started, strict=True):
            if s is None:
                out.append(EnvClosed(None, None, error=f"session {sid} is not open on environment worker {self.index}"))
                continue
            reward, error = self._finish_reward(s, st) if st is not None else (None, None)
            state = None
            if keep_state and s.instance is not None:
                state, state_error = self._pickle(s.instance)
                error = error or state_error
            self._count("sessions_closed")
            out.append(EnvClosed(reward, state, time.monotonic() - t0, error))
        return out

    # --- open ------------------------------------------------------------------------------------------------

    def _open(self, sid: int, req: EnvRequest) -> EnvOpened:
        t0 = time.monotonic()
        if not self.classes:  # tools only: the session is the functions
            return self._opened(sid, _Session(req.env, None, dict(self.tools)), None, t0)
        if req.env not in self.classes:
            self._count("reset_errors")
            have = [n for n in self.classes if n is not None]
            return EnvOpened(sid, None, 0.0, error=f"KeyError: unknown environment {req.env!r} (environment_factory "
                                                   f"has {have or 'one environment: request env None'})")
        fut = self._submit(self._start_episode, req)
        try:
            instance, observation = fut.result(timeout=self.spec.tool_timeout_s)
        except FutureTimeoutError:
            self._abandon(fut)
            self._seed_lock = threading.Lock()  # the hung reset keeps the old one
            return self._reset_failed(sid, t0, f"TimeoutError: {self.classes[req.env].__name__}() and reset() took more "
                                               f"than {self.spec.tool_timeout_s:g} s (agent.tool_timeout_s)")
        except Exception as err:  # noqa: BLE001 - the user's constructor or reset: the trajectory ends env_error
            return self._reset_failed(sid, t0, f"{type(err).__name__}: {err}")
        if observation is not None and not isinstance(observation, str):
            return self._reset_failed(sid, t0, f"TypeError: {type(instance).__name__}.reset returned "
                                               f"{type(observation).__name__}; it must return text (appended to the "
                                               "last user message) or None")
        tools = {**self.tools, **{m: getattr(instance, m) for m in self.methods[req.env]}}
        return self._opened(sid, _Session(req.env, instance, tools), observation, t0)

    def _opened(self, sid: int, session: _Session, observation: str | None, t0: float) -> EnvOpened:
        with self._lock:
            self.sessions[sid] = session
            self.counters["sessions_opened"] += 1
        return EnvOpened(sid, observation, time.monotonic() - t0)

    def _reset_failed(self, sid: int, t0: float, error: str) -> EnvOpened:
        self._count("reset_errors")
        return EnvOpened(sid, None, time.monotonic() - t0, error=error)

    def _start_episode(self, req: EnvRequest) -> tuple[Any, Any]:
        """Construct and reset, with the global generators seeded by the request (restored after)."""
        cls = self.classes[req.env]
        row = dict(req.row)
        if self.spec.routed:
            row.pop(ENVIRONMENT_COLUMN, None)
        if self._reset_takes_seed[req.env] and "seed" not in row:
            row["seed"] = req.seed
        with self._seed_lock:
            saved = random.getstate()
            np_random = _numpy_random() if self._numpy else None
            np_saved = np_random.get_state() if np_random is not None else None
            random.seed(req.seed)
            if np_random is not None:
                np_random.seed(req.seed % 2**32)
            try:
                instance = cls()
                observation = instance.reset(**row)
                if inspect.isawaitable(observation):
                    observation = asyncio.run_coroutine_threadsafe(_awaited(observation), self._loop).result()
            finally:
                random.setstate(saved)
                if np_random is not None:
                    np_random.set_state(np_saved)
        return instance, observation

    # --- tool calls --------------------------------------------------------------------------------------------

    def _start_call(self, s: _Session, c: ToolCall) -> ToolResult | tuple[float, Future, bool]:
        """A result at once (unknown tool, bad arguments), or (start, future, async) of the running call."""
        self._count("tool_calls")
        fn = s.tools.get(c.name)
        if fn is None:
            self._count("unknown_tools")
            return ToolResult(tool_error(f"Tool {c.name} not found."), "unknown_tool")
        bad = _bad_arguments(fn, c)
        if bad is not None:
            self._count("bad_arguments")
            return ToolResult(tool_error(bad), "error")
        return self._start(fn, c.arguments, self.spec.tool_timeout_s)

    def _finish_call(self, c: ToolCall, started: ToolResult | tuple[float, Future, bool]) -> ToolResult:
        if isinstance(started, ToolResult):
            return started
        t0 = started[0]
        ok, value = self._wait(started, self.spec.tool_timeout_s)
        if ok:
            return ToolResult(value if isinstance(value, str) else str(value), "ok", time.monotonic() - t0)
        if value is None:
            self._count("tool_timeouts")
            return ToolResult(tool_error(f"Tool {c.name} timed out after {self.spec.tool_timeout_s:g} s."), "timeout",
                              time.monotonic() - t0)
        self._count("tool_errors")
        return ToolResult(tool_error(str(value)), "error", time.monotonic() - t0)

    def _start(self, fn: Callable[..., Any], kwargs: dict[str, Any], bound_s: float) -> tuple[float, Future, bool]:
        """Start a user call: sync in a thread, async on the worker's loop (cut at bound_s there)."""
        t0 = time.monotonic()
        if not is_async_callable(fn):
            return t0, self._submit(fn, **kwargs), False
        try:
            coro = fn(**kwargs)
        except Exception as err:  # noqa: BLE001 - raised before its first await: the same as raising inside
            fut: Future = Future()
            fut.set_exception(err)
            return t0, fut, True
        return t0, asyncio.run_coroutine_threadsafe(_bounded(coro, bound_s), self._loop), True

    def _wait(self, started: tuple[float, Future, bool], bound_s: float) -> tuple[bool, Any]:
        """(True, its value), (False, the exception it raised), or (False, None) when it is past its bound."""
        t0, fut, is_async = started
        wait_s = bound_s + (ASYNC_SLACK_S if is_async else 0.0)
        try:
            return True, fut.result(timeout=max(t0 + wait_s - time.monotonic(), 0.0))
        except _PastBound:
            return False, None
        except Exception as err:  # noqa: BLE001 - the call's own exception, or our wait running out
            if fut.done():
                return False, err  # the user's TimeoutError is an error like any other
            if is_async:
                fut.cancel()  # a coroutine that blocks the loop: the loop's wait_for never got to cut it
            else:
                self._abandon(fut)
            return False, None

    # --- close -----------------------------------------------------------------------------------------------

    def _start_reward(self, s: _Session) -> tuple[float, Future, bool] | None:
        get_reward = getattr(s.instance, "get_reward", None) if s.instance is not None else None
        if not callable(get_reward):
            return None
        return self._start(get_reward, {}, self.spec.reward_timeout_s)

    def _finish_reward(self, s: _Session, started: tuple[float, Future, bool]) -> tuple[float | None, str | None]:
        """(reward, error): NaN for None (no opinion); None and the error when it raised, timed out or returned
        a non-number."""
        name = f"{type(s.instance).__name__}.get_reward()"
        ok, value = self._wait(started, self.spec.reward_timeout_s)
        if not ok and value is None:
            return self._reward_failed(f"TimeoutError: {name} took more than {self.spec.reward_timeout_s:g} s")
        if not ok:
            return self._reward_failed(f"{type(value).__name__}: {name} raised: {value}")
        if value is None:
            return math.nan, None
        try:
            reward = float(value)
        except (TypeError, ValueError):
            return self._reward_failed(f"TypeError: {name} returned {value!r} ({type(value).__name__}), expected a "
                                       "number or None")
        if math.isinf(reward):
            return self._reward_failed(f"ValueError: {name} returned {reward}; rewards must be finite")
        return reward, None

    def _reward_failed(self, error: str) -> tuple[None, str]:
        self._count("reward_errors")
        return None, error

    def _pickle(self, instance: Any) -> tuple[bytes | None, str | None]:
        from ray import cloudpickle  # Ray's, as Ray pickles everything else (rayward depends on ray)

        try:
            return cloudpickle.dumps(instance), None
        except Exception as err:  # noqa: BLE001 - the class's state is the user's to make picklable
            self._count("state_errors")
            name = type(instance).__name__
            return None, (
                f"PicklingError: cannot pickle the {name} environment for the reward functions that declare "
                f"`environments` ({type(err).__name__}: {err}); make {name} picklable (e.g. drop or recreate "
                "locks, clients and open files in __getstate__/__setstate__)"
            )

    # --- threads ---------------------------------------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counters[key] += n

    def _submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            if self._stuck >= ENV_CALL_THREADS // 2:  # hung sync calls hold threads forever: start a fresh pool
                self._executor, self._stuck = _executor(), 0
                self.counters["thread_pools"] += 1
            return self._executor.submit(fn, *args, **kwargs)

    def _abandon(self, fut: Future) -> None:
        """A sync call past its bound: cancelled if it had not started, else its thread is held."""
        if fut.cancel():
            return
        with self._lock:
            self._stuck += 1
            self.counters["stuck_threads"] += 1


def _executor() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(ENV_CALL_THREADS, thread_name_prefix="env-call")


def _numpy_random() -> Any:
    import numpy

    return numpy.random


def _bad_arguments(fn: Callable[..., Any], c: ToolCall) -> str | None:
    """Why the call's arguments do not fit the tool's signature (Python's words), or None."""
    if not isinstance(c.arguments, dict):
        return f"{c.name}() arguments must be a JSON object, got {type(c.arguments).__name__}"
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # no signature to check (a builtin): the call itself will say
    try:
        sig.bind(**c.arguments)
    except TypeError as err:
        return f"{c.name}() {err}"
    return None


class _PastBound(Exception):
    """An async call cut at its bound on the worker's loop."""


async def _bounded(coro: Any, timeout_s: float) -> Any:
    """The coroutine's result, or _PastBound once it has run timeout_s (it is cancelled then); a TimeoutError
    it raises itself stays its own. Module-level on purpose: an `async def` method would make Ray run EnvWorker
    as an async actor, whose sync methods then block its event loop (one call at a time)."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        task.cancel()
        raise _PastBound
    return task.result()


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


__all__ = ["COUNTERS", "ENV_CALL_THREADS", "EnvWorker", "tool_error"]
