"""The one typed config tree of a rayward run, one module per section.

Every section rejects unknown keys, every field has a docstring (shown by `rayward config-reference`, and in
docs/config.md with a heading per section), and validators check values without rewriting them. Field names
follow TRL's `GRPOConfig` where the meaning is the same. `load_config(path, overrides)` is the only entry point the
CLI uses; it raises `ConfigError` naming the bad field path before anything expensive (Ray, vLLM, torch models)
starts.

    base.py         _Section (unknown keys rejected, frozen), ConfigError
    schedules.py    numbers that follow the optimizer step (constant, linear, cosine, piecewise)
    model.py        model:            generation.py   generation:       grpo.py     grpo:
    data.py         data:             rewards.py      rewards: (judges, gates)      eval.py     eval:
    cluster.py      cluster:          loop.py         loop:             weight_sync.py  weight_sync:
    logging.py      logging:          agent.py        agent:            distill.py  distillation:
    run.py          RunConfig: the whole tree and the checks that span sections
    loading.py      load_config, parse_config, overrides, config_reference
"""

from orchestrator.config.agent import AgentConfig
from orchestrator.config.base import ConfigError
from orchestrator.config.cluster import (
    DEFAULT_DOWNSCALE_DELAY_S,
    DEFAULT_LOOK_BACK_S,
    DEFAULT_TARGET_UTILIZATION,
    DEFAULT_UPSCALE_DELAY_S,
    ClusterConfig,
    EnvAutoscaleConfig,
    EnvWorkerResources,
    GeneratorResources,
    LearnerResources,
    Resources,
    RewardAutoscaleConfig,
    RewardWorkerResources,
)
from orchestrator.config.data import DataConfig, DataSource, DifficultyConfig
from orchestrator.config.distill import DistillationConfig
from orchestrator.config.eval import EvalConfig
from orchestrator.config.generation import GenerationConfig
from orchestrator.config.grpo import GRPOSection
from orchestrator.config.loading import apply_overrides, config_reference, load_config, parse_config
from orchestrator.config.logging import LoggingConfig
from orchestrator.config.loop import LoopConfig
from orchestrator.config.model import LoraSettings, ModelConfig
from orchestrator.config.rewards import EnginesConfig, GateConfig, JudgeConfig, RewardConfig, check_rewards
from orchestrator.config.run import RUN_NAME_PATTERN, RunConfig
from orchestrator.config.schedules import (
    ConstantSchedule,
    CosineSchedule,
    LinearSchedule,
    PiecewiseSchedule,
    Schedule,
    ScheduledFloat,
    scheduled,
    steps_that_decide,
)
from orchestrator.config.weight_sync import DEFAULT_BUCKET_MB, WeightSyncConfig

__all__ = [
    "ConfigError",
    "ConstantSchedule",
    "CosineSchedule",
    "LinearSchedule",
    "PiecewiseSchedule",
    "Schedule",
    "ScheduledFloat",
    "scheduled",
    "steps_that_decide",
    "LoraSettings",
    "ModelConfig",
    "DataConfig",
    "DataSource",
    "DifficultyConfig",
    "GenerationConfig",
    "GRPOSection",
    "EnginesConfig",
    "GateConfig",
    "JudgeConfig",
    "RewardConfig",
    "check_rewards",
    "ClusterConfig",
    "DEFAULT_DOWNSCALE_DELAY_S",
    "DEFAULT_LOOK_BACK_S",
    "DEFAULT_TARGET_UTILIZATION",
    "DEFAULT_UPSCALE_DELAY_S",
    "EnvAutoscaleConfig",
    "EnvWorkerResources",
    "GeneratorResources",
    "LearnerResources",
    "Resources",
    "RewardAutoscaleConfig",
    "RewardWorkerResources",
    "EvalConfig",
    "LoopConfig",
    "DEFAULT_BUCKET_MB",
    "WeightSyncConfig",
    "LoggingConfig",
    "AgentConfig",
    "DistillationConfig",
    "RUN_NAME_PATTERN",
    "RunConfig",
    "apply_overrides",
    "config_reference",
    "load_config",
    "parse_config",
]
