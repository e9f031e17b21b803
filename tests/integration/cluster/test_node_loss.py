"""A preemption notice and a lost node, on a real multi-node Ray cluster (cluster/local_cluster.sh: `ray start`
nodes on this machine), one cluster and one `rayward run` for every assertion.

The head holds the driver and the reward pool; node A ({"work_node": 1, "reward_node": 8}) holds the learner, the
generator and the reward workers (each asks for its resource, so nothing else can host them). Mid-run:

  1. node B joins with the same resources (the capacity a cloud's replacement node brings);
  2. A is drained for preemption (`local_cluster.sh drain-node`: `ray drain-node --reason
     DRAIN_NODE_REASON_PREEMPTION` with a deadline): the run's watchdog sees the learner's node draining, the loop
     checkpoints at its next step boundary and the learner moves to B, losing no step and using none of
     cluster.max_failures;
  3. A is killed (`local_cluster.sh kill-node`: its raylet and every worker on it, as a preempted machine goes):
     Ray restarts the generator on B and it rejoins the weight group; the reward pool replaces its dead workers
     on B and re-runs their chunks. The token data of the step in flight lived in the dead generator's object
     store (docs/data-plane.md): those groups are lost by name, wherever they are read next (a re-run chunk, the
     learner), and replaced by new prompts' groups; no step trains fewer samples, none is trained twice.

The run finishes with exit 0 and every step trained. Skip with RAYWARD_SKIP_MULTINODE=1."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures.cluster import SCRIPT, Cluster, client_env, rayward_exe, tail
from tests.fixtures.slow_rewards import held_marker, release_file

pytestmark = [
    pytest.mark.skipif(os.environ.get("RAYWARD_SKIP_MULTINODE") == "1", reason="RAYWARD_SKIP_MULTINODE=1"),
    pytest.mark.timeout(600),
]

RUN = "node-loss"
STEPS, SAVE_STEPS = 10, 5
# Trainer steps (the reward's trainer_state.global_step) whose scoring waits for the test: the drain happens
# inside step HOLD_DRAIN + 1, the node's death inside step HOLD_KILL + 1.
HOLD_DRAIN, HOLD_KILL = 2, 6
NODE_RESOURCES = '{"work_node": 1, "reward_node": 8}'
DRAIN_DEADLINE_S = 120  # the notice's deadline: the learner moves well before it
WAIT_S = 300.0  # any wait below: reached only when what is awaited never happens
POLL_S = 0.25  # between checks of the run's files and the cluster's state


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")] if path.exists() else []


def _script(cluster: Cluster, *args: str) -> str:
    p = subprocess.run(["bash", str(SCRIPT), *args], env=cluster.env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"local_cluster.sh {' '.join(args)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nodeloss")
    runs, log, holds = tmp / "runs", tmp / "run.log", tmp / "holds"
    holds.mkdir()
    run_dir = runs / RUN
    cluster = Cluster()
    ok = False
    proc = None

    def wait(pred, what: str):
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            got = pred()
            if got:
                return got
            assert proc.poll() is None, f"the run ended while waiting for {what}:\n{tail(log)}"
            time.sleep(POLL_S)
        raise AssertionError(f"timed out waiting for {what}:\n{tail(log)}")

    def faults(kind: str) -> list[dict]:
        return [r for r in _rows(run_dir / "faults.jsonl") if r["kind"] == kind]

    def node_of(name: str) -> str | None:
        return next((a["node_id"] for a in cluster.state()["actors"] if a["name"] == name and a["state"] == "ALIVE"),
                    None)

    def release(step: int) -> None:
        Path(release_file(str(holds), step)).touch()

    try:
        cluster.up(reward_nodes=0)
        node_a = int(_script(cluster, "add-node", "--resources", NODE_RESOURCES).strip().splitlines()[-1])
        cmd = [
            rayward_exe(), "run", str(ROOT / "configs" / "demo.yaml"), f"cluster.address={cluster.gcs}",
            "cluster.learner={num_cpus: 0.5, resources: {work_node: 0.4}}",
            "cluster.generator={num_cpus: 0.5, resources: {work_node: 0.4}}",
            "cluster.reward_worker={num_cpus: 0.25, resources: {reward_node: 1}}",
            f"grpo.max_steps={STEPS}", f"grpo.save_steps={SAVE_STEPS}", "cluster.max_failures=0",
            f"rewards.0={{name: letter, function: 'tests.fixtures.slow_rewards:held_letter', timeout_s: 600, "
            f"kwargs: {{hold_dir: '{holds}', hold_steps: [{HOLD_DRAIN}, {HOLD_KILL}]}}}}",
            "logging.check_logprob_parity=false", f"logging.dir={runs}", "--name", RUN, "--debug",
        ]
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=client_env(), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        # 1. inside step HOLD_DRAIN + 1 (its scoring held): B joins, A is drained; the notice is seen while the
        #    step is in progress, then the step ends, checkpoints, and the learner moves
        wait(lambda: os.path.exists(held_marker(str(holds), HOLD_DRAIN)), f"step {HOLD_DRAIN + 1}'s scoring held")
        node_a_id = node_of(f"{RUN}/learner")
        _script(cluster, "add-node", "--resources", NODE_RESOURCES)
        _script(cluster, "drain-node", str(node_a), str(DRAIN_DEADLINE_S))
        wait(lambda: faults("preemption_notice"), "the watchdog's preemption notice")
        release(HOLD_DRAIN)
        (move,) = wait(lambda: faults("learner_moved"), "the learner's move off the drained node")
        node_b_id = wait(lambda: (n := node_of(f"{RUN}/learner")) != node_a_id and n, "the learner on node B")
        # 2. inside step HOLD_KILL + 1: A goes (its generator and reward workers with it)
        wait(lambda: os.path.exists(held_marker(str(holds), HOLD_KILL)), f"step {HOLD_KILL + 1}'s scoring held")
        _script(cluster, "kill-node", str(node_a))
        release(HOLD_KILL)
        wait(lambda: faults("generator_restarted"), "the generator's restart")
        gen_node = wait(lambda: node_of(f"{RUN}/generator-0"), "the generator alive again")
        rc = proc.wait(timeout=WAIT_S)
        assert rc == 0, f"rayward run failed (rc {rc}):\n{tail(log)}"
        ok = True
        yield {"dir": run_dir, "a": node_a_id, "b": node_b_id, "move": move, "generator_node": gen_node}
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        cluster.down(keep_logs=not ok)


def test_the_run_finishes_every_step(moved):
    steps = {r["step"] for r in _rows(moved["dir"] / "metrics.jsonl")}
    assert steps == set(range(1, STEPS + 1)), sorted(steps)


def test_a_preemption_notice_moves_the_learner_losing_nothing(moved):
    rows = _rows(moved["dir"] / "faults.jsonl")
    (notice,) = [r for r in rows if r["kind"] == "preemption_notice"]
    assert notice["node"] == moved["a"] and 0 < notice["deadline_s"] <= DRAIN_DEADLINE_S, notice
    m = moved["move"]
    assert m["steps_lost"] == 0 and m["failures"] == 0, m  # max_failures=0: a move is not a failure
    assert m["checkpoint"] == f"checkpoint-{m['restored_step']}" and m["restored_step"] == m["failed_at_step"]
    assert (moved["dir"] / m["checkpoint"]).is_dir()
    assert "was drained (preemption)" in m["cause"]


def test_a_lost_node_s_generator_and_reward_workers_come_back_on_the_node_left(moved):
    rows = _rows(moved["dir"] / "faults.jsonl")
    assert [r for r in rows if r["kind"] == "generator_restarted"], rows
    assert moved["generator_node"] == moved["b"]
    actors = (moved["dir"] / "actors.log").read_text()
    assert f"worker {RUN}/reward-" in actors and "died: killed; replacing it" in actors, actors[-3000:]
    assert _rows(moved["dir"] / "metrics.jsonl")[-1]["reward_pool/replaced"] >= 1


def test_the_dead_generator_s_payloads_are_lost_by_group_and_replaced(moved):
    rows = _rows(moved["dir"] / "metrics.jsonl")
    lost = {r["step"]: r["data_plane/lost_groups"] for r in rows if r.get("data_plane/lost_groups")}
    assert lost and min(lost) >= HOLD_KILL + 1, lost  # the held step's groups: their owner died with node A
    per_step = {r["step"]: r["batch/groups"] for r in rows}
    assert len(set(per_step.values())) == 1, per_step  # every step a whole batch, replacements included
