"""The agent loop: multi-turn, tool-calling rollouts, each trajectory at its own pace, token in / token out.

One `AgentLoop` serves one rollout call (the generator's `rollout` / `rollout_stream`): G trajectories per
dataset row, each a little state machine driven by the futures it waits on:

    open      the row's G environment sessions (one `Environments.open`, the row's group seed: every session
              of a group starts from the same state), then render the first prompt (reset's text appended to
              the last message, the environment's tool schemas)
    turn      one engine request: the trajectory's ids so far, max_tokens = what is left of the model-token
              budget and of the context; it joins the engine's running batch at its next step, beside the
              turns of every other trajectory (continuous batching)
    call      the turn's tool calls, parsed from the sampled ids, run in the session (`Environments.call`);
              their results, as the chat template renders them, are appended and the next turn submitted
    close     the session ends (`Environments.close`: get_reward, the environment's state if asked for)

until a stop reason (actors/types.py StopReason):

    stop       the model answered without a tool call
    max_turns  it called tools again after max_tool_calling_iterations rounds of tools (not run)
    length     the model-token budget (sampling max_tokens, over the whole trajectory), the context
               (max_model_len) or the tool-result token budget (max_tool_tokens) ran out
    timeout    the trajectory's deadline (trajectory_timeout_s from its group's open) passed while it waited
               (on the environment or on the engine: an unfinished turn is aborted and not kept)
    env_error  the environment failed: reset raised, the session was lost (its worker died or hung)

A tool that raises, times out or does not exist, and a call the model wrote but that cannot be read, are tool
messages the model reads next (counted as failures), not stop reasons. Nothing of the user's runs here: tools
and environments run in the environment pool; this loop only waits on futures. All the logic runs on the
calling thread: the engine's and the environments' futures only post events to it.

The next turn's ids are the previous prompt ids + the sampled ids + the tool results' suffix ids
(actors/generation/chat.py); earlier turns are never re-rendered. Per completion token the sample keeps the
sampling logprob (NaN where the model did not sample it), the policy version that sampled it (-1 there) and
the model turn (-1 there: Trajectory.turn_ids, the learner's mask).
"""

from __future__ import annotations

import hashlib
import math
import queue
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import CancelledError, Future
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from actors.envs.client import Environments
from actors.generation import chat
from actors.generation.engine import EngineLoop, Request, token_versions
from actors.types import (
    ENVIRONMENT_COLUMN,
    EnvClosed,
    EnvOpened,
    EnvRequest,
    Sample,
    StopReason,
    ToolResult,
    Trajectory,
)

# After a trajectory ends, how long its session's close (get_reward, the pickled state) may take past the
# trajectory's deadline. The environment pool bounds its own calls (a hung worker is replaced and its futures
# fail); this only keeps a pool that never answers from holding the rollout forever.
CLOSE_GRACE_S = 60.0
# A row without its prompt column when an environment supplies the prompt in reset() (as TRL defaults it).
EMPTY_PROMPT = ({"role": "user", "content": ""},)

# Makes the sampling params of one turn: (max_tokens, seed) -> vLLM SamplingParams (n=1, logprobs=0).
TurnParams = Callable[[int, int], Any]


@dataclass(frozen=True)
class AgentSettings:
    """What a run fixes about its agentic rollouts (the per-call sampling, including the model-token budget
    `max_tokens`, travels with each call)."""

    tools: Mapping[str | None, list[dict[str, Any]]]  # per environment (None: the only one): the JSON schemas of
    # its tools as the model sees them (TRL: the standalone tools, then the environment's public methods)
    max_tool_tokens: int  # tool-result and scaffold tokens per trajectory (agent.max_tool_tokens)
    trajectory_timeout_s: float  # per trajectory, from its group's open to its last turn (agent.trajectory_timeout_s)
    max_tool_calling_iterations: int | None = None  # rounds of tool calls per trajectory (None: until a budget)
    keep_env_state: bool = False  # close returns each environment pickled (reward functions declaring
    # `environments` receive them)
    prompt_column: str = "prompt"

    def __post_init__(self) -> None:
        if not self.tools:
            raise ValueError("AgentSettings.tools: no environment (give None: [schemas] for a single one)")
        if None in self.tools and len(self.tools) > 1:
            raise ValueError("AgentSettings.tools: either one environment (None) or named ones, not both")
        if self.max_tool_tokens < 0:
            raise ValueError(f"AgentSettings.max_tool_tokens must be >= 0, not {self.max_tool_tokens}")
        if not self.trajectory_timeout_s > 0:
            raise ValueError(f"AgentSettings.trajectory_timeout_s must be > 0, not {self.trajectory_timeout_s}")
        if self.max_tool_calling_iterations is not None and self.max_tool_calling_iterations < 0:
            raise ValueError("AgentSettings.max_tool_calling_iterations must be >= 0 or None, not "
                             f"{self.max_tool_calling_iterations}")

    @property
    def multi_environment(self) -> bool:
        """Rows pick their environment by their `environment` column (TRL's dict environment_factory)."""
        return None not in self.tools

    def environment(self, row: Mapping[str, Any]) -> str | None:
        if not self.multi_environment:
            return None
        name = row.get(ENVIRONMENT_COLUMN)
        if name not in self.tools:
            raise ValueError(f"a row's {ENVIRONMENT_COLUMN!r} is {name!r}, not one of the environments "
                             f"{sorted(self.tools)}")
        return name

    def messages(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The row's prompt as chat messages (a row without the column: an empty user turn, for reset to fill)."""
        prompt = row.get(self.prompt_column, list(EMPTY_PROMPT))
        if not (isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) and "role" in prompt[0]):
            raise ValueError(f"agentic rollouts need chat prompts: column {self.prompt_column!r} holds "
                             f"{type(prompt).__name__}, not a list of messages")
        return prompt

    def reset_row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """reset()'s keyword arguments: the row's columns (TRL passes them all, without `environment` when it
        picks the environment), not the driver's `prompt_ids`."""
        drop = {"prompt_ids", *([ENVIRONMENT_COLUMN] if self.multi_environment else [])}
        return {k: v for k, v in row.items() if k not in drop}


def turn_seed(seed: int, sample: int, turn: int) -> int:
    """The sampling seed of turn `turn` of sample `sample` of a row seeded `seed`: fixed by the three (a
    repeated rollout, or a resumed run, draws the same tokens), independent across turns and samples."""
    digest = hashlib.blake2b(f"{seed}/{sample}/{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # vLLM takes a non-negative int64


@dataclass
class _Trajectory:
    group: int
    sample: int  # index within its group
    seed: int  # the group's seed
    env: str | None
    tools: list[dict[str, Any]]
    row_messages: list[dict[str, Any]]
    deadline: float
    session: int | None = None
    prompt: list[dict[str, Any]] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # prompt + completion so far: the next turn's prompt
    completion: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    calling: list[str] = field(default_factory=list)  # the tools of the calls in flight, in order
    turns: int = 0
    model_tokens: int = 0
    tool_tokens: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    truncated: int = 0
    env_s: float = 0.0
    waiting: Future | None = None  # the future it waits on now (events of any other are stale)
    opening: bool = True  # waiting on its group's open
    since: float = 0.0  # when it started waiting on `waiting`
    closing: bool = False
    stop: StopReason | None = None
    closed: EnvClosed | None = None
    finished: bool = False

    def append(self, ids: list[int], logprobs: list[float], versions: list[int], turn: int) -> None:
        self.completion += ids
        self.logprobs += logprobs
        self.versions += versions
        self.turn_ids += [turn] * len(ids)
        self.ids += ids

    def append_scaffold(self, ids: list[int]) -> None:
        self.append(ids, [math.nan] * len(ids), [-1] * len(ids), -1)


class AgentLoop:
    """One rollout call: G trajectories per row, over the engine loop and the environments (see the module
    docstring). `run` yields the groups as they finish; a consumer that stops early leaves nothing running
    (turns aborted, sessions closed without waiting).

    params: the sampling params of one turn, from (max_tokens, seed). max_tokens: the model-token budget of each
    trajectory. min_version: `EngineLoop.submit`'s, for every turn. pin: no weight load changes the version from
    the engine's reaching min_version to the call's end, between turns too (`EngineLoop.pinned`: an eval).
    clock: monotonic seconds (deadlines)."""

    def __init__(
        self,
        engine: EngineLoop,
        envs: Environments,
        tokenizer: Any,
        agent: AgentSettings,
        *,
        n: int,
        max_tokens: int,
        max_model_len: int,
        params: TurnParams,
        min_version: int | None = None,
        pin: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if n < 1 or max_tokens < 1:
            raise ValueError(f"AgentLoop: n ({n}) and max_tokens ({max_tokens}) must be >= 1")
        self.engine, self.envs, self.tokenizer, self.agent = engine, envs, tokenizer, agent
        self.n, self.max_tokens, self.max_model_len, self.params = n, max_tokens, max_model_len, params
        self.min_version, self.pin, self.clock = min_version, pin, clock
        self._events: queue.SimpleQueue[tuple[str, Any, Future]] = queue.SimpleQueue()
        self._groups: dict[int, list[_Trajectory]] = {}

    def run(self, rows: list[Mapping[str, Any]], seeds: list[int]) -> Iterator[list[tuple[int, list[Sample]]]]:
        """Yields, as they finish, lists of (row index, its G samples); every row's group exactly once."""
        if len(seeds) != len(rows):
            raise ValueError(f"{len(seeds)} seeds for {len(rows)} rows")
        for row in rows:  # every row's mistake named before any environment opens
            self.agent.environment(row)
            self.agent.messages(row)
        with self.engine.pinned(self.min_version) if self.pin else nullcontext():
            try:
                for g, (row, seed) in enumerate(zip(rows, seeds, strict=True)):
                    self._open(g, row, seed)
                while self._groups:
                    self._wait_and_handle()
                    done = [g for g, group in self._groups.items() if all(t.finished for t in group)]
                    if done:
                        yield [(g, [self._sample(t) for t in self._groups.pop(g)]) for g in done]
            finally:
                self._abandon()

    # --- the events ---------------------------------------------------------------------------------------

    def _wait_and_handle(self) -> None:
        """Handle the next event (waiting at most until the nearest deadline) and any queued behind it, then end
        what is past its deadline."""
        deadline = min((self._deadline(t) for group in self._groups.values() for t in group if not t.finished),
                       default=self.clock())
        try:
            event = self._events.get(timeout=max(deadline - self.clock(), 0.0))
            while True:
                self._handle(*event)
                event = self._events.get_nowait()
        except queue.Empty:
            pass
        now = self.clock()
        for group in self._groups.values():
            for t in group:
                if not t.finished and now >= self._deadline(t):
                    self._expire(t)

    def _handle(self, kind: str, target: Any, future: Future) -> None:
        if kind == "opened":
            self._opened(target, future)
            return
        t: _Trajectory = target
        if future is not t.waiting:  # stale: it stopped waiting on this (a deadline, an abort)
            return
        t.waiting = None
        if kind == "turn":
            self._turn_done(t, future)
        elif kind == "called":
            t.env_s += self.clock() - t.since
            try:
                results: list[ToolResult] = future.result()
            except Exception:  # noqa: BLE001 - the session is gone (EnvSessionLost) or the pool failed
                self._end(t, "env_error")
                return
            self._tools_done(t, results)
        else:  # closed
            t.env_s += self.clock() - t.since
            try:
                (t.closed,) = future.result()
            except Exception:  # noqa: BLE001 - the session is gone: its reward with it
                t.stop = "env_error" if t.stop != "timeout" else t.stop
            t.finished = True

    def _wait(self, t: _Trajectory, kind: str, future: Future) -> None:
        t.waiting, t.since = future, self.clock()
        future.add_done_callback(lambda f: self._events.put((kind, t, f)))

    def _deadline(self, t: _Trajectory) -> float:
        return t.deadline + CLOSE_GRACE_S if t.closing else t.deadline

    def _expire(self, t: _Trajectory) -> None:
        if t.closing:  # the pool never answered the open or the close: no session to close, no reward
            t.env_s += self.clock() - t.since
            t.waiting, t.finished = None, True
            t.stop = "env_error" if t.stop != "timeout" else t.stop
            return
        self._end(t, "timeout")

    # --- open -> first turn -------------------------------------------------------------------------------

    def _open(self, g: int, row: Mapping[str, Any], seed: int) -> None:
        agent, env = self.agent, self.agent.environment(row)
        deadline = self.clock() + agent.trajectory_timeout_s
        messages = agent.messages(row)
        group = [_Trajectory(g, j, seed, env, list(agent.tools[env]), messages, deadline) for j in range(self.n)]
        self._groups[g] = group
        request = EnvRequest(env, agent.reset_row(row), seed)
        future = self.envs.open([request] * self.n)
        for t in group:
            t.waiting, t.since = future, self.clock()
        future.add_done_callback(lambda f: self._events.put(("opened", g, f)))

    def _opened(self, g: int, future: Future) -> None:
        try:
            opened: list[EnvOpened] | None = future.result()
        except Exception:  # noqa: BLE001 - the pool could not open them
            opened = None
        for j, t in enumerate(self._groups.get(g, [])):
            if t.waiting is not future:  # given up on (run's end)
                continue
            t.waiting, t.opening = None, False
            t.env_s += self.clock() - t.since
            session = opened[j] if opened is not None else None
            t.session = session.session if session is not None else None
            if t.stop is not None:  # its deadline passed while it opened: close what it got
                self._end(t, t.stop)
            elif session is None or session.error is not None:
                self._end(t, "env_error")
            else:
                self._first_turn(t, session)

    def _first_turn(self, t: _Trajectory, session: EnvOpened) -> None:
        t.prompt = chat.prompt_messages(t.row_messages, session.observation)
        t.prompt_ids = chat.render_prompt(self.tokenizer, t.prompt, t.tools)
        t.ids = list(t.prompt_ids)
        self._submit_turn(t)

    # --- turns --------------------------------------------------------------------------------------------

    def _submit_turn(self, t: _Trajectory) -> None:
        budget = min(self.max_tokens - t.model_tokens, self.max_model_len - len(t.ids))
        if budget <= 0:
            self._end(t, "length")
            return
        params = self.params(budget, turn_seed(t.seed, t.sample, t.turns))
        request = self.engine.submit(t.ids, params, min_version=self.min_version)
        self._wait(t, "turn", request)

    def _turn_done(self, t: _Trajectory, request: Request) -> None:
        try:
            out = request.result()
        except CancelledError:  # aborted by this loop; its end is already decided
            return  # (an engine that failed raises EngineError here: out of `run`, which abandons the rest)
        completion = out.outputs[0]
        ids = list(completion.token_ids)
        logprobs = [step[tok].logprob for tok, step in zip(ids, completion.logprobs, strict=True)]
        turn = chat.parse_turn(self.tokenizer, ids, t.ids, t.tools)  # t.ids: the prompt it was sampled after
        t.append(ids, logprobs, token_versions(completion), t.turns)
        t.turns += 1
        t.model_tokens += len(ids)
        t.messages.append(turn.message)
        if completion.finish_reason == "length":
            self._end(t, "length")
            return
        if not turn.calls and turn.malformed is None:
            self._end(t, "stop")
            return
        t.tool_calls += len(turn.calls) or 1
        limit = self.agent.max_tool_calling_iterations
        if limit is not None and t.turns > limit:
            self._end(t, "max_turns")
            return
        if turn.malformed is not None:
            t.tool_failures += 1
            self._append_results(t, [chat.malformed_result(turn.malformed)])
            return
        t.calling = [c.name for c in turn.calls]
        self._wait(t, "called", self.envs.call(t.session, turn.calls))

    def _tools_done(self, t: _Trajectory, results: list[ToolResult]) -> None:
        t.tool_failures += sum(r.status != "ok" for r in results)
        self._append_results(t, [{"role": "tool", "name": name, "content": r.content}
                                 for name, r in zip(t.calling, results, strict=True)])

    def _append_results(self, t: _Trajectory, messages: list[dict[str, Any]]) -> None:
        """The tool messages' suffix ids appended (contents cut to the tool-token budget and to the context,
        leaving room for one more token), then the next turn; nothing fits: `length`."""
        budget = min(self.agent.max_tool_tokens - t.tool_tokens, self.max_model_len - len(t.ids) - 1)
        fitted = chat.fit_tool_results(self.tokenizer, messages, budget) if budget > 0 else None
        if fitted is None:
            t.truncated += len(messages)
            self._end(t, "length")
            return
        t.truncated += fitted.truncated
        t.messages += fitted.messages
        t.append_scaffold(fitted.suffix_ids)
        t.tool_tokens += len(fitted.suffix_ids)
        self._submit_turn(t)

    # --- the end ------------------------------------------------------------------------------------------

    def _end(self, t: _Trajectory, reason: StopReason) -> None:
        """Stop the trajectory for `reason`: abort its turn in flight, close its session (waited for, up to
        CLOSE_GRACE_S past its deadline), or finish it at once if it has none. Still opening: it waits for its
        session (as long as for a close), to close it."""
        t.stop = reason
        t.closing = True
        if t.opening:
            return
        if isinstance(t.waiting, Request):
            t.waiting.cancel()
        t.waiting = None
        if not t.prompt_ids:  # never opened: the record still holds the prompt as the model would have seen it
            t.prompt = list(t.row_messages)
            t.prompt_ids = chat.render_prompt(self.tokenizer, t.prompt, t.tools)
        if t.session is None:
            t.finished = True
            return
        self._wait(t, "closed", self.envs.close([t.session], keep_state=self.agent.keep_env_state))

    def _sample(self, t: _Trajectory) -> Sample:
        closed = t.closed
        trajectory = Trajectory(
            prompt_ids=t.prompt_ids, prompt=t.prompt, messages=t.messages, turn_ids=t.turn_ids,
            stop_reason=t.stop or "env_error", env=t.env, tool_calls=t.tool_calls, tool_failures=t.tool_failures,
            tool_tokens=t.tool_tokens, truncated_tool_results=t.truncated, env_s=t.env_s,
            env_reward=closed.reward if closed is not None else None,
            env_state=closed.state if closed is not None else None,
        )
        trajectory.template_match = self._template_match(t)
        text = self.tokenizer.decode(t.completion, skip_special_tokens=True)
        return Sample(t.completion, t.logprobs, text, trajectory.stop_reason, t.versions, trajectory)

    def _template_match(self, t: _Trajectory) -> bool:
        """Whether the ids trained on (never re-rendered) agree with the template's rendering of the conversation
        at its special-token boundaries: the run's multiturn/template_mismatch_frac. A conversation the template
        cannot render at all counts as a mismatch."""
        try:
            return chat.template_check(self.tokenizer, t.prompt, t.messages, t.tools, t.prompt_ids + t.completion).match
        except Exception:  # noqa: BLE001 - the template's own error: it cannot reproduce what was trained on
            return False

    def _abandon(self) -> None:
        """What is still running when the call ends early (its consumer stopped, or an error): turns aborted,
        sessions closed without waiting (still opening: once open)."""
        for group in self._groups.values():
            for j, t in enumerate(group):
                if t.finished:
                    continue
                if isinstance(t.waiting, Request):
                    t.waiting.cancel()
                elif t.opening and t.waiting is not None:
                    t.waiting.add_done_callback(lambda f, j=j: self._close_opened(f, j))
                if t.session is not None and not t.closing:
                    self.envs.close([t.session], keep_state=False)
                t.waiting, t.finished = None, True
        self._groups.clear()

    def _close_opened(self, future: Future, j: int) -> None:
        try:
            session = future.result()[j].session
        except Exception:  # noqa: BLE001 - nothing opened, nothing to close
            return
        self.envs.close([session], keep_state=False)
