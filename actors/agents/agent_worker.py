"""AgentWorker: runs the user's agent function, one call per trajectory, many at once.

An agent function (`agent_function: "module:function"`) is a program written against the OpenAI API: it receives
an OpenAI client already pointed at its trajectory's endpoint (actors/agents/endpoint.py, served by the
generator) and the dataset row, runs whatever it runs (its own loop, tools, retries, context handling), and
returns a reward (a number) or None (reward functions score the conversation):

    async def agent(client: openai.AsyncOpenAI, row: dict, *, model: str) -> float | None
    def agent(client: openai.OpenAI, row: dict, **kwargs) -> float | None        # a sync one: the sync client

Keyword arguments it declares (or takes as **kwargs) are passed among `AGENT_KWARGS`: `model` (the served name,
for `chat.completions.create(model=...)`), `base_url` and `api_key` (for a harness that builds its own client),
`seed` (the GRPO group's: the G trajectories of a row share it, as environment sessions do).

A plain class (no Ray import): actors/envs/pool.py makes it an async Ray actor that runs up to
SESSIONS_PER_WORKER agents at once, where environment workers run (the environment pool places, bounds and
replaces it as it does an environment worker). An agent waits on the model most of its life, so an `async def`
agent runs on the actor's event loop, and a sync one in a thread of the worker's pool (a sync client blocks only
its thread). Each run is bounded by what is left of its trajectory's deadline: an async agent is cancelled then;
a sync one cannot be stopped from outside, but its endpoint refuses every request after the deadline, so an agent
waiting on the model fails there. What goes wrong (it raised, timed out, returned something that is not a number
or None) is in AgentDone.error; the trajectory keeps the turns it had.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from actors import user_code
from actors.envs.spec import EnvSpec, EnvSpecError, import_object
from actors.types import AgentDone, AgentRun

# The keyword arguments an agent function may declare (AgentRun's fields of the same names).
AGENT_KWARGS = ("model", "base_url", "api_key", "seed")
# Threads for sync agent functions: one per trajectory a worker holds (actors/envs/pool.py SESSIONS_PER_WORKER),
# with room for runs abandoned at their deadline that have not returned yet.
AGENT_THREADS = 64
# Seconds past its trajectory's deadline a run may take to return (a client's own timeout, closing it): the
# endpoint refuses the agent's requests from the deadline on, so a run ends soon after.
RETURN_GRACE_S = 5.0


def load_agent(target: str, what: str = "agent_function") -> Callable[..., Any]:
    """`module:function` imported and checked: callable, with a positional parameter for the client and one for the
    row. EnvSpecError naming `what` otherwise."""
    fn = import_object(target, what)
    if not callable(fn):
        raise EnvSpecError(f"{what} {user_code.describe(target)} is a {type(fn).__name__}, not a function")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return fn
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not any(p.kind is p.VAR_POSITIONAL for p in params) and len(positional) < 2:
        raise EnvSpecError(
            f"{what} {user_code.describe(target)} takes {len(positional)} positional parameter(s): an agent function "
            "receives (client, row): an OpenAI client pointed at its trajectory's endpoint, and the dataset row")
    return fn


def agent_kwargs(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The names among AGENT_KWARGS the function accepts (all of them with **kwargs)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return ()
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return AGENT_KWARGS
    return tuple(k for k in AGENT_KWARGS if k in params and params[k].kind is not params[k].POSITIONAL_ONLY)


def agent_reward(value: Any) -> tuple[float | None, str | None]:
    """An agent's return value as (reward, error): a number (bool included) -> float, None -> NaN (no opinion)."""
    if value is None:
        return math.nan, None
    if isinstance(value, bool | int | float) and math.isfinite(float(value)):
        return float(value), None
    return None, f"returned {value!r} ({type(value).__name__}), not a finite number or None"


class AgentWorker:
    """Runs the agent function of an EnvSpec (see the module docstring)."""

    def __init__(self, spec: EnvSpec, *, index: int = 0, sys_path: list[str] | None = None):
        if spec.agent_function is None:
            raise ValueError("AgentWorker: the spec has no agent_function")
        user_code.add_to_sys_path(sys_path)
        self.spec, self.index = spec, index
        self.fn = load_agent(spec.agent_function)
        self.is_async = user_code.is_async_callable(self.fn)
        self.kwargs = agent_kwargs(self.fn)
        self._threads: ThreadPoolExecutor | None = None
        # One HTTP connection pool per worker, shared by its runs' clients: making an httpx client (its TLS
        # context) costs tens of milliseconds, as much as several engine steps, and a run makes one client.
        self._http: Any = None
        self._http_sync: Any = None

    def __repr__(self) -> str:
        return f"AgentWorker(index={self.index}, agent_function={self.spec.agent_function!r})"

    def pid(self) -> int:
        return os.getpid()

    async def run_agent(self, run: AgentRun) -> AgentDone:
        """Run the agent for one trajectory, within run.timeout_s."""
        import openai

        t0 = time.monotonic()
        fn = self.spec.agent_function
        kw = {k: getattr(run, k) for k in self.kwargs}
        try:
            if self.is_async:
                if self._http is None:
                    self._http = openai.DefaultAsyncHttpxClient()
                client = openai.AsyncOpenAI(base_url=run.base_url, api_key=run.api_key, timeout=run.timeout_s,
                                            http_client=self._http)
                value = await asyncio.wait_for(self.fn(client, dict(run.row), **kw), run.timeout_s)
            else:
                if self._threads is None:
                    self._threads = ThreadPoolExecutor(AGENT_THREADS, thread_name_prefix="rayward-agent")
                    self._http_sync = openai.DefaultHttpxClient()
                value = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(
                    self._threads, self._run_sync, run, kw), run.timeout_s + RETURN_GRACE_S)
        except (asyncio.TimeoutError, TimeoutError):
            return AgentDone(None, time.monotonic() - t0, error=f"timed out after {run.timeout_s:.3g} s "
                                                                "(agent.trajectory_timeout_s)", function=fn)
        except Exception as err:  # noqa: BLE001 - the user's agent: what it raised is the trajectory's error
            return AgentDone(None, time.monotonic() - t0, error=f"{type(err).__name__}: {err}", function=fn)
        reward, error = agent_reward(value)
        return AgentDone(reward, time.monotonic() - t0, error=error, function=fn)

    def _run_sync(self, run: AgentRun, kw: dict[str, Any]) -> Any:
        import openai

        client = openai.OpenAI(base_url=run.base_url, api_key=run.api_key, timeout=run.timeout_s,
                               http_client=self._http_sync)
        return self.fn(client, dict(run.row), **kw)


__all__ = ["AgentWorker", "AGENT_KWARGS", "load_agent", "agent_kwargs", "agent_reward"]
