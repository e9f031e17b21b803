"""`rayward plot`: a PNG of a run's metrics.jsonl."""

from __future__ import annotations

import math

from orchestrator.cli.main import main
from orchestrator.cli.plot import phase_keys, reward_keys, series
from orchestrator.telemetry.metrics import MetricsLogger


def write_run(run_dir, steps: int = 6) -> list[dict]:
    log = MetricsLogger(run_dir, report_to=["jsonl"], progress=False, max_steps=steps)
    for s in range(1, steps + 1):
        m = {"reward": 0.1 * s, "rewards/letter/mean": 0.1 * s, "rewards/starts/mean": float("nan"), "kl": 0.001 * s,
             "entropy": 4 - 0.1 * s, "time/generate": 0.1, "time/train": 0.2, "time/step": 0.35, "time/sync": 0.02}
        if s % 3 == 0:
            m["eval/reward"] = 0.2 * s
        log.log(s, m)
    log.close()
    return log.history


def test_series_skip_missing_and_nan(tmp_path):
    rows = write_run(tmp_path)
    assert series(rows, "eval/reward") == ([3, 6], [0.6000000000000001, 1.2000000000000002])
    assert series(rows, "rewards/starts/mean") == ([], [])  # NaN is written as null
    assert reward_keys(rows) == ["rewards/letter/mean", "rewards/starts/mean"]
    assert phase_keys(rows) == ["time/step", "time/generate", "time/train", "time/sync"]
    assert not math.isnan(series(rows, "kl")[1][0])


def test_plot_command_writes_a_png(tmp_path, capsys):
    run = tmp_path / "runs" / "demo"
    write_run(run)
    assert main(["plot", "demo", "--dir", str(tmp_path / "runs")]) == 0
    png = run / "plot.png"
    assert capsys.readouterr().out.strip() == str(png)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 200_000
    out = tmp_path / "elsewhere" / "p.png"
    assert main(["plot", str(run), "--out", str(out)]) == 0 and out.exists()
