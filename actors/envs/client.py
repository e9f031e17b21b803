"""What a generator's agent loop needs from the environment pool (actors/envs/pool.py): open sessions, run one
turn's tool calls in a session, close sessions. Every call returns a Future, so one agent loop waits on many
trajectories at once and never blocks the engine.

A session is one environment instance (TRL's `environment_factory()`, then `reset(**row)`) living in one
environment worker for the whole trajectory. Its worker dying or hanging loses the session: the Future raises
EnvSessionLost and the trajectory ends `env_error`.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol

from actors.types import EnvClosed, EnvOpened, EnvRequest, ToolCall, ToolResult


class EnvSessionLost(RuntimeError):
    """The session's environment worker died or stopped answering; its state is gone."""


class Environments(Protocol):
    def open(self, requests: list[EnvRequest]) -> Future[list[EnvOpened]]:
        """One session per request, reset with the request's row and seed; results in request order."""

    def call(self, session: int, calls: list[ToolCall]) -> Future[list[ToolResult]]:
        """The tool calls of one model turn, run in the session (concurrently), each within the tool timeout;
        results in call order. A tool that raises or times out is a ToolResult, not an error of the Future."""

    def close(self, sessions: list[int], *, keep_state: bool) -> Future[list[EnvClosed]]:
        """End the sessions: get_reward() where the environment has one, and the pickled environment when
        keep_state (reward functions that declare `environments` receive it)."""
