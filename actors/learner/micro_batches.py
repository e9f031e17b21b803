"""Which rows of a generation batch each learner rank trains on, micro-batch by micro-batch (pure).

Data parallelism keeps the single-rank numbers: every rank receives the whole batch, draws the same shuffle and cuts
the same micro-batches as one rank would, and takes a contiguous run of them (rank r of W, with M micro-batches:
[M*r/W, M*(r+1)/W)). A rank with fewer micro-batches than the others pads with zero-weight slots, so every rank runs
ceil(M / W) forwards and backwards: FSDP's all-gathers and reduce-scatters need every rank in every one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    """One forward and backward of a rank."""

    micro_batch: int  # index into MicroBatchPlan.micro_batches
    padding: bool  # a zero-weight rerun of a real micro-batch (its gradient is 0): it keeps the ranks in lockstep


@dataclass(frozen=True)
class MicroBatchPlan:
    """One train step's micro-batches (every rank's: the loss normalisers count them all) and this rank's slots."""

    micro_batches: list[list[int]]  # row indices of the batch, in the shuffled order, micro_batch_size at most each
    slots: list[Slot]  # this rank's, in order; the same number on every rank

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches in the whole step (all ranks): the loss's gradient-accumulation divisor."""
        return len(self.micro_batches)


def plan_micro_batches(
    n: int, micro_batch_size: int, rank: int, world_size: int, rng: random.Random
) -> MicroBatchPlan:
    """The plan for a batch of n rows; `rng` draws the shuffle (the same draw on every rank: seed it alike).
    TRL shuffles rows across groups before splitting them into micro-batches."""
    if micro_batch_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"plan_micro_batches: micro_batch_size {micro_batch_size}, rank {rank} of {world_size}")
    order = list(range(n))
    rng.shuffle(order)
    micro = [order[i : i + micro_batch_size] for i in range(0, n, micro_batch_size)]
    m = len(micro)
    lo, hi = m * rank // world_size, m * (rank + 1) // world_size
    per_rank = -(-m // world_size)
    slots = [Slot(j, padding=False) for j in range(lo, hi)]
    slots += [Slot(lo, padding=True)] * (per_rank - (hi - lo))  # lo < m whenever a rank pads
    return MicroBatchPlan(micro, slots)
