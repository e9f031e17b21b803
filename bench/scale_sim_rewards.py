"""The reward of bench/scale_sim.py, in TRL's reward-function signature: cheap, so the reward stage's time is
the pool's and the data plane's, not the function's. Its own module so the reward workers import nothing else
of the bench."""

from __future__ import annotations

from typing import Any


def length_reward(completions: list[Any], completion_ids: list[Any], **kwargs: Any) -> list[float]:
    """Shorter is better: 1 / (1 + tokens / 1000). It reads each sample's ids, as a verifier reads its
    answer."""
    return [1.0 / (1.0 + len(ids) / 1000.0) for ids in completion_ids]
