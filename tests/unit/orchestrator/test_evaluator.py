"""checkpoint-best's record survives a resume (the Ray side of evaluation: tests/integration/orchestrator)."""

from __future__ import annotations

import json

from orchestrator.eval_metrics import Best
from orchestrator.evaluator import BEST_CHECKPOINT, BestCheckpoint


def test_resume_keeps_the_recorded_best(tmp_path):
    (tmp_path / BEST_CHECKPOINT).mkdir()
    record = {"metric": "eval/pass@1", "value": 0.5, "step": 20}
    (tmp_path / BEST_CHECKPOINT / "rayward_state.json").write_text(json.dumps({"global_step": 20, "best": record}))
    keeper = BestCheckpoint(Best("eval/pass@1", "max"), learner=None, run_dir=tmp_path, data_state=dict)
    keeper.restore()
    assert (keeper.best.value, keeper.best.step) == (0.5, 20)
    assert not keeper.best.improves(0.4) and keeper.best.improves(0.6)
    other = BestCheckpoint(Best("eval/reward", "max"), learner=None, run_dir=tmp_path, data_state=dict)
    other.restore()  # a best of another metric is not this one's
    assert other.best.value is None
    BestCheckpoint(Best("eval/reward", "max"), learner=None, run_dir=tmp_path / "fresh", data_state=dict).restore()
