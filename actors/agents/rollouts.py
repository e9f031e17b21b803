"""A generator's agentic rollouts, a part chosen once when the generator starts, from its `environments` and
`agent`.

    NoRollouts         neither given: the generator samples one turn per prompt, `rollout` is refused
    ToolRollouts       TRL's tools and environment classes, each trajectory driven by the agent loop
                       (actors/agents/loop.py AgentLoop)
    EndpointRollouts   agent functions (agent.served_model set): each trajectory an agent that calls the
                       generator's OpenAI-compatible endpoint (actors/agents/endpoint.py: the AgentEndpoint,
                       started here, and the EndpointLoop)

The interface of the three: `attach(loop, tokenizer, vision)` once the engine is up, `driver(turns, sampling)`
(the driver of one rollout call: its `run(rows, seeds)` yields the groups as they finish) and `endpoint` (the
agent endpoint; None: there is none).
"""

from __future__ import annotations

from typing import Any

from actors.agents import chat
from actors.agents.endpoint import AgentEndpoint, EndpointLoop, node_address
from actors.agents.loop import AgentLoop, AgentSettings, TurnSettings
from actors.envs.client import Environments
from actors.generation.engine import EngineLoop
from actors.types import Sampling
from actors.vision import Images


class NoRollouts:
    """A generator built without `environments` and `agent`."""

    endpoint: AgentEndpoint | None = None

    def attach(self, loop: EngineLoop, tokenizer: Any, vision: Images | None) -> None:
        """Nothing to set up."""

    def driver(self, turns: TurnSettings, sampling: Sampling) -> AgentLoop | EndpointLoop:
        raise ValueError("Generator.rollout: this generator was built without `environments` and `agent`")


class _Agentic:
    """What both agentic parts hold: the environment pool, the run's agent settings, the engine's loop and
    tokenizer."""

    endpoint: AgentEndpoint | None = None

    def __init__(self, environments: Environments, agent: AgentSettings) -> None:
        self.environments, self.agent = environments, agent
        self.loop: EngineLoop | None = None
        self.tokenizer: Any = None

    def attach(self, loop: EngineLoop, tokenizer: Any, vision: Images | None) -> None:
        """The engine's loop and tokenizer, the tokenizer set up as TRL's trainer sets up its own for a tool
        run (the driver checked it)."""
        self.loop, self.tokenizer = loop, tokenizer
        chat.prepare_tokenizer(tokenizer, dict(self.agent.chat_template_kwargs))


class ToolRollouts(_Agentic):
    """Tools and environment classes (TRL's `tools`, `environment_factory`): the agent loop drives each
    trajectory."""

    vision: Images | None = None  # a vision-language model's processor (the prompts part's)
    # Why a tool's image cannot reach the model (actors/agents/loop.py: the call is answered with an error
    # instead); None: it can.
    tool_images_problem: str | None = None

    def attach(self, loop: EngineLoop, tokenizer: Any, vision: Images | None) -> None:
        super().attach(loop, tokenizer, vision)
        self.vision = vision
        if vision is not None:
            self.tool_images_problem = chat.tool_images_problem(tokenizer, vision.image_token_id)

    def driver(self, turns: TurnSettings, sampling: Sampling) -> AgentLoop:
        assert self.loop is not None, "attach first"
        return AgentLoop(self.loop, self.environments, self.tokenizer, self.agent, turns, vision=self.vision,
                         tool_images_problem=self.tool_images_problem)


class EndpointRollouts(_Agentic):
    """Agent functions (`agent_function`): each trajectory's agent calls the endpoint at its own base URL."""

    def attach(self, loop: EngineLoop, tokenizer: Any, vision: Images | None) -> None:
        super().attach(loop, tokenizer, vision)
        # The OpenAI-compatible endpoint its agents call, one base URL per trajectory.
        self.endpoint = AgentEndpoint(self.agent.served_model, host=node_address())

    def driver(self, turns: TurnSettings, sampling: Sampling) -> EndpointLoop:
        assert self.loop is not None and self.endpoint is not None, "attach first"
        return EndpointLoop(self.loop, self.environments, self.tokenizer, self.endpoint, self.agent, turns,
                            temperature=sampling.temperature, top_p=sampling.top_p)


def rollouts_part(
    environments: Environments | None, agent: AgentSettings | None
) -> NoRollouts | ToolRollouts | EndpointRollouts:
    """The generator's rollouts part. environments, agent: an agentic run's environment pool
    (actors.envs.client.PoolEnvironments over the pool actor's handle) and its settings; both or neither."""
    if (environments is None) != (agent is None):
        raise ValueError("Generator: agentic rollouts need both `environments` and `agent` (or neither)")
    if environments is None or agent is None:
        return NoRollouts()
    if agent.served_model is not None:
        return EndpointRollouts(environments, agent)
    return ToolRollouts(environments, agent)


__all__ = ["EndpointRollouts", "NoRollouts", "ToolRollouts", "rollouts_part"]
