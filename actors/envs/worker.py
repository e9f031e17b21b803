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

The user's code runs where actors/user_code.py runs it (`UserCalls`, as the reward workers do): sync calls in a
thread pool, async ones on one persistent event loop, each within its bound. A hung sync call holds its thread
until it returns (Python cannot kill a thread): once half the pool is held so, later calls go to a fresh pool.
What goes wrong is in the results (EnvOpened.error, ToolResult.status, EnvClosed.error), which the pool counts.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actors import user_code
from actors.envs.spec import EnvSpec, load_environment, load_tool, tool_method_names
from actors.types import ENVIRONMENT_COLUMN, EnvClosed, EnvOpened, EnvRequest, ToolCall, ToolResult
from actors.user_code import Outcome, Pending, Raised, TimedOut, UserCalls

# Threads for sync work (constructors + resets, sync tools, sync get_reward): every session of a full worker
# (actors/envs/pool.py SESSIONS_PER_WORKER, 32) can run two sync calls of one turn at once; a call beyond that
# waits for a thread, and its timeout counts the wait.
ENV_CALL_THREADS = 64


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
        user_code.add_to_sys_path(sys_path)  # the user's run directory: `my_envs:Env` imports as with python -m
        self.spec, self.index = spec, index
        self.tools = {fn.__name__: fn for fn in (load_tool(t, f"tools[{i}]") for i, t in enumerate(spec.tools))}
        self.classes = {name: load_environment(t, "environment_factory") for name, t in spec.environments.items()}
        self.methods = {name: tool_method_names(cls) for name, cls in self.classes.items()}
        self._reset_takes_seed = {
            name: "seed" in inspect.signature(cls.reset).parameters for name, cls in self.classes.items()
        }
        self._numpy = importlib.util.find_spec("numpy") is not None
        self.calls = UserCalls("env-call", ENV_CALL_THREADS)
        self._seed_lock = threading.Lock()  # global random state is seeded around one reset at a time
        self._lock = threading.Lock()  # the sessions
        self.sessions: dict[int, _Session] = {}

    def __repr__(self) -> str:
        # Ray captures an actor's repr once (the dashboard's Repr column): only what never changes.
        envs = {n: c.__name__ for n, c in self.classes.items()}
        return f"EnvWorker(index={self.index}, environments={envs}, tools={sorted(self.tools)})"

    def pid(self) -> int:
        return os.getpid()

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
            out.append(EnvClosed(reward, state, time.monotonic() - t0, error))
        return out

    # --- open ------------------------------------------------------------------------------------------------

    def _open(self, sid: int, req: EnvRequest) -> EnvOpened:
        t0 = time.monotonic()
        if not self.classes:  # tools only: the session is the functions
            return self._opened(sid, _Session(req.env, None, dict(self.tools)), None, t0)
        if req.env not in self.classes:
            have = [n for n in self.classes if n is not None]
            return EnvOpened(sid, None, 0.0, error=f"KeyError: unknown environment {req.env!r} (environment_factory "
                                                   f"has {have or 'one environment: request env None'})")
        outcome = self.calls.call(self._start_episode, {"req": req}, self.spec.tool_timeout_s)
        if isinstance(outcome, TimedOut):
            self._seed_lock = threading.Lock()  # the hung reset keeps the old one
            return self._reset_failed(sid, t0, f"TimeoutError: {self.classes[req.env].__name__}() and reset() took more "
                                               f"than {self.spec.tool_timeout_s:g} s (agent.tool_timeout_s)")
        if isinstance(outcome, Raised):  # the user's constructor or reset: the trajectory ends env_error
            return self._reset_failed(sid, t0, f"{type(outcome.error).__name__}: {outcome.error}")
        instance, observation = outcome.value
        if observation is not None and not isinstance(observation, str):
            return self._reset_failed(sid, t0, f"TypeError: {type(instance).__name__}.reset returned "
                                               f"{type(observation).__name__}; it must return text (appended to the "
                                               "last user message) or None")
        tools = {**self.tools, **{m: getattr(instance, m) for m in self.methods[req.env]}}
        return self._opened(sid, _Session(req.env, instance, tools), observation, t0)

    def _opened(self, sid: int, session: _Session, observation: str | None, t0: float) -> EnvOpened:
        with self._lock:
            self.sessions[sid] = session
        return EnvOpened(sid, observation, time.monotonic() - t0)

    def _reset_failed(self, sid: int, t0: float, error: str) -> EnvOpened:
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
                if inspect.isawaitable(observation):  # an `async def reset`
                    observation = self.calls.await_here(observation)
            finally:
                random.setstate(saved)
                if np_random is not None:
                    np_random.set_state(np_saved)
        return instance, observation

    # --- tool calls --------------------------------------------------------------------------------------------

    def _start_call(self, s: _Session, c: ToolCall) -> ToolResult | Pending:
        """A result at once (unknown tool, bad arguments), or the running call."""
        fn = s.tools.get(c.name)
        if fn is None:
            return ToolResult(tool_error(f"Tool {c.name} not found."), "unknown_tool")
        bad = _bad_arguments(fn, c)
        if bad is not None:
            return ToolResult(tool_error(bad), "error")
        return self.calls.start(fn, c.arguments, self.spec.tool_timeout_s)

    def _finish_call(self, c: ToolCall, started: ToolResult | Pending) -> ToolResult:
        if isinstance(started, ToolResult):
            return started
        outcome = self.calls.outcome(started)
        if isinstance(outcome, TimedOut):
            return ToolResult(tool_error(f"Tool {c.name} timed out after {self.spec.tool_timeout_s:g} s."), "timeout",
                              outcome.seconds)
        if isinstance(outcome, Raised):  # the user's own TimeoutError too: an error like any other
            return ToolResult(tool_error(str(outcome.error)), "error", outcome.seconds)
        value = outcome.value
        return ToolResult(value if isinstance(value, str) else str(value), "ok", outcome.seconds)

    # --- close -----------------------------------------------------------------------------------------------

    def _start_reward(self, s: _Session) -> Pending | None:
        get_reward = getattr(s.instance, "get_reward", None) if s.instance is not None else None
        if not callable(get_reward):
            return None
        return self.calls.start(get_reward, {}, self.spec.reward_timeout_s)

    def _finish_reward(self, s: _Session, started: Pending) -> tuple[float | None, str | None]:
        """(reward, error): NaN for None (no opinion); None and the error when it raised, timed out or returned
        a non-number."""
        return _reward(f"{type(s.instance).__name__}.get_reward()", self.calls.outcome(started))

    def _pickle(self, instance: Any) -> tuple[bytes | None, str | None]:
        from ray import cloudpickle  # Ray's, as Ray pickles everything else (rayward depends on ray)

        try:
            return cloudpickle.dumps(instance), None
        except Exception as err:  # noqa: BLE001 - the class's state is the user's to make picklable
            name = type(instance).__name__
            return None, (
                f"PicklingError: cannot pickle the {name} environment for the reward functions that declare "
                f"`environments` ({type(err).__name__}: {err}); make {name} picklable (e.g. drop or recreate "
                "locks, clients and open files in __getstate__/__setstate__)"
            )


def _reward(name: str, outcome: Outcome) -> tuple[float | None, str | None]:
    """get_reward()'s outcome as (reward, error): NaN for None (no opinion); None and the error when it raised,
    timed out or returned a non-number."""
    if isinstance(outcome, TimedOut):
        return None, f"TimeoutError: {name} took more than {outcome.deadline_s:g} s"
    if isinstance(outcome, Raised):
        return None, f"{type(outcome.error).__name__}: {name} raised: {outcome.error}"
    value = outcome.value
    if value is None:
        return math.nan, None
    try:
        reward = float(value)
    except (TypeError, ValueError):
        return None, f"TypeError: {name} returned {value!r} ({type(value).__name__}), expected a number or None"
    if math.isinf(reward):
        return None, f"ValueError: {name} returned {reward}; rewards must be finite"
    return reward, None


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


__all__ = ["ENV_CALL_THREADS", "EnvWorker", "tool_error"]
