"""Reward-worker placement and live scaling on a real multi-node Ray cluster (`ray start` nodes on this machine).

cluster/local_cluster.sh starts a head (no reward resource), two nodes with {"reward_node": 8} and one with
{"generator_node": 1} (the package's `multinode` fixture, shared with test_multinode_learner.py). A real `rayward run`
joins it with reward workers asking for {"reward_node": 1} and its generator for {"generator_node": 1} (the
learner stays on the head, so every weight sync crosses nodes over the collective backend: the first sync's
logprob parity and every step's logprob gap are checked); the test runs `rayward scale` to 6 and then to 3
workers while it trains. The run's reward (tests/fixtures/slow_rewards.py:
tagged_value) returns the sample's `value` column and writes one line per scored sample (step, prompt uid,
completion token ids, node).

Ordered by gates, not by time: the reward holds the scoring of steps HOLD_UP, HOLD_DOWN and HOLD_END until the
test releases them, so each scale event and each check happens while the run is provably inside that step:
  HOLD_UP    scale to 6; the state API shows exactly 6 live workers and the pool counts 6 live; release
  HOLD_DOWN  scale to 3 (the retiring workers hold this step's chunks, and finish them); release
  HOLD_END   the state API shows exactly 3 live workers; release, and the run finishes
Checks:
  (a) placement: every RewardWorker actor of the run (Ray state API over HTTP, dead ones included) and every
      scored sample ran on a node with the reward_node resource, none on the head;
  (b) scaling: the per-step `reward_pool/target_workers` goes 2 -> 6 -> 3, the step after HOLD_UP used all 6
      workers, the steps after HOLD_DOWN at most 3;
  (c) exactly once, per step: 64 sample records, each of the step's 8 prompt rows exactly G=8 times with 8
      distinct completions (so every sample's reward call ran once: none missed, none repeated, even across
      the scale events), no retries; and the step's logged reward mean equals the mean of those rows' `value`
      with no None, timeout or error (so the values that reached training are those calls' return values).
Skip with RAYWARD_SKIP_MULTINODE=1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures.cluster import Cluster, client_env, rayward_exe, tail
from tests.fixtures.slow_rewards import held_marker, release_file

pytestmark = [
    pytest.mark.skipif(os.environ.get("RAYWARD_SKIP_MULTINODE") == "1", reason="RAYWARD_SKIP_MULTINODE=1"),
    pytest.mark.timeout(600),
]

RUN = "mn-scale"
G, PROMPTS = 8, 8  # generation_batch_size = 64 per step
HOLD_UP, HOLD_DOWN, HOLD_END = 2, 4, 7  # trainer steps whose scoring waits for the test
STEPS = HOLD_END + 1
ROWS = 128  # >= STEPS x PROMPTS: every step reads new rows in file order
REWARD_TIMEOUT_S = 600  # a held call waits for the test (worker start-ups under load), not for the reward
WAIT_S = 240.0  # any wait below: reached only when what is awaited never happens


def _value(uid: int) -> float:
    return round(((uid * 37) % 101) / 100, 2)


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def _auth_hint(text: str) -> str:
    if "InvalidAuthToken" in text or "Missing authentication token" in text:
        return ("\n=> rayward did not send the cluster token: Ray 2.60 reads RAY_AUTH_MODE once, at `import ray`, so "
                "orchestrator.cli.auth.prepare_client_auth() must run before anything imports ray "
                "(orchestrator/cli/main.py main)")
    return ""


def _wait(pred, what: str, proc: subprocess.Popen, log: Path, every: float = 1.0):
    """Until pred() holds. The run is held at a step the test has not released, so it cannot end first: its exit
    is a crash, reported with its log."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        out = pred()
        if out:
            return out
        if proc.poll() is not None and not pred():
            text = tail(log)
            pytest.fail(f"the run exited (rc {proc.returncode}) before: {what}{_auth_hint(text)}\n"
                        f"--- run log tail ---\n{text}")
        time.sleep(every)
    pytest.fail(f"timed out after {WAIT_S:.0f}s waiting for: {what}\n--- run log tail ---\n{tail(log)}")


def _scale(cluster: Cluster, n: int) -> str:
    """`rayward scale RUN --reward-workers n --address <dashboard URL>` (again: a no-op that reports the pool), as a
    laptop behind a port-forward of 8265 alone would; returns its line."""
    p = subprocess.run([rayward_exe(), "scale", RUN, "--reward-workers", str(n), "--address", cluster.dashboard],
                       cwd=ROOT, env=client_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and f"reward workers -> {n}" in p.stdout, (
        f"rayward scale {n} failed (rc {p.returncode}): {p.stdout}\n{p.stderr[-3000:]}{_auth_hint(p.stderr)}")
    return p.stdout


def _is_worker(actor: dict) -> bool:
    """A RewardWorker of the run (`RUN/reward-3`), not its pool (`RUN/reward-pool`)."""
    return re.fullmatch(rf"{RUN}/reward-\d+", actor["name"] or "") is not None


def _alive_workers(cluster: Cluster) -> int:
    return sum(a["state"] == "ALIVE" and _is_worker(a) for a in cluster.state()["actors"])


def test_reward_workers_on_reward_nodes_scale_2_6_3_every_sample_once(multinode: Cluster, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Write the letter {'abcd'[i % 4]}:", "uid": i, "value": _value(i)})
                            + "\n" for i in range(ROWS)))
    records, holds, runs, log = tmp_path / "records", tmp_path / "holds", tmp_path / "runs", tmp_path / "run.log"
    holds.mkdir()
    metrics = runs / RUN / "metrics.jsonl"
    cluster = multinode
    proc = None
    t0 = time.monotonic()

    def held(step: int) -> bool:
        return os.path.exists(held_marker(str(holds), step))

    def release(step: int) -> None:
        Path(release_file(str(holds), step)).touch()

    try:
        cmd = [
            rayward_exe(), "run", str(ROOT / "configs" / "demo.yaml"),
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
            f"timeout_s: {REWARD_TIMEOUT_S}, kwargs: {{record_dir: '{records}', hold_dir: '{holds}', "
            f"hold_steps: [{HOLD_UP}, {HOLD_DOWN}, {HOLD_END}]}}}}",
            "--name", RUN,
        ]
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=client_env(), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

        # Steps 0..HOLD_UP-1 on two workers; at HOLD_UP, grow to 6 while that step's chunks are held.
        _wait(lambda: held(HOLD_UP), f"step {HOLD_UP}'s scoring held (2 workers before it)", proc, log)
        _scale(cluster, 6)
        _wait(lambda: _alive_workers(cluster) == 6, "6 live RewardWorker actors (state API)", proc, log, every=2)
        _wait(lambda: "(6 live" in _scale(cluster, 6), "the pool counting 6 live workers", proc, log)
        release(HOLD_UP)
        # At HOLD_DOWN, shrink to 3 while all six hold that step's chunks; the retiring three finish them first.
        _wait(lambda: held(HOLD_DOWN), f"step {HOLD_DOWN}'s scoring held", proc, log)
        assert "3 retiring" in _scale(cluster, 3)
        release(HOLD_DOWN)
        _wait(lambda: held(HOLD_END), f"step {HOLD_END}'s scoring held", proc, log)
        _wait(lambda: _alive_workers(cluster) == 3, "3 live RewardWorker actors (state API)", proc, log, every=2)
        release(HOLD_END)
        rc = proc.wait(timeout=WAIT_S)
        assert rc == 0, f"rayward run failed (rc {rc}):\n{tail(log)}"
        t_run = time.monotonic() - t0

        # (a) placement, from the cluster's own records (dead actors keep their node id).
        st = cluster.state()
        reward_nodes = {n["node_id"] for n in st["nodes"] if n["resources"].get("reward_node", 0) > 0}
        head = {n["node_id"] for n in st["nodes"] if n["is_head"]}
        assert len(reward_nodes) == 2 and len(head) == 1 and not reward_nodes & head, st["nodes"]
        gen_node = {n["node_id"] for n in st["nodes"] if n["resources"].get("generator_node", 0) > 0}
        by_name = {a["name"]: a["node_id"] for a in st["actors"] if a["name"]}
        assert by_name[f"{RUN}/generator-0"] in gen_node and by_name[f"{RUN}/learner"] in head, by_name
        # the first sync crossed the nodes over the collective backend and landed (the driver prints the gap)
        gap = float(re.search(r"logprob parity after sync: max abs diff (\S+)", tail(log, 100_000)).group(1))
        assert gap < 1e-4, gap
        assert all(r["sampling/sampling_logp_difference/max"] < 1e-3 for r in _rows(metrics))
        workers = [a for a in st["actors"] if _is_worker(a)]
        assert len(workers) == 6, workers  # 2 at start + 4 added; scaling down adds none
        placed = Counter(a["node_id"] for a in workers)
        assert set(placed) <= reward_nodes, f"reward workers off the reward nodes: {placed} (reward: {reward_nodes})"
        recs = [json.loads(x) for f in sorted(records.glob("*.jsonl")) for x in f.read_text().splitlines()]
        scored_on = Counter(r["node"] for r in recs)
        assert set(scored_on) <= reward_nodes, f"samples scored off the reward nodes: {scored_on}"

        # (b) pool size per step: 2 -> 6 -> 3; the step after the scale-up on all 6 workers, none after on more than 3.
        rows = _rows(metrics)
        assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
        assert [r["reward_global_step"] for r in rows] == list(range(STEPS))
        sizes = [r["reward_pool/target_workers"] for r in rows]  # `workers` counts live ones only
        assert sizes == [2] * HOLD_UP + [6] * (HOLD_DOWN - HOLD_UP) + [3] * (STEPS - HOLD_DOWN), sizes
        used = [r["reward_pool/workers_used"] for r in rows]
        assert all(u <= 2 for u in used[:HOLD_UP]), used
        assert used[HOLD_UP + 1] == 6, used  # 8 chunks dispatched to 6 idle live workers: each took one
        assert all(u <= 3 for u in used[HOLD_DOWN + 1:]), used
        assert all(r["reward_pool/retries"] == 0 and r["reward_pool/replaced"] == 0 for r in rows), rows[-1]

        # (c) every step's samples scored exactly once.
        by_step = defaultdict(list)
        for r in recs:
            by_step[r["step"]].append(r)
        assert sorted(by_step) == list(range(STEPS)), sorted(by_step)
        for row in rows:
            s = row["step"] - 1
            uids = list(range(s * PROMPTS, (s + 1) * PROMPTS))  # data.shuffle_dataset=false: rows in file order
            got = by_step[s]
            assert len(got) == G * PROMPTS, f"step {s}: {len(got)} reward calls for {G * PROMPTS} samples"
            assert Counter(r["uid"] for r in got) == dict.fromkeys(uids, G), (
                f"step {s}: {Counter(r['uid'] for r in got)}")
            for u in uids:
                completions = {tuple(r["ids"]) for r in got if r["uid"] == u}
                assert len(completions) == G, f"step {s} prompt {u}: {len(completions)} distinct completions scored"
            assert row["rewards/tagged/mean"] == pytest.approx(sum(map(_value, uids)) / PROMPTS, abs=1e-6), s
            assert row["rewards/tagged/none_frac"] == 0.0
            assert row["rewards/tagged/timeouts"] == 0 and row["rewards/tagged/errors"] == 0
        print(f"\nmulti-node: run {t_run:.0f}s; pool sizes per step {sizes}; workers used "
              f"{used}; workers per reward node {sorted(placed.values())}; "
              f"samples per node {sorted(scored_on.values())}")
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
