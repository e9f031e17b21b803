"""Generator-learner logprob parity: the check that a weight sync really landed (after the first sync)."""

from __future__ import annotations

from typing import Any

from actors.runtime.group import GeneratorGroup, LearnerGroup

# A fixed sequence of ordinary tokens (ids above the tiny model's 3 specials, below any real vocab size).
PARITY_TOKENS = [5, 17, 42, 8, 99, 23, 61, 7, 150, 33, 12, 77]


def logprob_parity(
    learner: LearnerGroup, generators: GeneratorGroup, temperature: float, token_ids: list[int] | None = None,
    images: tuple[Any, ...] | None = None,
) -> float:
    """The max |logp_generator - logp_learner| over the tokens of a fixed sequence, taken over every generator.
    Call it after a sync: a partial or stale sync shows as a gap far above float noise. Engines that record
    routing (grpo.router_replay R3) hand theirs over and the learner replays each one, as training does: what is
    checked is the weights, not which side of a near-tied router each implementation falls. images: those the
    ids' placeholders stand for (a vision-language model: the check then covers the vision tower and projector)."""
    ids = token_ids or PARITY_TOKENS
    gaps = []
    for got, routes in generators.sequence_logprobs_and_routes(ids, temperature, images):
        # every rank (FSDP forwards are collectives); rank 0's answer
        want = learner.sequence_logprobs(ids, routes, images)
        gaps.append(max(abs(a - b) for a, b in zip(got, want, strict=True)))
    return max(gaps)
