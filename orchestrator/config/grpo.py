"""`grpo:` the GRPO update in the learner (TRL's GRPOConfig names where the meaning is the same)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from orchestrator.config.base import _Section


class GRPOSection(_Section):
    """The `grpo:` section (named apart from TRL's GRPOConfig, which `rayward.GRPOConfig` is: its fields map onto
    several sections, orchestrator/trl/args.py)."""

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
    def _consistent(self) -> GRPOSection:
        if self.warmup_steps >= self.max_steps and self.warmup_steps > 0:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below max_steps ({self.max_steps})")
        if self.max_steps % self.num_iterations:
            raise ValueError(
                f"max_steps ({self.max_steps}) must be a multiple of num_iterations ({self.num_iterations}): "
                "each generation batch is trained on num_iterations times"
            )
        return self
