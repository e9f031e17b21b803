"""Generator-learner logprob parity: the check that a weight sync really landed."""

from __future__ import annotations

from typing import Any

import ray

from orchestrator.loop import sync

# A fixed sequence of ordinary tokens (ids above the tiny model's 3 specials, below any real vocab size).
PARITY_TOKENS = [5, 17, 42, 8, 99, 23, 61, 7, 150, 33, 12, 77]


def logprob_parity(run: Any, token_ids: list[int] | None = None) -> float:
    """Sync weights learner -> generators, then return the max |logp_generator - logp_learner| over the
    tokens of a fixed sequence, taken over every generator."""
    ids = token_ids or PARITY_TOKENS
    sync(run)
    temperature = run.cfg.generation.temperature
    (learner,) = run.learner.handles
    ref = learner.sequence_logprobs.remote(ids)
    gens = [g.sequence_logprobs.remote(ids, temperature) for g in run.generators.handles]
    want, got = ray.get(ref), ray.get(gens)
    return max(abs(a - b) for g in got for a, b in zip(g, want, strict=True))
