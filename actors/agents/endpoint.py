"""The agent endpoint: an OpenAI-compatible chat-completions server per generator, one base URL per trajectory,
token in / token out; and the driver of agent-function rollouts over it.

A run with `agent_function` (actors/agents/agent_worker.py) trains agents written against the OpenAI API unmodified.
Each trajectory of a rollout call gets its own base URL on its generator's endpoint,
`http://<node address>:<port>/<trajectory>/v1`, and its own key (derived from a secret the generator draws at
start: a request without the key is refused, 401). The agent function runs in the environment pool with a client
pointed there; its requests join the generator's engine loop beside every other trajectory's turns (continuous
batching), and nothing else is served (no other path, no other model).

**Token in, token out** (`EndpointTrajectory`). The learner trains on the ids the engine sampled. A trajectory is
a list of branches, each a TrajectoryRecord (actors/agents/loop.py: the same record the environment-class
driver builds). A request whose messages extend a branch (the branch's previous request's messages, then the
assistant message the endpoint returned, as the agent sent it back: same text and calls; reasoning fields and
call ids aside) and whose tools are the branch's continues it: ids = the branch's ids + the new messages (tool
results, user turns) as the chat template renders them after an assistant turn (`chat.tool_suffix_ids`), never a
re-tokenization of the history. Any other request (the agent rewrote, truncated or summarized its history,
changed its tools, or runs a sub-agent) starts a new branch: its messages rendered as a first prompt.

**How branches train: the last one.** The sample of a trajectory is its last branch (the one its last request
extended or started): the sequence its reward judges, as reward functions see it (its conversation). Model turns
of earlier branches were sampled but are not trained (`Trajectory.untrained_turns`, metric
`agent/untrained_turns`), and branches are counted (`agent/branches`). The peers' choices: prime-rl/verifiers
train every branch as a sample of its own (a node shared by branches trained once), AReaL's `individual` export
every request as its own row and its `concat` export only linear conversations, NeMo-Gym asserts the history is
never rewritten. One sequence per trajectory keeps rayward's GRPO groups G sequences with one reward each; an
agent that compacts its context every few turns trains on its last context only (docs/agents.md).

Budgets, as for environments: the model tokens of the trained branch (generation.max_completion_length), the context
(generation.max_model_len), the tokens of the messages the agent adds after each response (agent.max_tool_tokens), the
rounds of tool calls (generation.max_tool_calling_iterations), the branches it starts (MAX_BRANCHES: an agent that
floods its endpoint; a request that would start one more is refused, 400, and the trajectory goes on), the trajectory's
deadline (agent.trajectory_timeout_s). A request past another budget is refused with an OpenAI error (400; the deadline
and a turn aborted by it: 408) and the trajectory ends with the budget's stop reason (`length`, `max_turns`, `timeout`);
a turn that the model-token budget cuts is returned with finish_reason "length" and ends it too. Otherwise the
trajectory ends when its agent returns: `stop` when its last turn was an answer, `max_turns` when the agent stopped
while the model still called tools, `length` when the agent's own max_tokens cut the last turn, `env_error` when the
agent raised, returned something that is not a number or None, or its worker was lost, and `timeout` when it was cut at
the deadline. A trajectory that never made a request is its row's prompt and an empty completion. The endpoint
names the first few failed runs in its log, and an agent function that returns without a request (`note`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import queue
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import CancelledError, Future
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from actors.agents import chat
from actors.agents.loop import (
    CLOSE_GRACE_S,
    AgentSettings,
    SampledTurn,
    TrajectoryRecord,
    TurnSettings,
    scaffold_budget,
    turn_budget,
    turn_seed,
)
from actors.agents.openai_api import (
    ApiError,
    ChatRequest,
    Served,
    chunks,
    completion,
    message_key,
    models,
    parse_request,
    response_message,
    sse,
    template_calls,
    usage,
)
from actors.envs.client import Environments
from actors.generation.engine import EngineError, EngineLoop, Request
from actors.types import EMPTY_PROMPT, AgentDone, AgentRun, EnvClosed, Sample, StopReason

# The key's prefix (an OpenAI key has one too): a key in a log reads as rayward's.
KEY_PREFIX = "rw-"
# Branches a trajectory may start. Each has a model-token budget of its own, so without a bound an agent that floods
# its endpoint (a runaway retry loop, a fan-out of parallel requests: each starts a branch) samples without end and
# starves the generator's other trajectories. Generous for what agents do on purpose: context compactions every few
# turns, sub-agents, a few retries after errors.
MAX_BRANCHES = 32
# Failed agent runs an endpoint names in its log (the generator's: the driver's terminal); the rest are only counted
# (env_pool/agent_errors). A few show what goes wrong without a line per trajectory of every step.
NAMED_AGENT_FAILURES = 5


# --- one trajectory: token in, token out ----------------------------------------------------------------------


@dataclass(eq=False)
class _Branch:
    record: TrajectoryRecord
    history: list[dict[str, Any]]  # the messages its ids hold, in the template's form (the last: an answer)
    tools: list[dict[str, Any]]
    busy: bool = False  # a request on it is in the engine
    broken: bool = False  # a request on it failed after its messages were appended: not extended again
    last_finish: str | None = None  # finish_reason of its last turn


@dataclass(eq=False)
class Turn:
    """A request admitted into the engine: what `EndpointTrajectory.end` needs."""

    branch: _Branch
    request: Request
    index: int  # the trajectory's request count before it (its calls' ids)
    cut_by_budget: bool  # its max_tokens is what is left of the trajectory's budgets
    stop: list[str]


@dataclass
class Answer:
    """One response, in OpenAI's form."""

    message: dict[str, Any]
    finish_reason: str
    usage: dict[str, int]


class EndpointTrajectory:
    """One trajectory's state behind its base URL (see the module docstring). `begin` admits a request (its
    branch chosen, its ids built, the engine request submitted), `end` turns the engine's answer into the
    response; `expire` stops it at its deadline; `to_sample` when its agent has returned. Thread-safe: requests
    arrive on the server's thread, the deadline and the end on the rollout's."""

    def __init__(
        self, tid: str, engine: EngineLoop, tokenizer: Any, agent: AgentSettings, turns: TurnSettings, *,
        seed: int, sample: int, deadline: float, row_messages: list[dict[str, Any]], served: Served,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.served = served  # the model's name and the call's sampling: what its requests may ask for
        self.tid, self.engine, self.tokenizer, self.agent, self.turns = tid, engine, tokenizer, agent, turns
        self.seed, self.sample, self.deadline, self.clock = seed, sample, deadline, clock
        self.row_messages = row_messages
        self.branches: list[_Branch] = []
        self.current: _Branch | None = None  # the branch of the latest request: the one trained
        self.requests = 0
        self.stop: StopReason | None = None  # a budget or the deadline ended it
        self.closed = False
        self._lock = threading.Lock()
        self._inflight: set[Request] = set()
        self.endpoint_s = 0.0  # seconds its requests spent in the endpoint beyond the engine (the server's thread)

    # --- a request ---------------------------------------------------------------------------------------

    def begin(self, req: ChatRequest) -> Turn:
        """Admit a request: ApiError if the trajectory has ended or a budget refuses it."""
        with self._lock:
            if self.closed or self.stop is not None:
                raise _ended(self.stop)
            if self.clock() >= self.deadline:
                self._stop("timeout")
                raise _ended("timeout")
            branch = self._extend(req) or self._new_branch(req)
            record = branch.record
            budget = turn_budget(self.turns, record)
            if budget <= 0:
                branch.broken = True
                self._stop("length")
                raise ApiError(400, "this trajectory has no tokens left (generation.max_completion_length over its "
                                    "turns, or generation.max_model_len): it has ended (length)",
                               code="context_length_exceeded")
            max_tokens = min(budget, req.max_tokens or budget)
            seed = turn_seed(self.seed, self.sample, self.requests)
            params = (self.turns.params(max_tokens, seed, stop=req.stop) if req.stop
                      else self.turns.params(max_tokens, seed))
            try:
                request = self.engine.submit(record.engine_prompt(), params, min_version=self.turns.min_version)
            except EngineError as err:
                branch.broken = True
                raise ApiError(500, f"the engine cannot serve: {err}", kind="server_error") from None
            self._inflight.add(request)
            branch.busy = True
            self.current = branch
            turn = Turn(branch, request, self.requests, max_tokens == budget, req.stop)
            self.requests += 1
            return turn

    def end(self, turn: Turn) -> Answer:
        """The admitted request's answer, appended to its branch; ApiError if its turn was aborted (the trajectory
        ended meanwhile) or the engine failed."""
        try:
            sampled = SampledTurn.of(turn.request, self.turns.routes)
        except CancelledError:
            with self._lock:
                self._inflight.discard(turn.request)
                turn.branch.busy, turn.branch.broken = False, True
            raise _ended(self.stop or "timeout") from None
        except EngineError as err:
            with self._lock:
                self._inflight.discard(turn.request)
                turn.branch.busy, turn.branch.broken = False, True
            raise ApiError(500, f"the engine failed: {err}", kind="server_error") from None
        with self._lock:
            self._inflight.discard(turn.request)
            branch = turn.branch
            branch.busy = False
            if self.closed:
                branch.broken = True
                raise _ended(self.stop)
            parsed = branch.record.append_turn(sampled)
            counts = branch.record.counts
            counts.tool_calls += len(parsed.calls) or int(parsed.malformed is not None)
            counts.tool_failures += int(parsed.malformed is not None)
            content = _cut_at_stop(parsed.message.get("content") or "", turn.stop)
            calls = template_calls(parsed.calls, turn.index)
            finish = "length" if sampled.finish_reason == "length" else "tool_calls" if calls else "stop"
            if finish == "length" and turn.cut_by_budget:
                self._stop("length")
            reasoning = parsed.message.get("reasoning_content") or parsed.message.get("thinking")
            branch.history.append({"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})})
            branch.last_finish = finish
            prompt_tokens = len(branch.record.ids) - len(sampled.ids)
            return Answer(response_message(content, calls, reasoning if isinstance(reasoning, str) else None),
                          finish, usage(prompt_tokens, len(sampled.ids)))

    def _extend(self, req: ChatRequest) -> _Branch | None:
        """The branch the request extends, its new messages' ids appended; None if it extends none."""
        keys = [message_key(m) for m in req.messages]
        for branch in reversed(self.branches):
            n = len(branch.history)
            if (branch.busy or branch.broken or branch.tools != req.tools or len(keys) <= n
                    or keys[:n] != [message_key(m) for m in branch.history]):
                continue
            tail = req.messages[n:]
            if any(m["role"] == "assistant" for m in tail):
                continue
            limit = self.agent.max_tool_calling_iterations
            if limit is not None and branch.record.counts.turns > limit and branch.last_finish == "tool_calls":
                self._stop("max_turns")
                raise ApiError(400, f"this trajectory has had its {limit} rounds of tool calls "
                                    "(generation.max_tool_calling_iterations): it has ended (max_turns)",
                               code="max_turns")
            try:
                ids = chat.tool_suffix_ids(self.tokenizer, tail)
            except Exception as err:  # noqa: BLE001 - the template's own error about these messages
                raise ApiError(400, f"the chat template cannot render these messages after the assistant's turn: "
                                    f"{type(err).__name__}: {err}", param="messages") from None
            if len(ids) > scaffold_budget(self.agent.max_tool_tokens, self.turns.max_model_len, branch.record):
                branch.broken = True
                self._stop("length")
                raise ApiError(400, f"the new messages take {len(ids)} tokens, more than is left of this "
                                    "trajectory's agent.max_tool_tokens or generation.max_model_len: it has ended "
                                    "(length)", param="messages", code="context_length_exceeded")
            branch.record.append_scaffold(ids, tail)
            branch.history += tail
            return branch
        return None

    def _new_branch(self, req: ChatRequest) -> _Branch:
        if len(self.branches) >= MAX_BRANCHES:  # refused, not ended: the turns in flight and extensions go on
            raise ApiError(400, f"this trajectory has started its {MAX_BRANCHES} branches (requests that extend none "
                                "of its conversations: rewritten histories, sub-agents, parallel or repeated "
                                "requests); send a request that extends one", param="messages",
                           code="too_many_branches")
        record = TrajectoryRecord(self.tokenizer, req.tools)
        try:
            record.start(req.messages)
        except Exception as err:  # noqa: BLE001 - the template's own error about these messages
            raise ApiError(400, f"the chat template cannot render these messages: {type(err).__name__}: {err}",
                           param="messages") from None
        if len(record.ids) >= self.turns.max_model_len:
            raise ApiError(400, f"the messages take {len(record.ids)} tokens; this model's context is "
                                f"{self.turns.max_model_len} tokens (generation.max_model_len)", param="messages",
                           code="context_length_exceeded")
        branch = _Branch(record, list(req.messages), list(req.tools))
        self.branches.append(branch)
        return branch

    # --- the end ------------------------------------------------------------------------------------------

    def expire(self) -> None:
        """The deadline passed: stop (`timeout`), the turns in the engine aborted (their requests answered 408)."""
        with self._lock:
            if self.stop is None:
                self._stop("timeout")

    def _stop(self, reason: StopReason) -> None:
        """Under the lock: ended for `reason`, nothing of it left in the engine."""
        self.stop = reason
        for request in list(self._inflight):
            request.cancel()

    def to_sample(self, done: AgentDone | None) -> Sample:
        """The trajectory's sample once its agent has returned (done; None: the pool never answered): its last
        branch, closed to requests."""
        with self._lock:
            self.closed = True
            for request in list(self._inflight):
                request.cancel()
            stop = self._stop_reason(done)
            branch = self.current
            if branch is None:
                record = TrajectoryRecord(self.tokenizer, [])
                record.start(list(self.row_messages) or list(EMPTY_PROMPT))
            else:
                record = branch.record
            sample = record.to_sample(stop, closed=EnvClosed(None if done is None else done.reward, None))
            t = sample.trajectory
            assert t is not None
            t.env_s = 0.0 if done is None else done.seconds
            t.requests, t.branches, t.endpoint_s = self.requests, len(self.branches), self.endpoint_s
            t.untrained_turns = sum(b.record.counts.turns for b in self.branches if b is not branch)
            return sample

    def _stop_reason(self, done: AgentDone | None) -> StopReason:
        if self.stop is not None:
            return self.stop
        if done is None or done.error is not None:
            return "timeout" if done is not None and done.error.startswith("timed out") else "env_error"
        finish = self.current.last_finish if self.current is not None else "stop"
        return {"tool_calls": "max_turns", "length": "length"}.get(finish or "stop", "stop")


def _ended(stop: StopReason | None) -> ApiError:
    if stop == "timeout":
        return ApiError(408, "this trajectory's deadline passed (agent.trajectory_timeout_s): it has ended",
                        code="trajectory_ended")
    return ApiError(400, f"this trajectory has ended ({stop or 'its agent returned'}): no further requests",
                    code="trajectory_ended")


def _cut_at_stop(content: str, stop: list[str]) -> str:
    """The content up to the first stop string (OpenAI leaves it out; the ids keep it)."""
    cuts = [content.find(s) for s in stop if s in content]
    return content[: min(cuts)] if cuts else content


# --- the server -------------------------------------------------------------------------------------------------


class AgentEndpoint:
    """The HTTP server: chat completions and /v1/models under each registered trajectory's path, on its own
    thread and event loop (aiohttp). host: the address it binds (the node's: the environment workers reach it
    from their nodes); port 0: any free one."""

    def __init__(self, model: str, host: str = "127.0.0.1", port: int = 0, secret: str | None = None) -> None:
        self.model = model
        self.log: Callable[[str], None] = print  # the generator's log
        self._failures = 0  # failed agent runs seen (the first NAMED_AGENT_FAILURES are named)
        self._silent: set[str | None] = set()  # agent functions named for returning without a request
        self._secret = (secret or secrets.token_hex(32)).encode()
        self._trajectories: dict[str, EndpointTrajectory] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        started: Future[str] = Future()
        self._thread = threading.Thread(target=self._serve, args=(host, port, started), name="rayward-endpoint",
                                        daemon=True)
        self._thread.start()
        self.root = started.result(timeout=30)

    def key(self, tid: str) -> str:
        """Trajectory `tid`'s API key."""
        return KEY_PREFIX + hmac.new(self._secret, tid.encode(), hashlib.sha256).hexdigest()

    def base_url(self, tid: str) -> str:
        return f"{self.root}/{tid}/v1"

    def register(self, t: EndpointTrajectory) -> None:
        with self._lock:
            self._trajectories[t.tid] = t

    def unregister(self, tid: str) -> None:
        with self._lock:
            self._trajectories.pop(tid, None)

    def note(self, done: AgentDone | None, requests: int) -> None:
        """Name in the log what an agent run did wrong, as agent_reward and the worker put it: a failure (it raised
        or returned something that is not a reward; not a timeout, which is the trajectory's stop reason), the first
        NAMED_AGENT_FAILURES of them; a run that returned without a request, once per agent function."""
        if done is None:
            return
        who = f"agent_function {done.function}" if done.function else "an agent function's run"
        if done.error is not None and not done.error.startswith("timed out"):
            self._failures += 1
            if self._failures <= NAMED_AGENT_FAILURES:
                sep = " " if done.error.startswith("returned") else ": "
                more = ("; further failures are only counted (env_pool/agent_errors)"
                        if self._failures == NAMED_AGENT_FAILURES else "")
                self.log(f"rayward: agent endpoint: {who}{sep}{done.error}: its trajectory ends env_error (its turns "
                         f"kept){more}")
        elif done.error is None and requests == 0 and done.function not in self._silent:
            self._silent.add(done.function)
            self.log(f"rayward: agent endpoint: {who} returned without a request to its endpoint (its client must "
                     "use the base_url and api_key it is given): its sample is the row's prompt and an empty "
                     "completion, which trains nothing")

    def close(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    # --- aiohttp ------------------------------------------------------------------------------------------

    def _serve(self, host: str, port: int, started: Future[str]) -> None:
        from aiohttp import web

        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/{tid}/v1/chat/completions", self._chat)
        app.router.add_get("/{tid}/v1/models", self._models)
        app.router.add_get("/{tid}/v1/models/{model}", self._models)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        runner = web.AppRunner(app, access_log=None)
        try:
            self._loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, host, port)
            self._loop.run_until_complete(site.start())
            bound = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the port bound for port 0
            started.set_result(f"http://{host}:{bound}")
        except Exception as err:  # noqa: BLE001 - the constructor raises it
            started.set_exception(err)
            return
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(runner.cleanup())

    def _authorized(self, request: Any, tid: str) -> None:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.key(tid).encode()):
            raise ApiError(401, "Incorrect API key provided. This endpoint takes the key given with the trajectory's "
                                "base URL.", code="invalid_api_key")

    async def _chat(self, request: Any) -> Any:
        from aiohttp import web

        t0 = time.perf_counter()
        tid = request.match_info["tid"]
        try:
            self._authorized(request, tid)
            with self._lock:
                t = self._trajectories.get(tid)
            if t is None:
                raise _ended(None)
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ApiError(400, "the request body is not valid JSON") from None
            req = parse_request(body, t.served)
            turn = t.begin(req)
            submitted = time.perf_counter()
            await _finished(turn.request)
            sampled = time.perf_counter()
            answer = t.end(turn)
        except ApiError as err:
            return web.json_response(err.body(), status=err.status)
        except Exception as err:  # noqa: BLE001 - a fault of the endpoint's: still an OpenAI error body
            failed = ApiError(500, f"the endpoint failed: {type(err).__name__}: {err}", kind="server_error")
            return web.json_response(failed.body(), status=failed.status)
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        if not req.stream:
            response = web.json_response(completion(cid, self.model, answer.message, answer.finish_reason,
                                                    answer.usage))
        else:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            try:
                await response.prepare(request)
                await response.write(sse(chunks(cid, self.model, answer.message, answer.finish_reason,
                                                answer.usage if req.include_usage else None)))
                await response.write_eof()
            except ConnectionResetError:  # aiohttp's ClientConnectionResetError: the client left (its agent worker
                return response  # died or it gave up); the turn is kept, the agent's failure is its trajectory's
        # What the endpoint added to the request: reading and rendering it, parsing and writing the answer.
        t.endpoint_s += (submitted - t0) + (time.perf_counter() - sampled)
        return response

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        tid = request.match_info["tid"]
        try:
            self._authorized(request, tid)
            wanted = request.match_info.get("model")
            if wanted is not None and wanted != self.model:
                raise ApiError(404, f"The model `{wanted}` does not exist or you do not have access to it.",
                               param="model", code="model_not_found")
        except ApiError as err:
            return web.json_response(err.body(), status=err.status)
        listed = models(self.model)
        return web.json_response(listed["data"][0] if wanted is not None else listed)

    async def _unknown(self, request: Any) -> Any:
        from aiohttp import web

        err = ApiError(404, f"Invalid URL ({request.method} {request.path}): this endpoint serves "
                            "/<trajectory>/v1/chat/completions and /<trajectory>/v1/models", code="unknown_url")
        return web.json_response(err.body(), status=err.status)


async def _finished(request: Request) -> None:
    """Wait, on the server's loop, for an engine request to finish (its result is read by `end`)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    request.add_done_callback(lambda _: loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None)))
    await done


# --- the driver --------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Run:
    group: int
    trajectory: EndpointTrajectory
    deadline: float
    done: AgentDone | None = None
    finished: bool = False
    expired: bool = False
    sample: Sample | None = field(default=None, repr=False)


class EndpointLoop:
    """One rollout call of an agent-function run: G trajectories per row, each its agent function's run in the
    environment pool against its own base URL; `run` yields the groups as they finish (as AgentLoop's). A consumer
    that stops early leaves nothing running here: the trajectories are closed to requests and their turns
    aborted (their agents fail at their next request)."""

    def __init__(
        self, engine: EngineLoop, envs: Environments, tokenizer: Any, endpoint: AgentEndpoint, agent: AgentSettings,
        turns: TurnSettings, *, temperature: float, top_p: float = 1.0, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """temperature, top_p: the call's sampling (an agent's request may repeat them, not change them)."""
        self.engine, self.envs, self.tokenizer, self.endpoint = engine, envs, tokenizer, endpoint
        self.served = Served(endpoint.model, temperature, top_p)
        self.agent, self.turns, self.clock = agent, turns, clock
        self._events: queue.SimpleQueue[tuple[_Run, Future]] = queue.SimpleQueue()

    def run(self, rows: list[Mapping[str, Any]], seeds: list[int]) -> Iterator[list[tuple[int, list[Sample]]]]:
        if len(seeds) != len(rows):
            raise ValueError(f"{len(seeds)} seeds for {len(rows)} rows")
        groups: dict[int, list[_Run]] = {}
        with self.engine.pinned(self.turns.min_version) if self.turns.pin else nullcontext():
            try:
                for g, (row, seed) in enumerate(zip(rows, seeds, strict=True)):
                    groups[g] = [self._start(g, j, row, seed) for j in range(self.turns.n)]
                while groups:
                    self._wait(groups)
                    done = [g for g, runs in groups.items() if all(r.finished for r in runs)]
                    if done:
                        yield [(g, [r.sample for r in groups.pop(g)]) for g in done]  # type: ignore[misc]
            finally:
                for runs in groups.values():
                    for r in runs:
                        if not r.finished:
                            r.trajectory.to_sample(None)
                        self.endpoint.unregister(r.trajectory.tid)

    def _start(self, g: int, j: int, row: Mapping[str, Any], seed: int) -> _Run:
        now = self.clock()
        deadline = now + self.agent.trajectory_timeout_s
        tid = uuid.uuid4().hex[:16]
        t = EndpointTrajectory(tid, self.engine, self.tokenizer, self.agent, self.turns, seed=seed, sample=j,
                               deadline=deadline, row_messages=_row_messages(row, self.agent.prompt_column),
                               served=self.served, clock=self.clock)
        self.endpoint.register(t)
        r = _Run(g, t, deadline)
        future = self.envs.run_agent(AgentRun(
            dict(row), seed, self.endpoint.base_url(tid), self.endpoint.key(tid), self.endpoint.model,
            self.agent.trajectory_timeout_s))
        future.add_done_callback(lambda f: self._events.put((r, f)))
        return r

    def _wait(self, groups: dict[int, list[_Run]]) -> None:
        live = [r for runs in groups.values() for r in runs if not r.finished]
        soonest = min((r.deadline + (CLOSE_GRACE_S if r.expired else 0.0) for r in live), default=self.clock())
        try:
            r, future = self._events.get(timeout=max(soonest - self.clock(), 0.0))
            while True:
                self._done(r, future)
                r, future = self._events.get_nowait()
        except queue.Empty:
            pass
        now = self.clock()
        for r in live:
            if r.finished:
                continue
            if not r.expired and now >= r.deadline:
                r.expired = True
                r.trajectory.expire()
            elif r.expired and now >= r.deadline + CLOSE_GRACE_S:  # the pool never answered
                self._finish(r, None)

    def _done(self, r: _Run, future: Future) -> None:
        if r.finished:
            return
        try:
            done: AgentDone = future.result()
        except Exception as err:  # noqa: BLE001 - the pool failed: the trajectory keeps what it has
            done = AgentDone(None, error=f"{type(err).__name__}: {err}")
        self._finish(r, done)

    def _finish(self, r: _Run, done: AgentDone | None) -> None:
        self.endpoint.note(done, r.trajectory.requests)
        r.sample = r.trajectory.to_sample(done)
        r.finished = True
        self.endpoint.unregister(r.trajectory.tid)


def _row_messages(row: Mapping[str, Any], column: str) -> list[dict[str, Any]]:
    """The row's prompt as messages (for a trajectory that never made a request): chat messages, a text prompt as
    one user message, or the empty prompt."""
    prompt = row.get(column)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) and "role" in prompt[0]:
        return list(prompt)
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return list(EMPTY_PROMPT)


def node_address() -> str:
    """The address the endpoint binds: this node's (reachable from the environment workers' nodes), or loopback
    outside Ray."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - no Ray: a local run
        pass
    return "127.0.0.1"


__all__ = ["AgentEndpoint", "EndpointLoop", "EndpointTrajectory", "node_address"]
