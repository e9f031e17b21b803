"""Whether the learner packs its micro-batches (grpo.padding_free), chosen once when it is built: where the
architecture and attention implementation compute packed rows as separate samples (layout.packing_refusal) and
a probe at start-up agrees (its packed log-probs equal the padded layout's, on every rank).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from actors.learner.distributed import sum_over_ranks
from actors.learner.layout import Forward, Packed, Padded, packing_refusal
from actors.learner.model import eval_mode

logger = logging.getLogger("rayward.learner")

# The probe: three samples whose two short ones share a packed row (rows are capped at the padded layout's row
# length, 3 + 5), against the padded layout. A model that does not see where a packed row's samples start
# conditions the third sample on the second: its log-probs move by nats, not by rounding.
PROBE_PROMPTS = [[5, 17, 42], [8, 99], [23, 61]]
PROBE_COMPLETIONS = [[7, 150, 33, 12, 77], [12, 33], [77, 5]]
# The largest packed-vs-padded log-prob gap (nats) that is rounding: float32 adds in another order (1e-6 on
# the tiny model); bfloat16 / float16 round every layer's activations to 8 / 11 bits, which a deep model
# compounds.
PROBE_ATOL_FP32 = 1e-3
PROBE_ATOL_HALF = 0.25

# The learner's layout of the probe's samples: (prompts, completions, packed=) -> rows.
Layout = Callable[..., Packed | Padded]


def choose_packing(wanted: bool | None, model: torch.nn.Module, dtype: torch.dtype, probe: Callable[[], float]
                   ) -> bool:
    """Whether micro-batches are packed: not when `wanted` is False; else where the model (the transformers
    one, as built) computes packed rows as separate samples and the probe (`probe_gap`, bound to the learner)
    agrees. Where they do not: an error when `wanted` is True, padded with a warning when None."""
    if wanted is False:
        return False
    why = packing_refusal(model)
    if why is None:
        gap = probe()
        atol = PROBE_ATOL_FP32 if dtype == torch.float32 else PROBE_ATOL_HALF
        if not gap <= atol:
            why = (f"packed rows of {type(model).__name__} give log-probs {gap:.3g} nats away from the "
                   f"padded layout's (more than rounding, {atol:g}): its samples see each other")
    if why is None:
        return True
    if wanted:
        raise ValueError(f"grpo.padding_free: {why}; set grpo.padding_free=false (padded micro-batches)")
    logger.warning("grpo.padding_free: %s; training on padded micro-batches", why)
    return False


@torch.no_grad()
def probe_gap(model: torch.nn.Module, forward: Forward, layout: Layout, world_size: int) -> float:
    """The largest |packed - padded| log-prob of the probe's completion tokens (the worst over ranks), from
    the policy `model` in eval mode through the learner's `forward` and `layout`."""
    with eval_mode(model):
        want = forward(model, layout(PROBE_PROMPTS, PROBE_COMPLETIONS, packed=False), with_entropy=False)[0]
        got = forward(model, layout(PROBE_PROMPTS, PROBE_COMPLETIONS, packed=True), with_entropy=False)[0]
    mask = torch.zeros_like(want)
    for r, c in enumerate(PROBE_COMPLETIONS):
        mask[r, : len(c)] = 1
    gap = ((got - want).abs() * mask).max().item()
    return sum_over_ranks([gap], world_size, op="max")[0]
