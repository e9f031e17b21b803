"""What a generator's agent loop needs from the environment pool (actors/envs/pool.py): open sessions, run one
turn's tool calls in a session, close sessions. Every call returns a Future, so one agent loop waits on many
trajectories at once and never blocks the engine.

A session is one environment instance (a free one of the worker's, or a new `environment_factory()`; then
`reset(**row)`) living in one environment worker for the whole trajectory. Its worker dying or hanging loses the
session: the Future of a `call` raises EnvSessionLost and the trajectory ends `env_error`; a `close` reports it per
session instead (EnvClosed.error "EnvSessionLost: ...", reward None), so the other sessions closed with it keep their
rewards. An `open` whose worker dies is re-sent to another (nothing of it existed yet); a reset that raised is its
EnvOpened.error.

`PoolEnvironments` is the protocol over the environment pool's actor handle (actors/envs/pool.py): each method is
one call on the pool actor, its ObjectRef turned into a Future (no thread, no Ray import here).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol

from actors.types import AgentDone, AgentRun, EnvClosed, EnvOpened, EnvRequest, ToolCall, ToolResult


class EnvSessionLost(RuntimeError):
    """The session's environment worker died or stopped answering; its state is gone."""


class Environments(Protocol):
    def open(self, requests: list[EnvRequest]) -> Future[list[EnvOpened]]:
        """One session per request, reset with the request's row and seed; results in request order."""

    def call(self, session: int, calls: list[ToolCall]) -> Future[list[ToolResult]]:
        """The tool calls of one model turn, run in the session (sync ones one after another, async ones at
        once), each within the tool timeout; results in call order. A tool that raises or times out is a ToolResult, not
        an error of the Future."""

    def close(self, sessions: list[int], *, keep_state: bool) -> Future[list[EnvClosed]]:
        """End the sessions: get_reward() where the environment has one, and the pickled environment when
        keep_state (reward functions that declare `environments` receive it)."""

    def run_agent(self, run: AgentRun) -> Future[AgentDone]:
        """Run the agent function for one trajectory (a run with agent_function); what went wrong is in
        AgentDone.error, not an error of the Future."""


class PoolEnvironments:
    """Environments over the pool actor `<run>/env-pool` (its handle, e.g. passed to a generator actor)."""

    def __init__(self, pool: Any):
        self.pool = pool

    def open(self, requests: list[EnvRequest]) -> Future[list[EnvOpened]]:
        return _future(self.pool.open.remote(requests))

    def call(self, session: int, calls: list[ToolCall]) -> Future[list[ToolResult]]:
        return _future(self.pool.call.remote(session, calls))

    def close(self, sessions: list[int], *, keep_state: bool) -> Future[list[EnvClosed]]:
        return _future(self.pool.close.remote(sessions, keep_state))

    def run_agent(self, run: AgentRun) -> Future[AgentDone]:
        return _future(self.pool.run_agent.remote(run))


def _future(ref: Any) -> Future[Any]:
    """The ObjectRef's Future, with the pool's EnvSessionLost raised as itself (Ray wraps an actor's exception in
    a RayTaskError that is also an instance of it); other errors (the pool actor died) pass as Ray raises them."""
    out: Future[Any] = Future()

    def done(f: Future[Any]) -> None:
        if f.cancelled():
            out.cancel()
            return
        err = f.exception()
        if err is None:
            out.set_result(f.result())
        elif isinstance(err, EnvSessionLost):
            out.set_exception(EnvSessionLost(str(getattr(err, "cause", None) or err)))
        else:
            out.set_exception(err)

    ref.future().add_done_callback(done)
    return out

