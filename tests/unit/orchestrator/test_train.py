"""Resuming picks the latest periodic checkpoint: never checkpoint-best, an unfinished *.tmp or an eval's
candidate."""

from __future__ import annotations

from orchestrator.train import latest_checkpoint


def test_latest_checkpoint_is_the_latest_periodic_one(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    for name in ("checkpoint-5", "checkpoint-20", "checkpoint-100.tmp", "checkpoint-best", "checkpoint-best.candidate",
                 "checkpoint-7"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rayward_state.json").write_text("{}")
    (tmp_path / "checkpoint-30").mkdir()  # no rayward_state.json: not complete
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-20"
