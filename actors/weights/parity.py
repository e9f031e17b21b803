"""Generator-learner logprob parity: the check that a weight sync really landed (after the first sync)."""

from __future__ import annotations

from actors.group import GeneratorGroup, LearnerGroup

# A fixed sequence of ordinary tokens (ids above the tiny model's 3 specials, below any real vocab size).
PARITY_TOKENS = [5, 17, 42, 8, 99, 23, 61, 7, 150, 33, 12, 77]


def logprob_parity(
    learner: LearnerGroup, generators: GeneratorGroup, temperature: float, token_ids: list[int] | None = None
) -> float:
    """The max |logp_generator - logp_learner| over the tokens of a fixed sequence, taken over every generator.
    Call it after a sync: a partial or stale sync shows as a gap far above float noise."""
    ids = token_ids or PARITY_TOKENS
    engines = generators.submit_sequence_logprobs(ids, temperature)
    want = learner.sequence_logprobs(ids)  # every rank (FSDP forwards are collectives); rank 0's answer
    return max(abs(a - b) for p in engines for a, b in zip(p.result(), want, strict=True))
