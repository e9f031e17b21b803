"""JudgePool on a real local Ray cluster, its engines stand-ins that answer from the request (no vLLM): answers in
request order across engines, an engine killed mid-call (its requests re-sent, every request answered once),
`scale`, and the answer a request gets when no engine can take it. The engine itself, on an engine loop, is
tests/unit/actors/engines/test_judge.py."""

from __future__ import annotations

import json
import os
import sys
import time

from actors.engines.judge import JudgeAnswer, JudgeRequest, JudgeSpec
from actors.engines.pool import JudgePool
from tests.fixtures.waiting import wait_for_stats

WAIT_S = 180.0
SPEC = JudgeSpec(reward="judged", model="stand-in", template="{completion}", labels={"yes": 1.0}, timeout_s=30.0)


class StandInEngine:
    """A judge engine's interface: answers each request with its `i` field; a request whose `gate` names a file
    waits until that file exists; every answer is also appended to `record` (one line per request answered)."""

    def __init__(self, spec: JudgeSpec, sys_path=None, record: str = "", **_):
        self.record = record

    def pid(self) -> int:
        return os.getpid()

    def judge(self, requests: list[JudgeRequest]) -> list[JudgeAnswer]:
        for r in requests:
            while r.fields.get("gate") and not os.path.exists(r.fields["gate"]):
                time.sleep(0.01)
            time.sleep(r.fields.get("delay", 0.0))
        with open(self.record, "a") as f:
            f.writelines(f"{r.fields['i']}\n" for r in requests)
        return [JudgeAnswer("ok", float(r.fields["i"]), text="yes") for r in requests]


def make_pool(ray, name, record, n=2, namespace=None, **kw):
    return ray.remote(JudgePool).options(name=f"{name}/judge-judged-pool", num_cpus=0, max_concurrency=100,
                                         namespace=namespace).remote(
        SPEC, run_name=name, role="judge-judged", num_engines=n, engine_options={"num_cpus": 0.25},
        engine_kwargs={"record": str(record)}, engine_cls=StandInEngine, **kw)


def requests(n, gate=""):
    return [JudgeRequest({"i": i, "gate": str(gate)}) for i in range(n)]


def kill_pool(ray, pool):
    for h in ray.get(pool.worker_handles.remote()).values():
        ray.kill(h)
    ray.kill(pool)


def test_answers_in_order_across_engines_and_a_killed_engines_requests_answered_once(ray_cluster, tmp_path):
    ray = ray_cluster
    record = tmp_path / "answered"
    pool = make_pool(ray, "t-judge", record, max_inflight=8)
    wait_for_stats(ray, pool, lambda s: s.workers == 2, "2 live engines", WAIT_S)
    out = ray.get(pool.judge.remote(requests(40)))
    assert [a.value for a in out] == [float(i) for i in range(40)]
    stats = ray.get(pool.stats.remote())
    assert stats.requests == 40 and stats.requests_inflight == 0 and stats.queue_depth == 0

    # Both engines hold gated calls (8 requests each, the rest queued); one is killed mid-call.
    gate = tmp_path / "gate"
    record.unlink()
    ref = pool.judge.remote(requests(40, gate))
    wait_for_stats(ray, pool, lambda s: s.requests_inflight == 16 and s.queue_depth == 24, "both engines full",
                   WAIT_S)
    victim = ray.get(pool.worker_handles.remote())[0]
    ray.kill(victim, no_restart=True)
    wait_for_stats(ray, pool, lambda s: s.retries >= 1 and s.replaced >= 1, "the dead engine replaced", WAIT_S)
    gate.touch()
    out = ray.get(ref, timeout=WAIT_S)
    assert [a.value for a in out] == [float(i) for i in range(40)] and all(a.status == "ok" for a in out)
    answered = [int(x) for x in record.read_text().split()]
    assert sorted(answered) == list(range(40))  # the killed engine answered none: each request exactly once
    stats = ray.get(pool.stats.remote())
    assert stats.requests == 80 and stats.retries >= 1

    stats = ray.get(pool.scale.remote(3))
    assert stats.target_workers == 3
    wait_for_stats(ray, pool, lambda s: s.workers == 3, "3 live engines", WAIT_S)
    out = ray.get(pool.judge.remote(requests(30)))
    assert [a.value for a in out] == [float(i) for i in range(30)]
    kill_pool(ray, pool)


def test_requests_no_engine_takes_are_answered_timeout(ray_cluster, tmp_path):
    ray = ray_cluster
    # Its one engine asks for a resource no node has: it never starts.
    pool = ray.remote(JudgePool).options(num_cpus=0, max_concurrency=100).remote(
        SPEC, run_name="t-judge-unplaced", role="judge-judged", num_engines=1,
        engine_options={"num_cpus": 0.25, "resources": {"no-such-node": 1}},
        engine_kwargs={"record": str(tmp_path / "answered")}, engine_cls=StandInEngine, queue_timeout_s=1.0)
    out = ray.get(pool.judge.remote(requests(3)), timeout=WAIT_S)
    assert [a.status for a in out] == ["timeout"] * 3 and "no judge engine took" in out[0].error
    stats = ray.get(pool.stats.remote())
    assert stats.timeouts == 3 and stats.queue_depth == 0
    kill_pool(ray, pool)




def test_rayward_scale_judge_engines(ray_cluster, tmp_path):
    """`rayward scale`'s job body (`python -m orchestrator.cli.scale`, what the job the CLI submits through the
    dashboard runs) in a process of its own, against a running run's judge pool: the run's only judge is found
    without --judge; bounds name it."""
    import subprocess

    from orchestrator.cli.scale import RESULT
    from orchestrator.run.cluster import namespace
    from tests.conftest import ROOT
    from tests.fixtures.cluster import client_env

    ray = ray_cluster
    name = "j-cli"
    pool = make_pool(ray, name, tmp_path / "answered", n=1, namespace=namespace(name))
    wait_for_stats(ray, pool, lambda s: s.workers == 1, "the first engine", WAIT_S)
    gcs = ray.get_runtime_context().gcs_address

    def scale(*args, code=0):
        p = subprocess.run([sys.executable, "-m", "orchestrator.cli.scale", name, "--pool", "judge", *args],
                           env=client_env(RAY_ADDRESS=gcs), cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
        assert p.returncode == code, p.stderr[-3000:]
        return p.stdout.strip()

    assert json.loads(scale("--count", "3").split(RESULT)[1])["target_workers"] == 3
    wait_for_stats(ray, pool, lambda s: s.workers == 3, "3 live engines", WAIT_S)
    assert json.loads(scale("--judge", "judged", "--min", "1", "--max", "2").split(RESULT)[1])["autoscale"] == "1..2"
    wait_for_stats(ray, pool, lambda s: s.target_workers == 2 and s.retiring == 0, "the pool at its new maximum",
                   WAIT_S)
    assert "no judge reward 'nope' in run 'j-cli'" in scale("--count", "2", "--judge", "nope", code=2)
    kill_pool(ray, pool)


def test_the_pool_grows_while_the_judge_is_slow_and_shrinks_back_when_it_is_fast(ray_cluster, tmp_path):
    """The reward pool's sync-loop shape: a batch of 4 parts of 8 requests, then a pause (generation and training).
    Each answer takes 50 ms while the judge is slow (one engine takes 4 calls at a time): the pool grows; once it
    is fast, it shrinks back to 1."""
    from actors.runtime.autoscale import AutoscaleSettings

    ray = ray_cluster
    settings = AutoscaleSettings(1, 3, target_utilization=0.5, look_back_s=3.0, upscale_delay_s=0.0,
                                 downscale_delay_s=2.0)
    pool = make_pool(ray, "t-judge-scale", tmp_path / "answered", n=1, autoscale=settings)
    wait_for_stats(ray, pool, lambda s: s.workers == 1, "the first engine", WAIT_S)

    def step(delay: float) -> None:
        ray.get(pool.begin_batch.remote())
        parts = [[JudgeRequest({"i": i, "delay": delay}) for i in range(8)] for _ in range(4)]
        ray.get([pool.judge.remote(p, part=True) for p in parts])
        time.sleep(0.3)

    live = []
    for _ in range(12):
        step(0.05)
        live.append(ray.get(pool.stats.remote()).workers)
    assert max(live) >= 2, live
    for _ in range(60):
        step(0.0)
        if ray.get(pool.stats.remote()).target_workers == 1:
            break
    stats = ray.get(pool.stats.remote())
    assert stats.target_workers == 1 and stats.requests == 32 * (12 + _ + 1), stats
    kill_pool(ray, pool)
