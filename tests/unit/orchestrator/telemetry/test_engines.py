"""The engines' per-step metrics from their stream items' counters (orchestrator/telemetry/engines.py)."""

from __future__ import annotations

import pytest

from actors.types import EngineCounters
from orchestrator.telemetry.engines import EngineMeter


def test_a_step_reports_the_differences_since_the_last_over_the_engines_heard_from():
    meter = EngineMeter()
    meter.observe(0, EngineCounters(steps=10, running=80, busy_s=2.0))
    meter.observe(1, EngineCounters(steps=10, running=20, busy_s=1.0))
    meter.observe(0, None)  # a generator that keeps no counters
    m = meter.step_metrics(wall_s=5.0, engines=2)
    assert m["generators/occupancy"] == pytest.approx(100 / 20)
    assert m["generators/busy"] == pytest.approx(3.0 / 10.0)
    assert m["generators/tokens_per_s_per_engine"] == pytest.approx(100 / 10)
    # the next step: only what changed since; an engine restarted (its counters back to small) counts from zero
    meter.observe(0, EngineCounters(steps=14, running=96, busy_s=2.5))
    meter.observe(1, EngineCounters(steps=3, running=3, busy_s=0.2))
    m = meter.step_metrics(wall_s=1.0, engines=2)
    assert m["generators/occupancy"] == pytest.approx((16 + 3) / (4 + 3))
    assert m["generators/busy"] == pytest.approx(0.7 / 2)
    assert meter.step_metrics(wall_s=1.0, engines=2) == {}  # nothing heard: nothing said (the sync loop)
