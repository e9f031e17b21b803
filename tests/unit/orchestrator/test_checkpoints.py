"""orchestrator/checkpoints.py, the files: which checkpoint --resume picks, and checkpoint-best's record across a
resume. (When checkpoints are written and what a resume restores: tests/unit/orchestrator/test_loop.py.)"""

from __future__ import annotations

import json

from actors.learner.checkpoint import STATE_FILE
from orchestrator.checkpoints import BEST, BestCheckpoint, latest, saved_step
from orchestrator.eval_metrics import Best


def test_latest_is_the_latest_complete_periodic_checkpoint(tmp_path):
    """Never checkpoint-best, an unfinished *.tmp or an eval's candidate."""
    assert latest(tmp_path) is None
    for name in ("checkpoint-5", "checkpoint-20", "checkpoint-100.tmp", "checkpoint-best", "checkpoint-best.candidate",
                 "checkpoint-7"):
        (tmp_path / name).mkdir()
        (tmp_path / name / STATE_FILE).write_text(json.dumps({"global_step": 1}))
    (tmp_path / "checkpoint-30").mkdir()  # no state file: not complete
    assert latest(tmp_path) == tmp_path / "checkpoint-20"
    assert saved_step(tmp_path / "checkpoint-20") == 1 and saved_step(tmp_path / "checkpoint-30") is None


def test_resume_keeps_the_recorded_best(tmp_path):
    (tmp_path / BEST).mkdir()
    record = {"metric": "eval/pass@1", "value": 0.5, "step": 20}
    (tmp_path / BEST / STATE_FILE).write_text(json.dumps({"global_step": 20, "best": record}))
    keeper = BestCheckpoint(Best("eval/pass@1", "max"), learner=None, run_dir=tmp_path, data_state=dict)
    keeper.restore()
    assert (keeper.best.value, keeper.best.step) == (0.5, 20)
    assert not keeper.best.improves(0.4) and keeper.best.improves(0.6)
    other = BestCheckpoint(Best("eval/reward", "max"), learner=None, run_dir=tmp_path, data_state=dict)
    other.restore()  # a best of another metric is not this one's
    assert other.best.value is None
    fresh = BestCheckpoint(Best("eval/reward", "max"), learner=None, run_dir=tmp_path / "fresh", data_state=dict)
    fresh.restore()
    assert fresh.best.value is None
