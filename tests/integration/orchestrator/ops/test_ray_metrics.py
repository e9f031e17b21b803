"""The Ray metrics exporter inside a real Ray session."""

from __future__ import annotations

from orchestrator.ops.ray_metrics import RayMetricsExporter


class FreshExporter(RayMetricsExporter):
    _gauges: dict = {}  # this test's own gauge cache (other tests' runs export in the same process)
    _warned: set = set()


def test_exporter_sets_numbers_and_skips_the_rest(ray_cluster):
    FreshExporter("unit").export(1, {"reward": 1.0, "time/generate": "not a number", "kl": None})
    assert set(FreshExporter._gauges) == {"rayward_reward", "rayward_global_step"}
    assert not FreshExporter._warned  # nothing failed
