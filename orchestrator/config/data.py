"""`data:` the prompt dataset, streamed or in memory, and the curriculum over its prompts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.config.base import _Section
from orchestrator.config.schedules import ScheduledFloat, scheduled, steps_that_decide


class DataSource(_Section):
    path: str | None = None
    """A local `.jsonl`/`.json`/`.parquet`/`.csv` file, a directory or glob of parquet/jsonl shards, a directory
    saved with `datasets.save_to_disk`, a hub dataset id, or a built-in task: `toy` (the letter task the tiny model
    learns in a few dozen steps), `toy-mixed` (the same with 5 rows in 8 unanswerable, for curricula), `code`
    (45 function-writing problems with assert tests, for the `code_tests` reward), `boxes` (the tool task) or
    `colors` (the letter task shown as a colour, for vision-language models: an `image` column).
    null: `toy`; but for the training data of a run whose `environment_factory` is one environment, the
    environment owns the data (TRL's GRPOTrainer without a train_dataset): generation_batch_size /
    num_generations placeholder rows, each an empty user message, to which reset()'s text is appended."""
    split: str = "train"
    """Dataset split to read (hub datasets and saved DatasetDicts)."""
    streaming: bool = False
    """Read the dataset as a stream, rows as drawn, memory flat in its size (orchestrator/data/shards.py): `path` is a
    directory, a glob or a file of parquet/jsonl shards, or a dataset saved with `datasets.save_to_disk`. The
    stream's position (shard, offset, shuffle buffer, random state) is in every checkpoint: a resume is exact. An
    eval set streams its first `eval.max_samples` rows."""
    prompt_column: str = "prompt"
    """Column holding the prompt: plain text, or chat messages (list of {role, content}) to which the
    model's chat template is applied. Every other column travels with the sample to the reward functions.
    With `tools` or `environment_factory` the prompt is chat messages, and rows may lack the column (as TRL's
    rows with only an `environment` column): the prompt is then an empty user message for reset()'s text.
    Images (vision-language models) come as TRL takes them: an `image` column (one per row) or `images` (a list),
    each a PIL image, encoded bytes, a `{bytes, path}` dict or a file path, put before the first user message's
    text (TRL's `prepare_multimodal_messages`); or image parts in the messages themselves."""


class DifficultyConfig(_Section):
    """The `difficulty` sampler's pools (orchestrator/data/curriculum.py): each prompt's pass rate in its last scored
    group (the share of its completions whose total reward is at least `pass_threshold`) puts it in `easy`,
    `learnable` or `hard`; a prompt never scored is `unseen`; a prompt whose group had no spread (every
    completion's total the same: solved by all or none, for a pass/fail reward) `rest_after` times in a row is
    rested for `rest_steps` steps, then drawn again from its pool."""

    pass_threshold: float = 1.0
    """A completion passes when its weighted total reward is at least this."""
    easy_above: float = Field(0.75, ge=0, le=1)
    """A pass rate at or above this is `easy`."""
    hard_below: float = Field(0.25, ge=0, le=1)
    """A pass rate at or below this is `hard`; between the two, `learnable`."""
    weights: dict[Literal["unseen", "learnable", "easy", "hard"], ScheduledFloat] = Field(
        default_factory=lambda: {"unseen": 1.0, "learnable": 2.0, "easy": 0.1, "hard": 0.1})
    """Each pool's share of a step's draws (relative, over the pools that have prompts): a number or a schedule
    over steps, as reward weights. A pool left out draws nothing."""
    rest_after: int = Field(2, ge=1)
    """Scorings in a row without spread after which a prompt is rested."""
    rest_steps: int = Field(20, ge=0)
    """Steps a rested prompt is not drawn."""

    @field_validator("weights")
    @classmethod
    def _a_distribution(cls, weights: dict[str, ScheduledFloat]) -> dict[str, ScheduledFloat]:
        """Shares of a draw: never negative, and some pool weighs more than 0, at every step."""
        for step in steps_that_decide(list(weights.values())):
            values = {pool: scheduled(w, step) for pool, w in weights.items()}
            for pool, x in values.items():
                if x < 0:
                    raise ValueError(f"{pool} is {x:g} at step {step}: a pool's share of the draws cannot be "
                                     "negative (0 draws nothing from it)")
            if sum(values.values()) <= 0:
                raise ValueError(f"every pool weighs 0 at step {step} ({values}): at least one must weigh more than "
                                 "0 at every step")
        return weights

    @model_validator(mode="after")
    def _ordered(self) -> DifficultyConfig:
        if self.hard_below >= self.easy_above:
            raise ValueError(f"hard_below ({self.hard_below}) must be below easy_above ({self.easy_above})")
        return self


class DataConfig(DataSource):
    shuffle_dataset: bool = True
    """Shuffle the prompts each epoch (TRL's name). False keeps file order, e.g. for difficulty curricula."""
    shuffle_buffer_size: int = Field(10_000, ge=1)
    """With `streaming`: rows held in the shuffle buffer (`datasets`' IterableDataset.shuffle(buffer_size)); each
    epoch also shuffles the shards' order. Larger mixes better and holds more rows in the driver."""
    sampler: str = "uniform"
    """How each step's prompts are drawn. `uniform`: every row in turn (shuffled per epoch). `difficulty`: from
    pools by each prompt's recent pass rate (`data.difficulty`), the run's own scores kept per prompt. Or
    `module:function` (or `path/to/file.py:function`): called as `fn(stats=, trainer_state=, k=, num_rows=)` with
    the per-prompt statistics ({row index: PromptStats}), the step's TrainerState, how many prompts to draw and
    the dataset's size; returns k row indices (the data-side twin of a reward function's `trainer_state`). The
    statistics and the sampler's state are in every checkpoint. In-memory datasets only (not `streaming`)."""
    difficulty: DifficultyConfig = DifficultyConfig()
    """The `difficulty` sampler's pools, weights and resting."""
    on_bad_row: Literal["raise", "skip"] = "raise"
    """With `streaming`: a row without the prompt column, a row whose columns are not the first row's, a row whose
    image does not decode, or a shard that cannot be read, stops the run naming the file and row (`raise`), or is
    left out and counted (`skip`: the step metric `data/skipped_rows`, the first few named in the driver's log).
    In memory: the first 1,000 rows' images are decoded before the run starts (a broken one stops it there); a later
    row whose image does not decode, known only when drawn, is treated the same way."""

    @model_validator(mode="after")
    def _sampler(self) -> DataConfig:
        if self.sampler not in ("uniform", "difficulty"):
            module, _, name = self.sampler.rpartition(":")
            if not module or not name:
                raise ValueError(f"sampler: {self.sampler!r} is `uniform`, `difficulty` or module:function")
        if self.sampler != "uniform" and self.streaming:
            raise ValueError(f"sampler {self.sampler!r} draws from the whole dataset by its statistics: not with "
                             "streaming (use uniform)")
        return self
