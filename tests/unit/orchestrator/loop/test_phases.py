"""The phases' pure parts (orchestrator/loop/phases.py): what a step logs about scoring its batch."""

from __future__ import annotations

from orchestrator.loop.phases import step_metrics
from tests.fixtures.records import rollouts, scores


def test_a_steps_metrics_count_each_lazily_gated_rewards_skipped_calls():
    s = scores(4)
    s.skipped = {"b": [True, False, True, True]}
    m = step_metrics(rollouts(2), s)
    assert m["rewards/b/skipped"] == 3 and "rewards/a/skipped" not in m  # a is not lazily gated
