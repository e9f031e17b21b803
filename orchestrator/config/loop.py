"""`loop:` the synchronous or the pipelined training loop."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.config.base import _Section


class LoopConfig(_Section):
    mode: Literal["sync", "pipelined", "async"] = "sync"
    """`sync`: generate -> score -> train -> sync, one step at a time (the reference). `pipelined`: the next
    batches are generated and scored (each group as soon as its completions exist) while the learner trains.
    `async`: the generators never wait for a batch boundary: small calls keep them fed, the learner trains on the
    next scored groups, oldest first, and new weights load between engine steps while sequences run (each token
    keeps its version; docs/pipelined.md#async-generation)."""
    max_staleness: int = Field(1, ge=0)
    """Pipelined and async: how many optimizer steps older than the learner the generating policy may be; also
    how many batches are generated ahead. 0 = strictly on-policy (same accounting as `sync`). Samples older than
    this are never trained on (async: a group whose oldest token is older is dropped and counted); the vLLM
    importance-sampling correction covers the staleness allowed."""
    generation_chunks: int = Field(1, ge=1)
    """Pipelined and async: generator calls per generator per step (async: the size of each call of the feed,
    a step's prompts / generators / this). Finished groups stream to the reward pool either way;
    more than 1 only splits a generator's share into separate engine batches (slower on small models)."""

    @property
    def overlapped(self) -> bool:
        """Generation overlaps training (pipelined, async): evals queue beside training, the generators get their
        own cores, the learner sends weights while it trains."""
        return self.mode != "sync"
