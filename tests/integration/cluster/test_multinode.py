"""Reward-worker placement and live scaling on a real multi-node Ray cluster (`ray start` nodes on this machine).

cluster/local_cluster.sh starts a head (no reward resource), two nodes with {"reward_node": 8} and one with
{"generator_node": 1}. A real `rayward run` joins it with reward workers asking for {"reward_node": 1} and its
generator for {"generator_node": 1} (the learner stays on the head, so every weight sync crosses nodes over the
collective backend: the first sync's logprob parity and every step's logprob gap are checked); a second process runs
`rayward scale` to 6 and then to 3 workers while it trains. The run's reward (tests/fixtures/slow_rewards.py:
tagged_value) sleeps per sample, returns the sample's `value` column, and writes one line per scored sample
(step, prompt uid, completion token ids, node). Checks:
  (a) placement: every RewardWorker actor of the run (Ray state API over HTTP, dead ones included) and every
      scored sample ran on a node with the reward_node resource, none on the head;
  (b) scaling: the per-step `reward_pool/target_workers` goes 2 -> 6 -> 3, steps used all 6 workers, and the state
      API shows exactly 6 and then exactly 3 live workers;
  (c) exactly once, per step: 64 sample records, each of the step's 8 prompt rows exactly G=8 times with 8
      distinct completions (so every sample's reward call ran once: none missed, none repeated, even across
      the scale events), no retries; and the step's logged reward mean equals the mean of those rows' `value`
      with no None, timeout or error (so the values that reached training are those calls' return values).
The test process never calls ray.init (the session's ray_cluster may be live): everything Ray runs in subprocesses.
Skip with RAYWARD_SKIP_MULTINODE=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [
    pytest.mark.skipif(os.environ.get("RAYWARD_SKIP_MULTINODE") == "1", reason="RAYWARD_SKIP_MULTINODE=1"),
    pytest.mark.timeout(600),
]

SCRIPT = ROOT / "cluster" / "local_cluster.sh"
RUN = "mn-scale"
# generation_batch_size = 64 per step. Steps take ~1 s and added workers score only once alive (their imports
# take seconds, tens of them on a loaded machine), so the run lasts long enough for them to join.
G, PROMPTS, STEPS = 8, 8, 48
DELAY_S = 0.2  # per sample: a step's scoring spans ~1 s on 2 workers, so scale events land mid-run
ROWS = 512  # >= STEPS x PROMPTS: every step reads new rows in file order

# State API over HTTP in a subprocess: Ray caches RAY_AUTH_MODE at its first read, so setting it in this
# (shared) pytest process could be too late; a fresh process with RAY_AUTH_MODE=token always sends the token.
STATE_QUERY = """
import json, sys
from ray.util.state import list_actors, list_nodes
addr = sys.argv[1]
actors = list_actors(address=addr, detail=True, limit=10000, raise_on_missing_output=False)  # placement checks all roles
nodes = list_nodes(address=addr, detail=True, limit=1000, raise_on_missing_output=False)
print(json.dumps({
    "actors": [{"name": a.name, "state": a.state, "node_id": a.node_id, "ns": a.ray_namespace} for a in actors],
    "nodes": [{"node_id": n.node_id, "is_head": n.is_head_node, "resources": n.resources_total, "state": n.state}
              for n in nodes],
}))
"""


def _value(uid: int) -> float:
    return round(((uid * 37) % 101) / 100, 2)


def _client_env() -> dict[str, str]:
    """The environment a user's shell would give rayward: no Ray address or auth mode inherited from this
    pytest process (rayward must find the token itself), the repo importable for tests.fixtures."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_NAMESPACE", "RAY_AUTH_MODE", "RAYWARD_TEST_RECORD")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _rayward() -> str:
    exe = Path(sys.executable).with_name("rayward")
    return str(exe) if exe.exists() else (shutil.which("rayward") or "rayward")


class Cluster:
    """local_cluster.sh with its own state dir (short path: Ray's unix sockets live under it)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rwmn-", dir="/tmp"))
        self.env = {**_client_env(), "RAYWARD_CLUSTER_DIR": str(self.dir)}
        self.base = 0

    def up(self, reward_nodes: int, generator_node: bool = False) -> str:
        args = ["up", "--reward-nodes", str(reward_nodes)] + (["--generator-node"] if generator_node else [])
        p = subprocess.run(["bash", str(SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"local_cluster.sh up failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        self.base = int((self.dir / "base_port").read_text())
        return p.stdout

    @property
    def gcs(self) -> str:
        return f"127.0.0.1:{self.base}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.base + 1}"

    def state(self) -> dict:
        p = subprocess.run([sys.executable, "-c", STATE_QUERY, self.dashboard], env={**self.env, "RAY_AUTH_MODE": "token"},
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"state API query failed:\n{p.stderr[-3000:]}"
        return json.loads(p.stdout.strip().splitlines()[-1])

    def down(self, keep_logs: bool) -> None:
        subprocess.run(["bash", str(SCRIPT), "down"], env=self.env, capture_output=True, text=True, timeout=120)
        if keep_logs:
            print(f"\nmulti-node cluster logs kept in {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def _tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


def _auth_hint(text: str) -> str:
    if "InvalidAuthToken" in text or "Missing authentication token" in text:
        return ("\n=> rayward did not send the cluster token: Ray 2.60 reads RAY_AUTH_MODE once, at `import ray`, so "
                "orchestrator.cli.auth.prepare_client_auth() must run before anything imports ray (orchestrator/cli.py main)")
    return ""


def _wait(pred, what: str, proc: subprocess.Popen, log: Path, timeout: float = 180.0, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = pred()
        if out:
            return out
        if proc.poll() is not None and not pred():
            text = _tail(log)
            pytest.fail(f"the run exited (rc {proc.returncode}) before: {what}{_auth_hint(text)}\n--- run log tail ---\n{text}")
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for: {what}\n--- run log tail ---\n{_tail(log)}")


def _scale(cluster: Cluster, n: int) -> None:
    p = subprocess.run([_rayward(), "scale", RUN, "--reward-workers", str(n), "--address", cluster.gcs],
                       cwd=ROOT, env=_client_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and f"reward workers -> {n}" in p.stdout, (
        f"rayward scale {n} failed (rc {p.returncode}): {p.stdout}\n{p.stderr[-3000:]}{_auth_hint(p.stderr)}")


def _is_worker(actor: dict) -> bool:
    """A RewardWorker of the run (`RUN/reward-3`), not its pool (`RUN/reward-pool`)."""
    return re.fullmatch(rf"{RUN}/reward-\d+", actor["name"] or "") is not None


def _alive_workers(cluster: Cluster) -> int:
    return sum(a["state"] == "ALIVE" and _is_worker(a) for a in cluster.state()["actors"])


def test_reward_workers_on_reward_nodes_scale_2_6_3_every_sample_once(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Write the letter {'abcd'[i % 4]}:", "uid": i, "value": _value(i)})
                            + "\n" for i in range(ROWS)))
    records, runs, log = tmp_path / "records", tmp_path / "runs", tmp_path / "run.log"
    metrics = runs / RUN / "metrics.jsonl"
    cluster = Cluster()
    proc, passed = None, False
    t0 = time.monotonic()
    try:
        cluster.up(reward_nodes=2, generator_node=True)
        t_up = time.monotonic() - t0
        cmd = [
            _rayward(), "run", str(ROOT / "configs" / "demo.yaml"),
            f"cluster.address={cluster.gcs}",
            "cluster.num_reward_workers=2",
            "cluster.reward_worker={num_cpus: 0.25, resources: {reward_node: 1}}",
            # the generator on its own node, the learner on the head: weights cross nodes over the collective
            "cluster.generator={num_cpus: 0.5, resources: {generator_node: 1}}",
            f"generation.num_generations={G}", f"generation.generation_batch_size={G * PROMPTS}",
            # A reward constant within each group still moves the policy (float-rounded group means give advantages
            # ~1e-4, which AdamW scales to full steps) and it collapses to repeated tokens; a negligible lr keeps
            # the 8 completions of a prompt distinct, as the exactly-once check needs.
            f"grpo.max_steps={STEPS}", "grpo.learning_rate=1e-9", f"data.path={data}", "data.shuffle_dataset=false",
            f"logging.dir={runs}", "logging.progress=true",
            f"rewards.0={{name: tagged, function: 'tests.fixtures.slow_rewards:tagged_value', "
            f"kwargs: {{record_dir: '{records}', delay_s: {DELAY_S}}}}}",
            "--name", RUN,
        ]
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=_client_env(), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

        # Phase 1: two workers score the first steps.
        _wait(lambda: len(_rows(metrics)) >= 2, "2 steps on 2 reward workers", proc, log, timeout=240)
        _scale(cluster, 6)
        _wait(lambda: _alive_workers(cluster) == 6, "6 live RewardWorker actors (state API)", proc, log, every=2)
        _wait(lambda: any(r.get("reward_pool/workers_used") == 6 for r in _rows(metrics)),
              "a step scored by all 6 reward workers", proc, log)
        _scale(cluster, 3)
        n3 = len(_rows(metrics))
        _wait(lambda: _alive_workers(cluster) == 3, "3 live RewardWorker actors (state API)", proc, log, every=2)
        _wait(lambda: len(_rows(metrics)) >= n3 + 2, "2 steps after scaling down to 3", proc, log)
        rc = proc.wait(timeout=240)
        assert rc == 0, f"rayward run failed (rc {rc}):\n{_tail(log)}"
        t_run = time.monotonic() - t0 - t_up

        # (a) placement, from the cluster's own records (dead actors keep their node id).
        st = cluster.state()
        reward_nodes = {n["node_id"] for n in st["nodes"] if n["resources"].get("reward_node", 0) > 0}
        head = {n["node_id"] for n in st["nodes"] if n["is_head"]}
        assert len(reward_nodes) == 2 and len(head) == 1 and not reward_nodes & head, st["nodes"]
        gen_node = {n["node_id"] for n in st["nodes"] if n["resources"].get("generator_node", 0) > 0}
        by_name = {a["name"]: a["node_id"] for a in st["actors"] if a["name"]}
        assert by_name[f"{RUN}/generator-0"] in gen_node and by_name[f"{RUN}/learner"] in head, by_name
        # the first sync crossed the nodes over the collective backend and landed (the driver prints the gap)
        gap = float(re.search(r"logprob parity after sync: max abs diff (\S+)", _tail(log, 100_000)).group(1))
        assert gap < 1e-4, gap
        assert all(r["sampling/sampling_logp_difference/max"] < 1e-3 for r in _rows(metrics))
        workers = [a for a in st["actors"] if _is_worker(a)]
        assert len(workers) == 6, workers  # 2 at start + 4 added; scaling down adds none
        placed = Counter(a["node_id"] for a in workers)
        assert set(placed) <= reward_nodes, f"reward workers off the reward nodes: {placed} (reward: {reward_nodes})"
        recs = [json.loads(x) for f in sorted(records.glob("*.jsonl")) for x in f.read_text().splitlines()]
        scored_on = Counter(r["node"] for r in recs)
        assert set(scored_on) <= reward_nodes, f"samples scored off the reward nodes: {scored_on}"

        # (b) pool size per step: 2 -> 6 -> 3, and the added workers took chunks.
        rows = _rows(metrics)
        assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
        sizes = [r["reward_pool/target_workers"] for r in rows]  # `workers` counts live ones only
        assert [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]] == [2, 6, 3], sizes
        used = [r["reward_pool/workers_used"] for r in rows]
        assert all(u <= 2 for u, s in zip(used, sizes, strict=True) if s == 2), (sizes, used)
        assert used[-1] <= 3, (sizes, used)
        assert all(r["reward_pool/retries"] == 0 and r["reward_pool/replaced"] == 0 for r in rows), rows[-1]

        # (c) every step's samples scored exactly once.
        by_step = defaultdict(list)
        for r in recs:
            by_step[r["step"]].append(r)
        assert sorted(by_step) == list(range(STEPS)), sorted(by_step)
        for row in rows:
            s = row["step"] - 1
            assert row["reward_global_step"] == s
            uids = list(range(s * PROMPTS, (s + 1) * PROMPTS))  # data.shuffle_dataset=false: rows in file order
            got = by_step[s]
            assert len(got) == G * PROMPTS, f"step {s}: {len(got)} reward calls for {G * PROMPTS} samples"
            assert Counter(r["uid"] for r in got) == dict.fromkeys(uids, G), f"step {s}: {Counter(r['uid'] for r in got)}"
            for u in uids:
                completions = {tuple(r["ids"]) for r in got if r["uid"] == u}
                assert len(completions) == G, f"step {s} prompt {u}: {len(completions)} distinct completions scored"
            assert row["rewards/tagged/mean"] == pytest.approx(sum(map(_value, uids)) / PROMPTS, abs=1e-6), s
            assert row["rewards/tagged/none_frac"] == 0.0
            assert row["rewards/tagged/timeouts"] == 0 and row["rewards/tagged/errors"] == 0
        print(f"\nmulti-node: cluster up {t_up:.0f}s, run {t_run:.0f}s; pool sizes per step {sizes}; workers used "
              f"{used}; workers per reward node {sorted(placed.values())}; samples per node {sorted(scored_on.values())}")
        passed = True
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        cluster.down(keep_logs=not passed)
