"""`eval:` held-out evaluation during training and for `rayward eval`."""

from __future__ import annotations

from pydantic import Field, model_validator

from orchestrator.config.base import _Section
from orchestrator.config.data import DataSource
from orchestrator.config.rewards import RewardConfig, check_rewards


class EvalConfig(_Section):
    data: DataSource
    """Held-out prompts, from the same sources as `data` (a file, a saved or hub `datasets` dataset and its
    split, or `toy`); every column besides the prompt reaches the reward functions."""
    every_n_steps: int | None = Field(None, ge=1)
    """Evaluate every this many optimizer steps, and after the last step. null: only after the last step (and
    at the start with `at_start`)."""
    at_start: bool = False
    """Also evaluate the policy the run starts from (the initial model, or the resumed checkpoint) before its
    first step: the baseline of the eval curve."""
    num_generations: int = Field(1, ge=1)
    """Completions per prompt: the k of `eval/pass@k`."""
    temperature: float | None = Field(None, ge=0)
    """Sampling temperature; 0 = greedy. Default: `generation.temperature`. top_p and top_k are generation's.
    Each prompt's completions are seeded from the run's seed and the prompt's position, the same at every eval,
    so evals at different steps draw the same random numbers."""
    max_completion_length: int | None = Field(None, ge=1)
    """Maximum new tokens per eval completion. Default: `generation.max_completion_length`."""
    max_samples: int | None = Field(None, ge=1)
    """Evaluate on the first this many prompts of the dataset (file order); null: all of them. An eval costs
    about max_samples x num_generations completions of generation and scoring."""
    rewards: list[RewardConfig] | None = None
    """Reward functions for eval, as in `rewards` (weights, gates, schedules at the evaluated step); scored by
    a separate one-worker pool, `<name>/eval-reward-pool`. null: the training rewards, scored by the run's
    pool."""
    pass_threshold: float = 1.0
    """A completion passes when its total (weighted, gated) reward is at least this: the success behind
    `eval/pass@1` and `eval/pass@k`."""

    @model_validator(mode="after")
    def _consistent(self) -> EvalConfig:
        if self.temperature == 0 and self.num_generations > 1:
            raise ValueError(
                f"temperature 0 (greedy) makes the num_generations ({self.num_generations}) completions of a "
                "prompt identical: use num_generations 1, or a temperature above 0 for pass@k"
            )
        if self.rewards is not None:
            if not self.rewards:
                raise ValueError("rewards: give at least one reward, or null for the training rewards")
            check_rewards(self.rewards)
        return self

    def metric_names(self, training_rewards: list[str]) -> list[str]:
        """The eval metrics an eval produces (`orchestrator.eval.metrics.eval_metrics`) that `grpo.save_best`
        may name."""
        names = [r.name for r in self.rewards] if self.rewards is not None else training_rewards
        k = self.num_generations
        return ["eval/reward", *(f"eval/rewards/{n}/mean" for n in names), "eval/pass@1",
                *([f"eval/pass@{k}"] if k > 1 else []), "eval/mean_length"]
