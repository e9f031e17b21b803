"""`agent:` multi-turn rollouts with tools, environments or an agent function."""

from __future__ import annotations

from pydantic import Field, model_validator

from orchestrator.config.base import _Section


class AgentConfig(_Section):
    """rayward's own settings for multi-turn rollouts with tools (`tools`, `environment_factory`) or an agent function
    (`agent_function`)."""

    tool_timeout_s: float = Field(60.0, gt=0)
    """Each tool call's time bound, in the environment worker (the calls of one turn run at once, each with its
    own); also bounds an environment's construction + reset(). A call past it returns an error message the model
    reads, and is counted; the trajectory goes on."""
    trajectory_timeout_s: float = Field(600.0, gt=0)
    """Each trajectory's deadline, from its group's environment sessions opening (an agent function's run
    starting) to its last turn: past it the trajectory ends with stop reason `timeout` (and its reward is scored as
    usual; an agent function is cancelled, its endpoint refuses its requests)."""
    max_tool_tokens: int = Field(1024, ge=1)
    """Tool-result tokens per trajectory (the model-token budget is generation.max_completion_length): a result
    that would pass it is cut to fit, and counted; the context (generation.max_model_len) bounds both. An agent
    function's: the tokens of the messages it sends after each response (tool results, user turns); a request that
    would pass it is refused (an OpenAI error: the trajectory ends `length`)."""

    @model_validator(mode="after")
    def _deadlines(self) -> AgentConfig:
        if self.trajectory_timeout_s <= self.tool_timeout_s:
            raise ValueError(f"trajectory_timeout_s ({self.trajectory_timeout_s:g}) must be above tool_timeout_s "
                             f"({self.tool_timeout_s:g}): a trajectory holds at least one tool call")
        return self
