"""The agent endpoint over TRL's chat templates: for each family TRL runs a tool loop with (test_chat_templates.py's
HANDLED), an agent written against the `openai` SDK (tests/fixtures/agents.py weather_agent) asks, gets the model's
call back in OpenAI's `tool_calls` format (parsed as the family writes it), sends the tool's result and reads the
answer; the trajectory trains exactly the ids the scripted model wrote plus the family's rendering of the result,
and the template check agrees. The model's turns are the family's own rendering of the messages (model_turn), on
the scripted engine."""

from __future__ import annotations

from typing import Any

import pytest

from actors.agents import chat
from actors.agents.endpoint import AgentEndpoint, EndpointLoop
from actors.agents.loop import AgentSettings, TurnSettings
from tests.fixtures.agents import HERE, LocalAgents, weather_tools
from tests.fixtures.chat_templates import template_tokenizer
from tests.fixtures.engines import scripted_loop
from tests.unit.actors.generation.test_chat_templates import (
    ANSWER,
    CALL,
    HANDLED,
    PROMPT,
    RESULTS,
    model_turn,
)
from tests.unit.actors.generation.test_endpoint import params

WAIT_S = 30


@pytest.mark.parametrize("name", HANDLED)
def test_an_openai_agent_runs_a_tool_turn_on_every_family_trl_runs(tool_tokenizer, name):
    tok = template_tokenizer(tool_tokenizer, name)
    chat.prepare_tokenizer(tok, {})
    tools = weather_tools()
    first = chat.render_prompt(tok, PROMPT, tools)
    call_ids = model_turn(tok, PROMPT, CALL, tools)
    answer_ids = model_turn(tok, [*PROMPT, CALL, *RESULTS], ANSWER, tools)

    def reply(prompt: list[int], _: Any) -> list[int]:
        return call_ids if prompt == first else answer_ids

    loop, _ = scripted_loop(reply)
    endpoint, agents = AgentEndpoint(f"tiny/{name}"), LocalAgents(f"{HERE}:weather_agent")
    try:
        agent = AgentSettings(tools={None: []}, max_tool_tokens=1000, trajectory_timeout_s=WAIT_S,
                              served_model=f"tiny/{name}")
        turns = TurnSettings(n=1, max_tokens=500, max_model_len=4096, params=params)
        (((_, (sample,)),),) = list(EndpointLoop(loop, agents, tok, endpoint, agent, turns, temperature=1.0).run(
            [{"prompt": PROMPT}], [0]))
    finally:
        agents.shutdown()
        endpoint.close()
        loop.close(WAIT_S)
    t = sample.trajectory
    assert (t.stop_reason, t.env_reward, t.requests, t.branches) == ("stop", 1.0, 2, 1), t
    suffix = chat.tool_suffix_ids(tok, [{**RESULTS[0], "tool_call_id": "call_0_0"}])
    assert t.prompt_ids == first and sample.completion_ids == call_ids + suffix + answer_ids
    assert t.template_match, tok.decode(t.prompt_ids + sample.completion_ids)
