"""The run's terminal display: step lines off a terminal, the live bar on one, the summary table."""

from __future__ import annotations

import io
import re

from rich.console import Console

from orchestrator.telemetry.progress import (
    LiveBar,
    StepClock,
    StepLines,
    format_duration,
    open_display,
    summary_footer,
    summary_table,
)

ROW = {"reward": 0.25, "reward_std": 0.1, "loss": 0.01, "entropy": 3.5, "completions/mean_length": 12.0,
       "sampling/sampling_logp_difference/max": 1e-5, "time/generate": 0.11, "time/reward": 0.02, "time/step": 0.2}


def history(n: int) -> list[dict]:
    return [{"step": i, **ROW, "reward": 0.1 * i, "rewards/letter/mean": 0.1 * i, "kl": 0.01} for i in range(1, n + 1)]


def test_step_lines_off_a_terminal_keep_the_greppable_format():
    out = io.StringIO()
    d = StepLines(40, stream=out)
    d.start(0)
    d.step(3, ROW)
    d.message("rayward: hello")
    line, msg = out.getvalue().splitlines()
    assert re.match(r"^step +3/40 \| reward 0\.25 \| reward_std 0\.1 \| loss 0\.01 \| entropy 3\.5 \| "
                    r"mean_length 12 \| logp_gap 1e-05 \| time generate 0\.11s reward 0\.02s$", line), line
    assert msg == "rayward: hello"


def test_live_bar_shows_step_reward_pace_and_eta():
    out = io.StringIO()
    bar = LiveBar(10, console=Console(file=out, force_terminal=True, width=120, color_system=None))
    bar.start(0)
    for step in (1, 2, 3):
        bar.step(step, {**ROW, "reward": 0.5})
    bar.message("rayward: a generator died; waiting for Ray to restart it")
    bar.close()
    bar.close()  # idempotent (train() closes on every path)
    text = out.getvalue()
    last = [x for x in re.split(r"\r|\n", text) if "step " in x][-1]
    assert "step 3/10" in last and "reward 0.5" in last and "s/step" in last and "ETA 0:00:00" in last, last
    assert "rayward: a generator died" in text


def test_eta_from_recent_step_times():
    clock = StepClock(window=2)
    clock.start()
    clock._times.extend([10.0, 2.0, 4.0])  # the window keeps the last two
    assert clock.seconds_per_step == 3.0 and clock.eta(5) == 15.0
    assert format_duration(3725) == "1:02:05" and format_duration(None) == "-:--:--"


def test_displays_by_where_the_output_goes():
    assert type(open_display(True, 5, live=False)) is StepLines
    assert type(open_display(True, 5, live=True)) is LiveBar
    quiet = open_display(False, 5)
    assert type(quiet) not in (StepLines, LiveBar)


def test_summary_table_first_and_last_steps_and_the_run_files(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "actors.log").write_text("")
    out = io.StringIO()
    display = StepLines(12, stream=out)
    display.summary(summary_table(history(12), name="demo", elapsed_s=75),
                    summary_footer(tmp_path, tmp_path / "checkpoint-12"))
    text = out.getvalue()
    assert "rayward run 'demo': steps 1-12 in 0:01:15" in text
    reward = next(line for line in text.splitlines() if line.strip().startswith("reward "))
    assert reward.split()[1:] == ["0.3", "1"]  # mean of steps 1-5, of steps 8-12
    for key in ("rewards/letter/mean", "kl", "entropy", "completions/mean_length", "time/step", "time/generate"):
        assert key in text, key
    # long lines are not cut or wrapped by rich (off a terminal it assumes 80 columns)
    assert text.splitlines()[-3:] == [f"in {tmp_path}: metrics.jsonl, actors.log, checkpoint-12",
                                      f"see the samples: rayward samples {tmp_path}",
                                      f"plot the run:    rayward plot {tmp_path}"]


def test_summary_with_evals_between_the_steps_counts_steps_only():
    """Eval rows (one at step 0, then every 4 steps) sit between the step rows in the history: the span and the
    first/last windows are the steps'; the eval reward's columns are the first and the last eval."""
    rows = history(12)
    for at in (12, 8, 4, 0):
        rows.insert(at, {"step": at, "eval/reward": 0.1 * (at + 1)})
    out = io.StringIO()
    StepLines(12, stream=out).summary(summary_table(rows, name="demo", elapsed_s=75), [])
    text = out.getvalue()
    assert "rayward run 'demo': steps 1-12 in 0:01:15" in text
    reward = next(line for line in text.splitlines() if line.strip().startswith("reward "))
    assert reward.split()[1:] == ["0.3", "1"]  # still the mean of steps 1-5 and of steps 8-12
    evals = next(line for line in text.splitlines() if line.strip().startswith("eval/reward"))
    assert evals.split()[-2:] == ["0.1", "1.3"]
