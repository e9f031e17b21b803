"""Which rows of a generation batch each learner rank trains on, micro-batch by micro-batch (pure).

Two ways to cut a batch, both the same on every rank (every rank receives the whole batch and draws the same
shuffle):

* fixed size (`micro_batch_size` rows, TRL's per_device_train_batch_size): shuffle, cut in order; rank r of W,
  with M micro-batches, takes the contiguous run [M*r/W, M*(r+1)/W).
* token budget (`max_tokens`, grpo.max_tokens_per_microbatch): first-fit-decreasing bins, so a micro-batch's
  forward never holds more than `max_tokens` token positions; a row longer than the budget gets a bin of its own
  (`MicroBatchPlan.oversized`). A bin's size is what its forward holds: the sum of its rows' prompt + completion
  tokens packed (padding-free); rows x (longest prompt + longest completion) padded, pad included. The bins go
  to the ranks heaviest first, each to the least-loaded rank that still has room, so the ranks' token loads are
  balanced and their bin counts differ by at most one.

A rank with fewer micro-batches than the others pads with zero-weight slots, so every rank runs ceil(M / W)
forwards and backwards: FSDP's all-gathers and reduce-scatters need every rank in every one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Slot:
    """One forward and backward of a rank."""

    micro_batch: int  # index into MicroBatchPlan.micro_batches
    padding: bool  # a zero-weight rerun of a real micro-batch (its gradient is 0): it keeps the ranks in lockstep


@dataclass(frozen=True)
class MicroBatchPlan:
    """One train step's micro-batches (every rank's: the loss normalisers count them all) and this rank's slots."""

    micro_batches: list[list[int]]  # row indices of the batch, each row in exactly one
    slots: list[Slot]  # this rank's, in order; the same number on every rank
    oversized: list[int] = field(default_factory=list)  # rows longer than max_tokens (each alone in its bin)

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches in the whole step (all ranks): the loss's gradient-accumulation divisor."""
        return len(self.micro_batches)


@dataclass
class _Bin:
    """A token-budget bin being filled: its rows and what its forward would hold."""

    rows: list[int]
    tokens: int  # prompt + completion tokens of its rows
    prompt: int  # its longest prompt
    completion: int  # its longest completion

    def size(self, padded: bool) -> int:
        return len(self.rows) * (self.prompt + self.completion) if padded else self.tokens

    def plus(self, row: int, p: int, c: int) -> _Bin:
        return _Bin(self.rows + [row], self.tokens + p + c, max(self.prompt, p), max(self.completion, c))


def token_bins(
    sizes: Sequence[tuple[int, int]], order: list[int], max_tokens: int, padded: bool
) -> tuple[list[_Bin], list[int]]:
    """First-fit-decreasing bins of the rows `order` (rows of equal length keep their order in it) under a budget of
    `max_tokens` positions per bin (sizes[i]: row i's (prompt, completion) tokens; `padded`: a bin holds rows x
    its longest prompt + longest completion). Returns the bins (each's rows longest first) and the rows longer than
    the budget, each alone in a bin."""
    bins: list[_Bin] = []
    oversized = []
    for i in sorted(order, key=lambda i: -sum(sizes[i])):  # stable: ties in `order`'s order
        p, c = sizes[i]
        for k, b in enumerate(bins):
            grown = b.plus(i, p, c)
            if grown.size(padded) <= max_tokens:
                bins[k] = grown
                break
        else:
            bins.append(_Bin([i], p + c, p, c))
            if p + c > max_tokens:
                oversized.append(i)
    return bins, oversized


def balance(loads: list[int], world_size: int) -> list[list[int]]:
    """Bins (by index) for each rank: heaviest first, each to the least-loaded rank (lowest rank on ties) among
    those that may take one more, so every rank's count is within one of the others': floor(M / W) bins each, and
    M mod W ranks one more. (A cap of ceil(M / W) alone is not enough: one heavy bin then leaves its rank with one
    bin while the light ones fill the others, and that rank's padding slots rerun its heavy bin.)"""
    base, extra = divmod(len(loads), world_size)
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    totals = [0] * world_size

    def may_take(r: int) -> bool:
        return len(ranks[r]) < base or (len(ranks[r]) == base and sum(len(x) > base for x in ranks) < extra)

    for j in sorted(range(len(loads)), key=lambda j: -loads[j]):
        r = min(filter(may_take, range(world_size)), key=lambda r: (totals[r], r))
        ranks[r].append(j)
        totals[r] += loads[j]
    return ranks


def plan_micro_batches(
    sizes: Sequence[tuple[int, int]],
    micro_batch_size: int,
    rank: int,
    world_size: int,
    rng: random.Random,
    *,
    max_tokens: int | None = None,
    padded: bool = False,
) -> MicroBatchPlan:
    """The plan for a batch whose row i has sizes[i] = (prompt tokens, completion tokens). `rng` draws the shuffle
    (the same draw on every rank: seed it alike); TRL shuffles rows across groups before cutting micro-batches.
    max_tokens None: micro-batches of `micro_batch_size` rows; set: token-budget bins (micro_batch_size unused),
    sized as the forward lays them out (`padded`)."""
    if micro_batch_size < 1 or not 0 <= rank < world_size or (max_tokens is not None and max_tokens < 1):
        raise ValueError(
            f"plan_micro_batches: micro_batch_size {micro_batch_size}, max_tokens {max_tokens}, rank {rank} of "
            f"{world_size}"
        )
    order = list(range(len(sizes)))
    rng.shuffle(order)
    if max_tokens is None:
        micro = [order[i : i + micro_batch_size] for i in range(0, len(order), micro_batch_size)]
        m = len(micro)
        mine = list(range(m * rank // world_size, m * (rank + 1) // world_size))
        oversized: list[int] = []
    else:
        bins, oversized = token_bins(sizes, order, max_tokens, padded)
        micro = [b.rows for b in bins]
        mine = sorted(balance([b.size(padded) for b in bins], world_size)[rank])
    per_rank = -(-len(micro) // world_size)
    slots = [Slot(j, padding=False) for j in mine]
    slots += [Slot(mine[0] if mine else 0, padding=True)] * (per_rank - len(mine))
    return MicroBatchPlan(micro, slots, oversized)
