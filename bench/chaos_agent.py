"""The chaos run's endpoint agent (bench/chaos_profiles.py, the `agentic` profile's `agent` part): the box task's
OpenAI-SDK agent (orchestrator/builtin/tasks/box_agent.py) that now and then raises or hangs, as user code does."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from orchestrator.builtin.tasks.box_agent import box_agent

# Shares of trajectories whose agent raises (after its first request) or hangs past the run's trajectory_timeout_s.
RAISE_P = 0.02
HANG_P = 0.005
HANG_S = 3600.0


async def flaky_box_agent(client: Any, row: dict[str, Any], *, model: str) -> float:
    """box_agent, but RAISE_P of the time it raises after its first request and HANG_P of the time it never ends."""
    draw = random.random()
    if draw < HANG_P:
        await asyncio.sleep(HANG_S)
    if draw < HANG_P + RAISE_P:
        await client.chat.completions.create(model=model, messages=list(row["prompt"]), max_tokens=4)
        raise RuntimeError("flaky_box_agent: a failure the chaos run injects")
    return await box_agent(client, row, model=model)
