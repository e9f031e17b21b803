"""The one typed config tree of a rayward run.

Every section rejects unknown keys, every field has a docstring (shown by `rayward config-reference`),
and validators check values without rewriting them. Field names follow TRL's `GRPOConfig` where the
meaning is the same. `load_config(path, overrides)` is the only entry point the CLI uses; it raises
`ConfigError` naming the bad field path before anything expensive (Ray, vLLM, torch models) starts.
"""

from __future__ import annotations

import math
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

# Reward-pool autoscaling defaults (cluster.reward_autoscale; `rayward scale --min/--max` on a pool without
# autoscaling starts from them too), for runs that last hours, after Ray Serve's AutoscalingConfig: grow after
# 30 s of sustained load, shrink only after 10 minutes of sustained slack (a worker started costs seconds of
# imports; an idle one only its reservation), decide on about 30 s of history.
DEFAULT_UPSCALE_DELAY_S = 30.0
DEFAULT_DOWNSCALE_DELAY_S = 600.0
DEFAULT_LOOK_BACK_S = 30.0
# Busy fraction each reward worker should settle at. In the synchronous loop the reward phase then takes about
# target / (1 - target) of the rest of the step (0.5: as long as generation + training + sync); in the
# pipelined loop workers are busy about half the time, with room to absorb a slower batch.
DEFAULT_TARGET_UTILIZATION = 0.5


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


# ---------------------------------------------------------------------------------------------------------
# Schedules: a value that follows the optimizer step (curriculum). Used for reward weights and gate thresholds.
# ---------------------------------------------------------------------------------------------------------


class ConstantSchedule(_Section):
    type: Literal["constant"] = "constant"
    """Always `value`."""
    value: float
    """The value at every step."""

    def at(self, step: int) -> float:
        return self.value

    def breakpoints(self) -> tuple[int, ...]:
        """The steps where the value changes how it moves (between two of them it is constant or monotone)."""
        return ()


class _Ramp(_Section):
    start: float
    """Value at and before `start_step`."""
    end: float
    """Value at and after `end_step`."""
    start_step: int = Field(0, ge=0)
    """First step of the ramp."""
    end_step: int = Field(ge=0)
    """Last step of the ramp."""

    @model_validator(mode="after")
    def _ordered(self) -> _Ramp:
        if self.end_step <= self.start_step:
            raise ValueError(f"end_step ({self.end_step}) must be greater than start_step ({self.start_step})")
        return self

    def _shape(self, frac: float) -> float:
        """How far along the ramp (0 -> 1) the value is at `frac` of its steps."""
        return frac

    def at(self, step: int) -> float:
        frac = min(max((step - self.start_step) / (self.end_step - self.start_step), 0.0), 1.0)
        return self.start + (self.end - self.start) * self._shape(frac)

    def breakpoints(self) -> tuple[int, ...]:
        return (self.start_step, self.end_step)


class LinearSchedule(_Ramp):
    type: Literal["linear"] = "linear"
    """`start` until `start_step`, a straight line to `end` at `end_step`, then `end`."""


class CosineSchedule(_Ramp):
    type: Literal["cosine"] = "cosine"
    """Half a cosine from `start` (at `start_step`) to `end` (at `end_step`), constant outside."""

    def _shape(self, frac: float) -> float:
        return (1 - math.cos(math.pi * frac)) / 2  # 0 -> 1 along half a cosine


class PiecewiseSchedule(_Section):
    type: Literal["piecewise"] = "piecewise"
    """Steps: `[[0, 0.0], [20, 1.0]]` means 0.0 for steps 0-19 and 1.0 from step 20 on."""
    steps: list[tuple[int, float]] = Field(min_length=1)
    """`[step, value]` pairs, steps strictly increasing; the value holds from its step until the next one.
    Before the first step the first value holds."""

    @field_validator("steps")
    @classmethod
    def _increasing(cls, v: list[tuple[int, float]]) -> list[tuple[int, float]]:
        starts = [s for s, _ in v]
        if any(b <= a for a, b in zip(starts, starts[1:], strict=False)) or starts[0] < 0:
            raise ValueError(f"steps must be non-negative and strictly increasing, got {starts}")
        return v

    def at(self, step: int) -> float:
        current = self.steps[0][1]
        for start, v in self.steps:
            if step >= start:
                current = v
        return current

    def breakpoints(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self.steps)


Schedule = Annotated[
    ConstantSchedule | LinearSchedule | CosineSchedule | PiecewiseSchedule, Field(discriminator="type")
]
ScheduledFloat = float | Schedule


def scheduled(value: ScheduledFloat, step: int) -> float:
    """The value of a number or a schedule at optimizer step `step`."""
    return float(value) if isinstance(value, (int, float)) else value.at(step)


def steps_that_decide(values: list[ScheduledFloat]) -> list[int]:
    """The steps at which checking `values` decides a property of every step: each schedule is constant or
    monotone between its breakpoints, so the extremes of each (and the steps where several are zero together)
    are at 0, a breakpoint or a step next to one."""
    steps = {0}
    for v in values:
        if not isinstance(v, (int, float)):
            steps.update(s + d for s in v.breakpoints() for d in (-1, 0, 1) if s + d >= 0)
    return sorted(steps)


# ---------------------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------------------

TINY_MODEL = "tiny"
TINY_JUDGE_MODEL = "tiny-judge"  # the tiny model warmed up to judge the letter task (orchestrator/builtin/models/judge.py)
TINY_TEACHER_MODEL = "tiny-teacher"  # the tiny model taught the letter task (orchestrator/builtin/models/teacher.py)
TINY_TOOLS_MODEL = "tiny-tools"  # the tiny model warmed up to call tools (orchestrator/builtin/models/tools.py)
# The tiny mixtures of experts (orchestrator/builtin/models/moe.py): name -> (family, near_ties)
TINY_MOE_MODELS = {"tiny-moe": ("qwen3_moe", False), "tiny-qwen2-moe": ("qwen2_moe", False),
                   "tiny-moe-ties": ("qwen3_moe", True)}
TINY_VLM_MODEL = "tiny-vlm"  # a random Qwen2.5-VL of the tiny model's size (orchestrator/builtin/models/vlm.py)
TINY_TOOL_VLM_MODEL = "tiny-vlm-tools"  # the same, warmed up on the cards task (orchestrator/builtin/tasks/cards.py)
# Run names become Ray namespaces, actor names and directory names: lower-case DNS-label characters only.
RUN_NAME_PATTERN = r"^[a-z0-9][a-z0-9\-]{0,62}$"


class LoraSettings(_Section):
    """LoRA adapters through PEFT, with the meanings of PEFT's `LoraConfig` (same names; `alpha` and `dropout`
    are accepted as short aliases of `lora_alpha` and `lora_dropout`)."""

    r: int = Field(8, ge=1)
    """LoRA rank (PEFT's `r`)."""
    lora_alpha: int = Field(8, ge=1, validation_alias=AliasChoices("lora_alpha", "alpha"))
    """Scale numerator (alias `alpha`): the adapter's update is scaled by lora_alpha / r (lora_alpha / sqrt(r)
    with use_rslora). PEFT's default, 8."""
    lora_dropout: float = Field(0.0, ge=0, lt=1, validation_alias=AliasChoices("lora_dropout", "dropout"))
    """Dropout on the adapter's input in the learner's training forwards (alias `dropout`). The generators
    sample from merged weights without it; 0 (PEFT's default) keeps sampling and training the same function."""
    target_modules: str | list[str] | None = "all-linear"
    """Layers that get an adapter, as PEFT matches them: a list of module names (or name suffixes, e.g.
    [q_proj, v_proj]), a regular expression matched against full module names, or `all-linear` (every linear
    layer except the output head). rayward's default is `all-linear`, not PEFT's (null: the architecture's
    default, q_proj and v_proj for Qwen2 and Llama): LoRA on the MLPs too is what keeps up with full fine-tuning
    in RL (Thinking Machines, "LoRA Without Regret", 2025), and what learns on the demo at the demo's learning
    rate, where q_proj and v_proj alone barely move the reward (bench/README.md, "LoRA on the demo"). Linear
    layers only; not the output head (as TRL)."""
    bias: Literal["none", "all", "lora_only"] = "none"
    """Which biases train with the adapter (PEFT's meaning). With `all` or `lora_only` the trained biases stay
    in place when adapters are disabled, so the KL reference is then not exactly the base model."""
    use_rslora: bool = False
    """Rank-stabilised LoRA: scale by lora_alpha / sqrt(r) instead of lora_alpha / r (PEFT's name)."""
    save_merged: bool = False
    """When the run finishes, also write `<logging.dir>/<run name>/merged`: the base model with the adapter merged
    in (the weights the generators run) and its tokenizer, a plain HF model directory for transformers or vLLM."""

    @model_validator(mode="before")
    @classmethod
    def _one_name_each(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, alias in (("lora_alpha", "alpha"), ("lora_dropout", "dropout")):
                if name in data and alias in data:
                    raise ValueError(f"give `{name}` or its alias `{alias}`, not both")
        return data


class ModelConfig(_Section):
    name_or_path: str = TINY_MODEL
    """HF model directory or hub id of the policy. `tiny` builds rayward's offline tiny model (random
    Qwen2-style, head_dim 64) into the cache on first use; `tiny-tools` the same model warmed up to call the box
    task's tools (configs/tools.yaml); `tiny-moe` and `tiny-qwen2-moe` random mixtures of experts of its size
    (Qwen3-MoE, Qwen2-MoE: 8 experts, top-2; configs/moe.yaml), `tiny-moe-ties` a Qwen3-MoE whose routers are
    near ties (docs/moe.md); `tiny-vlm` a random Qwen2.5-VL vision-language model of its size
    (configs/vlm.yaml, docs/vision.md), `tiny-vlm-tools` one with Qwen3-VL's chat template warmed up to call the
    cards task's tool, which returns an image (configs/vlm-tools.yaml)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype in the learner and the generators. float32 on CPU (vLLM-CPU and the learner then agree in
    logprobs to rounding: the parity check after the first sync prints the gap); bfloat16 is the usual choice on
    GPUs."""
    trust_remote_code: bool = False
    """Passed to transformers and vLLM when loading the model and tokenizer."""
    attn_implementation: (
        Literal["sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3"] | None
    ) = None
    """The learner's attention kernel (transformers' `attn_implementation`; the generators use vLLM's own). null:
    transformers' default for the model (sdpa where the model has it). flash_attention_2 / _3 need a GPU and the
    flash-attn package; packed micro-batches are then one row each, with no pad at all. flex_attention trains on
    GPUs only (torch has no backward for it on CPU)."""
    processor_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Vision-language models: keyword arguments of the model's processor, under the processor's own names, as a
    TRL script passes them to `AutoProcessor.from_pretrained` (Qwen-VL: `{min_pixels: 3136, max_pixels: 200704}`
    bounds each image's size and so its vision tokens). The learner's processor and the generators' (vLLM's
    `mm_processor_kwargs`) get the same, so both expand an image into the same tokens."""
    lora: LoraSettings | None = None
    """Train LoRA adapters (PEFT) instead of every weight: e.g. {r: 8, alpha: 16, target_modules: all-linear}.
    The optimizer holds the adapters only, the KL reference is the base with adapters disabled (no second
    copy), the generators receive the merged weights, checkpoints hold the adapter in PEFT's format. null: full
    fine-tuning."""


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
    """With `streaming`: a row without the prompt column, or a shard that cannot be read, stops the run naming the
    file and row (`raise`), or is left out and counted (`skip`: the step metric `data/skipped_rows`, the first
    few named in the driver's log)."""

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


class GenerationConfig(_Section):
    num_generations: int = Field(8, ge=2)
    """Completions per prompt (G, the GRPO group size)."""
    generation_batch_size: int = Field(32, ge=2)
    """Completions generated per optimizer step, across all generators; a multiple of num_generations
    (prompts per step = generation_batch_size / num_generations)."""
    max_completion_length: int = Field(64, ge=1)
    """Maximum new tokens per completion (also the dr_grpo normaliser). With tools: the tokens the model samples
    over all turns of a trajectory; tool results count in agent.max_tool_tokens instead (TRL counts both in
    this one)."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; the learner divides logits by it too, so logprobs match the sampler's."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass (not applied to training logprobs, as in TRL)."""
    top_k: int = Field(0, ge=0)
    """Top-k sampling; 0 disables it."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the chat template wherever rayward renders one (TRL's name): the prompts of training
    and eval, an agentic run's first prompt, tool results and template check, and reward models' inputs. E.g.
    `{enable_thinking: false}` renders a Qwen3 policy without thinking, as TRL's environment examples do."""
    max_model_len: int = Field(512, ge=16)
    """vLLM context length (prompt + completion)."""
    kv_cache_gib: float = Field(1.0, gt=0)
    """KV cache per generator in GiB on CPU (VLLM_CPU_KVCACHE_SPACE)."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """Fraction of GPU memory a generator's vLLM may take (GPU only)."""
    max_tool_calling_iterations: int | None = Field(None, ge=0)
    """With tools: the most tool-calling rounds per trajectory (TRL's name); a model that still calls a tool after
    them ends its trajectory with stop reason `max_turns`. null: no limit but the token budgets and
    agent.trajectory_timeout_s."""
    tensor_parallel_size: int = Field(1, ge=1)
    """vLLM tensor parallelism inside each generator (vLLM's name): the engine's workers split every layer.
    On GPUs each generator actor then takes tensor_parallel_size x cluster.generator.num_gpus GPUs of one node;
    on CPU each rank gets its own share of the actor's cores (VLLM_CPU_OMP_THREADS_BIND, set unless given)."""

    @model_validator(mode="after")
    def _divisible(self) -> GenerationConfig:
        if self.generation_batch_size % self.num_generations:
            raise ValueError(
                f"generation_batch_size ({self.generation_batch_size}) must be a multiple of "
                f"num_generations ({self.num_generations})"
            )
        if self.max_completion_length >= self.max_model_len:
            raise ValueError(
                f"max_completion_length ({self.max_completion_length}) must be below max_model_len "
                f"({self.max_model_len}), which also holds the prompt"
            )
        return self


class GRPOConfig(_Section):
    max_steps: int = Field(20, ge=1)
    """Optimizer steps in the run (TRL's name)."""
    learning_rate: float = Field(1e-6, gt=0)
    """Peak AdamW learning rate."""
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate decay after warm-up."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up from 0 over this many optimizer steps."""
    optim: Literal["adamw_torch", "sgd"] = "adamw_torch"
    """Optimizer."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay."""
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW beta1."""
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    """AdamW beta2."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Gradient clipping by global norm; null disables it."""
    per_device_train_batch_size: int = Field(8, ge=1)
    """Micro-batch size in completions. One optimizer step accumulates gradients over
    generation_batch_size / per_device_train_batch_size micro-batches (TRL's gradient_accumulation_steps)."""
    num_iterations: int = Field(1, ge=1)
    """Optimizer steps per generation batch (TRL's mu); >1 reuses samples with frozen old logprobs."""
    beta: float = Field(0.0, ge=0)
    """KL coefficient to the frozen reference model (k3 estimator). 0 loads no reference model."""
    use_bias_correction_kl: bool = True
    """Multiply the KL term by the (non-detached) importance ratio, as TRL does by default."""
    epsilon: float = Field(0.2, gt=0)
    """Lower clip range of the ratio (and upper, unless epsilon_high is set)."""
    epsilon_high: float | None = Field(None, gt=0)
    """Upper clip range (DAPO clip-higher); for cispo the absolute cap on the IS weight."""
    delta: float | None = Field(None, gt=1)
    """Two-sided clipping (INTELLECT-2): cap on the unclipped ratio."""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"] = "dapo"
    """Loss aggregation, with TRL's exact normalisers."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """Ratio per token, or per sequence (GSPO, length-mean of log-ratios)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Divide advantages by the group std, the batch std, or not at all (Dr. GRPO)."""
    multi_objective_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize"
    """Combine rewards by weighted sum then normalise (TRL default), or normalise each then sum (GDPO)."""
    mask_truncated_completions: bool = False
    """Exclude completions that hit max_completion_length from the loss."""
    vllm_importance_sampling_correction: bool = True
    """Correct for the generator-learner logprob mismatch (TIS/MIS), as TRL does with vLLM."""
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = (
        "sequence_mask"
    )
    """Truncate (clamp) or mask the IS ratio, per token or per sequence (TRL's default: sequence_mask)."""
    vllm_importance_sampling_clip_max: float | None = Field(3.0, gt=0)
    """Upper cap C_max of the IS ratio."""
    vllm_importance_sampling_clip_min: float | None = Field(None, ge=0)
    """Lower bound C_min of the IS ratio (mask modes)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose weighted total reward has zero spread (std, not mean: such
    groups have zero advantage and teach nothing) and refill with new prompts."""
    max_refill_rounds: int = Field(3, ge=0)
    """With dynamic_sampling: at most this many extra generation rounds per step; if the batch is still short,
    the step trains on the groups it has (and logs it)."""
    save_steps: int | None = Field(None, ge=1)
    """Save a checkpoint (policy weights, optimizer, run state) every this many optimizer steps, and at the end."""
    gradient_checkpointing: bool = True
    """Recompute each decoder layer's activations in the backward pass instead of keeping them from the forward
    (TRL's name and default): less learner memory for more compute, the same loss and gradients. Needs a model
    that supports it (transformers' `supports_gradient_checkpointing`)."""
    gradient_checkpointing_kwargs: dict[str, Any] | None = None
    """Keyword arguments for `torch.utils.checkpoint.checkpoint` (TRL's name), e.g. {use_reentrant: true}.
    null: transformers' default ({use_reentrant: false})."""
    padding_free: bool | None = None
    """Pack each micro-batch's samples (prompt + completion) into rows with no pad tokens between them, each
    sample's position_ids restarting at 0 (TRL's name, from its SFT trainer), so the learner computes no pad;
    the loss and gradients are the padded layout's. null: packed where the model computes packed rows as separate
    samples (its attention implementation and layer types, and a packed forward checked against the padded one
    when the learner starts), padded elsewhere, with a warning. true: packed, or an error where it cannot be.
    false: TRL's padded layout (prompts left-padded, completions right-padded)."""
    router_replay: Literal["R2", "R3"] | None = None
    """Mixture-of-experts policies: route the learner's tokens to the experts chosen elsewhere (docs/moe.md).
    R3 (rollout routing replay, as veRL, slime and SkyRL name it): the engine records the experts every MoE layer
    chose for every token it computed, the sample carries them ([tokens, layers, top_k] small integers), and every
    learner forward of the step (old log-probs, policy, reference) routes those tokens there, so a near-tied router
    that the two implementations break differently no longer moves the importance ratio. Prompt and tool tokens
    replay the engine's prefill routing. The engine then computes every prompt whole (no prefix caching). R2: the
    learner replays its own first-pass routing in the step's later iterations (num_iterations > 1). null: each
    forward routes by its own router. Metrics with R3: `routing/agreement` (the fraction of model tokens' (token,
    layer) expert sets the learner would have chosen alike) and `routing/logp_difference_without_replay/mean`."""
    router_aux_loss_coef: float | None = Field(None, ge=0)
    """Mixture-of-experts policies: the weight of the router's load-balancing auxiliary loss added to the GRPO
    loss (TRL's name and rule: null takes the model config's `router_aux_loss_coef`, 0 turns it off; logged as
    `aux_loss`). A dense model with a non-zero value is refused."""
    max_tokens_per_microbatch: int | None = Field(None, ge=1)
    """Cut each step's batch into micro-batches by tokens instead of by count: first-fit-decreasing bins of at
    most this many positions (prompt + completion tokens packed; rows x longest prompt + longest completion with
    padding_free false), balanced across learner ranks, so the learner's peak memory follows the budget rather
    than per_device_train_batch_size x the longest sample (per_device_train_batch_size is then unused). A sample
    longer than the budget trains in a micro-batch of its own, with a warning: give at least the longest prompt
    + max_completion_length. null: micro-batches of per_device_train_batch_size completions."""
    save_best: str | None = None
    """Also keep `<dir>/<run name>/checkpoint-best`: the checkpoint of the policy with the best value so far of
    this eval metric (`eval/reward`, `eval/pass@1`, `eval/rewards/<name>/mean`, ...; needs an `eval` block),
    with its step and value in its rayward_state.json. Periodic checkpoints and --resume (from the latest
    periodic one) are unchanged."""
    save_best_mode: Literal["max", "min"] = "max"
    """Whether a higher (`max`) or a lower (`min`) value of `save_best` is better."""

    @model_validator(mode="after")
    def _consistent(self) -> GRPOConfig:
        if self.warmup_steps >= self.max_steps and self.warmup_steps > 0:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below max_steps ({self.max_steps})")
        if self.max_steps % self.num_iterations:
            raise ValueError(
                f"max_steps ({self.max_steps}) must be a multiple of num_iterations ({self.num_iterations}): "
                "each generation batch is trained on num_iterations times"
            )
        return self


class GateConfig(_Section):
    reward: str
    """Name of the gating reward (another entry of `rewards`)."""
    threshold: ScheduledFloat
    """When the gating reward of a sample is below this, this reward is replaced by `fill` for that sample.
    A number or a schedule over steps."""
    fill: float = 0.0
    """Value the gated reward takes when the gate is closed."""
    lazy: bool | None = None
    """Do not call this reward for a sample whose gate is closed (its value would be replaced by `fill`): the
    gating reward is scored first, then this one on the open samples only. Saves the calls of an expensive reward
    (a program run, a judge) behind a cheap primary one. Advantages, totals and gated values are those of calling
    it everywhere; its raw value is None (no opinion) on a skipped sample, so `rewards/<name>/mean` and the
    completions log's raw column cover the samples it scored, and `rewards/<name>/skipped` counts the rest per
    step. null (default): on for a `judge`, off for a function (opt-in: a function with side effects is then not
    called for every sample). Needs a judge or a per-sample function (not `batched`, not a reward model or an
    environment's reward), a number as `threshold`, and a gating reward that is not itself gated (and, for a
    function, not a judge: functions are scored before judges)."""


class RewardAutoscaleConfig(_Section):
    min_workers: int = Field(1, ge=1)
    """Fewest reward workers; idle workers are retired down to this many."""
    max_workers: int = Field(ge=1)
    """Most reward workers; the pool adds workers up to this many while work waits."""
    target_utilization: float = Field(DEFAULT_TARGET_UTILIZATION, gt=0, le=1)
    """Fraction of the time each worker should be busy (scoring at least one chunk); the pool sizes itself so
    that each batch keeps its workers busy that fraction of the batch cycle (pipelined: busy workers / target). In the synchronous loop the reward phase then settles at
    about target / (1 - target) of the rest of the step (0.5: as long as generate + train + sync; 0.2: a quarter
    of it, with more workers). Like Ray Serve's target_ongoing_requests."""
    look_back_s: float = Field(DEFAULT_LOOK_BACK_S, gt=0)
    """Seconds of history each decision averages over (Serve's look_back_period_s), stretched to whole batch
    cycles (in the synchronous loop the window always holds at least one whole step) and cut at the newest
    regime: cycles of more than 2x or less than half the newest one's work are left out, so the pool follows a
    reward that became slower or faster at once."""
    upscale_delay_s: float = Field(DEFAULT_UPSCALE_DELAY_S, ge=0)
    """The load must call for more workers this long before the pool grows (Ray Serve's default: 30 s)."""
    downscale_delay_s: float = Field(DEFAULT_DOWNSCALE_DELAY_S, ge=0)
    """The load must call for fewer workers this long before the pool retires any (Ray Serve's default:
    600 s); retiring workers finish their chunks first."""

    @model_validator(mode="after")
    def _bounds(self) -> RewardAutoscaleConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) must not exceed max_workers ({self.max_workers})")
        return self


class EnginesConfig(_Section):
    num_engines: int = Field(1, ge=1)
    """Engine actors at start (each a vLLM engine holding the judge's or the teacher's model); `rayward scale
    NAME --judge-engines N --judge REWARD` (`--teacher-engines N`) changes it while the run trains."""
    autoscale: RewardAutoscaleConfig | None = None
    """Size the engines from their request queue, as `cluster.reward_autoscale` sizes the reward pool
    (`min_workers`/`max_workers` count engines here). null: a fixed `num_engines`."""
    num_cpus: float = Field(0.5, ge=0)
    """Logical CPUs reserved per engine actor (as a generator's: a CPU engine's threads use the node's cores
    whatever it reserves)."""
    num_gpus: float = Field(0.0, ge=0)
    """GPUs per engine actor (fractions share a GPU); 0: the engine runs on CPU (vllm-cpu)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources per engine actor (places the engines on the nodes that declare them)."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """The model's weights' dtype. Default: `model.dtype`."""
    max_model_len: int | None = Field(None, ge=16)
    """Longest request in tokens: a judge's prompt + answer, a teacher's prompt + completion + the one token it
    generates; a longer one is answered as an error (a judge reward's `on_error`; a sample without the teacher's
    log-probs), never truncated. Default: 1024 for a judge; `generation.max_model_len` + 1 for the teacher (every
    sample fits)."""
    kv_cache_gib: float = Field(1.0, gt=0)
    """CPU engines: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."""
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """GPU engines: fraction of the GPU's memory the engine may take."""
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """More `vllm.LLM` arguments (e.g. `max_num_seqs`, `tensor_parallel_size`), passed as given."""
    max_inflight: int = Field(64, ge=1)
    """Requests one engine holds at once (its batch); more wait in the pool's queue, which is what the
    autoscaler reads."""
    queue_timeout_s: float | None = Field(None, gt=0)
    """A request that finds no live engine for this long is answered as a timeout (every engine failing to
    start). Default: `cluster.hang_timeout_s`."""


class JudgeConfig(_Section):
    model: str
    """The judge: an HF path or hub id of a causal LM (or `tiny-judge`, the offline tiny judge of the letter
    task), served on engines of its own; the run's generators are never borrowed."""
    template: str
    """The judge's prompt, Python str.format over the sample: `{prompt}`, `{completion}`, `{conversation}` (a
    conversation as `role: content` lines) and the dataset's columns (`{letter}`). It is the user message of
    the judge's chat template (when its tokenizer has one), after `system`."""
    system: str | None = None
    """System message before the template (chat templates only)."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the judge's chat template (e.g. `enable_thinking: false`: some templates open a thinking
    block in the generation prompt, which a short answer would cut off)."""
    temperature: float = Field(0.0, ge=0)
    """The judge's sampling temperature; 0 (default): greedy, the same verdict for the same sample."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling (temperature > 0)."""
    top_k: int = Field(0, ge=0)
    """Top-k sampling (temperature > 0); 0: off."""
    max_completion_length: int = Field(16, ge=1)
    """The judge's answer's token budget."""
    stop: list[str] = Field(default_factory=list)
    """Strings that end the judge's answer."""
    regex: str | None = None
    """The score is this regular expression's first group (else the whole match) in the answer, read as a
    number. One of `regex`, `labels`, `parser`."""
    labels: dict[str, float] | None = None
    """The score is the value of the label the answer starts with (spaces stripped; longest label first), e.g.
    `{yes: 1.0, no: 0.0}`."""
    parser: str | None = None
    """`module:function` from the answer's text to a float, or None for no opinion; raising is an error."""
    engines: EnginesConfig = EnginesConfig()
    """The judge's engine pool, `<run>/judge-<reward>-pool`."""

    @model_validator(mode="after")
    def _one_score_rule(self) -> JudgeConfig:
        given = [k for k in ("regex", "labels", "parser") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of regex, labels, parser (how the judge's answer becomes a score); "
                             f"got {given or 'none'}")
        if self.regex is not None:
            import re

            try:
                re.compile(self.regex)
            except re.error as err:
                raise ValueError(f"regex {self.regex!r}: {err}") from None
        if self.parser is not None and ":" not in self.parser:
            raise ValueError(f"parser {self.parser!r} is not of the form module:function")
        return self


class RewardConfig(_Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-<>]+$")
    """Name used in logs (`rewards/<name>/mean`) and by gates."""
    function: str | None = None
    """`package.module:callable` (importable from the directory you run rayward from), a `.py` file path
    with `:callable`, or a built-in name (see `rayward rewards`). TRL's reward-function signature. Neither
    `function` nor `model`: the `get_reward()` of the environment class of this `name` (environment_factory),
    to weight, gate or schedule it (unnamed, it is a reward of weight 1); a missing value (get_reward raised or
    timed out, the trajectory's environment was lost) scores `fallback`, whatever `on_error` says."""
    model: str | None = None
    """Instead of `function`: a sequence-classification reward model (HF path or hub id), scored on
    prompt + completion as TRL does."""
    judge: JudgeConfig | None = None
    """Instead of `function`: an LLM judge, a model that reads the sample through a template and answers; its
    answer becomes the score (regex, labels or a parser). `timeout_s` bounds each judged sample; a judge that
    fails to answer or parse scores by `on_error`/`fallback`. Lazily gated by default (gate.lazy)."""
    weight: float = 1.0
    """Weight in the weighted sum (TRL's reward_weights)."""
    schedule: Schedule | None = None
    """Optional multiplier on `weight` over optimizer steps (curriculum): e.g. linear 1 -> 0 over steps 0-50."""
    gate: GateConfig | None = None
    """Optional gate: this reward counts only where another reward reaches a threshold."""
    timeout_s: float = Field(60.0, gt=0)
    """Per-call time bound; a call past it scores `fallback` and is counted under reward_pool/timeouts."""
    on_error: Literal["raise", "fallback"] = "raise"
    """On an exception or an invalid return: fail the run naming the reward and sample, or score `fallback`."""
    fallback: float | None = 0.0
    """Score used for timeouts and (with on_error=fallback) errors; null means "no opinion" (TRL's None)."""
    batched: bool = False
    """Call the function once per group (all G completions of a prompt) instead of once per completion.
    Per-completion calls isolate timeouts and errors to one sample; per-group calls suit groupwise judges."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for a factory: when set, `function` is called with them once to build the reward."""

    @model_validator(mode="after")
    def _one_source(self) -> RewardConfig:
        sources = [k for k in ("function", "model", "judge") if getattr(self, k) is not None]
        if len(sources) > 1:
            raise ValueError(f"give one of `function`, `model` or `judge`, not {' and '.join(sources)} (none: an "
                             "environment's get_reward())")
        if self.judge is not None and (self.batched or self.kwargs):
            raise ValueError("a judge reward takes no `batched` or `kwargs` (those are a function's)")
        if self.lazy:
            if (self.function is None and self.judge is None) or self.batched:
                what = "a reward model" if self.model else "batched" if self.batched else "an environment's reward"
                raise ValueError(f"gate.lazy: {self.name!r} is {what}; lazy gating skips per-sample calls of a "
                                 "judge or a function (batched: false)")
            if not isinstance(self.gate.threshold, (int, float)):
                raise ValueError("gate.lazy: the threshold must be a number (a scheduled threshold with lazy gating "
                                 "is not supported yet)")
        if self.function is not None and ":" not in self.function and not self.function.isidentifier():
            raise ValueError(f"function {self.function!r} is neither `module:callable` nor a built-in name")
        if self.fallback is not None and not math.isfinite(self.fallback):
            raise ValueError("fallback must be a finite number or null")
        return self

    @property
    def lazy(self) -> bool:
        """Whether its gate is lazy (gate.lazy; null: a judge's is, a function's is not)."""
        if self.gate is None:
            return False
        return self.gate.lazy if self.gate.lazy is not None else self.judge is not None

    @property
    def has_source(self) -> bool:
        """A function, a model or a judge (else: an environment's get_reward())."""
        return self.function is not None or self.model is not None or self.judge is not None


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


def check_rewards(rewards: list[RewardConfig]) -> None:
    """A reward list's names are unique and its gates name other rewards of the list, with no cycle."""
    names = [r.name for r in rewards]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"reward names must be unique, repeated: {dupes}")
    for r in rewards:
        if r.gate is not None:
            if r.gate.reward not in names:
                raise ValueError(f"reward {r.name!r}: gate names unknown reward {r.gate.reward!r} (have {names})")
            if r.gate.reward == r.name:
                raise ValueError(f"reward {r.name!r}: a reward cannot gate itself")
    gated = {r.name for r in rewards if r.gate is not None}
    judges = {r.name for r in rewards if r.judge is not None}
    for r in rewards:
        if r.gate is not None and r.lazy and r.gate.reward in gated:
            raise ValueError(f"reward {r.name!r}: gate.lazy: its gating reward {r.gate.reward!r} is itself gated; "
                             "lazy gating takes an ungated gating reward")
        if r.gate is not None and r.lazy and r.judge is None and r.gate.reward in judges:
            raise ValueError(f"reward {r.name!r}: gate.lazy: its gating reward {r.gate.reward!r} is a judge, scored "
                             "after the functions; gate a function lazily on a function, or set gate.lazy: false")
    cycle = _gate_cycle({r.name: r.gate.reward for r in rewards if r.gate})
    if cycle:
        raise ValueError(f"gates form a cycle: {' -> '.join(cycle)}")


class Resources(_Section):
    num_cpus: float = Field(1.0, ge=0)
    """Logical CPUs reserved per actor."""
    num_gpus: float = Field(0.0, ge=0)
    """GPUs per actor (fractions share a GPU)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources per actor: a resource only some nodes declare (e.g. {"reward_node": 1}) places the
    actor on those nodes."""


class GeneratorResources(Resources):
    num_cpus: float = Field(0.5, ge=0)
    """Logical CPUs reserved per generator actor."""


class LearnerResources(Resources):
    num_cpus: float = Field(0.5, ge=0)
    """Logical CPUs reserved for the learner actor."""


class RewardWorkerResources(Resources):
    num_cpus: float = Field(0.25, ge=0)
    """Logical CPUs reserved per reward worker (latency-bound rewards need little; CPU-bound ones want 1)."""


class EnvWorkerResources(Resources):
    num_cpus: float = Field(0.25, ge=0)
    """Logical CPUs reserved per environment worker (tools that wait on a service need little; ones that compute
    want 1)."""


class EnvAutoscaleConfig(_Section):
    min_workers: int = Field(1, ge=1)
    """Fewest environment workers; idle workers are retired down to this many (once their sessions end)."""
    max_workers: int = Field(ge=1)
    """Most environment workers; the pool adds workers up to this many while tool calls keep them busy or
    sessions wait for room."""
    target_utilization: float = Field(DEFAULT_TARGET_UTILIZATION, gt=0, le=1)
    """Fraction of the time each worker should be busy (running a tool turn, a reset or a get_reward, or full of
    sessions); the pool sizes itself to busy workers / target, as the reward pool does (docs/agents.md)."""
    look_back_s: float = Field(DEFAULT_LOOK_BACK_S, gt=0)
    """Seconds of history each decision averages over (Serve's look_back_period_s), stretched to whole cycles
    between session opens."""
    upscale_delay_s: float = Field(DEFAULT_UPSCALE_DELAY_S, ge=0)
    """The load must call for more workers this long before the pool grows (Ray Serve's default: 30 s)."""
    downscale_delay_s: float = Field(DEFAULT_DOWNSCALE_DELAY_S, ge=0)
    """The load must call for fewer workers this long before the pool retires any (Ray Serve's default: 600 s);
    a retiring worker takes no new sessions and goes once its open ones have closed."""

    @model_validator(mode="after")
    def _bounds(self) -> EnvAutoscaleConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) must not exceed max_workers ({self.max_workers})")
        return self


class ClusterConfig(_Section):
    address: str | None = None
    """Ray cluster to join (`auto`, `host:6379`). null: the cluster $RAY_ADDRESS names (as inside a Ray job; the
    run's first line says so), else an embedded local cluster of the run's own (laptop, CI), whatever other Ray
    cluster runs on the machine."""
    local_num_cpus: int | None = Field(None, ge=1)
    """CPUs of the embedded local cluster (default: this machine's count). Logical: actors ask for fractions."""
    num_generators: int = Field(1, ge=1)
    """vLLM generator actors; prompts are split across them."""
    num_learners: int = Field(1, ge=1)
    """Learner ranks (data parallel), one actor each with the `learner` resources, placed by a placement group
    as `learner_placement` says. Above 1 needs `learner_strategy: fsdp`."""
    learner_placement: Literal["pack", "spread"] = "pack"
    """Where the learner ranks go. `pack`: all on one node (Ray STRICT_PACK; NCCL over NVLink/PCIe). `spread`:
    each rank on its own node (Ray STRICT_SPREAD), for a model or batch that needs several nodes; the cluster
    must have num_learners nodes with room for one rank each (checked when Ray starts)."""
    learner_strategy: Literal["single", "fsdp"] = "single"
    """`single`: one learner process on one device. `fsdp`: the num_learners ranks form a torch.distributed
    process group (gloo on CPU, NCCL on GPUs), shard the policy and reference model with FSDP2 (per decoder
    layer) and each trains on its share of every batch's micro-batches, with the single learner's numbers.
    On GPUs with model.dtype bfloat16: float32 master weights and optimizer state, bfloat16 compute."""
    num_reward_workers: int = Field(2, ge=1)
    """Reward worker actors at start (scale later with `rayward scale`); with reward_autoscale, clamped to its
    bounds."""
    reward_autoscale: RewardAutoscaleConfig | None = None
    """Let the reward pool size itself between min_workers and max_workers from its load (docs/reward-pool.md,
    "Autoscaling"). null: a fixed pool of num_reward_workers."""
    cpu_split: float = Field(0.5, gt=0, lt=1)
    """CPU nodes, pipelined loop: the generator's engine gets the last (1 - cpu_split) of its node's cores, a
    thread per core; the learner trains on every core. The sync loop splits nothing. Why: actors/runtime/cpus.py."""
    generator_max_restarts: int = Field(3, ge=0)
    """How often Ray restarts a generator actor that died (vLLM crash, OOM, lost node). A restarted generator
    rejoins the weight-transfer group and gets the current weights before it generates again."""
    max_failures: int = Field(3, ge=0)
    """How many times a run brings its learner back by itself (Ray Train's name): when a learner rank dies, its
    node is lost or it hangs, the learner is rebuilt from the latest checkpoint (grpo.save_steps; without one,
    from the initial model), the steps since that checkpoint are trained again, and the run goes on. One more
    loss ends the run naming the last cause. A learner moved off a node drained for preemption (it checkpoints
    first, nothing is lost) does not count. 0: the first loss ends the run."""
    hang_timeout_s: float = Field(120.0, gt=0)
    """How long a live generator, learner rank or reward worker may go without answering before it counts as
    hung, is killed and is replaced like a dead one (the message names it). Generators and learner ranks answer
    a driver-side ping; a reward worker's chunk may take its rewards' timeout_s plus this. Long enough for the
    longest pause a healthy actor makes (a GIL-holding call, a swap storm)."""
    reward_chunk_groups: int = Field(1, ge=1)
    """Groups (prompts x num_generations completions) per scoring chunk sent to one reward worker."""
    generator: GeneratorResources = GeneratorResources()
    """Resources of each generator actor."""
    learner: LearnerResources = LearnerResources()
    """Resources of the learner actor (of each rank, with num_learners > 1)."""
    reward_worker: RewardWorkerResources = RewardWorkerResources()
    """Resources of each reward worker actor."""
    num_env_workers: int = Field(2, ge=1)
    """With tools or environment_factory: environment worker actors at start (they hold the trajectories'
    environments and run the tools; scale later with `rayward scale --env-workers`); with env_autoscale,
    clamped to its bounds."""
    env_autoscale: EnvAutoscaleConfig | None = None
    """Let the environment pool size itself between min_workers and max_workers from its load (docs/agents.md).
    null: a fixed pool of num_env_workers."""
    env_worker: EnvWorkerResources = EnvWorkerResources()
    """Resources of each environment worker actor (`resources` can place them on CPU nodes of their own)."""

    @model_validator(mode="after")
    def _learners(self) -> ClusterConfig:
        if self.num_learners > 1 and self.learner_strategy == "single":
            raise ValueError(
                f"learner_strategy 'single' runs one learner; num_learners ({self.num_learners}) > 1 needs "
                "learner_strategy: fsdp"
            )
        lr = self.learner
        if self.learner_strategy == "fsdp" and not (lr.num_cpus or lr.num_gpus or any(lr.resources.values())):
            raise ValueError(
                "learner: FSDP ranks are placed by a placement group, whose bundles need a positive amount: "
                "set learner.num_cpus or learner.num_gpus above 0"
            )
        if self.learner_placement == "spread" and self.num_learners < 2:
            raise ValueError(
                "learner_placement 'spread' puts each learner rank on its own node: it needs num_learners >= 2 "
                "(with learner_strategy: fsdp)"
            )
        if self.num_learners > 1 and 0 < self.learner.num_gpus < 1:
            raise ValueError(
                f"learner.num_gpus ({self.learner.num_gpus}): FSDP ranks need a whole GPU each (NCCL runs one "
                "rank per GPU)"
            )
        return self


class LoopConfig(_Section):
    mode: Literal["sync", "pipelined"] = "sync"
    """`sync`: generate -> score -> train -> sync, one step at a time (the reference). `pipelined`: the next
    batches are generated and scored (each group as soon as its completions exist) while the learner trains."""
    max_staleness: int = Field(1, ge=0)
    """Pipelined: how many optimizer steps older than the learner the generating policy may be; also how many
    batches are generated ahead. 0 = strictly on-policy (same accounting as `sync`). Samples older than this
    are never trained on; the vLLM importance-sampling correction covers the staleness allowed."""
    generation_chunks: int = Field(1, ge=1)
    """Pipelined: generator calls per generator per step. Finished groups stream to the reward pool either way;
    more than 1 only splits a generator's share into separate engine batches (slower on small models)."""


# Weight-sync bucket: the first bucket is on the wire alone and the last one loads alone, so smaller buckets
# overlap the wire with vLLM's load more finely, until per-bucket costs win; 64 MiB was the fastest of the sizes
# tried (bench/README.md, bench/weight_sync.py). On NCCL a 64 MiB broadcast is still far above the size where
# launch latency matters.
DEFAULT_BUCKET_MB = 64.0


class WeightSyncConfig(_Section):
    backend: Literal["collective", "object_store"] = "collective"
    """`collective`: the learner's rank 0 broadcasts the weights bucket by bucket to every engine worker (every
    tensor-parallel rank) over a process group (NCCL on GPUs, gloo on CPU), each worker loading each bucket in
    place as it arrives. `object_store`: the whole state dict as safetensors bytes through Ray's object store
    (slower, more memory; for clusters whose generator nodes cannot open TCP connections to the learner's node)."""
    bucket_mb: float = Field(DEFAULT_BUCKET_MB, gt=0)
    """Collective: bucket size in MiB. The learner holds at most two buckets beyond the model (one on the wire, one
    being packed); an engine holds two buckets plus what vLLM's layerwise reload needs for the layer being loaded
    (that layer afresh and, on CPU, its repacked copy: with a large embedding, more than a bucket). Smaller buckets
    overlap the wire and the engine's load more finely, larger ones mean fewer collectives."""
    timeout_s: float = Field(600.0, gt=0)
    """Collective: seconds any member waits for the others (forming the group, each bucket) before the sync
    fails naming the stage and the engine. It must cover a generation already queued on a generator ahead of
    the sync in pipelined mode."""


class LoggingConfig(_Section):
    dir: str = "runs"
    """Root directory; each run writes metrics.jsonl (and checkpoints) under `<dir>/<run name>/`."""
    report_to: list[Literal["jsonl", "tensorboard", "wandb", "mlflow"]] = ["jsonl"]
    """Metric sinks. jsonl is always useful; the others need their package installed."""
    progress: bool = True
    """Print one progress line per step on the driver."""
    check_logprob_parity: bool = True
    """After the first weight sync, compare generator and learner logprobs of a fixed sequence and print the
    max abs difference (the alarm for a broken sync); above `max_logprob_parity_gap` the run stops."""
    max_logprob_parity_gap: float | None = Field(None, gt=0)
    """The largest generator-learner logprob gap (nats, max over the parity sequence's tokens) the run starts
    with; above it the run stops before its first step, saying what the gap means. None: 1e-3 in float32 (the
    same weights in vLLM and torch differ by ~1e-5: more is a sync that did not land, or an engine that computes
    another function), 0.5 in bfloat16/float16 (every layer rounds to 8 or 11 bits)."""
    log_completions: bool = True
    """Write every trained sample to `<dir>/<run name>/completions.jsonl` (TRL's name): step, prompt, completion,
    each reward raw and gated, total, advantage, and the reward functions' log_extra columns."""


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


class DistillationConfig(_Section):
    """On-policy distillation: a teacher on engines of its own scores every token the student samples (its
    log-prob of the token), and the learner pulls the student towards it on those tokens, beside the rewards
    (actors/learner/distill.py; docs/rewards.md "Distillation teachers")."""

    teacher: str = Field(validation_alias=AliasChoices("teacher", "teacher_model_name_or_path"))
    """The teacher: an HF path or hub id of a causal LM (or `tiny-teacher`, the offline tiny teacher of the letter
    task) whose tokenizer is the policy's (the run refuses to start otherwise: its log-probs are of the student's
    token ids). Also accepted as TRL's `teacher_model_name_or_path`."""
    mode: Literal["advantage", "loss"] = "advantage"
    """`advantage` (slime's OPD, Thinking Machines' on-policy distillation): each sampled token's GRPO advantage
    minus `coef` x (log p_student - log p_teacher), trained by the GRPO surrogate. `loss` (TRL's
    ServerDistillationTrainer): `coef` x the reverse KL on the {sampled token, tail} support added to the loss,
    a token mean over the step's model tokens; its gradient is scaled by the student's probability of the token,
    so it moves a student far from the teacher slowly."""
    coef: float = Field(1.0, gt=0)
    """The teacher's weight beside the rewards (slime's `--opd-kl-coef`). To distil only, give every reward
    weight 0."""
    beta: float = 1.0
    """`loss` mode, TRL's generalised-JSD interpolation; 1: the reverse KL(student || teacher), the only one a
    teacher serving log-probs of the sampled tokens supports (TRL's server path with beta > 0 is top-1 too)."""
    loss_top_k: int = 1
    """`loss` mode, TRL's support size; 1 (the sampled token), as TRL requires for beta > 0."""
    loss_add_tail: bool = True
    """`loss` mode, TRL's tail bucket: the support is {sampled token, every other token}; without it a one-token
    support normalises to probability 1 for both models and the term is always 0, so it stays on."""
    reverse_kl_top_1_mode: Literal["sampled"] = "sampled"
    """`loss` mode, TRL's top-1 token for the reverse KL: the student's sampled token (`argmax` needs the teacher's
    distribution, which TRL's server path refuses too)."""
    timeout_s: float = Field(120.0, gt=0)
    """Per sample: a teacher answer later than this leaves the sample out of the distillation term (counted as
    `distill/teacher_failures`); its rewards and advantage are unchanged."""
    engines: EnginesConfig = EnginesConfig()
    """The teacher's engine pool, `<run>/teacher-pool`."""

    @model_validator(mode="after")
    def _served(self) -> DistillationConfig:
        if self.beta != 1.0:
            raise ValueError(f"beta {self.beta}: only 1 (reverse KL) is served: the teacher returns the log-prob of "
                             "each sampled token, not its distribution (forward KL and JSD need the latter)")
        if self.loss_top_k != 1:
            raise ValueError(f"loss_top_k {self.loss_top_k}: only 1 (the sampled token), as TRL for beta > 0")
        if not self.loss_add_tail:
            raise ValueError("loss_add_tail false: on a one-token support the term is always 0 (TRL's note); "
                             "leave it true")
        return self


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
    grpo: GRPOConfig = GRPOConfig()
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
        return self

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
                raise ValueError("environment_factory: an empty mapping; give `module:Class`, or name -> `module:Class`")
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


def _gate_cycle(edges: dict[str, str]) -> list[str] | None:
    """A cycle in the gated -> gating graph (each reward has at most one gate), or None."""
    for start in edges:
        seen, node = [start], edges[start]
        while node in edges:
            if node in seen:
                return seen[seen.index(node) :] + [node]
            seen.append(node)
            node = edges[node]
    return None


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------


class ConfigError(ValueError):
    """A config that cannot run; the message names every bad field path."""


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"  {loc or '<root>'}: {msg}")
    return "invalid config:\n" + "\n".join(lines)


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted `key.sub=value` overrides (values parsed as YAML; list items by index: rewards.0.weight=2;
    the index one past the end appends: rewards.1={name: x, function: m:f})."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"override {key!r}: its value is not YAML ({str(err).splitlines()[0]}); quote a "
                              f"string that starts with {{, [ or a quote: {key}=\"'{raw}'\"") from None
        node: Any = tree
        parts = key.split(".")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) > len(node):
                    raise ConfigError(f"override {key!r}: {'.'.join(parts[:i]) or '<root>'} has no item {part!r}")
                if int(part) == len(node):  # one past the end appends (e.g. add a reward from the CLI)
                    node.append(value if last else {})
                    node = node if last else node[-1]
                    continue
                if last:
                    node[int(part)] = value
                else:
                    node = node[int(part)]
            elif isinstance(node, dict):
                if last:
                    node[part] = value
                else:
                    node = node.setdefault(part, {})
            else:
                raise ConfigError(f"override {key!r}: {'.'.join(parts[:i])} is a value, not a section")
    return tree


def parse_config(tree: dict[str, Any]) -> RunConfig:
    """Validate a config mapping; raises ConfigError naming each bad field."""
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config (or start from defaults when path is None) and apply dotted overrides."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            tree = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{p}: not valid YAML: {err}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
    return parse_config(apply_overrides(tree, list(overrides or [])))


def config_reference(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted field, default, docstring) for every field: docs/config.md is generated from it."""
    rows = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        sub = ann if isinstance(ann, type) and issubclass(ann, _Section) else None
        if sub is not None:
            rows.extend(config_reference(sub, f"{prefix}{name}."))
            continue
        union = typing.get_origin(ann) in (typing.Union, types.UnionType)
        optional = [a for a in typing.get_args(ann) if isinstance(a, type) and issubclass(a, _Section)] if union else []
        if optional:  # an optional section (`eval`): its own row (off by default), then its fields
            rows.append((f"{prefix}{name}", repr(field.get_default()), (field.description or "").replace("\n", " ")))
            rows.extend(config_reference(optional[0], f"{prefix}{name}."))
            continue
        if name == "rewards" and model is RunConfig:
            rows.append((f"{prefix}rewards", repr(field.get_default()), (field.description or "").replace("\n", " ")))
            rows.extend(config_reference(RewardConfig, f"{prefix}rewards[]."))
            continue
        default = "(required)" if field.is_required() else repr(field.get_default(call_default_factory=True))
        rows.append((f"{prefix}{name}", default, (field.description or "").replace("\n", " ")))
    return rows
