"""`rayward scale`'s client side (orchestrator/cli/scale.py): what it makes of the scale job's answer."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest

from orchestrator.cli.scale import RESULT, _answer
from tests.fixtures.records import pool_stats


def test_a_reward_pools_answer_with_its_own_fields_is_read_as_the_pools_common_stats():
    """The job prints the pool's own record (a reward pool's carries global_step, which other pools lack): the client
    keeps the fields every pool has, instead of failing on the rest (the scenario through the dashboard did)."""
    record = asdict(pool_stats(workers=3, global_step=7))
    assert "global_step" in record
    log = f"starting\n{RESULT}{json.dumps(record)}\n"
    stats = _answer(log, "JobStatus.SUCCEEDED", "http://127.0.0.1:8265")
    assert stats.workers == 3 and stats.target_workers == 3 and not hasattr(stats, "global_step")


def test_scale_generators_asks_the_run_for_a_fleet_size_and_prints_when_it_applies(monkeypatch, capsys):
    """`rayward scale RUN --generators N`: one request for the generator fleet (a count, never autoscaling bounds),
    sent as the other pools' are, and the answer says the driver applies it at its next step boundary."""
    from orchestrator.cli import main as cli
    from orchestrator.cli import scale as scale_module

    asked = []

    def scale(address, request):
        asked.append(request)
        return replace(pool_stats(workers=1), target_workers=2, starting=1)

    monkeypatch.setattr(scale_module, "scale", scale)
    assert cli.main(["scale", "r1", "--generators", "2", "--address", "http://127.0.0.1:8265"]) == 0
    assert asked == [scale_module.ScaleRequest("r1", "generators", 2)]
    assert asked[0].argv() == ["r1", "--pool", "generators", "--count", "2"]
    assert "generators -> 2 at the run's next step boundary" in capsys.readouterr().out
    # one action at a time: a fleet size with a pool's size is refused before anything is sent
    assert cli.main(["scale", "r1", "--generators", "2", "--reward-workers", "3"]) != 0 and len(asked) == 1


def test_the_control_mailbox_keeps_the_last_request_until_the_driver_takes_it():
    from actors.runtime.control import RunControl

    control = RunControl(generators=1)
    assert control.take_generators() is None
    assert control.scale_generators(3).target_workers == 3
    answer = control.scale_generators(2)  # a newer request replaces the one not taken yet
    assert (answer.workers, answer.target_workers, answer.starting) == (1, 2, 1)
    assert control.take_generators() == 2 and control.take_generators() is None
    control.report(2, 0)
    assert control.stats().workers == 2
    with pytest.raises(ValueError, match="at least 1 generator"):
        control.scale_generators(0)
