"""EnvWorker: holds environment sessions and runs their tools, each call within a time bound.

A plain class (no Ray import): actors/envs/pool.py makes it a Ray actor that runs one call at a time on its
process's main thread (below). A **session** is one trajectory's environment for its whole life: an instance of
TRL's `environment_factory()`, reset with the dataset row, its public methods the tools (with the standalone
`tools` functions); in a run with `tools` only, a session holds just the functions. The pool routes every open,
call and close of a session here.

**Instances are reused, TRL's contract.** Per environment name the worker keeps the instances no session holds
(`free`). Opening a session takes a free instance, or calls `environment_factory()` when none is free (any
callable: a class, a function, a functools.partial), then `reset(**row)`s it; closing it (after get_reward and
the pickled state) puts it back. So a worker makes at most as many instances of an environment as it held
sessions of it at once, and an expensive `__init__` (a client, a sandbox) is paid once per instance, not per
trajectory: `reset` must start every episode afresh, as under TRL (which keeps one instance per concurrent
rollout of a batch and resets it every step). An instance whose `reset` or `get_reward` raised or was cut at its
deadline is dropped instead, its state unknown (the next open calls the factory); a tool that raised or timed
out leaves it in the session (the trajectory goes on, as in TRL) and back in the free list at close. The
instances of a worker that dies or is replaced die with it. What differs from TRL: TRL's pool is one process's,
rayward's one per worker (a session never moves), and TRL keeps the instance of its start-up probe while rayward
never creates an instance outside a worker (a factory that is not a class is called once in the driver to learn
its class, and that instance is dropped: actors/envs/spec.py).

* **open**: take or create the instance, then reset it, TRL's way: every column of the row is a keyword argument,
  but for the `environment` column when environment_factory is a mapping (a control column, as in TRL). A GRPO
  group's G sessions share the request's seed: Python's `random` (and numpy's global generator, when numpy is
  installed) is seeded with it around the factory call (when there is one) and reset, under a lock, and restored
  after; `reset` receives `seed=` too when it declares a `seed` parameter and the row has no `seed` column. An
  environment that draws its state from its own generator should seed it in reset (from the `seed` argument, or
  a row column); state drawn in `__init__` is not the group's (the instance may have served another group), and
  state drawn elsewhere (a remote service) is not reproducible by the group. The factory and reset together are
  bounded by the tool timeout; failing, they end the trajectory `env_error` (EnvOpened.error).
* **call**: the calls of one model turn, each within `tool_timeout_s` of its start: sync tools one after another
  on the main thread (TRL runs them so), `async def` tools at the same time on the worker's event loop. What goes
  wrong is a ToolResult the model reads, never an error of the call, written as TRL 1.16 writes a failed tool
  (`str({"error": str(exception)})`):

      raised           {'error': '<str(exception)>'}                     (TRL: the same)
      its own alarm    {'error': '<its TimeoutError's message>'}         (TRL: the same: it raised)
      unknown tool     {'error': 'Tool <name> not found.'}               (TRL: the same)
      bad arguments    {'error': '<name>() got an unexpected keyword argument ...' / 'missing a required
                        argument ...'} (checked against the signature, the tool is not run; TRL calls it and
                        passes Python's TypeError on)
      timed out        {'error': 'Tool <name> timed out after <t> s.'}   (TRL has no timeout)

  A result is passed on whole (`tool_content`): as `str(result)`, or, for TRL's multimodal tool responses (a
  list of content blocks, `{"type": "image", "image": ...}` and `{"type": "text", "text": ...}`), as that list,
  its images decoded to RGB PIL (an image that cannot be decoded is an error result naming the tool). TRL passes
  any list on as content; rayward passes a list of anything else on as its `str`, as any other value. The agent
  loop budgets tool-result tokens, the images' vision tokens included.
* **close**: `get_reward()` (sync or async, within the environment reward's timeout; None where the environment
  has none, NaN where it returned None, None and an error when it raised, timed out or returned a non-number),
  and when asked the instance pickled with cloudpickle (for reward functions that declare `environments`). The
  instance then goes back to the free list (or is dropped, above).

**Where the user's code runs** (actors/user_code.py `UserCalls`, `sync_on="main"`): the worker's sync calls (the
factory, reset, sync tools, sync get_reward) on the process's main thread, as TRL runs them on the trainer's, so a
tool that bounds itself with `signal.signal(SIGALRM)` + `signal.alarm` works as under TRL; async ones on one
persistent event loop in a thread of its own. Each call's bound on the main thread is a SIGALRM timer of
rayward's, unless the call arms its own alarm, which then rules that call (user_code's docstring has the exact
rules). A call stuck in C code that no signal interrupts is cut from outside: the pool replaces a worker that does
not answer within its call's bound plus grace, and its sessions end `env_error`. `sync_on="threads"` runs sync
calls in a thread pool instead, for a worker run off its process's main thread (the pool's in-process tests): a
tool's own alarm fails there, and a hung call holds its thread until it returns.
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
from actors.envs.spec import (
    RESET,
    EnvSpec,
    factory_field,
    factory_name,
    has_reset,
    load_factory,
    load_tool,
    tool_method_names,
)
from actors.types import ENVIRONMENT_COLUMN, EnvClosed, EnvOpened, EnvRequest, ToolCall, ToolResult
from actors.user_code import Outcome, Pending, Raised, SyncOn, TimedOut, UserCalls
from actors.vision import ImageError, to_image

# Threads for sync calls with sync_on="threads" only (a worker run off its process's main thread): one turn's or
# one group's calls at once, with room for calls abandoned at their deadline. The main-thread mode uses none.
ENV_CALL_THREADS = 16


@dataclass
class _Session:
    env: str | None
    instance: Any | None  # None: tools only
    tools: dict[str, Callable[..., Any]]  # tool name -> callable (the instance's bound methods included)


@dataclass(frozen=True)
class _Class:
    """What the worker reads from an environment's class, once per class (TRL reads type(instance) per rollout)."""

    methods: list[str]  # its tools (tool_method_names)
    reset_takes_seed: bool


@dataclass
class _Opening:
    """How far an open got (the factory and reset run within one bound): what the messages and the free list
    need when it failed."""

    req: EnvRequest
    instance: Any = None  # taken from the free list, or made by the factory
    created: bool = False  # the factory was called


def tool_error(message: str) -> str:
    """The tool message for a failed call, as TRL writes it."""
    return str({"error": message})


# The content-block types of TRL's multimodal tool responses (GRPOTrainer._tool_call_loop).
CONTENT_BLOCK_TYPES = ("text", "image")


def tool_content(value: Any, tool: str) -> str | list[dict[str, Any]]:
    """A tool's return value as the tool message's content: a list of content blocks (every item a dict whose
    `type` is text or image) as blocks, `{"type": "text", "text": str}` and `{"type": "image", "image": RGB PIL}`;
    anything else as `str(value)`. Raises ImageError (naming the tool and the block) for an image that cannot be
    decoded."""
    if isinstance(value, str):
        return value
    if not (isinstance(value, list) and value and all(
            isinstance(b, dict) and b.get("type") in CONTENT_BLOCK_TYPES for b in value)):
        return str(value)
    blocks: list[dict[str, Any]] = []
    for i, b in enumerate(value):
        if b["type"] == "image":
            blocks.append({"type": "image", "image": to_image(b.get("image"), f"tool {tool} result block {i}")})
        else:
            blocks.append({"type": "text", "text": str(b.get("text", ""))})
    return blocks


class EnvWorker:
    """Sessions of one run's environments, and the free instances between them. Called one call at a time (a Ray
    actor with max_concurrency=1: the pool sends a worker its calls one after another)."""

    def __init__(
        self, spec: EnvSpec, *, index: int = 0, sys_path: list[str] | None = None, sync_on: SyncOn = "main",
    ):
        """sync_on: where sync user calls run (see the module docstring): "main" in a Ray actor, whose methods run
        on the main thread; "threads" for a worker called from other threads."""
        user_code.add_to_sys_path(sys_path)  # the user's run directory: `my_envs:Env` imports as with python -m
        self.spec, self.index = spec, index
        self.tools = {fn.__name__: fn for fn in (load_tool(t, f"tools[{i}]") for i, t in enumerate(spec.tools))}
        self.factories = {name: load_factory(t, factory_field(name)) for name, t in spec.environments.items()}
        self.free: dict[str | None, list[Any]] = {name: [] for name in self.factories}  # instances no session holds
        self._classes: dict[type, _Class] = {}
        self._numpy = importlib.util.find_spec("numpy") is not None
        self.calls = UserCalls("env-call", ENV_CALL_THREADS, sync_on=sync_on)
        self._seed_lock = threading.Lock()  # global random state is seeded around one factory + reset at a time
        self.sessions: dict[int, _Session] = {}

    def __repr__(self) -> str:
        # Ray captures an actor's repr once (the dashboard's Repr column): only what never changes.
        return f"EnvWorker(index={self.index}, environments={self.spec.environments}, tools={sorted(self.tools)})"

    def pid(self) -> int:
        return os.getpid()

    # --- sessions -------------------------------------------------------------------------------------------

    def open(self, requests: list[tuple[int, EnvRequest]]) -> list[EnvOpened]:
        """Open a session per (pool's session id, request), one after another (their resets seed the same
        global generators); results in order."""
        return [self._open(sid, req) for sid, req in requests]

    def call(self, session: int, calls: list[ToolCall]) -> list[ToolResult]:
        """One model turn's tool calls in `session` (async ones concurrently); results in call order. KeyError
        for a session that is not open here."""
        s = self.sessions[session]
        started = [self._start_call(s, c) for c in calls]
        return [self._finish_call(c, st) for c, st in zip(calls, started, strict=True)]

    def close(self, sessions: list[int], keep_state: bool) -> list[EnvClosed]:
        """End the sessions: every get_reward() (async ones at once), then (keep_state) each instance pickled; the
        instances go back to the free list, but those whose get_reward raised or timed out. A session that is not
        open here gets an EnvClosed with its error."""
        popped = [(sid, self.sessions.pop(sid, None)) for sid in sessions]
        t0 = time.monotonic()
        started = [self._start_reward(s) if s is not None else None for _, s in popped]
        out = []
        for (sid, s), st in zip(popped, started, strict=True):
            if s is None:
                out.append(EnvClosed(None, None, error=f"session {sid} is not open on environment worker {self.index}"))
                continue
            outcome = self.calls.outcome(st) if st is not None else None  # None: no get_reward
            reward, error = (None, None) if outcome is None else _reward(
                f"{type(s.instance).__name__}.get_reward()", outcome)
            state = None
            if keep_state and s.instance is not None:
                state, state_error = self._pickle(s.instance)
                error = error or state_error
            if s.instance is not None and not isinstance(outcome, (Raised, TimedOut)):
                self.free[s.env].append(s.instance)
            out.append(EnvClosed(reward, state, time.monotonic() - t0, error))
        return out

    # --- open ------------------------------------------------------------------------------------------------

    def _open(self, sid: int, req: EnvRequest) -> EnvOpened:
        t0 = time.monotonic()
        if not self.factories:  # tools only: the session is the functions
            return self._opened(sid, _Session(req.env, None, dict(self.tools)), None, t0)
        if req.env not in self.factories:
            have = [n for n in self.factories if n is not None]
            return EnvOpened(sid, None, 0.0, error=f"KeyError: unknown environment {req.env!r} (environment_factory "
                                                   f"has {have or 'one environment: request env None'})")
        opening = _Opening(req)
        outcome = self.calls.call(self._start_episode, {"opening": opening}, self.spec.tool_timeout_s)
        if isinstance(outcome, TimedOut):  # the instance, if any, is dropped: its state is unknown
            self._seed_lock = threading.Lock()  # sync_on="threads": the hung call keeps the old one
            return self._failed(sid, opening, t0, f"TimeoutError: {self._what_ran(opening)} took more than "
                                                  f"{self.spec.tool_timeout_s:g} s (agent.tool_timeout_s)")
        if isinstance(outcome, Raised):  # the user's factory or reset: the trajectory ends env_error
            return self._failed(sid, opening, t0, f"{type(outcome.error).__name__}: {outcome.error}")
        instance, observation = opening.instance, outcome.value
        if observation is not None and not isinstance(observation, str):
            self.free[req.env].append(instance)  # reset returned: the instance is as good as any
            return self._failed(sid, opening, t0, f"TypeError: {type(instance).__name__}.reset returned "
                                                  f"{type(observation).__name__}; it must return text (appended to "
                                                  "the last user message) or None")
        tools = {**self.tools, **{m: getattr(instance, m) for m in self._class(type(instance)).methods}}
        return self._opened(sid, _Session(req.env, instance, tools), observation, t0, opening.created)

    def _opened(self, sid: int, session: _Session, observation: str | None, t0: float, created: bool = False
                ) -> EnvOpened:
        self.sessions[sid] = session
        return EnvOpened(sid, observation, time.monotonic() - t0, created=created)

    def _failed(self, sid: int, opening: _Opening, t0: float, error: str) -> EnvOpened:
        return EnvOpened(sid, None, time.monotonic() - t0, error=error, created=opening.created)

    def _what_ran(self, opening: _Opening) -> str:
        """What an open that timed out was running, as its message names it: `Factory()`, `Factory() and
        reset()`, or `Class.reset()` for a reused instance."""
        name = factory_name(self.factories[opening.req.env])
        if opening.instance is None:
            return f"{name}()"
        return f"{name}() and reset()" if opening.created else f"{type(opening.instance).__name__}.reset()"

    def _class(self, cls: type) -> _Class:
        if cls not in self._classes:
            takes_seed = "seed" in inspect.signature(getattr(cls, RESET)).parameters
            self._classes[cls] = _Class(tool_method_names(cls), takes_seed)
        return self._classes[cls]

    def _start_episode(self, opening: _Opening) -> Any:
        """Take a free instance or make one, and reset it, with the global generators seeded by the request
        (restored after); what reset returned. `opening` records how far it got."""
        req = opening.req
        row = dict(req.row)
        if self.spec.routed:
            row.pop(ENVIRONMENT_COLUMN, None)
        with self._seed_lock:
            saved = random.getstate()
            np_random = _numpy_random() if self._numpy else None
            np_saved = np_random.get_state() if np_random is not None else None
            random.seed(req.seed)
            if np_random is not None:
                np_random.seed(req.seed % 2**32)
            try:
                free = self.free[req.env]
                if free:
                    opening.instance = free.pop()
                else:
                    opening.created = True
                    opening.instance = self._make(req.env)
                if self._class(type(opening.instance)).reset_takes_seed and "seed" not in row:
                    row["seed"] = req.seed
                observation = opening.instance.reset(**row)
                if inspect.isawaitable(observation):  # an `async def reset`
                    observation = self.calls.await_here(observation)
            finally:
                random.setstate(saved)
                if np_random is not None:
                    np_random.set_state(np_saved)
        return observation

    def _make(self, env: str | None) -> Any:
        """A new instance from the environment's factory, checked for `reset` (a factory that is not a class may
        return anything)."""
        factory = self.factories[env]
        instance = factory()
        if not has_reset(type(instance)):
            raise TypeError(f"{factory_name(factory)}() ({factory_field(env)}) returned a {type(instance).__name__}, "
                            "which has no `reset` method")
        return instance

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
        try:
            content = tool_content(outcome.value, c.name)
        except ImageError as err:
            return ToolResult(tool_error(str(err)), "error", outcome.seconds)
        return ToolResult(content, "ok", outcome.seconds)

    # --- close -----------------------------------------------------------------------------------------------

    def _start_reward(self, s: _Session) -> Pending | None:
        get_reward = getattr(s.instance, "get_reward", None) if s.instance is not None else None
        if not callable(get_reward):
            return None
        return self.calls.start(get_reward, {}, self.spec.reward_timeout_s)

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


__all__ = ["ENV_CALL_THREADS", "EnvWorker", "tool_content", "tool_error"]
