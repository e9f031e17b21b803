"""Metric sinks, the completions log, the phase timer, reading a run directory back."""

from __future__ import annotations

import json

import pytest

from orchestrator.telemetry.metrics import (
    MetricsLogger,
    PhaseTimer,
    completions_table,
    find_run_dir,
    read_jsonl,
)


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


def test_completions_log_and_the_wandb_table_columns(tmp_path):
    """The driver sends rows without their completions; the writer reads each from its group's payload (a chat
    prompt's as one assistant message) and returns the table's rows as written."""
    from actors.payloads import group_out, keep
    from actors.runtime.completions import CompletionsWriter
    from actors.types import Sample

    chat = [{"role": "user", "content": "hi"}]
    sent = [
        {"step": 1, "policy_version": 0, "prompt": chat, "completion": None, "total": 1.5, "advantage": 0.7,
         "rewards/a": 1.0, "gated/a": 1.0, "rewards/b": None, "gated/b": 0.0, "judge_note": "fine"},
        {"step": 1, "policy_version": 0, "prompt": chat, "completion": None, "total": 0.5, "advantage": -0.7,
         "rewards/a": 0.0, "gated/a": 0.0, "rewards/b": None, "gated/b": 0.0, "judge_note": "meh"},
    ]
    payload = group_out(0, [Sample([1], [-0.1], "yo", "stop"), Sample([2], [-0.2], "no", "stop")], keep).payload
    table = CompletionsWriter(tmp_path).write("completions.jsonl", sent, [payload], 2, table_rows=1)
    rows = [json.loads(x) for x in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [r["completion"] for r in rows] == [[{"role": "assistant", "content": "yo"}],
                                               [{"role": "assistant", "content": "no"}]]
    assert rows[0] == {**sent[0], "completion": [{"role": "assistant", "content": "yo"}]} and table == rows[:1]
    columns, data = completions_table(table)
    # TRL's GRPOTrainer table: step, prompt, completion, rewards by name, log_extra columns, advantage
    assert columns == ["step", "prompt", "completion", "a", "b", "judge_note", "advantage", "total", "policy_version"]
    assert data == [[1, "user: hi", "assistant: yo", 1.0, None, "fine", 0.7, 1.5, 0]]
    log = MetricsLogger(tmp_path / "plain", report_to=["jsonl"], progress=False, max_steps=2)
    assert log.table_rows == 0  # no tracker takes tables: the writer returns none
    log.close()


def test_find_run_dir_by_path_or_name(tmp_path):
    run = tmp_path / "runs" / "demo"
    MetricsLogger(run, report_to=["jsonl"], progress=False, max_steps=1).log(1, {"reward": 0.1})
    assert find_run_dir(str(run)) == run
    assert find_run_dir("demo", str(tmp_path / "runs")) == run
    with pytest.raises(FileNotFoundError, match="no run 'other'"):
        find_run_dir("other", str(tmp_path / "runs"))
    (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text() + '{"step": 2, "rew')  # being written
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1]
