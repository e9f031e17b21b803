"""`distillation:` on-policy distillation from a teacher model."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, model_validator

from orchestrator.config.base import _Section
from orchestrator.config.rewards import EnginesConfig


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
