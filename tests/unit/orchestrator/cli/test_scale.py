"""`rayward scale`'s client side (orchestrator/cli/scale.py): what it makes of the scale job's answer."""

from __future__ import annotations

import json
from dataclasses import asdict

from orchestrator.cli.scale import RESULT, _answer
from tests.fixtures.records import pool_stats


def test_a_reward_pools_answer_with_its_own_fields_is_read_as_the_pools_common_stats():
    """The job prints the pool's own record (a reward pool's carries global_step, which other pools lack): the client
    keeps the fields every pool has, instead of failing on the rest (the scenario through the dashboard did)."""
    record = asdict(pool_stats(workers=3, global_step=7))
    assert "global_step" in record
    log = f"starting\n{RESULT}{json.dumps(record)}\n"
    stats = _answer(log, "JobStatus.SUCCEEDED", "http://127.0.0.1:8265")
    assert stats.workers == 3 and stats.target_workers == 3 and not hasattr(stats, "global_step")
