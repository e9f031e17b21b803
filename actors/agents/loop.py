"""The agent loop: multi-turn, tool-calling rollouts, each trajectory at its own pace, token in / token out.

One `AgentLoop` serves one rollout call (the generator's `rollout` / `rollout_stream`): G trajectories per
dataset row, each a small state machine. A trajectory is in one `Phase` at a time and waits on one future; the
future's done-callback posts a typed event to the loop, and the loop moves the trajectory on:

    OPENING   its group's G environment sessions open (one `Environments.open`, the row's group seed: every
              session of a group starts from the same state).
              Opened: render the first prompt (reset's text appended to the last message, the environment's
              tool schemas) and submit the first turn -> SAMPLING; reset raised, the pool could not open
              it, or no room for a turn -> CLOSING
    SAMPLING  one engine request: the trajectory's ids so far, max_tokens = what is left of the model-token
              budget and of the context; it joins the engine's running batch at its next step, beside the
              turns of every other trajectory (continuous batching).
              Sampled: the turn's ids appended, its tool calls parsed; calls -> CALLING; an unreadable call:
              its error appended as the tool message, the next turn -> SAMPLING; a stop reason -> CLOSING
    CALLING   the turn's tool calls run in the session (`Environments.call`).
              Called: their results, as the chat template renders them, appended, the next turn -> SAMPLING;
              the session lost, or no room for the results or for another turn -> CLOSING
    CLOSING   stopped for a stop reason: its turn in flight aborted, its session closing
              (`Environments.close`: get_reward, the environment's state if asked for); stopped while it
              opened, it waits for its session to close it.
              Closed -> DONE
    DONE      nothing of it runs; its group is yielded once all of its trajectories are DONE

`TRANSITIONS` lists the moves each phase allows; DONE has none. Each trajectory's deadline
(trajectory_timeout_s from its group's open) moves it to CLOSING (`timeout`) from any phase before it; in
CLOSING it has CLOSE_GRACE_S more. An event of a future the trajectory no longer waits on (its deadline
passed, its turn was aborted, the call ended) is stale and ignored. A trajectory runs until a stop reason
(actors/types.py StopReason):

    stop       the model answered without a tool call
    max_turns  it called tools again after max_tool_calling_iterations rounds of tools (not run)
    length     the model-token budget (sampling max_tokens, over the whole trajectory), the context
               (max_model_len) or the tool-result token budget (max_tool_tokens) ran out
    timeout    the trajectory's deadline (trajectory_timeout_s from its group's open) passed while it waited
               (on the environment or on the engine: an unfinished turn is aborted and not kept)
    env_error  the environment failed: reset raised, the session was lost (its worker died or hung); a
               session lost after the deadline keeps `timeout`, the first cause (`AgentLoop._session_lost`)

A tool that raises, times out or does not exist, and a call the model wrote but that cannot be read, are tool
messages the model reads next (counted as failures), not stop reasons. Nothing of the user's runs here: tools
and environments run in the environment pool; this loop only waits on futures. All the logic runs on the
calling thread: the engine's and the environments' futures only post events to it.

The next turn's ids are the previous prompt ids + the sampled ids + the tool results' suffix ids
(actors/agents/chat.py); earlier turns are never re-rendered. Per completion token the sample keeps the
sampling logprob (NaN where the model did not sample it), the policy version that sampled it (-1 there) and
the model turn (-1 there: Trajectory.turn_ids, the learner's mask).

What any driver of a trajectory needs is apart from this one (the environment-class driver, `AgentLoop`), so
another driver (one where an external agent program sends the messages) reuses it: `TurnSettings` (the
call's budgets and sampling), `TrajectoryRecord` (the sample being built: `start`, `append_turn`,
`append_scaffold`, `to_sample` with its template check), `turn_budget` / `scaffold_budget` and `submit_turn`.
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
from enum import Enum
from typing import Any

from actors.agents import chat
from actors.envs.client import Environments
from actors.generation.engine import EngineLoop, Request, token_versions
from actors.types import (
    EMPTY_PROMPT,
    ENVIRONMENT_COLUMN,
    EnvClosed,
    EnvOpened,
    EnvRequest,
    Sample,
    StopReason,
    ToolCall,
    ToolResult,
    Trajectory,
)
from actors.vision import ImageError

# After a trajectory ends, how long its session's close (get_reward, the pickled state) may take past the
# trajectory's deadline. The environment pool bounds its own calls (a hung worker is replaced and its futures
# fail); this only keeps a pool that never answers from holding the rollout forever.
CLOSE_GRACE_S = 60.0

# Why a text model's tool results cannot carry images (the error result a model reads instead of one).
NOT_A_VISION_MODEL = "this model reads no images (not a vision-language model)"

# Makes the sampling params of one turn: (max_tokens, seed) -> vLLM SamplingParams (n=1, logprobs=0); the agent
# endpoint also passes `stop=` (the request's stop strings) when it has some.
TurnParams = Callable[..., Any]


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
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # every render of the chat template
    # (generation.chat_template_kwargs, TRL's chat_template_kwargs)
    # agent_function: the generators serve the agent endpoint (actors/agents/endpoint.py), under this model
    # name; None: the environment-class driver (AgentLoop)
    served_model: str | None = None

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
        """reset()'s keyword arguments: the row's columns, as TRL passes them (without `environment` when it picks
        the environment; a row without a prompt gets none)."""
        if not self.multi_environment:
            return dict(row)
        return {k: v for k, v in row.items() if k != ENVIRONMENT_COLUMN}


def turn_seed(seed: int, sample: int, turn: int) -> int:
    """The sampling seed of turn `turn` of sample `sample` of a row seeded `seed`: fixed by the three (a
    repeated rollout, or a resumed run, draws the same tokens), independent across turns and samples."""
    digest = hashlib.blake2b(f"{seed}/{sample}/{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # vLLM takes a non-negative int64


# --- what every driver of a trajectory needs ----------------------------------------------------------------


@dataclass(frozen=True)
class TurnSettings:
    """What one rollout call fixes about its trajectories' turns (AgentSettings: what the run fixes)."""

    n: int  # trajectories per row: a GRPO group
    max_tokens: int  # the model-token budget of each trajectory, over all its turns
    max_model_len: int  # the context: a trajectory's prompt and completion together
    params: TurnParams  # the sampling params of one turn, from (max_tokens, seed)
    min_version: int | None = None  # `EngineLoop.submit`'s, for every turn
    pin: bool = False  # no weight load changes the version from the engine's reaching min_version to the
    # call's end, between turns too (`EngineLoop.pinned`: an eval)
    # Routing replay (grpo.router_replay R3): a finished turn's request -> the experts the engine chose at each
    # position it computed (numpy int16 [positions, layers, top_k], -1 where none). None: not recorded.
    routes: Callable[[Request], Any] | None = None

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_tokens < 1:
            raise ValueError(f"TurnSettings: n ({self.n}) and max_tokens ({self.max_tokens}) must be >= 1")


@dataclass
class TrajectoryCounts:
    """What a trajectory counts besides its ids (Trajectory's counters, the run's multiturn/ metrics)."""

    turns: int = 0  # model turns sampled
    model_tokens: int = 0  # tokens the model sampled: the model-token budget counts these
    tool_tokens: int = 0  # tool-result and scaffold tokens: the tool-token budget counts these
    tool_calls: int = 0  # calls the model wrote (well-formed or not)
    tool_failures: int = 0  # calls that raised, timed out, named an unknown tool or could not be read
    truncated: int = 0  # tool results cut to fit the tool-token budget
    env_s: float = 0.0  # seconds waiting on the environment: open, tools, close


@dataclass(frozen=True)
class SampledTurn:
    """One finished engine turn: the ids the model sampled, their sampling logprobs and policy versions."""

    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str | None  # vLLM's: "length" when max_tokens cut it
    routes: Any = None  # TurnSettings.routes of its request: positions of the whole conversation so far
    prompt_len: int | None = None  # the tokens of the prompt the engine ran (its images expanded by vLLM)

    @classmethod
    def of(cls, request: Request, routes: Callable[[Request], Any] | None = None) -> SampledTurn:
        """The turn of a finished request (n=1; raises CancelledError for an aborted one)."""
        out = request.result()
        completion = out.outputs[0]
        ids = list(completion.token_ids)
        logprobs = [step[tok].logprob for tok, step in zip(ids, completion.logprobs, strict=True)]
        ran = getattr(out, "prompt_token_ids", None)
        return cls(ids, logprobs, token_versions(completion), completion.finish_reason,
                   routes(request) if routes is not None else None, None if ran is None else len(ran))


@dataclass
class TrajectoryRecord:
    """One trajectory's sample as it is built, token in / token out: the first prompt rendered once (`start`),
    then model turns (`append_turn`) and scaffold between them (`append_scaffold`: tool results, or any
    messages the template renders after a turn) appended as ids, never re-rendered; `to_sample` at the end."""

    tokenizer: Any
    tools: list[dict[str, Any]]  # the JSON schemas of the tools the model sees
    prompt: list[dict[str, Any]] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # prompt + completion so far: the next turn's prompt
    completion: list[int] = field(default_factory=list)
    # Per completion token, each [len(completion)]: the sampling logprob, the policy version that sampled it
    # and the model turn; NaN, -1 and -1 where the model did not sample it.
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the completion as chat messages
    counts: TrajectoryCounts = field(default_factory=TrajectoryCounts)
    # Routing replay: per position of `ids`, the experts of the first engine request that computed it (a model
    # token: the turn that sampled it; a prompt, tool or scaffold token: the prefill of the first turn whose
    # prompt held it); -1 where none did. None: not recorded.
    routes: Any = None
    # A vision-language model's processor (actors/vision.py Images): `ids` hold each image as its placeholder
    # repeated once per vision token, as the learner trains on them; the engine gets one placeholder per image
    # (`engine_prompt`). None: a text model.
    vision: Any = None
    images: list[Any] = field(default_factory=list)  # every image `ids` hold, in placeholder order: the first
    # prompt's, then the tool results'

    @property
    def started(self) -> bool:
        return bool(self.prompt_ids)

    def start(self, prompt: list[dict[str, Any]], like: TrajectoryRecord | None = None) -> None:
        """Render the first prompt (the chat template, the tools' schemas; its image parts' placeholders
        expanded): the first turn's ids. like: a record started already whose prompt and tools may be the same (its
        group's first): its ids are taken instead of rendering them again."""
        self.prompt = prompt
        if like is not None and like.started and like.tools == self.tools and like.prompt == prompt:
            self.prompt_ids, self.ids, self.images = list(like.prompt_ids), list(like.prompt_ids), list(like.images)
            return
        ids = chat.render_prompt(self.tokenizer, prompt, self.tools)
        self.images = chat.message_images(prompt)
        if self.images:
            if self.vision is None:
                raise ImageError("an agentic prompt with images for a model without an image processor")
            ids = self.vision.expand(ids, self.images)
        self.prompt_ids = ids
        self.ids = list(ids)

    def engine_prompt(self) -> list[int] | dict[str, Any]:
        """The next turn's prompt as the engine takes it: the ids, or (with images) vLLM's token prompt with one
        placeholder per image and the images as its multi-modal data (vLLM expands them again)."""
        return self.vision.engine_prompt(self.ids, self.images) if self.images else self.ids

    def append_turn(self, sampled: SampledTurn) -> chat.Turn:
        """Append one model turn (sampled after `ids`); returns it as the model wrote it: message, calls."""
        if self.images and sampled.prompt_len is not None and sampled.prompt_len != len(self.ids):
            raise ImageError(
                f"vLLM ran a turn's prompt of {sampled.prompt_len} tokens where the generator's processor made "
                f"{len(self.ids)}: the two expand an image into different numbers of vision tokens; give the "
                "processor's image sizes in model.processor_kwargs (both sides read them)")
        turn = chat.parse_turn(self.tokenizer, sampled.ids, self.ids, self.tools)
        if sampled.routes is not None:
            self.routes = merge_routes(self.routes, sampled.routes)
        self._append(sampled.ids, sampled.logprobs, sampled.versions, self.counts.turns)
        self.messages.append(turn.message)
        self.counts.turns += 1
        self.counts.model_tokens += len(sampled.ids)
        return turn

    def append_scaffold(self, ids: list[int], messages: list[dict[str, Any]], images: list[Any] = ()) -> None:
        """Append what the model did not sample (out of the loss): messages and their rendered suffix ids (images:
        those the ids' placeholders stand for, in order)."""
        self._append(ids, [math.nan] * len(ids), [-1] * len(ids), -1)
        self.messages += messages
        self.images += images
        self.counts.tool_tokens += len(ids)

    def to_sample(
        self, stop: StopReason, *, env: str | None = None, closed: EnvClosed | None = None
    ) -> Sample:
        """The finished sample. env: the environment's name; closed: what its session's close returned."""
        c = self.counts
        trajectory = Trajectory(
            prompt_ids=self.prompt_ids, prompt=self.prompt, messages=self.messages, turn_ids=self.turn_ids,
            stop_reason=stop, env=env, tool_calls=c.tool_calls, tool_failures=c.tool_failures,
            tool_tokens=c.tool_tokens, truncated_tool_results=c.truncated, env_s=c.env_s,
            env_reward=closed.reward if closed is not None else None,
            env_state=closed.state if closed is not None else None,
            template_match=self.template_match(), images=tuple(self.images),
        )
        text = self.tokenizer.decode(self.completion, skip_special_tokens=True)
        routes = None if self.routes is None else merge_routes(None, self.routes, len(self.prompt_ids) +
                                                               len(self.completion))
        return Sample(self.completion, self.logprobs, text, stop, self.versions, trajectory, routes)

    def template_match(self) -> bool:
        """Whether the ids trained on (never re-rendered) agree with the template's rendering of the conversation
        at its special-token boundaries: the run's multiturn/template_mismatch_frac. A conversation the template
        cannot render at all counts as a mismatch."""
        try:
            ids = self.prompt_ids + self.completion
            if self.images:
                ids = self.vision.collapse(ids, self.images)
            return chat.template_check(self.tokenizer, self.prompt, self.messages, self.tools, ids).match
        except Exception:  # noqa: BLE001 - the template's own error: it cannot reproduce what was trained on
            return False

    def _append(self, ids: list[int], logprobs: list[float], versions: list[int], turn: int) -> None:
        self.completion += ids
        self.logprobs += logprobs
        self.versions += versions
        self.turn_ids += [turn] * len(ids)
        self.ids += ids


def merge_routes(old: Any, new: Any, length: int | None = None) -> Any:
    """Routes of one conversation: `old` where it has them, `new` elsewhere, cut or padded (-1) to `length`
    (default: the longer). old, new: numpy int16 [positions, layers, top_k] from position 0, or old None."""
    import numpy as np

    n = length if length is not None else max(len(new), 0 if old is None else len(old))
    out = np.full((n, *new.shape[1:]), -1, dtype=np.int16)
    out[: min(n, len(new))] = new[:n]
    if old is not None:
        k = min(n, len(old))
        have = (old[:k] >= 0).all(axis=(1, 2))
        out[:k][have] = old[:k][have]
    return out


def turn_budget(turns: TurnSettings, record: TrajectoryRecord) -> int:
    """max_tokens of the record's next turn: what is left of the model-token budget and of the context (<= 0:
    no room for a turn, the trajectory ends `length`)."""
    return min(turns.max_tokens - record.counts.model_tokens, turns.max_model_len - len(record.ids))


def scaffold_budget(max_tool_tokens: int, max_model_len: int, record: TrajectoryRecord) -> int:
    """How many ids the record's next scaffold may take: what is left of the tool-token budget and of the
    context, leaving room for one more model token (<= 0: none, the trajectory ends `length`)."""
    return min(max_tool_tokens - record.counts.tool_tokens, max_model_len - len(record.ids) - 1)


def submit_turn(
    engine: EngineLoop, turns: TurnSettings, record: TrajectoryRecord, seed: int
) -> Request | None:
    """Submit the record's next turn (its ids, max_tokens = `turn_budget`, the turn's sampling seed); None
    when there is no room for one (the trajectory ends `length`)."""
    budget = turn_budget(turns, record)
    if budget <= 0:
        return None
    return engine.submit(record.engine_prompt(), turns.params(budget, seed), min_version=turns.min_version)


# --- the environment-class driver: the state machine -------------------------------------------------------


class Phase(Enum):
    """Where a trajectory is (see the module docstring): what it waits on."""

    OPENING = "opening"  # its group's open
    SAMPLING = "sampling"  # its turn in the engine
    CALLING = "calling"  # its turn's tool calls in its session
    CLOSING = "closing"  # stopped: its session's close (stopped while opening: its open, to close it then)
    DONE = "done"  # nothing: its sample is ready


# The phases each phase may move to. Every phase but DONE may also move to DONE when the call ends early (its
# consumer stopped, or an error): nothing of the trajectory is waited for then. DONE is never left.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.OPENING: frozenset({Phase.SAMPLING, Phase.CLOSING, Phase.DONE}),
    Phase.SAMPLING: frozenset({Phase.SAMPLING, Phase.CALLING, Phase.CLOSING, Phase.DONE}),
    Phase.CALLING: frozenset({Phase.SAMPLING, Phase.CLOSING, Phase.DONE}),
    Phase.CLOSING: frozenset({Phase.DONE}),
    Phase.DONE: frozenset(),
}


@dataclass(eq=False)
class _Trajectory:
    """A trajectory of the environment-class driver: who it is, its phase and what it waits on, its record."""

    group: int
    sample: int  # index within its group
    seed: int  # the group's seed
    env: str | None
    row_messages: list[dict[str, Any]]
    deadline: float
    record: TrajectoryRecord
    phase: Phase = Phase.OPENING
    waiting: _Event | None = None  # the event it waits for (any other is stale)
    since: float = 0.0  # when it started waiting
    session: int | None = None
    calling: list[str] = field(default_factory=list)  # the tools of the calls in flight, in order
    stop: StopReason | None = None  # set when it enters CLOSING
    closed: EnvClosed | None = None  # what its session's close returned

    @property
    def counts(self) -> TrajectoryCounts:
        return self.record.counts

    def enter(self, phase: Phase) -> None:
        if phase not in TRANSITIONS[self.phase]:
            raise RuntimeError(f"agent loop: a trajectory cannot move from {self.phase.name} to {phase.name}")
        self.phase = phase


# The events: each carries the future it is the outcome of; a trajectory waits for one event at a time.


@dataclass(eq=False)
class _Opened:
    group: int  # all of the group's trajectories wait for it
    future: Future  # Environments.open: list[EnvOpened], one per trajectory


@dataclass(eq=False)
class _Sampled:
    trajectory: _Trajectory
    future: Request


@dataclass(eq=False)
class _Called:
    trajectory: _Trajectory
    future: Future  # Environments.call: list[ToolResult], one per call


@dataclass(eq=False)
class _Closed:
    trajectory: _Trajectory
    future: Future  # Environments.close: [EnvClosed]


_Event = _Opened | _Sampled | _Called | _Closed


class AgentLoop:
    """One rollout call: G trajectories per row, over the engine loop and the environments (see the module
    docstring). `run` yields the groups as they finish; a consumer that stops early leaves nothing running
    (turns aborted, sessions closed without waiting). turns: the call's budgets and sampling. clock: monotonic
    seconds (deadlines)."""

    def __init__(
        self,
        engine: EngineLoop,
        envs: Environments,
        tokenizer: Any,
        agent: AgentSettings,
        turns: TurnSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        vision: Any = None,
        tool_images_problem: str | None = None,
    ) -> None:
        self.engine, self.envs, self.tokenizer, self.agent, self.turns = engine, envs, tokenizer, agent, turns
        self.clock = clock
        self.vision = vision  # a vision-language model's Images (actors/vision.py); None: a text model
        # Why images in tool results cannot reach the model (chat.tool_images_problem); None: they can.
        self.no_tool_images = tool_images_problem if vision is not None else NOT_A_VISION_MODEL
        self._events: queue.SimpleQueue[_Event] = queue.SimpleQueue()
        self._groups: dict[int, list[_Trajectory]] = {}

    def run(self, rows: list[Mapping[str, Any]], seeds: list[int]) -> Iterator[list[tuple[int, list[Sample]]]]:
        """Yields, as they finish, lists of (row index, its G samples); every row's group exactly once."""
        if len(seeds) != len(rows):
            raise ValueError(f"{len(seeds)} seeds for {len(rows)} rows")
        for row in rows:  # every row's mistake named before any environment opens
            self.agent.environment(row)
            self.agent.messages(row)
        with self.engine.pinned(self.turns.min_version) if self.turns.pin else nullcontext():
            try:
                for g, (row, seed) in enumerate(zip(rows, seeds, strict=True)):
                    self._open(g, row, seed)
                while self._groups:
                    self._wait_and_handle()
                    done = [g for g, group in self._groups.items()
                            if all(t.phase is Phase.DONE for t in group)]
                    if done:
                        yield [(g, [self._sample(t) for t in self._groups.pop(g)]) for g in done]
            finally:
                self._abandon()

    # --- the events ---------------------------------------------------------------------------------------

    def _wait_and_handle(self) -> None:
        """Handle the next event (waiting at most until the nearest deadline) and any queued behind it, then end
        what is past its deadline."""
        live = [t for group in self._groups.values() for t in group if t.phase is not Phase.DONE]
        deadline = min((self._deadline(t) for t in live), default=self.clock())
        try:
            event = self._events.get(timeout=max(deadline - self.clock(), 0.0))
            while True:
                self._handle(event)
                event = self._events.get_nowait()
        except queue.Empty:
            pass
        now = self.clock()
        for t in live:
            if t.phase is not Phase.DONE and now >= self._deadline(t):
                self._expire(t)

    def _handle(self, event: _Event) -> None:
        if isinstance(event, _Opened):
            self._opened(event)
            return
        t = event.trajectory
        if event is not t.waiting:  # stale: it stopped waiting on this (a deadline, an abort)
            return
        t.waiting = None
        if isinstance(event, _Sampled):
            self._sampled(t, event.future)
        elif isinstance(event, _Called):
            self._called(t, event.future)
        else:
            self._closed(t, event.future)

    def _wait(self, t: _Trajectory, event: _Event) -> None:
        t.waiting, t.since = event, self.clock()
        event.future.add_done_callback(lambda _: self._events.put(event))

    def _waited_on_env(self, t: _Trajectory) -> None:
        t.counts.env_s += self.clock() - t.since

    def _deadline(self, t: _Trajectory) -> float:
        return t.deadline + CLOSE_GRACE_S if t.phase is Phase.CLOSING else t.deadline

    def _expire(self, t: _Trajectory) -> None:
        if t.phase is Phase.CLOSING:  # the pool never answered the open or the close: no session to close
            self._waited_on_env(t)
            t.waiting = None
            self._session_lost(t)
        elif t.phase is Phase.OPENING:  # it still waits for its session, to close it
            t.stop = "timeout"
            t.enter(Phase.CLOSING)
        else:
            self._end(t, "timeout")

    # --- OPENING ------------------------------------------------------------------------------------------

    def _open(self, g: int, row: Mapping[str, Any], seed: int) -> None:
        agent, env = self.agent, self.agent.environment(row)
        deadline = self.clock() + agent.trajectory_timeout_s
        messages = agent.messages(row)
        group = [_Trajectory(g, j, seed, env, messages, deadline,
                             TrajectoryRecord(self.tokenizer, list(agent.tools[env]), vision=self.vision))
                 for j in range(self.turns.n)]
        self._groups[g] = group
        request = EnvRequest(env, agent.reset_row(row), seed)
        event = _Opened(g, self.envs.open([request] * self.turns.n))
        for t in group:
            t.waiting, t.since = event, self.clock()
        event.future.add_done_callback(lambda _: self._events.put(event))

    def _opened(self, event: _Opened) -> None:
        try:
            opened: list[EnvOpened] | None = event.future.result()
        except Exception:  # noqa: BLE001 - the pool could not open them
            opened = None
        first: TrajectoryRecord | None = None  # the group's first record started: its prompt is usually theirs
        for j, t in enumerate(self._groups.get(event.group, [])):
            if t.waiting is not event:  # given up on (its deadline and grace, the run's end)
                continue
            t.waiting = None
            self._waited_on_env(t)
            session = opened[j] if opened is not None else None
            t.session = session.session if session is not None else None
            if t.phase is Phase.CLOSING:  # its deadline passed while it opened: close what it got
                self._close_session(t)
            elif session is None or session.error is not None:
                self._end(t, "env_error")
            else:
                t.record.start(chat.prompt_messages(t.row_messages, session.observation), like=first)
                first = first or t.record
                self._submit_turn(t)

    # --- SAMPLING -----------------------------------------------------------------------------------------

    def _submit_turn(self, t: _Trajectory) -> None:
        seed = turn_seed(t.seed, t.sample, t.counts.turns)
        request = submit_turn(self.engine, self.turns, t.record, seed)
        if request is None:
            self._end(t, "length")
            return
        t.enter(Phase.SAMPLING)
        self._wait(t, _Sampled(t, request))

    def _sampled(self, t: _Trajectory, request: Request) -> None:
        try:
            sampled = SampledTurn.of(request, self.turns.routes)
        except CancelledError:  # aborted by this loop; its end is already decided
            return  # (an engine that failed raises EngineError here: out of `run`, which abandons the rest)
        turn = t.record.append_turn(sampled)
        if sampled.finish_reason == "length":
            self._end(t, "length")
            return
        if not turn.calls and turn.malformed is None:
            self._end(t, "stop")
            return
        t.counts.tool_calls += len(turn.calls) or 1
        limit = self.agent.max_tool_calling_iterations
        if limit is not None and t.counts.turns > limit:
            self._end(t, "max_turns")
            return
        if turn.malformed is not None:
            t.counts.tool_failures += 1
            self._append_results(t, [chat.malformed_result(turn.malformed)])
            return
        self._call(t, turn.calls)

    # --- CALLING ------------------------------------------------------------------------------------------

    def _call(self, t: _Trajectory, calls: list[ToolCall]) -> None:
        t.calling = [c.name for c in calls]
        t.enter(Phase.CALLING)
        self._wait(t, _Called(t, self.envs.call(t.session, calls)))

    def _called(self, t: _Trajectory, future: Future) -> None:
        self._waited_on_env(t)
        try:
            results: list[ToolResult] = future.result()
        except Exception:  # noqa: BLE001 - the session is gone (EnvSessionLost) or the pool failed
            self._session_lost(t)
            return
        results = [self._readable(name, r) for name, r in zip(t.calling, results, strict=True)]
        t.counts.tool_failures += sum(r.status != "ok" for r in results)
        self._append_results(t, [{"role": "tool", "name": name, "content": r.content}
                                 for name, r in zip(t.calling, results, strict=True)])

    def _readable(self, name: str, result: ToolResult) -> ToolResult:
        """The result, or, for an image the model cannot be shown (a text model, a template that drops images in
        tool messages), an error result the model reads instead, counted as a failed call."""
        if self.no_tool_images is not None and isinstance(result.content, list) and chat.message_images(
                [{"content": result.content}]):
            return ToolResult(str({"error": f"Tool {name} returned an image, and {self.no_tool_images}"}), "error",
                              result.seconds)
        return result

    def _append_results(self, t: _Trajectory, messages: list[dict[str, Any]]) -> None:
        """The tool messages' suffix ids appended (contents cut to the tool-token budget and to the context,
        leaving room for one more token), then the next turn; nothing fits: `length`."""
        budget = scaffold_budget(self.agent.max_tool_tokens, self.turns.max_model_len, t.record)
        expand = self.vision.expand if self.vision is not None else None
        fitted = chat.fit_tool_results(self.tokenizer, messages, budget, expand) if budget > 0 else None
        if fitted is None:
            t.counts.truncated += len(messages)
            self._end(t, "length")
            return
        t.counts.truncated += fitted.truncated
        t.record.append_scaffold(fitted.suffix_ids, fitted.messages, fitted.images)
        self._submit_turn(t)

    # --- CLOSING ------------------------------------------------------------------------------------------

    def _end(self, t: _Trajectory, reason: StopReason) -> None:
        """Stop the trajectory for `reason` (its session open, or failed to open): abort its turn in flight,
        close its session (waited for, up to CLOSE_GRACE_S past its deadline), or finish it at once if it has
        none."""
        t.stop = reason
        if isinstance(t.waiting, _Sampled):
            t.waiting.future.cancel()
        t.waiting = None
        t.enter(Phase.CLOSING)
        self._close_session(t)

    def _close_session(self, t: _Trajectory) -> None:
        if t.session is None:
            self._finish(t)
            return
        self._wait(t, _Closed(t, self.envs.close([t.session], keep_state=self.agent.keep_env_state)))

    def _closed(self, t: _Trajectory, future: Future) -> None:
        self._waited_on_env(t)
        try:
            (t.closed,) = future.result()
        except Exception:  # noqa: BLE001 - the session is gone: its reward with it
            self._session_lost(t)
            return
        self._finish(t)

    def _session_lost(self, t: _Trajectory) -> None:
        """Its session is gone (its worker died or hung, the pool failed or never answered): `env_error`,
        unless its deadline had stopped it before (`timeout`: the first cause). Lost while it called tools,
        it still closes its session (the pool reports it lost); lost at its close, it is done, without a
        reward."""
        if t.phase is not Phase.CLOSING:
            self._end(t, "env_error")
            return
        t.stop = "timeout" if t.stop == "timeout" else "env_error"
        self._finish(t)

    def _finish(self, t: _Trajectory) -> None:
        t.waiting = None
        t.enter(Phase.DONE)

    def _sample(self, t: _Trajectory) -> Sample:
        if not t.record.started:  # never opened: the record holds the prompt as the model would have seen it
            t.record.start(list(t.row_messages))
        return t.record.to_sample(t.stop or "env_error", env=t.env, closed=t.closed)

    # --- the call's end -----------------------------------------------------------------------------------

    def _abandon(self) -> None:
        """What is still running when the call ends early (its consumer stopped, or an error): turns aborted,
        sessions closed without waiting (still opening: once open)."""
        for group in self._groups.values():
            for j, t in enumerate(group):
                if t.phase is Phase.DONE:
                    continue
                if isinstance(t.waiting, _Sampled):
                    t.waiting.future.cancel()
                elif isinstance(t.waiting, _Opened):
                    t.waiting.future.add_done_callback(lambda f, j=j: self._close_opened(f, j))
                if t.session is not None and t.phase is not Phase.CLOSING:
                    self.envs.close([t.session], keep_state=False)
                self._finish(t)
        self._groups.clear()

    def _close_opened(self, future: Future, j: int) -> None:
        try:
            session = future.result()[j].session
        except Exception:  # noqa: BLE001 - nothing opened, nothing to close
            return
        self.envs.close([session], keep_state=False)
