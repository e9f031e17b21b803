"""configs/code.yaml end to end: the built-in code task, `code_tests` in the reward workers' sandboxes, gating the
format reward. The tiny random model writes no working code, so the point is that the path runs."""

from __future__ import annotations

import json

import pytest

from orchestrator.config import load_config
from orchestrator.run.train import train
from tests.conftest import ROOT


def test_code_config_trains_with_sandboxed_rewards(ray_cluster, tmp_path):
    cfg = load_config(ROOT / "configs" / "code.yaml", [
        "grpo.max_steps=2", "generation.generation_batch_size=16", "grpo.per_device_train_batch_size=16",
        "generation.max_completion_length=48", f"logging.dir={tmp_path}", "logging.progress=false",
    ])
    history = train(cfg, "code-task", show_progress=False)
    assert [h["step"] for h in history] == [1, 2]
    rows = [json.loads(x) for x in (tmp_path / "code-task" / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 32  # every trained sample, with its scores raw and gated (format gated on tests)
    for r in rows:
        assert 0.0 <= r["rewards/tests"] <= 1.0 and (r["gated/format"] == 0.0 or r["rewards/tests"] >= 0.5)
    for h in history:
        assert h["rewards/tests/errors"] == 0 and h["rewards/tests/timeouts"] == 0  # every program ran and scored
        assert 0.0 <= h["rewards/tests/mean"] <= 1.0
        # the gate closed exactly on the step's samples that passed under half their tests
        mine = [r for r in rows if r["step"] == h["step"]]
        assert len(mine) == 16
        closed = sum(r["rewards/tests"] < 0.5 for r in mine) / len(mine)
        assert h["gates/format<-tests/closed_frac"] == pytest.approx(closed)
