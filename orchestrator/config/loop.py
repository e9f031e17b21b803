"""`loop:` the synchronous or the pipelined training loop."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.config.base import _Section


class LoopConfig(_Section):
    mode: Literal["sync", "pipelined"] = "sync"
    """`sync`: generate -> score -> train -> sync, one step at a time (the reference). `pipelined`: the next
    batches are generated and scored (each group as soon as its completions exist) while the learner trains."""
    max_staleness: int = Field(1, ge=0)
    """Pipelined: how many optimizer steps older than the learner the generating policy may be; also how many
    batches are generated ahead. 0 = strictly on-policy (same accounting as `sync`). Samples older than this
    are never trained on; the vLLM importance-sampling correction covers the staleness allowed."""
    generation_chunks: int = Field(1, ge=1)
    """Pipelined: generator calls per generator per step. Finished groups stream to the reward pool either way;
    more than 1 only splits a generator's share into separate engine batches (slower on small models)."""
