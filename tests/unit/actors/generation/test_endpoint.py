"""The agent endpoint, in process: a real EngineLoop over the scripted engine (tests/fixtures/engines.py), the real
HTTP server (actors/agents/endpoint.py), the real `openai` SDK in the agent functions, run by the real
AgentWorker on an event loop of its own, and the tool model's real tokenizer (TRL's Qwen2.5 template).

What users bring: orchestrator/builtin/tasks/box_agent.py is written only against the `openai` SDK (streamed, and a sync
client); its trajectories' ids are checked against the environment-class path's (TRL's BoxEnv through AgentLoop)
on the same script, token for token. The agents below that misbehave (rewrite their history, raise, hang, ask
for what is not served) are what agent harnesses do."""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace
from typing import Any

import openai
import pytest

from actors.agents import chat
from actors.agents.agent_worker import agent_kwargs, agent_reward, load_agent
from actors.agents.endpoint import AgentEndpoint, EndpointLoop, EndpointTrajectory, _cut_at_stop
from actors.agents.loop import AgentLoop, AgentSettings, TurnSettings
from actors.agents.openai_api import ApiError, Served, convert_messages, message_key, parse_request
from actors.envs.spec import EnvSpecError
from actors.types import Sample
from orchestrator.builtin.tasks.box_agent import TOOLS
from orchestrator.builtin.tasks.boxes import BoxEnv, boxes_dataset
from tests.fixtures.agents import HERE, LocalAgents
from tests.fixtures.engines import TOKEN_LOGPROB, by_turn, scripted_loop
from tests.fixtures.envs import WAIT_S, LocalEnvironments, tool_schemas

MODEL = "tiny-tools"


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call><|im_end|>"


def solve(turn: int, text: str) -> str:
    """The scripted model solving the box task: open the asked box, submit the code it read, answer."""
    if turn == 0:
        return call("open_box", box=int(re.search(r"Open box (\d)", text).group(1)))
    if turn == 1:
        return call("submit", code=int(re.findall(r"<tool_response>\n(\d+)", text)[-1]))
    return "Done.<|im_end|>"


def params(max_tokens: int, seed: int, stop: list[str] | None = None) -> SimpleNamespace:
    return SimpleNamespace(max_tokens=max_tokens, seed=seed, stop=stop)


def settings(**kw: Any) -> AgentSettings:
    return AgentSettings(**{"tools": {None: []}, "max_tool_tokens": 1000, "trajectory_timeout_s": WAIT_S,
                            "served_model": MODEL, **kw})


def turns(**kw: Any) -> TurnSettings:
    return TurnSettings(**{"n": 2, "max_tokens": 200, "max_model_len": 2048, "params": params, **kw})


class Rig:
    def __init__(self, tokenizer: Any, replies: Any) -> None:
        self.tokenizer = tokenizer
        self.loop, self.engine = scripted_loop(by_turn(tokenizer, replies))
        self.endpoint = AgentEndpoint(MODEL)
        self.agents: list[LocalAgents] = []

    def rollout(self, target: str, rows: list[dict[str, Any]], agent: AgentSettings | None = None,
                **kw: Any) -> list[list[Sample]]:
        agents = LocalAgents(target)
        self.agents.append(agents)
        loop = EndpointLoop(self.loop, agents, self.tokenizer, self.endpoint, agent or settings(), turns(**kw),
                            temperature=1.0)
        out: dict[int, list[Sample]] = {}
        for piece in loop.run(rows, list(range(len(rows)))):
            out.update(piece)
        return [out[g] for g in range(len(rows))]

    def close(self) -> None:
        for a in self.agents:
            a.shutdown()
        self.endpoint.close()
        self.loop.close(WAIT_S)


@pytest.fixture
def tokenizer(tool_tokenizer):
    chat.prepare_tokenizer(tool_tokenizer, {})
    return tool_tokenizer


@pytest.fixture
def rig(tokenizer):
    made: list[Rig] = []

    def make(replies: Any) -> Rig:
        made.append(Rig(tokenizer, replies))
        return made[-1]

    yield make
    for r in made:
        r.close()


def rows(n: int = 2) -> list[dict[str, Any]]:
    return boxes_dataset(n, seed=3)


# --- the box agent against the environment-class path -----------------------------------------------------------


@pytest.mark.parametrize("target", ["orchestrator.builtin.tasks.box_agent:box_agent",
                                    "orchestrator.builtin.tasks.box_agent:box_agent_sync"])
def test_openai_sdk_agent_trains_the_ids_the_environment_class_path_trains(rig, tokenizer, target):
    data = rows()
    endpoint = rig(solve).rollout(target, data)
    envs = LocalEnvironments({None: BoxEnv})
    try:
        engine_loop, _ = scripted_loop(by_turn(tokenizer, solve))
        env_agent = AgentSettings(tools={None: tool_schemas(BoxEnv)}, max_tool_tokens=1000, trajectory_timeout_s=WAIT_S)
        env_loop = AgentLoop(engine_loop, envs, tokenizer, env_agent, turns())
        by_row: dict[int, list[Sample]] = {}
        for piece in env_loop.run(data, [0, 1]):
            by_row.update(piece)
        engine_loop.close(WAIT_S)
    finally:
        envs.shutdown()
    assert TOOLS == tool_schemas(BoxEnv)  # the agent's own schemas: the ones TRL makes of BoxEnv's methods
    for g in range(len(data)):
        for ours, theirs in zip(endpoint[g], by_row[g], strict=True):
            t = ours.trajectory
            assert t.prompt_ids == theirs.trajectory.prompt_ids
            assert ours.completion_ids == theirs.completion_ids
            assert t.turn_ids == theirs.trajectory.turn_ids
            assert [x for x in ours.logprobs if not math.isnan(x)] == [TOKEN_LOGPROB] * sum(t.mask)
            assert (t.stop_reason, t.turns, t.tool_calls, t.requests, t.branches) == ("stop", 3, 2, 3, 1)
            assert t.template_match is True and theirs.trajectory.template_match is True
            assert t.env_reward == theirs.trajectory.env_reward == 1.0
            assert t.endpoint_s > 0
            assert [m["role"] for m in t.messages] == ["assistant", "tool", "assistant", "tool", "assistant"]


def test_turn_seeds_follow_the_row_seed_and_sample(rig):
    r = rig(solve)
    r.rollout("orchestrator.builtin.tasks.box_agent:box_agent", rows(1))
    seeds = sorted(p.seed for _, _, p, _ in r.engine.added)
    assert len(seeds) == 6 and len(set(seeds)) == 6  # 2 samples x 3 turns, each its own seed


# --- branches, failures, budgets ----------------------------------------------------------------------------------


def test_a_rewritten_history_starts_a_branch_and_the_last_branch_is_the_sample(rig):
    (group,) = rig(lambda turn, text: call("open_box", box=1) if turn == 0 and "Box 1 holds" not in text
                   else call("submit", code=123)).rollout(f"{HERE}:summarizing_agent", rows(1))
    for s in group:
        t = s.trajectory
        assert (t.requests, t.branches, t.untrained_turns, t.turns) == (2, 2, 1, 1)
        assert t.prompt == [{"role": "user", "content": "Box 1 holds 123. Submit 123."}]
        assert t.stop_reason == "max_turns"  # the agent stopped while the model still called a tool
        assert math.isnan(t.env_reward)  # it returned None: the reward functions score the conversation


def test_an_agent_that_raises_keeps_its_turns_and_scores_as_failed(rig):
    (group,) = rig(solve).rollout(f"{HERE}:raising_agent", rows(1))
    for s in group:
        assert (s.trajectory.stop_reason, s.trajectory.turns, s.trajectory.env_reward) == ("env_error", 1, None)
        assert s.completion_ids  # the sampled turn is kept


def test_an_agent_that_hangs_ends_at_its_deadline(rig):
    (group,) = rig(solve).rollout(f"{HERE}:hanging_agent", rows(1), agent=settings(trajectory_timeout_s=1.0))
    assert [s.trajectory.stop_reason for s in group] == ["timeout", "timeout"]
    assert all(s.trajectory.turns == 1 and s.trajectory.env_reward is None for s in group)


def test_tool_rounds_past_the_budget_are_refused_and_end_the_trajectory(rig):
    (group,) = rig(lambda turn, text: call("open_box", box=1)).rollout(
        "orchestrator.builtin.tasks.box_agent:box_agent", rows(1), agent=settings(max_tool_calling_iterations=1))
    for s in group:
        t = s.trajectory
        assert (t.stop_reason, t.turns, t.requests) == ("max_turns", 2, 2)


def test_the_model_token_budget_cuts_the_turn_and_ends_the_trajectory(rig):
    (group,) = rig(solve).rollout("orchestrator.builtin.tasks.box_agent:box_agent", rows(1), max_tokens=30)
    for s in group:
        assert s.trajectory.stop_reason == "length"
        assert sum(s.trajectory.mask) == 30


def test_stop_strings_end_the_turn_and_a_non_number_is_an_error(rig):
    (group,) = rig(lambda turn, text: "All Done.<|im_end|>").rollout(f"{HERE}:stopping_agent", rows(1))
    # the scripted engine ignores stop strings (the real engine's are checked in the integration tests); the agent
    # returned text, not a number: its trajectory is an error, its turn kept
    assert all(s.trajectory.stop_reason == "env_error" and s.trajectory.env_reward is None for s in group)
    assert _cut_at_stop("All Done.", ["Done"]) == "All " and _cut_at_stop("abc", ["x"]) == "abc"


# --- the server: refusals -------------------------------------------------------------------------------------------


@pytest.fixture
def served(rig, tokenizer):
    """One registered trajectory and a client with its key."""
    r = rig(lambda turn, text: call("open_box", box=1))
    t = EndpointTrajectory("t1", r.loop, tokenizer, settings(), turns(n=1), seed=0, sample=0, deadline=1e18,
                           row_messages=[], served=Served(MODEL, 1.0))
    r.endpoint.register(t)
    client = openai.OpenAI(base_url=r.endpoint.base_url("t1"), api_key=r.endpoint.key("t1"), max_retries=0)
    return r, t, client


def test_requests_without_the_key_are_refused(served):
    r, _, _ = served
    bad = openai.OpenAI(base_url=r.endpoint.base_url("t1"), api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert err.value.code == "invalid_api_key"
    other = openai.OpenAI(base_url=r.endpoint.base_url("t2"), api_key=r.endpoint.key("t1"), max_retries=0)
    with pytest.raises(openai.AuthenticationError):  # one trajectory's key is not another's
        other.models.list()


def test_models_and_unserved_parameters_answer_as_openai_does(served):
    _, t, client = served
    assert [m.id for m in client.models.list()] == [MODEL]
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=hi)
    assert err.value.code == "model_not_found"
    for kw, param in [({"seed": 1}, "seed"), ({"temperature": 0.2}, "temperature"), ({"n": 2}, "n"),
                      ({"tool_choice": "required", "tools": TOOLS}, "tool_choice"), ({"logprobs": True}, "logprobs"),
                      ({"extra_body": {"guided_json": {}}}, "guided_json")]:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=MODEL, messages=hi, **kw)
        assert err.value.param == param, kw
    assert t.requests == 0  # nothing refused reached the engine
    answer = client.chat.completions.create(model=MODEL, messages=hi, temperature=1.0, tools=TOOLS)
    assert answer.choices[0].finish_reason == "tool_calls"
    assert answer.usage.completion_tokens > 0 and t.requests == 1


def test_a_request_after_the_trajectory_ended_is_refused(served):
    r, t, client = served
    t.to_sample(None)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert err.value.code == "trajectory_ended"
    r.endpoint.unregister("t1")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])


def test_unknown_urls_are_404(served):
    import httpx

    r, _, _ = served
    answer = httpx.get(r.endpoint.root + "/v1/models")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "unknown_url"


# --- the protocol ---------------------------------------------------------------------------------------------------


def test_messages_are_converted_to_the_templates_form():
    msgs = convert_messages([
        {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": "Open box 1."},
        {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
            {"id": "call_0_0", "type": "function", "function": {"name": "open_box", "arguments": "{\"box\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_0_0", "content": "123"},
    ])
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[2] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "open_box", "arguments": {"box": 1}}, "id": "call_0_0"}]}
    assert msgs[3] == {"role": "tool", "content": "123", "tool_call_id": "call_0_0", "name": "open_box"}
    # the echo of the endpoint's own answer (call ids and reasoning aside) is the same turn
    ours = {"role": "assistant", "content": "", "reasoning_content": "hmm",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "open_box", "arguments": {"box": 1}}}]}
    assert message_key(ours) == message_key(msgs[2])


@pytest.mark.parametrize("messages, param", [
    ([], "messages"),
    ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0].type"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function", "function": {
        "name": "f", "arguments": "{not json"}}]}], "messages[0].tool_calls[0].function.arguments"),
    ([{"role": "tool", "tool_call_id": "nope", "content": "x"}], "messages[0].tool_call_id"),
])
def test_bad_messages_name_the_parameter(messages, param):
    with pytest.raises(ApiError) as err:
        parse_request({"model": MODEL, "messages": messages}, Served(MODEL, 1.0))
    assert err.value.param == param and err.value.status == 400


def test_request_settings_are_read():
    req = parse_request({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 9,
                         "max_completion_tokens": 5, "stop": "END", "stream": True,
                         "stream_options": {"include_usage": True}, "tools": [{**TOOLS[0], "strict": True}]},
                        Served(MODEL, 1.0))
    assert (req.max_tokens, req.stop, req.stream, req.include_usage) == (5, ["END"], True, True)
    assert "strict" not in req.tools[0]["function"]


# --- the agent function -----------------------------------------------------------------------------------------------


def test_agent_functions_are_checked_and_their_returns_read():
    with pytest.raises(EnvSpecError, match="takes 1 positional parameter"):
        load_agent(f"{HERE}:no_client_agent")
    with pytest.raises(EnvSpecError, match="agent_function"):
        load_agent(f"{HERE}:missing")
    assert agent_kwargs(load_agent("orchestrator.builtin.tasks.box_agent:box_agent")) == ("model",)
    assert agent_reward(True) == (1.0, None) and math.isnan(agent_reward(None)[0])
    assert agent_reward("1.0")[0] is None and "not a finite number" in agent_reward(math.inf)[1]


# --- issue 52: agent functions that misbehave ------------------------------------------------------------------------


def test_an_agent_flood_is_refused_past_the_branch_budget_and_the_trajectory_ends(rig):
    """Every request that extends no branch starts one, with a model-token budget of its own: an agent that floods
    its endpoint would sample without bound. A request that would start one past MAX_BRANCHES is refused (an OpenAI
    error naming the budget); the turns in flight are answered and the last branch is the sample."""
    from actors.agents.endpoint import MAX_BRANCHES
    from tests.fixtures import agents

    agents.FLOOD_REFUSALS.clear()
    assert agents.FLOOD_WAVES * agents.FLOOD_WIDTH > 2 * MAX_BRANCHES  # the flood is far past the budget
    (group,) = rig(lambda turn, text: "No.<|im_end|>").rollout(f"{HERE}:flooding_agent", rows(1))
    for s in group:
        t = s.trajectory
        assert t.branches == MAX_BRANCHES and t.requests == MAX_BRANCHES and t.stop_reason == "stop"
        assert s.completion_ids  # the last branch is the sample
    assert agents.FLOOD_REFUSALS == ["too_many_branches"] * len(group)


def test_an_agent_that_returns_text_is_named_in_the_generators_log_and_its_turn_kept(rig):
    """The trajectory ends env_error and is counted (env_pool/agent_errors); its turn is kept; the first few such
    failures are named in the generator's log (the driver's terminal), with the agent function."""
    r = rig(lambda turn, text: "Box 1.<|im_end|>")
    logged: list[str] = []
    r.endpoint.log = logged.append
    (group,) = r.rollout(f"{HERE}:string_agent", rows(1))
    assert all(s.trajectory.stop_reason == "env_error" and s.completion_ids for s in group)
    assert logged[0] == (f"rayward: agent endpoint: agent_function {HERE}:string_agent returned 'Box 1.' (str), not a "
                         "finite number or None: its trajectory ends env_error (its turns kept)")
    assert len(logged) == len(group)


def test_an_agent_that_never_calls_its_endpoint_is_named_and_its_sample_is_the_prompt(rig):
    """Its sample is the row's prompt and an empty completion (it trains nothing; its reward still counts in its
    group), and the generator's log says so once per agent function and generator, naming it."""
    r = rig(solve)
    logged: list[str] = []
    r.endpoint.log = logged.append
    for _ in range(2):
        (group,) = r.rollout(f"{HERE}:silent_agent", rows(1))
    assert all(s.trajectory.requests == 0 and not s.completion_ids and s.trajectory.env_reward == 1.0 for s in group)
    assert logged == [f"rayward: agent endpoint: agent_function {HERE}:silent_agent returned without a request to "
                      "its endpoint (its client must use the base_url and api_key it is given): its sample is the "
                      "row's prompt and an empty completion, which trains nothing"]


def test_a_client_that_leaves_before_its_streamed_answer_costs_no_traceback(served, caplog):
    """An agent worker killed mid-request (bench/chaos.py found it): its connection closes before the streamed answer
    is written. The turn is kept and the server logs no handler error (aiohttp's `Error handling request` with a
    traceback per dropped connection)."""
    import json
    import logging
    import socket
    import time
    from urllib.parse import urlsplit

    r, t, _ = served
    url = urlsplit(r.endpoint.base_url("t1"))
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    head = (f"POST {url.path}/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {r.endpoint.key('t1')}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    caplog.set_level(logging.ERROR, logger="aiohttp.server")
    with socket.create_connection((url.hostname, url.port)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # close = RST
        s.sendall(head + body)
    deadline = time.monotonic() + 10
    while t.requests == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the handler's write, after the engine answered
    assert t.requests == 1
    assert not [rec for rec in caplog.records if rec.name == "aiohttp.server"], caplog.text
