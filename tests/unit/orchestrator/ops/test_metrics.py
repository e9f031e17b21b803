"""Metric sinks and the phase timer."""

from __future__ import annotations

import json

from orchestrator.ops.metrics import MetricsLogger, PhaseTimer


def test_metrics_sinks_write_jsonl_and_tensorboard(tmp_path):
    log = MetricsLogger(tmp_path, report_to=["jsonl", "tensorboard"], progress=False, max_steps=2)
    log.log(1, {"reward": 0.5, "rewards/a/mean": float("nan"), "gates/b<-a/closed_frac": 0.25})
    log.close()
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row == {"step": 1, "reward": 0.5, "rewards/a/mean": None, "gates/b<-a/closed_frac": 0.25}
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_phase_timer_accumulates_per_phase():
    t = PhaseTimer()
    for _ in range(2):
        with t("generate"):
            pass
    m = t.metrics()
    assert set(m) == {"time/generate", "time/step"} and 0 <= m["time/generate"] <= m["time/step"]
