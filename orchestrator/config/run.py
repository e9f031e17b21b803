"""The whole tree (`RunConfig`): every section, and the checks that span sections."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from orchestrator.config.agent import AgentConfig
from orchestrator.config.base import _Section
from orchestrator.config.cluster import ClusterConfig
from orchestrator.config.data import DataConfig
from orchestrator.config.distill import DistillationConfig
from orchestrator.config.eval import EvalConfig
from orchestrator.config.generation import GenerationConfig
from orchestrator.config.grpo import GRPOSection
from orchestrator.config.logging import LoggingConfig
from orchestrator.config.loop import LoopConfig
from orchestrator.config.model import ModelConfig
from orchestrator.config.rewards import RewardConfig, check_rewards
from orchestrator.config.weight_sync import WeightSyncConfig

# Run names become Ray namespaces, actor names and directory names: lower-case DNS-label characters only.
RUN_NAME_PATTERN = r"^[a-z0-9][a-z0-9\-]{0,62}$"


class RunConfig(_Section):
    name: str | None = Field(None, pattern=RUN_NAME_PATTERN)
    """Run name (actors, namespace `rayward-<name>`, log directory). Default: generated and printed."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    model: ModelConfig = ModelConfig()
    """The policy model."""
    data: DataConfig = DataConfig()
    """The prompt dataset."""
    generation: GenerationConfig = GenerationConfig()
    """Sampling in the vLLM generators."""
    grpo: GRPOSection = GRPOSection()
    """The GRPO update in the learner."""
    rewards: list[RewardConfig] = []
    """Reward functions, combined by weights, gates and schedules. At least one, unless an environment_factory
    class has a get_reward() (TRL's rule)."""
    tools: list[str] = []
    """Tools the model may call (TRL's `tools=`): `module:function` (or `path/to/file.py:function`), sync or
    `async def`, each with type hints and a Google-style docstring, the schema the model sees. They run in the
    environment workers, never in the driver or a generator (docs/agents.md)."""
    environment_factory: str | dict[str, str] | None = None
    """TRL's `environment_factory=`: `module:name` of a class, or of any callable taking no argument that returns
    an environment (a function, a functools.partial; called once before Ray starts to learn its class, as TRL
    probes it). An instance serves one trajectory at a time in an environment worker and is reused, reset, by the
    worker's later trajectories (TRL's contract: `__init__` runs once per instance); `reset(**row)` gets the
    dataset row's columns and may return text appended to the last user message; the public methods of its class
    are tools; an optional `get_reward()` is a reward named after the class. Or a mapping name -> `module:name`: the
    dataset's `environment` column picks each row's environment and tools."""
    agent_function: str | None = None
    """An agent written against the OpenAI API, trained unmodified: `module:function` (or `path/to/file.py:function`),
    sync or `async def`, called once per trajectory with an OpenAI client (the `openai` SDK's, `AsyncOpenAI` for an
    async function) pointed at the trajectory's own endpoint on the generator, and the dataset row; keyword
    arguments it declares among `model`, `base_url`, `api_key`, `seed` are passed too. It returns a reward (a
    number: a reward named after the function, weight 1 unless `rewards` names it) or None (the reward functions
    score the conversation). It runs in the environment workers; not with `tools` or `environment_factory`
    (the agent runs its own tools). docs/agents.md "Agents written against the OpenAI API"."""
    agent: AgentConfig = AgentConfig()
    """Multi-turn rollouts with tools or an agent function: time bounds and the tool-result token budget."""
    cluster: ClusterConfig = ClusterConfig()
    """Ray cluster and actor placement."""
    loop: LoopConfig = LoopConfig()
    """Synchronous or pipelined training loop."""
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    """How new weights travel from the learner into the generators after each optimizer step."""
    logging: LoggingConfig = LoggingConfig()
    """Metrics and logs."""
    eval: EvalConfig | None = None
    """Held-out evaluation during training (and for `rayward eval`); null: none."""
    distillation: DistillationConfig | None = None
    """On-policy distillation from a teacher model beside the rewards; null: none."""

    @model_validator(mode="after")
    def _rewards_consistent(self) -> RunConfig:
        self._check_agentic()
        check_rewards(self.rewards)
        if self.generation.generation_batch_size % self.grpo.per_device_train_batch_size:
            raise ValueError(
                f"generation.generation_batch_size ({self.generation.generation_batch_size}) must be a multiple of "
                f"grpo.per_device_train_batch_size ({self.grpo.per_device_train_batch_size})"
            )
        micro = self.generation.generation_batch_size // self.grpo.per_device_train_batch_size
        if micro < self.cluster.num_learners:
            raise ValueError(
                f"cluster.num_learners ({self.cluster.num_learners}) is more than the micro-batches per step "
                f"(generation_batch_size / grpo.per_device_train_batch_size = {micro}): some learner ranks "
                "would have nothing to train on"
            )
        self._check_eval()
        self._check_distillation()
        if self.cluster.generator_autoscale is not None and self.loop.mode == "sync":
            raise ValueError(
                "cluster.generator_autoscale sizes the fleet from the learner's wait for data while generation "
                "overlaps training: it needs loop.mode pipelined or async (the sync loop's learner waits for every "
                "batch by design)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _async_defaults(cls, data: Any) -> Any:
        """loop.mode async: a weight load lands while sequences run, so one sample's tokens come from several
        policy versions, and the importance-sampling correction is per token unless the config names a mode: TRL's
        sequence-level default would weigh (or mask) a whole sequence by the product of ratios that span versions;
        PipelineRL and prime-rl correct per token, as token_truncate does."""
        loop, grpo = (data.get("loop"), data.get("grpo")) if isinstance(data, dict) else (None, None)
        if isinstance(loop, dict) and loop.get("mode") == "async" and (grpo is None or isinstance(grpo, dict)):
            if "vllm_importance_sampling_mode" not in (grpo or {}):
                data = {**data, "grpo": {**(grpo or {}), "vllm_importance_sampling_mode": "token_truncate"}}
        return data

    def _check_distillation(self) -> None:
        d = self.distillation
        if d is None:
            return
        length = d.engines.max_model_len
        if length is not None and length <= self.generation.max_model_len:
            raise ValueError(
                f"distillation.engines.max_model_len ({length}) must exceed generation.max_model_len "
                f"({self.generation.max_model_len}): the teacher reads whole samples and generates one token")

    def _check_agentic(self) -> None:
        """`tools` and `environment_factory` name `module:name` targets; a reward without a source names an
        environment; something gives a reward. Whether the targets import and have tools is checked before Ray
        starts (orchestrator/run/agents.py)."""
        factory = self.environment_factory
        targets = [(f"tools[{i}]", t) for i, t in enumerate(self.tools)]
        if self.agent_function is not None:
            if self.tools or factory is not None:
                raise ValueError("agent_function: an agent function runs its own tools (its requests carry their "
                                 "schemas): give `tools`/`environment_factory` or `agent_function`, not both")
            targets.append(("agent_function", self.agent_function))
        if isinstance(factory, dict):
            if not factory:
                raise ValueError("environment_factory: an empty mapping; give `module:Class`, "
                                 "or name -> `module:Class`")
            targets += [(f"environment_factory[{k}]", v) for k, v in factory.items()]
        elif factory is not None:
            targets.append(("environment_factory", factory))
        for where, target in targets:
            module, _, name = target.rpartition(":")
            if not module or not name:
                raise ValueError(f"{where}: {target!r} is not of the form module:name")
        sourceless = [r.name for r in [*self.rewards, *(self.eval.rewards or [] if self.eval else [])]
                      if not r.has_source]
        if sourceless and factory is None and self.agent_function is None:
            raise ValueError(
                f"rewards {sourceless}: no `function`, `model` or `judge`, which names an environment's get_reward() "
                "(or an agent function's returned reward), but neither environment_factory nor agent_function is set"
            )
        if not self.rewards and factory is None and self.agent_function is None:
            raise ValueError("rewards: give at least one reward (or an environment_factory whose class has a "
                             "get_reward())")

    def _check_eval(self) -> None:
        e, best = self.eval, self.grpo.save_best
        if e is not None:
            length = e.max_completion_length or self.generation.max_completion_length
            if length >= self.generation.max_model_len:
                raise ValueError(
                    f"eval.max_completion_length ({length}) must be below generation.max_model_len "
                    f"({self.generation.max_model_len}), which also holds the prompt"
                )
        if best is None:
            return
        if e is None:
            raise ValueError(f"grpo.save_best {best!r} needs an eval block (`eval: {{data: ...}}`) to measure it")
        produced = e.metric_names([r.name for r in self.rewards])
        if best not in produced:
            raise ValueError(f"grpo.save_best {best!r}: eval produces no such metric (it produces {produced})")
