"""On-policy distillation's input to the loss: the teacher's log-probs of each micro-batch's completion
tokens, laid out as the policy's (`LossInputs.teacher_logp`; the terms themselves are
actors/learner/distill.py's). One part, chosen when the learner is built (`teacher_part`): `Teacher` where the
run distills (`distill_coef`), `NoTeacher` otherwise; both answer `logps(batch, idx, like)`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from actors.learner.loss import LossConfig
from actors.types import TrainBatch


class NoTeacher:
    """No distillation: the loss gets no teacher term."""

    def logps(self, batch: TrainBatch, idx: list[int], like: Tensor) -> Tensor | None:
        return None


class Teacher:
    """The teacher's log-probs, as the teacher pool scored the batch (TrainBatch.teacher_logprobs)."""

    def logps(self, batch: TrainBatch, idx: list[int], like: Tensor) -> Tensor | None:
        """[B, T] the teacher's log-probs of micro-batch rows `idx`, laid out as the policy's (`like`): NaN
        past a row's completion and on a row the teacher gave none. None for a batch that carries none (the
        loss then names what it lacks)."""
        if batch.teacher_logprobs is None:
            return None
        out = torch.full_like(like, float("nan"), requires_grad=False)
        for r, i in enumerate(idx):
            lp = batch.teacher_logprobs[i]
            if lp:
                out[r, : len(lp)] = torch.tensor(lp, dtype=out.dtype)
        return out


def teacher_part(cfg: LossConfig) -> NoTeacher | Teacher:
    """The part for the run's loss: a teacher where distill_coef is set (the loss reads its log-probs only
    then)."""
    return Teacher() if cfg.distill_coef != 0.0 else NoTeacher()
