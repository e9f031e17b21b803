"""The watchdog (orchestrator/run/watchdog.py) on stand-ins for the groups' members (actors/runtime/group.py Member:
name, id, the GCS's record, ping, kill) and Ray's drain list.

- Preemption: a learner rank on a draining node asks the loop to move the learner, once per rank (the check runs
  again while the move is under way and must not ask twice); a rank elsewhere is left alone.
- Hangs: a member whose ping is unanswered after cluster.hang_timeout_s is killed and recorded; a learner rank's
  kill is also what the supervisor hears (`hung_learner`, once).
(On a real cluster: tests/integration/cluster/test_node_loss.py, tests/integration/faults.)"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from actors.runtime.group import Member, Pending
from orchestrator.run import watchdog
from orchestrator.run.state import FaultLog, Progress


class Answered(Pending):
    """A ping that came back."""

    def __init__(self) -> None:
        pass

    def done(self) -> bool:
        return True


class Unanswered(Answered):
    """A ping of a wedged actor: never back."""

    def done(self) -> bool:
        return False


def member(name: str, aid: str, *, node: str = "n0", answers: bool = True, killed: list[str] | None = None) -> Member:
    return Member(name, aid, lambda: {"State": "ALIVE", "Address": {"NodeID": node}},
                  Answered if answers else Unanswered, lambda: killed.append(name))


@pytest.fixture
def draining(monkeypatch):
    """The draining nodes ({node: deadline ms}) Ray reports."""
    nodes: dict[str, int] = {}
    monkeypatch.setattr(watchdog.ray_compat, "draining_nodes", lambda: dict(nodes))
    return nodes


def run_with(tmp_path, ranks, generators=(), hang_timeout_s=0.0):
    said = []
    return SimpleNamespace(
        learner=SimpleNamespace(members=lambda: list(ranks)),
        generators=SimpleNamespace(members=lambda: list(generators)),
        progress=Progress(), faults=FaultLog(tmp_path, said.append), said=said,
        cfg=SimpleNamespace(cluster=SimpleNamespace(hang_timeout_s=hang_timeout_s)),
    )


def records(tmp_path):
    return [json.loads(x) for x in (tmp_path / "faults.jsonl").read_text().splitlines()]


def test_a_drained_learner_node_moves_the_learner_once_per_rank(tmp_path, draining):
    old = [member("r/learner-0", "a0", node="n1"), member("r/learner-1", "a1", node="n2")]
    run = run_with(tmp_path, old)
    dog = watchdog.Watchdog(run)
    dog.check_drains()
    assert run.progress.move_learner is None  # nothing draining
    draining["n2"] = int((time.time() + 60) * 1000)
    dog.check_drains()
    assert run.progress.move_learner == "r/learner-1's node n2 was drained (preemption)"
    run.progress.move_learner = None  # the supervisor took it; the old ranks are still on the node meanwhile
    dog.check_drains()
    assert run.progress.move_learner is None
    recs = records(tmp_path)
    assert [r["kind"] for r in recs] == ["preemption_notice"] and 0 < recs[0]["deadline_s"] <= 60
    # the rebuilt group, placed on a draining node again (nowhere else had room), is a new notice
    new = [member("r/learner-0", "b0", node="n2"), member("r/learner-1", "b1", node="n3")]
    run.learner.members = lambda: new
    dog.check_drains()
    assert run.progress.move_learner == "r/learner-0's node n2 was drained (preemption)"


def test_a_member_that_does_not_answer_its_ping_is_killed_and_a_learner_ranks_kill_is_said_once(tmp_path):
    """hang_timeout_s 0: a ping not back by the next check is overdue (no clock involved)."""
    killed: list[str] = []
    gens = [member("r/generator-0", "g0", killed=killed), member("r/generator-1", "g1", answers=False, killed=killed)]
    ranks = [member("r/learner", "l0", killed=killed)]
    run = run_with(tmp_path, ranks, gens)
    dog = watchdog.Watchdog(run)
    dog.check_hangs()  # pings sent
    assert killed == []
    dog.check_hangs()
    assert killed == ["r/generator-1"] and dog.hung_learner() is None  # the answering ones are pinged again
    ranks[0] = member("r/learner", "l0", answers=False, killed=killed)
    dog.check_hangs()  # the learner's answered ping is done: a new one, never answered
    dog.check_hangs()
    assert killed[1:] == ["r/generator-1", "r/learner"]  # generator-1 pinged anew after its kill, hung again
    assert dog.hung_learner() == "r/learner did not answer within 0 s (hung)" and dog.hung_learner() is None
    recs = records(tmp_path)
    assert [(r["kind"], r["actor"]) for r in recs] == [("hung_killed", "r/generator-1")] * 2 + [
        ("hung_killed", "r/learner")]
    assert recs[0]["message"] == "r/generator-1 did not answer within 0 s (hung): killed; Ray restarts it"
    assert recs[-1]["message"].endswith("killed; the learner is rebuilt")
