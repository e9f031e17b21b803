"""One train step's context, and the step's numbers: what `Learner.train_step` holds while it runs a
generation batch through its micro-batches (`StepContext`), each micro-batch's loss mask, and the metrics it
returns.

Metric values are kept per micro-batch (`StepContext.sums`) and reduced once at the end over every rank's
micro-batches (actors/learner/distributed.py): means, and the extremes of the `_max` / `_min` names.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import Tensor

from actors.learner.distributed import gather_metrics, sum_over_ranks
from actors.learner.layout import Packed, Padded
from actors.learner.loss import LossInputs
from actors.learner.micro_batches import MicroBatchPlan, Slot
from actors.types import TrainBatch


@dataclass
class StepContext:
    """What one train_step's slots share: the batch, this rank's plan, each micro-batch's rows and loss mask,
    the terms frozen at the first pass, the routes replayed (routing replay), and the metric values so far."""

    batch: TrainBatch
    plan: MicroBatchPlan
    rows: dict[int, Packed | Padded]  # this rank's micro-batches, laid out for the forward
    masks: list[Tensor]  # [B, T] loss tokens of every micro-batch (the step's normalisers count them all)
    num_items: Tensor  # loss tokens in the whole generation batch (the dapo / cispo normaliser)
    frozen: list[LossInputs | None]  # each real slot's loss inputs bar the live logp, from the first pass
    routes: dict[int, Tensor | None] = field(default_factory=dict)  # micro-batch -> routes it replays
    sums: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # metric -> values
    recorded: dict[int, list[float]] = field(default_factory=dict)  # batch.record's rows: first-pass log-probs

    def samples(self, slot: Slot) -> list[int]:
        """The batch rows of the slot's micro-batch."""
        return self.plan.micro_batches[slot.micro_batch]

    def add(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.sums[k].append(v)

    def add_tensors(self, metrics: dict[str, Tensor]) -> None:
        """The loss's metrics; NaN (no value in this micro-batch) left out."""
        for k, v in metrics.items():
            if not torch.isnan(v):
                self.sums[k].append(v.item())


def loss_mask(batch: TrainBatch, idx: list[int], mask_truncated: bool, device: torch.device) -> Tensor:
    """[B, T] for the rows `idx` (T = their longest completion): 1 on each completion's tokens the model
    sampled (TrainBatch.completion_mask; every token without one), 0 on the rest; all 0 for a truncated
    completion with `mask_truncated` (mask_truncated_completions)."""
    lens = [len(batch.completion_ids[i]) for i in idx]
    m = torch.zeros(len(idx), max(max(lens), 1))
    for r, (i, ln) in enumerate(zip(idx, lens, strict=True)):
        if mask_truncated and batch.truncated[i]:
            continue
        m[r, :ln] = 1.0 if batch.completion_mask is None else torch.tensor(batch.completion_mask[i])
    return m.to(device)


def step_metrics(
    sums: dict[str, list[float]], losses: list[float], norms: list[float], world_size: int
) -> dict[str, float]:
    """The step's metrics from every rank's per-micro-batch values: means, and the extremes of `_max` / `_min`
    names. loss: per optimizer step, the sum of its micro-batch losses (over ranks); grad_norm: already global
    (the norm of the full gradient)."""
    sums = gather_metrics(sums, world_size)
    sums["loss"] = sum_over_ranks(losses, world_size)
    sums["grad_norm"] = norms
    extreme = ("_max", "_min")
    out = {k: sum(v) / len(v) for k, v in sums.items() if v and not k.endswith(extreme)}
    out.update({k: (max if k.endswith("_max") else min)(v)
                for k, v in sums.items() if v and k.endswith(extreme)})
    return out


def throughput_metrics(ctx: StepContext, num_iterations: int, world_size: int, compute_s: float
                       ) -> dict[str, float]:
    """learner/tokens_per_s: the batch's prompt + completion tokens, once per optimizer step, per second of
    train_step; learner/padding_frac: the pad share of the positions the policy forwards computed (every
    rank's real micro-batches); learner/micro_batches: micro-batches in the step (all ranks)."""
    batch = ctx.batch
    real = sum(len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids, strict=True))
    mine = [ctx.rows[slot.micro_batch] for slot in ctx.plan.slots if not slot.padding]
    counted, positions = sum_over_ranks(
        [float(sum(r.real_tokens for r in mine)), float(sum(r.positions for r in mine))], world_size
    )
    return {
        "learner/tokens_per_s": real * num_iterations / compute_s,
        "learner/padding_frac": 1.0 - counted / positions if positions else 0.0,
        "learner/micro_batches": float(ctx.plan.grad_accum_steps),
    }
