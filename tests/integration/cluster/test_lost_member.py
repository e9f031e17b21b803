"""A group member lost with its node, on a real multi-node Ray cluster (cluster/local_cluster.sh): what the driver
needs to go on without it (orchestrator/loop/phases.py go_on_without), from Ray itself.

Two members of a group, each on a node of its own (each asks for the node's one `lost_node`). Member 0's node is
SIGKILLed (`local_cluster.sh kill-node`, as a preempted machine goes); Ray would restart the actor, but no node has
room for it, so it waits. `lost_with_node` names it from the GCS's record (the death's cause, NODE_DIED), `room`
says there is none, `remove` takes it out and renumbers the other member in the streams already running (member 1
becomes 0, its stream goes on), and a member started in its place (`start_pending`) joins once a node with room
comes. The driver runs in a subprocess (the test process never calls ray.init). Skip with
RAYWARD_SKIP_MULTINODE=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.fixtures.cluster import SCRIPT, Cluster, tail

pytestmark = [
    pytest.mark.skipif(os.environ.get("RAYWARD_SKIP_MULTINODE") == "1", reason="RAYWARD_SKIP_MULTINODE=1"),
    pytest.mark.timeout(600),
]

DRIVER = r'''
import faulthandler, json, subprocess, sys, time
import ray

faulthandler.dump_traceback_later(300, exit=True)  # a hang names where it is
from actors.runtime.group import ActorGroup

SCRIPT, GCS = sys.argv[1], sys.argv[2]
WAIT_S = 120.0  # reached only when what is awaited never happens
NODE = '{"lost_node": 1}'


def sh(*args):
    return subprocess.run(["bash", SCRIPT, *args], check=True, capture_output=True, text=True).stdout


def until(pred, what):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if (got := pred()):
            return got
        time.sleep(0.5)
    from actors.runtime.group import actor_info
    states = [{k: str(v)[:300] for k, v in actor_info(h).items() if k in ("State", "DeathCause", "Address")}
              for h in group._handles]
    alive = {n["NodeID"][:8]: n["Alive"] for n in ray.nodes()}
    raise SystemExit(f"timed out waiting for {what}: {states}; nodes {[n[:8] for n in nodes]}; alive {alive}")


class Echo:
    def node(self):
        return ray.get_runtime_context().get_node_id()

    def count(self, n):
        for i in range(n):
            time.sleep(0.1)
            yield i


ray.init(address=GCS, namespace="lost-member", log_to_driver=False)
out = {}
node_a = int(sh("add-node", "--resources", NODE).strip().splitlines()[-1])
group = ActorGroup(Echo, 1, run_name="lost", role="echo",
                   options={"num_cpus": 0.1, "resources": {"lost_node": 1}, "max_restarts": 1,
                            "max_concurrency": 4})
group.wait_started(WAIT_S)
sh("add-node", "--resources", NODE)
group.grow(2, WAIT_S)
nodes = [ray.get(h.node.remote()) for h in group._handles]
out["distinct_nodes"] = len(set(nodes)) == 2
streams = [group._stream(m, "count", 10_000) for m in range(2)]
out["before"] = [s.next() for s in streams]
out["lost_before_kill"] = group.lost_with_node()
sh("kill-node", str(node_a))  # member 0's node: the first node added
out["lost"] = until(group.lost_with_node, "the GCS to report member 0 down with its node")
out["room"] = group.room(1)
print("lost", out["lost"], out["room"], file=sys.stderr, flush=True)
out["removed"] = group.remove(out["lost"])
out["members_after"] = [s.member for s in streams]
out["size_after"] = [len(group), group.active]
out["survivor_streams_on"] = streams[1].next() > out["before"][1]
print("survivor", out["survivor_streams_on"], file=sys.stderr, flush=True)
out["started"] = group.start_pending(1)
out["pending_ready_without_room"] = group.pending_ready(WAIT_S)
sh("add-node", "--resources", NODE)
until(lambda: group.pending_ready(WAIT_S), "the new member to start on the node added")
out["joined"] = group.poll_pending(WAIT_S)
out["size_joined"] = len(group)
out["nodes_joined"] = len({ray.get(h.node.remote()) for h in group._handles})
print("RESULT " + json.dumps(out))
'''


def test_a_member_lost_with_its_node_is_named_removed_and_replaced_once_there_is_room(tmp_path):
    cluster = Cluster()
    ok = False
    try:
        cluster.up(reward_nodes=0)
        env = {**cluster.env, "RAY_AUTH_MODE": "token", "PYTHONPATH": str(ROOT)}
        p = subprocess.run([sys.executable, "-c", DRIVER, str(SCRIPT), cluster.gcs], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=540)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        assert p.returncode == 0 and lines, (f"driver failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n"
                                             f"{p.stderr[-4000:]}")
        out = json.loads(lines[-1].removeprefix("RESULT "))
        assert out["distinct_nodes"] and out["lost_before_kill"] == []
        assert out["lost"] == [0]
        assert out["room"] is not None and "no room for 1 more echo" in out["room"]
        assert out["removed"] == ["lost/echo-0"]
        assert out["members_after"] == [None, 0]  # the lost member's stream has none; the other one's is renumbered
        assert out["size_after"] == [1, 1] and out["survivor_streams_on"]
        assert out["started"] == ["lost/echo-2"] and out["pending_ready_without_room"] is False
        assert out["joined"] == [["lost/echo-2"], []] and out["size_joined"] == 2 and out["nodes_joined"] == 2
        ok = True
    finally:
        cluster.down(keep_logs=not ok)
        if not ok:
            print(tail(cluster.dir / "pids"))
