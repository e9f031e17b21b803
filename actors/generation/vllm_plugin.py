"""vLLM general plugin (entry point `vllm.general_plugins`): loaded by vLLM in every engine process.

It does nothing unless `RAYWARD_VLLM_SPIN_S` is set, which `actors.generation.generator.Generator` does for the
engines it starts, so other vLLM users in the same environment are untouched.

Why: vLLM's shared-memory message queue between the engine core and its worker process keeps readers
busy-spinning (`sched_yield`) for `busy_loop_s` = 1 s after every message before they park on a zmq
socket (`vllm/distributed/device_communicators/shm_broadcast.py`, `SpinCondition`, not configurable).
For a generator that is called once per RL step this burns most of a core for a second after every
`generate`, exactly when the learner and reward workers need that core (more CPU than the generation itself
on a small machine; bench/README.md has the numbers). While decoding, messages come every few milliseconds,
so a short spin window keeps the fast path; only the idle tail is cut.
"""

from __future__ import annotations

import os

SPIN_ENV = "RAYWARD_VLLM_SPIN_S"


def register() -> None:
    """Cap the shm-queue readers' busy-spin window at `$RAYWARD_VLLM_SPIN_S` seconds."""
    raw = os.environ.get(SPIN_ENV)
    if raw is None:
        return
    limit = float(raw)
    try:
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError:  # a vLLM without the spin condition has nothing to cap
        return
    if getattr(SpinCondition.wait, "_rayward_capped", False):
        return
    original = SpinCondition.wait

    def wait(self, timeout_ms: int | None = None) -> None:
        # Patched on the class, so queues created before the plugin loaded are capped too.
        if getattr(self, "busy_loop_s", 0) > limit:
            self.busy_loop_s = limit
        return original(self, timeout_ms)

    wait._rayward_capped = True  # type: ignore[attr-defined]
    wait._rayward_original = original  # type: ignore[attr-defined]  # vLLM's own, for a test to start clean
    SpinCondition.wait = wait  # type: ignore[method-assign]
