"""Tools and environments before anything starts: the checks, and what the build hands the pool and the generators.

`prepare_agent` runs in `orchestrator.run.build.prepare` (before Ray), after the tokenizer and the dataset have
loaded, and fails with one line naming the field or function at fault:

* a tool or environment method without the type hints or docstring its schema needs (transformers'
  get_json_schema, what TRL uses), or two tools with one name;
* an environment_factory that cannot be imported or is not callable; a class without `reset`; any other factory
  (a function, a functools.partial) that raises when called once, or returns something without `reset`;
* a chat template TRL's trainer cannot run a tool loop with: one that cannot render a tool call (TRL's
  supports_tool_calling, with what it drops named), or one without a response template to read the model's
  calls with (none in the tokenizer's files, none in TRL's add_response_schema for it). The tokenizer is
  prepared in place as TRL prepares its own (chat.prepare_tokenizer: the response template, TRL's training
  template where the model's is not prefix-preserving);
* environment_factory as a mapping with rows that lack an `environment` column, or name an unknown key;
* a reward named without a function or model that is no environment class's get_reward(); no reward at all.

Its AgentSetup carries the tool schemas per environment (rendered into each row's prompt by the generators: the
environment's methods are read from the class, bound to a placeholder for their signatures; a class is not
instantiated here, a factory that is not a class is called once to learn its class, as TRL probes it:
actors/envs/spec.py), the workers' EnvSpec, the environment rewards, and whether a
reward function wants the environments' state at close.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.agents.agent_worker import load_agent
from actors.agents.chat import (
    ChatTemplateError,
    extension_note,
    prepare_tokenizer,
    template_family,
    tool_images_problem,
    tool_template_problem,
)
from actors.envs.spec import EnvSpec, EnvSpecError, environment_classes, reward_classes, tool_schemas
from actors.rewards.worker import RewardSpec
from actors.types import ENVIRONMENT_COLUMN
from orchestrator.config import ConfigError, RewardConfig, RunConfig
from orchestrator.data.sources import is_conversational


@dataclass(frozen=True)
class AgentSetup:
    """What a run with tools or environments is built with (see the module docstring)."""

    spec: EnvSpec  # the environment workers' tools, classes and time bounds
    schemas: dict[str | None, list[dict[str, Any]]]  # environment name (None: the only one, or tools only) ->
    # the tool schemas a row of it sees, in prompt order (apply_chat_template's `tools=`)
    env_classes: dict[str | None, str]  # environment_factory name -> its class's name (an environment reward's name)
    env_rewards: list[RewardConfig]  # get_reward()s that `rewards` does not name: weight 1, after the named ones
    env_reward_specs: list[RewardSpec]  # the same, as reward-worker specs
    keep_state: bool  # a reward function declares `environments`: sessions close with keep_state
    template_note: str | None = None  # the chat template is not prefix-preserving: what that means (start-up note)
    images_note: str | None = None  # a vision-language model whose template drops images in tool messages: a tool
    # that returns one is answered with an error (start-up note)

    @property
    def routed(self) -> bool:
        return self.spec.routed


def env_spec(cfg: RunConfig) -> EnvSpec:
    """The config's tools and environment_factory as the workers' spec. get_reward()'s bound is its reward's
    `timeout_s` (the longest, with several environment rewards; RewardConfig's default where none is named)."""
    factory = cfg.environment_factory
    envs = {} if factory is None else dict(factory) if isinstance(factory, dict) else {None: factory}
    named = [r.timeout_s for r in cfg.rewards if not r.has_source]
    default_timeout = RewardConfig.model_fields["timeout_s"].default
    return EnvSpec(tools=tuple(cfg.tools), environments=envs, tool_timeout_s=cfg.agent.tool_timeout_s,
                   reward_timeout_s=max(named, default=default_timeout))


def env_reward_spec(r: RewardConfig) -> RewardSpec:
    """A reward without function or model: the get_reward() of the environment class of its name. A missing value
    (get_reward raised, the session was lost) always scores its fallback: one environment's failure must not end
    the run (on_error applies to reward functions)."""
    return RewardSpec(name=r.name, timeout_s=r.timeout_s, on_error="fallback", fallback=r.fallback, env_reward=True)


def prepare_agent(
    cfg: RunConfig,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    specs: list[RewardSpec],
    eval_rows: list[dict[str, Any]] | None = None,
    image_token_id: int | None = None,
) -> AgentSetup | None:
    """The checks above, for a run with `tools` or `environment_factory` (None for a one-turn run). specs: the
    run's reward specs as `reward_specs` built them (which functions declare `environments`); image_token_id: a
    vision-language model's image placeholder (tools may return images: TRL's multimodal tool responses)."""
    if cfg.agent_function is not None:
        return _prepare_agent_function(cfg, tokenizer, specs)
    if not cfg.tools and cfg.environment_factory is None:
        return None
    spec = env_spec(cfg)
    schemas, rewarding, env_classes = _read_environments(spec)
    implicit = _env_rewards(cfg, rewarding)
    check_tool_template(cfg, tokenizer)
    check_environment_rows(cfg, rows, "data")
    check_chat_prompts(rows, cfg.data.prompt_column, "data")
    if eval_rows is not None and cfg.eval is not None:
        check_environment_rows(cfg, eval_rows, "eval.data")
        check_chat_prompts(eval_rows, cfg.eval.data.prompt_column, "eval.data")
    return AgentSetup(
        spec=spec, schemas=schemas, env_classes=env_classes, env_rewards=implicit,
        env_reward_specs=[env_reward_spec(r) for r in implicit], keep_state=any(s.takes_environments for s in specs),
        template_note=extension_note(tokenizer),
        images_note=None if image_token_id is None else _images_note(tokenizer, image_token_id),
    )


def _prepare_agent_function(cfg: RunConfig, tokenizer: Any, specs: list[RewardSpec]) -> AgentSetup:
    """agent_function: importable, callable with (client, row); the chat template can render and read tool calls
    (the endpoint parses the model's calls); its returned reward named after it (`rewards` may weight it)."""
    target = cfg.agent_function
    assert target is not None
    try:
        fn = load_agent(target, "agent_function")
    except EnvSpecError as err:
        raise ConfigError(str(err)) from None
    name = getattr(fn, "__name__", type(fn).__name__)
    takes = [s.name for s in specs if s.takes_environments]
    if takes:
        raise ConfigError(f"rewards {takes} declare `environments`, but an agent function has no environment "
                          "instances to pass (its reward functions see the conversation)")
    implicit = _env_rewards(cfg, {name: [None]})
    check_tool_template(cfg, tokenizer)
    spec = EnvSpec(agent_function=target, tool_timeout_s=cfg.agent.tool_timeout_s,
                   reward_timeout_s=cfg.agent.trajectory_timeout_s)
    return AgentSetup(
        spec=spec, schemas={None: []}, env_classes={None: name}, env_rewards=implicit,
        env_reward_specs=[env_reward_spec(r) for r in implicit], keep_state=False,
        template_note=extension_note(tokenizer),
    )


def _images_note(tokenizer: Any, image_token_id: int) -> str | None:
    problem = tool_images_problem(tokenizer, image_token_id)
    if problem is None:
        return None
    family = template_family(tokenizer)
    which = f"TRL's {family} chat template" if family else "its chat template"
    return (f"the model's {which}: {problem.removeprefix('its chat template ')}; a tool that returns an image "
            "(TRL's multimodal tool responses) is answered with an error the model reads, counted in "
            "tools/failure_frequency (docs/vision.md)")


def _read_environments(
    spec: EnvSpec,
) -> tuple[dict[str | None, list[dict[str, Any]]], dict[str, list[str | None]], dict[str | None, str]]:
    """The tool schemas, the classes with a get_reward() and each environment's class name, each factory called at
    most once (actors/envs/spec.py environment_class); ConfigError naming the field or function at fault."""
    try:
        classes = environment_classes(spec)
        return tool_schemas(spec, classes), reward_classes(spec, classes), {n: c.__name__ for n, c in classes.items()}
    except EnvSpecError as err:
        raise ConfigError(str(err)) from None


def _env_rewards(cfg: RunConfig, rewarding: dict[str, list[str | None]]) -> list[RewardConfig]:
    """The environment rewards `rewards` does not name (weight 1, TRL's), after checking the ones it names."""
    lists = [("rewards", cfg.rewards)] + ([("eval.rewards", cfg.eval.rewards)] if cfg.eval and cfg.eval.rewards else [])
    for field, rewards in lists:
        for r in rewards:
            sourceless = not r.has_source
            if sourceless and r.name not in rewarding:
                raise ConfigError(
                    f"{field}[{r.name}]: neither function nor model names an environment's get_reward(), but no "
                    f"environment_factory class named {r.name!r} has one (classes with get_reward: {sorted(rewarding)})"
                )
            if not sourceless and r.name in rewarding:
                raise ConfigError(
                    f"{field}[{r.name}]: {r.name} is also the name of environment {r.name}'s get_reward() reward; "
                    f"rename this reward, or drop its function/model to weight or gate the environment's"
                )
    named = {r.name for r in cfg.rewards}
    implicit = [RewardConfig(name=n) for n in rewarding if n not in named]
    if not cfg.rewards and not implicit:
        raise ConfigError("rewards: no reward source: give at least one reward, or an environment_factory class "
                          "with a get_reward() method")
    return implicit


# --- the chat template -------------------------------------------------------------------------------------


def check_tool_template(cfg: RunConfig, tokenizer: Any) -> None:
    """The driver's tokenizer prepared for a tool run as TRL's trainer prepares its own (chat.prepare_tokenizer,
    in place: the generators prepare theirs alike); a template TRL cannot run a tool loop with is refused, naming
    the model, the template (which of TRL's, if one) and what is missing."""
    try:
        prepare_tokenizer(tokenizer, cfg.generation.chat_template_kwargs)
    except ChatTemplateError as err:
        family = template_family(tokenizer)
        which = f"TRL's {family} chat template" if family else "a chat template TRL does not ship"
        raise ConfigError(f"model.name_or_path {cfg.model.name_or_path!r} ({which}): its chat template {err}") from None


# --- the dataset -------------------------------------------------------------------------------------------


def check_chat_prompts(rows: list[dict[str, Any]], column: str, field: str) -> None:
    """With tools, a prompt is chat messages (the tool schemas and reset()'s text are rendered into it), or absent
    (an environment supplies it): text would fail at the first rollout, after Ray and the engines started."""
    for i, row in enumerate(rows):
        prompt = row.get(column)
        if prompt is not None and not is_conversational(prompt):
            raise ConfigError(
                f"{field}.prompt_column {column!r}: with tools or environment_factory the prompt is chat messages (a "
                f"list of {{role, content}}), but row {i} holds {type(prompt).__name__}; convert the column, or drop "
                "data.path to let a single environment own the data (its reset() returns each prompt)")


def check_environment_rows(cfg: RunConfig, rows: list[dict[str, Any]], field: str) -> None:
    """With environment_factory as a mapping, every row's `environment` names one of its keys (TRL's routing)."""
    factory = cfg.environment_factory
    if not isinstance(factory, dict):
        return
    keys = sorted(factory)
    for i, row in enumerate(rows):
        if ENVIRONMENT_COLUMN not in row:
            raise ConfigError(
                f"{field}: environment_factory is a mapping, so every row needs an `{ENVIRONMENT_COLUMN}` column "
                f"naming one of {keys}; row {i} has none (columns: {sorted(row)})"
            )
        if row[ENVIRONMENT_COLUMN] not in factory:
            raise ConfigError(
                f"{field} row {i}: {ENVIRONMENT_COLUMN} {row[ENVIRONMENT_COLUMN]!r} is not a key of "
                f"environment_factory (have {keys})"
            )


__all__ = [
    "AgentSetup", "ENVIRONMENT_COLUMN", "check_chat_prompts", "check_environment_rows", "check_tool_template",
    "env_reward_spec", "env_spec", "prepare_agent", "tool_template_problem",
]
