"""Generator-learner logprob parity: the check that a weight sync really landed (after the first sync)."""

from __future__ import annotations

from typing import Any

import ray

# A fixed sequence of ordinary tokens (ids above the tiny model's 3 specials, below any real vocab size).
PARITY_TOKENS = [5, 17, 42, 8, 99, 23, 61, 7, 150, 33, 12, 77]


def logprob_parity(learner: Any, generators: list[Any], temperature: float, token_ids: list[int] | None = None) -> float:
    """The max |logp_generator - logp_learner| over the tokens of a fixed sequence, taken over every generator
    (learner: a handle whose `.sequence_logprobs.remote` answers; generators: actor handles). Call it after a
    sync: a partial or stale sync shows as a gap far above float noise."""
    ids = token_ids or PARITY_TOKENS
    ref = learner.sequence_logprobs.remote(ids)
    gens = [g.sequence_logprobs.remote(ids, temperature) for g in generators]
    want, got = ray.get(ref), ray.get(gens)
    return max(abs(a - b) for g in got for a, b in zip(g, want, strict=True))
