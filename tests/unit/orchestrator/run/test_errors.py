"""The short block a failed run prints: errors raised by a real RewardWorker, wrapped the way Ray wraps them when
they cross actors (RayTaskError per actor, as_instanceof_cause on ray.get), then by train() (RunFailed)."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
from ray import cloudpickle
from ray.exceptions import RayActorError, RayTaskError

from actors.rewards.worker import RewardFunctionError, RewardSpec, RewardWorker
from actors.types import RewardBatch
from actors.weights.collective import WeightTransferError
from orchestrator.run.errors import RunFailed, RunStopped, explain, failed_in, root_cause

BAD = "tests.fixtures.bad_rewards:misbehaving"


def reward_error(mode: str) -> RewardFunctionError:
    worker = RewardWorker([RewardSpec("bad", BAD, kwargs={"mode": mode})])
    chunk = RewardBatch(["Write the letter q:"] * 2, ["qq" * 60, "qa"], [[1]] * 2, {}, 2, offset=8)
    with pytest.raises(RewardFunctionError) as info:
        worker.score(chunk)
    return info.value


def as_ray_delivers(err: BaseException, *functions: str) -> BaseException:
    """`err` raised in the actor method functions[-1], called from functions[-2], ...: what ray.get raises."""
    for fn in reversed(functions):
        try:
            raise err
        except BaseException as e:  # noqa: BLE001 - the traceback Ray formats into traceback_str
            text = "".join(traceback.format_exception(e))
        err = RayTaskError(fn, text, err, proctitle=f"ray::{fn}", pid=1, ip="127.0.0.1").as_instanceof_cause()
    return err


def failed_run(err: BaseException, tmp_path: Path, step: int | None = 3, ckpt: bool = True) -> RunFailed:
    checkpoint = tmp_path / "checkpoint-2" if ckpt else None
    try:
        try:
            raise err
        except BaseException as e:
            raise RunFailed("demo", tmp_path, step, checkpoint) from e
    except RunFailed as run_failed:
        return run_failed


def test_a_raising_reward_is_one_short_block(tmp_path):
    err = as_ray_delivers(reward_error("raise"), "RewardPool.score", "RewardWorker.score_chunks")
    run = failed_run(err, tmp_path)
    assert isinstance(root_cause(run), RewardFunctionError)
    text = explain(run)
    lines = text.splitlines()
    assert lines[0] == "rayward: run 'demo' failed at step 3"
    assert lines[1] == "reward 'bad' raised on sample 8: ValueError: verifier exploded"
    assert lines[2] == "  prompt:     'Write the letter q:'"
    assert lines[3] == f"  completion: '{'q' * 72}…'"  # the start of it
    assert 'File "tests/fixtures/bad_rewards.py", line 14, in check_answer' in text
    assert '    raise ValueError("verifier exploded")' in text
    assert "last checkpoint: " in text and "checkpoint-2 (continue with --name demo --resume)" in text
    assert lines[-1].startswith("(--debug shows the full traceback")
    for internal in ("Traceback", "ray::", "asyncio", "concurrent", "worker.py", "RayTaskError", "site-packages"):
        assert internal not in text, internal
    assert len(lines) <= 14


def test_debug_adds_every_traceback(tmp_path):
    run = failed_run(as_ray_delivers(reward_error("raise"), "RewardPool.score", "RewardWorker.score_chunks"), tmp_path)
    text = explain(run, debug=True)
    assert text.startswith("rayward: run 'demo' failed at step 3\nreward 'bad' raised on sample 8")
    assert "Traceback (most recent call last)" in text and "ray::RewardPool.score" in text
    assert "In the reward worker:" in text and "actors/rewards/worker.py" in text  # the worker's own traceback


@pytest.mark.parametrize(
    ("mode", "batched", "message"),
    [
        ("wrong_length", True, "reward 'bad' returned 3 values for 2 completions (samples 8..9)"),
        # one call per sample (the default, as in a run of configs/demo.yaml)
        ("wrong_length", False, "reward 'bad' returned 2 values for 1 completions (samples 8..8)"),
        ("strings", False, "reward 'bad' returned 'high' (str) for sample 8, expected a number or None"),
    ],
)
def test_a_bad_return_value_names_the_function(mode, batched, message, tmp_path):
    worker = RewardWorker([RewardSpec("bad", BAD, kwargs={"mode": mode}, batched=batched)])
    with pytest.raises(RewardFunctionError) as info:
        worker.score(RewardBatch(["p1", "p2"], ["c1", "c2"], [[1]] * 2, {}, 2, offset=8))
    crossed = cloudpickle.loads(cloudpickle.dumps(info.value))  # as it crosses from the worker to the driver
    text = explain(failed_run(as_ray_delivers(crossed, "RewardPool.score"), tmp_path, ckpt=False))
    lines = text.splitlines()
    assert lines[1] == message
    assert lines[2:4] == ["  prompt:     'p1'", "  completion: 'c1'"]
    assert "  the reward function is defined at tests/fixtures/bad_rewards.py:19" in lines
    assert "Traceback" not in text and "last checkpoint" not in text


def test_an_internal_error_in_an_actor_names_the_role_and_where(tmp_path):
    def train_step():
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore details")

    try:
        train_step()
    except RuntimeError as e:
        cause = e
    err = as_ray_delivers(cause, "Learner.train_step")
    assert failed_in(err) == "the learner"
    text = explain(failed_run(err, tmp_path, step=7))
    lines = text.splitlines()
    assert lines[:2] == ["rayward: run 'demo' failed at step 7",
                         "the learner raised RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    assert lines[2].startswith("  at tests/unit/orchestrator/run/test_errors.py:") and "in train_step" in lines[2]
    assert "Traceback" not in text


def test_weight_transfer_and_dead_actors_read_as_one_line_each(tmp_path):
    wt = WeightTransferError("weight group did not form within 3 s: ranks [2] never joined")
    text = explain(failed_run(as_ray_delivers(wt, "Learner.broadcast"), tmp_path, step=None, ckpt=False))
    assert text.splitlines()[:2] == [
        "rayward: run 'demo' failed while starting",
        "weight transfer: weight group did not form within 3 s: ranks [2] never joined",
    ]
    died = RayActorError(error_msg=(
        "The actor died unexpectedly before finishing this task.\n\tclass_name: Generator\n\tactor_id: ab12\n"
        "\tpid: 4242\n\tname: demo/generator-0\n\tnamespace: rayward-demo\n\tip: 10.0.0.1\n"
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
        "The leased worker has unrecoverable failure. Worker is requested to be destroyed when it is returned."
    ))
    line = explain(failed_run(died, tmp_path)).splitlines()[1]
    assert line.startswith("demo/generator-0 died: The actor is dead because its worker process has died.")


def test_stopped_says_where_to_resume(tmp_path):
    assert str(RunStopped("demo", 4, tmp_path / "checkpoint-4")).startswith("stopped at step 4 (SIGTERM); checkpoint ")
    assert str(RunStopped("demo", None, None)) == "stopped before training started (SIGTERM)"
