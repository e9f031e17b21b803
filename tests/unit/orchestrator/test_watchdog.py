"""The watchdog's preemption check (orchestrator/watchdog.py) on stand-ins for Ray's drain list and actor table: a
learner rank on a draining node asks the loop to move the learner, once per rank (the check runs again while the
move is under way and must not ask twice); a rank elsewhere is left alone. (On a real cluster:
tests/integration/cluster/test_node_loss.py.)"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from orchestrator import watchdog
from orchestrator.run import FaultLog, Progress


class Handle:
    def __init__(self, aid: str):
        self._actor_id = SimpleNamespace(hex=lambda: aid)


@pytest.fixture
def cluster(monkeypatch):
    """node of each actor id, and the draining nodes ({node: deadline ms})."""
    c = SimpleNamespace(node_of={}, draining={})
    monkeypatch.setattr(watchdog, "actor_info", lambda h: {"Address": {"NodeID": c.node_of[h._actor_id.hex()]}})
    from ray._private.state import state

    monkeypatch.setattr(state, "get_draining_nodes", lambda: dict(c.draining))
    return c


def run_with(tmp_path, ranks):
    said = []
    learner = SimpleNamespace(names=[f"r/learner-{i}" for i in range(len(ranks))], ranks=ranks)
    return SimpleNamespace(learner=learner, progress=Progress(), faults=FaultLog(tmp_path, said.append), said=said)


def test_a_drained_learner_node_moves_the_learner_once_per_rank(tmp_path, cluster):
    old = [Handle("a0"), Handle("a1")]
    cluster.node_of.update(a0="n1", a1="n2")
    run = run_with(tmp_path, old)
    dog = watchdog.Watchdog(run)
    dog.check_drains()
    assert run.progress.move_learner is None  # nothing draining
    cluster.draining["n2"] = int((time.time() + 60) * 1000)
    dog.check_drains()
    assert run.progress.move_learner == "r/learner-1's node n2 was drained (preemption)"
    run.progress.move_learner = None  # the supervisor took it; the old ranks are still on the node meanwhile
    dog.check_drains()
    assert run.progress.move_learner is None
    recs = [json.loads(x) for x in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in recs] == ["preemption_notice"] and 0 < recs[0]["deadline_s"] <= 60
    # the rebuilt group, placed on a draining node again (nowhere else had room), is a new notice
    new = [Handle("b0"), Handle("b1")]
    cluster.node_of.update(b0="n2", b1="n3")
    run.learner.ranks = new
    dog.check_drains()
    assert run.progress.move_learner == "r/learner-0's node n2 was drained (preemption)"
