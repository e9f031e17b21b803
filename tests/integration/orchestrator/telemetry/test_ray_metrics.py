"""The Ray metrics exporter inside a real Ray session."""

from __future__ import annotations

from orchestrator.telemetry.ray_metrics import RayMetricsExporter


class FreshExporter(RayMetricsExporter):
    _gauges: dict = {}  # this test's own gauge cache (other tests' runs export in the same process)
    _warned: set = set()


def test_exporter_sets_numbers_and_skips_the_rest(ray_cluster):
    FreshExporter("unit").export(1, {"reward": 1.0, "time/generate": "not a number", "kl": None})
    assert set(FreshExporter._gauges) == {"rayward_reward", "rayward_global_step"}
    assert not FreshExporter._warned  # nothing failed


class FreshEvalExporter(RayMetricsExporter):
    _gauges: dict = {}
    _warned: set = set()


def test_an_eval_sets_the_eval_gauges_and_leaves_the_step_alone(ray_cluster):
    FreshEvalExporter("unit").export(
        10, {"eval/reward": 0.4, "eval/pass@4": 0.5, "eval/rewards/letter/mean": 0.4, "eval/policy_version": 10},
        with_step=False,
    )
    assert set(FreshEvalExporter._gauges) == {
        "rayward_eval_reward", "rayward_eval_pass_at", "rayward_eval_reward_fn_mean", "rayward_eval_policy_version"}
    assert not FreshEvalExporter._warned
