"""orchestrator/run/checkpoints.py, the files: which checkpoint --resume picks (a damaged one passed over), a resume
that has nothing to do, and checkpoint-best's record across a resume. (When checkpoints are written and what a resume
restores: tests/unit/orchestrator/loop/test_loops.py and test_supervisor.py.)"""

from __future__ import annotations

import json

import pytest

from actors.learner.checkpoint import STATE_FILE, damaged, write_state
from orchestrator.config import ConfigError
from orchestrator.eval.metrics import Best
from orchestrator.run import checkpoints
from orchestrator.run.checkpoints import BestCheckpoint, latest, saved_step
from tests.fixtures.fakes import fake_run, messages


def _checkpoint(run_dir, step, weights=b"w" * 10, run=None):
    """A checkpoint's files; with `run`, its STATE_FILE holds that run's state (a checkpoint resume can load)."""
    d = run_dir / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(weights)
    write_state(d, {"global_step": step, **(checkpoints.run_state(run).to_json() if run is not None else {})})
    return d


def test_latest_is_the_latest_complete_periodic_checkpoint(tmp_path):
    """Never checkpoint-best, an unfinished *.tmp, one being replaced (*.old) or an eval's candidate."""
    assert latest(tmp_path) is None
    for name in ("checkpoint-5", "checkpoint-20", "checkpoint-100.tmp", "checkpoint-90.old", "checkpoint-best",
                 "checkpoint-best.candidate", "checkpoint-7"):
        (tmp_path / name).mkdir()
        (tmp_path / name / STATE_FILE).write_text(json.dumps({"global_step": 1}))
    (tmp_path / "checkpoint-30").mkdir()  # no state file: not complete
    assert latest(tmp_path) == tmp_path / "checkpoint-20"
    assert saved_step(tmp_path / "checkpoint-20") == 1 and saved_step(tmp_path / "checkpoint-30") is None


def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before_with_a_message(tmp_path):
    _checkpoint(tmp_path, 4)
    newest = _checkpoint(tmp_path, 8)
    assert damaged(newest) is None and latest(tmp_path) == newest
    (newest / "model.safetensors").write_bytes(b"w" * 3)  # truncated
    said = []
    assert checkpoints.usable(tmp_path, said.append) == [tmp_path / "checkpoint-4"]
    assert said == ["rayward: checkpoint-8 is damaged (model.safetensors has 3 bytes, 10 were written): using the "
                    "checkpoint before it"]
    (newest / "model.safetensors").unlink()
    assert damaged(newest) == "model.safetensors is missing"
    (newest / STATE_FILE).write_text('{"global_st')  # torn
    assert damaged(newest).startswith(f"{STATE_FILE} unreadable")
    assert latest(tmp_path) == tmp_path / "checkpoint-4"


def test_a_checkpoint_that_fails_to_load_falls_back_to_the_one_before(tmp_path):
    run = fake_run(tmp_path / "r", ["grpo.max_steps=8"])
    _checkpoint(run.run_dir, 2, run=run)
    bad = _checkpoint(run.run_dir, 4, run=run)
    (bad / STATE_FILE).write_text(json.dumps({"files": {}}))  # whole by its sizes, but no global_step: loads badly
    assert checkpoints.resume(run, checkpoints.usable(run.run_dir)) == run.run_dir / "checkpoint-2"
    assert run.progress.global_step == 2
    assert any(m.startswith("rayward: checkpoint-4 could not be loaded (KeyError: ")
               and m.endswith("using checkpoint-2") for m in messages(run))


def test_a_resume_with_nothing_to_do_fails_before_anything_starts(tmp_path):
    said = []
    with pytest.raises(ConfigError, match="no checkpoint in .* nothing to resume"):
        checkpoints.find(tmp_path, checkpoints.RESUME_REQUIRED, 10, said.append)
    assert checkpoints.find(tmp_path, checkpoints.RESUME_AUTO, 10, said.append) == []  # a retried driver starts
    assert said == [f"rayward: no checkpoint in {tmp_path} yet: starting from the initial model"]
    assert checkpoints.find(tmp_path, None, 10, said.append) == []
    _checkpoint(tmp_path, 4)
    _checkpoint(tmp_path, 10)
    for mode in (checkpoints.RESUME_REQUIRED, checkpoints.RESUME_AUTO):  # the veRL bug: never "finish" untrained
        with pytest.raises(ConfigError, match="checkpoint-10 is at step 10 and grpo.max_steps is 10: the run has "
                                              "nothing left to train"):
            checkpoints.find(tmp_path, mode, 10, said.append)
    assert checkpoints.find(tmp_path, checkpoints.RESUME_REQUIRED, 12, said.append)[0] == tmp_path / "checkpoint-10"


def test_resume_keeps_the_recorded_best(tmp_path):
    """From the checkpoint's own record, for the same metric."""
    keeper = BestCheckpoint(Best("eval/pass@1", "max"), learner=None, run_dir=tmp_path, data_state=dict)
    keeper.restore({"metric": "eval/pass@1", "value": 0.25, "step": 10})
    assert (keeper.best.value, keeper.best.step) == (0.25, 10) and keeper.state() == {
        "metric": "eval/pass@1", "value": 0.25, "step": 10}
    assert not keeper.best.improves(0.2) and keeper.best.improves(0.3)
    keeper.restore(None)  # the run's start: nothing yet
    assert keeper.best.value is None
    other = BestCheckpoint(Best("eval/reward", "max"), learner=None, run_dir=tmp_path, data_state=dict)
    other.restore({"metric": "eval/pass@1", "value": 0.5, "step": 20})  # a best of another metric is not this one's
    assert other.best.value is None


def test_the_run_state_round_trips_through_the_state_file(tmp_path):
    """What a checkpoint keeps of the run (RunState) is what a resume reads back: the data position (with its
    skips), the trainer_state, the evaluator's record, the reward pool's size and the generator fleet's, through
    JSON; a checkpoint written before the fleet's size was kept still loads."""
    from orchestrator.run.checkpoints import RunState

    run = fake_run(tmp_path / "r", ["loop.mode=pipelined"])
    run.prompts.next_batch(5)
    run.progress.resume_data = run.prompts.untrained_position(run.prompts.state(), [])
    run.progress.global_step = 3
    saved = checkpoints.run_state(run)
    assert saved.data == run.prompts.state() and saved.trainer_state.global_step == 3
    ckpt = _checkpoint(run.run_dir, 3, run=run)
    state = json.loads((ckpt / STATE_FILE).read_text())
    assert set(state) == {"global_step", "files", "data", "trainer_state", "eval", "reward_pool", "generators"}
    assert RunState.from_json(state) == saved and saved.generators == 1
    older = {k: v for k, v in state.items() if k != "generators"}
    assert RunState.from_json(older).generators is None
    with pytest.raises(KeyError):  # a state file without the run's state is no checkpoint to resume from
        RunState.from_json({"global_step": 3})
