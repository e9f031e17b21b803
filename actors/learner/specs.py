"""What the driver hands the learner at construction: frozen records, built once from the run config
(orchestrator/run/build.py: learner_spec) and pickled to every learner rank.

Plain dataclasses of this package's own types, so unpickling them imports nothing of the driver. Field names
follow TRL's GRPOConfig and PEFT's LoraConfig where the meaning is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.learner.loss import LossConfig

STRATEGIES = ("single", "fsdp")


@dataclass(frozen=True)
class ModelSpec:
    """The policy: which weights, in which dtype, trained how."""

    name_or_path: str  # an HF model directory (or hub id) that every learner rank can read
    dtype: str = "float32"  # a torch dtype name; under FSDP the masters stay float32 and compute runs in it
    trust_remote_code: bool = False
    gradient_checkpointing: bool = True  # TRL's default
    gradient_checkpointing_kwargs: dict[str, Any] | None = None  # torch.utils.checkpoint arguments (TRL's name)
    lora: dict[str, Any] | None = None  # PEFT LoraConfig keyword arguments; None: train every weight
    attn_implementation: str | None = None  # transformers' name; None: its default for the model (sdpa or eager)
    processor_kwargs: dict[str, Any] | None = None  # a vision-language model's processor settings (image sizes)


@dataclass(frozen=True)
class OptimSpec:
    """The optimizer and its learning-rate schedule (transformers' names)."""

    optim: str = "adamw_torch"  # or "sgd"
    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    lr_scheduler_type: str = "constant"  # "constant", "linear" or "cosine", after warmup_steps
    warmup_steps: int = 0
    max_steps: int = 1  # optimizer steps of the whole run: the schedule's length
    max_grad_norm: float | None = 1.0  # None: no clipping (the norm is still reported)


@dataclass(frozen=True)
class StepSpec:
    """How one train_step consumes a generation batch."""

    micro_batch_size: int = 8  # completions per forward and backward (TRL's per_device_train_batch_size)
    num_iterations: int = 1  # optimizer steps per batch, old / ref / IS terms frozen at the first (TRL's)
    mask_truncated_completions: bool = False  # completions cut at max_completion_length add no loss tokens
    # Samples packed into rows with no pad (actors/learner/layout.py): True, or None = where the model computes
    # packed rows correctly (padded elsewhere); False: TRL's padded layout.
    padding_free: bool | None = None
    # Micro-batches as token-budget bins of at most this many positions (actors/learner/micro_batches.py), in
    # place of micro_batch_size rows; None: micro_batch_size rows.
    max_tokens_per_microbatch: int | None = None
    # Mixture-of-experts policies (actors/learner/routing.py): "R3" replays the engine's routes (TrainBatch.routes),
    # "R2" the learner's own first-pass routing; None: each forward routes itself.
    router_replay: str | None = None
    # The load-balancing auxiliary loss's weight (TRL's rule: None = the model config's; 0: off).
    router_aux_loss_coef: float | None = None


@dataclass(frozen=True)
class LearnerSpec:
    """Everything a learner rank is built from, except its place among the ranks (ParallelSpec)."""

    model: ModelSpec
    optim: OptimSpec = OptimSpec()
    loss: LossConfig = LossConfig()
    step: StepSpec = StepSpec()
    seed: int = 0  # torch and the micro-batch shuffle (every rank alike)
    device: str | None = None  # "cpu" or "cuda"; None: CUDA when there is one


@dataclass(frozen=True)
class ParallelSpec:
    """This rank's place: strategy "single" (one device, no process group) or "fsdp" (rank `rank` of `world_size`
    joins the process group at `init_method`, tcp://host:port of rank 0, optional for one rank)."""

    strategy: str = "single"
    rank: int = 0
    world_size: int = 1
    init_method: str | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r} (have {STRATEGIES})")
        if self.strategy == "single" and self.world_size != 1:
            raise ValueError(f"strategy 'single' runs one rank, not world_size={self.world_size}")

    @property
    def sharded(self) -> bool:
        return self.strategy == "fsdp"
