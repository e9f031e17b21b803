"""The two reward functions of the TRL-vs-rayward benchmark, in TRL's reward-function signature.

* `letter_fraction` (cheap, pure Python): rayward's built-in toy reward, re-exported unchanged.
* `sandbox_reward` (latency-bound): what a user writes around a code-sandbox or remote-judge call, a plain
  sync function that blocks ~50 ms per completion it is given (`time.sleep`, no CPU). TRL calls it once with
  the whole generation batch (and sync reward functions one after the other), so it loops over all of them;
  rayward calls it once per completion by default and gets its concurrency from the reward workers' threads
  and the number of workers. Same function, same per-sample cost in both.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.tasks.letters import _text, letter_fraction

SANDBOX_LATENCY_S = 0.05  # one "sandbox round trip" per completion

__all__ = ["SANDBOX_LATENCY_S", "letter_fraction", "sandbox_reward"]


def sandbox_reward(completions: list[Any], letter: list[str] | None = None, **kwargs: Any) -> list[float]:
    """1.0 if the completion contains the requested letter, else 0.0, after a 50 ms blocking call per completion."""
    out = []
    for i, c in enumerate(completions):
        time.sleep(SANDBOX_LATENCY_S)  # the sandbox round trip: blocks this thread, uses no CPU
        want = letter[i] if letter else ""
        out.append(1.0 if want and want in _text(c) else 0.0)
    return out
