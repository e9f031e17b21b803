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


def test_an_eval_is_a_row_of_its_own_with_a_progress_line(tmp_path, capsys):
    log = MetricsLogger(tmp_path, report_to=["jsonl", "tensorboard"], progress=True, max_steps=40)
    log.log(10, {"reward": 0.5})
    log.log_eval(10, {"eval/reward": 0.25, "eval/rewards/letter/mean": 0.25, "eval/pass@1": 0.1,
                      "eval/pass@4": float("nan"), "eval/mean_length": 16.0, "eval/prompts": 256,
                      "eval/policy_version": 10, "eval/seconds": 1.25})
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["step"] == 10 and rows[1]["eval/reward"] == 0.25 and rows[1]["eval/pass@4"] is None
    assert log.history == rows
    line = capsys.readouterr().out.splitlines()[-1]
    assert line == ("eval   10/40 | reward 0.25 | letter/mean 0.25 | pass@1 0.1 | mean_length 16 | prompts 256 "
                    "| time 1.25s"), line
