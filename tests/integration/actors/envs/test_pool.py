"""EnvPool on a real local Ray cluster, through PoolEnvironments (what a generator's agent loop holds): the box task
end to end, TRL's SIGALRM-bound tool and instance reuse in a real worker, a worker SIGKILLed mid-trajectory, a
SIGSTOPped worker, retiring workers with open sessions, and `rayward scale --env-workers` against a running pool.

Nothing here is timed. A call that must be in flight while the test acts waits on a gate file the test creates
once it has seen what it waits for, so the order of events is fixed whatever the machine's speed."""

import json
import os
import signal
import subprocess
import sys

import pytest

from actors.envs.client import EnvSessionLost, PoolEnvironments
from actors.envs.pool import EnvPool
from actors.envs.spec import EnvSpec
from actors.types import EnvRequest, ToolCall
from orchestrator.cli.scale import RESULT
from tests.conftest import ROOT
from tests.fixtures import envs as fixture_envs
from tests.fixtures.cluster import client_env
from tests.fixtures.waiting import wait_for_stats

WAIT_S = 180.0  # any wait below on a loaded machine; reached only when what is awaited never happens
BOXES = EnvSpec(environments={None: "orchestrator.builtin.tasks.boxes:BoxEnv"})
COUNTER = EnvSpec(environments={None: "tests.fixtures.envs:CounterEnv"})


# Scenario tier: a fault or scaling case (CI time); a SIGKILLed worker mid-run stays in CI
# (agentic/test_tools_run.py).


def make_pool(ray, name, spec, n=2, namespace=None, **kw):
    options = {"namespace": namespace} if namespace else {}
    return ray.remote(EnvPool).options(name=f"{name}/env-pool", num_cpus=0, max_concurrency=1000, **options).remote(
        spec, run_name=name, num_workers=n, worker_options={"num_cpus": 0.25}, sys_path=[], **kw
    )


def wait_for(ray, pool, pred, what, timeout=WAIT_S):
    return wait_for_stats(ray, pool, pred, what, timeout)


def kill_pool(ray, pool):
    for h in ray.get(pool.worker_handles.remote()).values():
        ray.kill(h)
    ray.kill(pool)


def worker_pids(ray, pool):
    return {i: ray.get(h.pid.remote()) for i, h in ray.get(pool.worker_handles.remote()).items()}


def opened(envs, requests):
    out = envs.open(requests).result(timeout=WAIT_S)
    assert all(o.error is None for o in out), out
    return [o.session for o in out]


def test_box_task_end_to_end(ray_cluster):
    """A group of 4 sessions of the box task: spread over the workers, the same boxes for all (the row's seed),
    the tools and get_reward() in the workers, the state pickled for `environments` rewards."""
    from ray import cloudpickle

    from orchestrator.builtin.tasks.boxes import BoxEnv, boxes_dataset

    ray = ray_cluster
    pool = make_pool(ray, "e-boxes", BOXES)
    wait_for(ray, pool, lambda s: s.workers == 2, "2 live workers")
    envs = PoolEnvironments(pool)
    row = boxes_dataset(1)[0]
    sessions = opened(envs, [EnvRequest(None, row, seed=7)] * 4)
    assert sorted(ray.get(pool.session_workers.remote()).values()) == [0, 0, 1, 1]  # least-loaded placement
    codes = [envs.call(s, [ToolCall("open_box", {"box": row["box"]})]).result(timeout=WAIT_S)[0] for s in sessions]
    assert {c.status for c in codes} == {"ok"} and len({c.content for c in codes}) == 1  # one group, one state
    code = int(codes[0].content)
    submits = [code, code, code + 1, code]  # sample 2 submits a wrong code
    for s, c in zip(sessions, submits, strict=True):
        (r,) = envs.call(s, [ToolCall("submit", {"code": c})]).result(timeout=WAIT_S)
        assert r.content == "Submitted."
    (bad,) = envs.call(sessions[0], [ToolCall("open_box", {"box": 9})]).result(timeout=WAIT_S)
    assert bad.status == "error" and bad.content == "{'error': 'There is no box 9; the boxes are 1 to 4.'}"
    closed = envs.close(sessions, keep_state=True).result(timeout=WAIT_S)
    assert [c.reward for c in closed] == [1.0, 1.0, 0.0, 1.0] and all(c.error is None for c in closed)
    env = cloudpickle.loads(closed[0].state)
    assert isinstance(env, BoxEnv) and env.opened == [row["box"]] and env.submitted == code
    stats = ray.get(pool.stats.remote())
    assert (stats.sessions, stats.sessions_opened, stats.sessions_closed, stats.tool_calls, stats.tool_errors) == (
        0, 4, 4, 9, 1)
    with pytest.raises(EnvSessionLost, match="is not open"):
        envs.call(sessions[0], [ToolCall("submit", {"code": 1})]).result(timeout=WAIT_S)
    kill_pool(ray, pool)


def test_trl_tools_bound_by_their_own_sigalrm_and_reused_instances_in_a_real_worker(ray_cluster):
    """TRL's grpo_agent.py tool in a real environment worker: its `signal.alarm` works (sync tools run on the
    worker's main thread, as TRL runs them on the trainer's), and its own alarm cuts a slow query with its own
    message; a tool hanging in pure Python is cut by rayward's bound and the session goes on. The factory (a
    functools.partial) is called once per concurrent session, not per trajectory: its __init__'s client is opened
    twice for six trajectories, and reset starts each afresh."""
    ray = ray_cluster
    spec = EnvSpec(environments={None: "tests.fixtures.envs:sql_env_of_five"}, tool_timeout_s=2.0)
    pool = make_pool(ray, "e-alarm", spec, n=1)
    wait_for(ray, pool, lambda s: s.workers == 1, "the worker")
    envs = PoolEnvironments(pool)

    def turn(session, name, **arguments):
        (r,) = envs.call(session, [ToolCall(name, arguments)]).result(timeout=WAIT_S)
        return r.content, r.status

    rewards = []
    for step in range(3):
        a, b = opened(envs, [EnvRequest(None, {}, seed=step)] * 2)
        assert turn(a, "query", sql_command="SELECT count(*) FROM numbers") == ("[(5,)]", "ok")
        assert turn(b, "opened") == ("2 MainThread", "ok")  # two clients in this worker, on every step
        if step == 0:
            assert turn(a, "query", sql_command=fixture_envs.ENDLESS_QUERY) == (
                "{'error': 'Operation timed out after 1 seconds'}", "error")
            assert turn(b, "spin") == ("{'error': 'Tool spin timed out after 2 s.'}", "timeout")
            assert turn(b, "query", sql_command="SELECT 7") == ("[(7,)]", "ok")  # the session lives on
        rewards.append([c.reward for c in envs.close([a, b], keep_state=False).result(timeout=WAIT_S)])
    assert rewards == [[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]]  # queries per trajectory: reset between them
    s = ray.get(pool.stats.remote())
    assert (s.instances_created, s.instances_reused, s.sessions_opened) == (2, 4, 6)
    assert (s.tool_errors, s.tool_timeouts, s.replaced, s.timeouts, s.sessions_lost) == (1, 1, 0, 0, 0)
    kill_pool(ray, pool)


def test_sigkilled_worker_loses_exactly_its_sessions_and_is_replaced(ray_cluster, tmp_path):
    ray = ray_cluster
    pool = make_pool(ray, "e-kill", COUNTER)
    wait_for(ray, pool, lambda s: s.workers == 2, "2 live workers")
    envs = PoolEnvironments(pool)
    sessions = opened(envs, [EnvRequest(None, {"start": i}, seed=0) for i in range(4)])
    where = ray.get(pool.session_workers.remote())
    victim_worker = where[sessions[0]]
    doomed = [s for s in sessions if where[s] == victim_worker]
    kept = [s for s in sessions if where[s] != victim_worker]
    victim_pid = worker_pids(ray, pool)[victim_worker]  # asked first: a worker answers one call at a time
    gate = tmp_path / "never"
    in_flight = envs.call(doomed[0], [ToolCall("hold", {"gate": str(gate)})])  # mid-trajectory: a call running
    wait_for(ray, pool, lambda s: s.calls_inflight == 1, "the held call in flight")
    os.kill(victim_pid, signal.SIGKILL)
    with pytest.raises(EnvSessionLost, match=f"environment worker {victim_worker} died"):
        in_flight.result(timeout=WAIT_S)
    stats = wait_for(ray, pool, lambda s: s.replaced == 1 and s.workers == 2, "the dead worker replaced")
    assert stats.sessions_lost == len(doomed) == 2 and stats.sessions == 2
    for s in doomed:
        with pytest.raises(EnvSessionLost, match="was lost"):
            envs.call(s, [ToolCall("add", {"n": 1})]).result(timeout=WAIT_S)
    for s in kept:  # the other worker's sessions go on with their state
        assert envs.call(s, [ToolCall("add", {"n": 10})]).result(timeout=WAIT_S)[0].status == "ok"
    closed = envs.close(sessions, keep_state=False).result(timeout=WAIT_S)
    by_session, start = dict(zip(sessions, closed, strict=True)), dict(zip(sessions, range(4), strict=True))
    assert [by_session[s].reward for s in kept] == [10.0 + start[s] for s in kept]
    assert all(by_session[s].reward is None and by_session[s].error.startswith("EnvSessionLost:") for s in doomed)
    assert sorted(ray.get(pool.worker_handles.remote())) == [1 - victim_worker, 2]  # the replacement is worker 2
    assert opened(envs, [EnvRequest(None, {}, seed=0)] * 2)  # the pool takes new sessions
    kill_pool(ray, pool)


def test_sigstopped_worker_is_detected_at_its_deadline_and_replaced(ray_cluster):
    """A stopped worker answers nothing: the call's deadline (tool timeout + grace) kills and replaces it."""
    ray = ray_cluster
    spec = EnvSpec(environments={None: "tests.fixtures.envs:CounterEnv"}, tool_timeout_s=1.0)
    pool = make_pool(ray, "e-stop", spec, grace_s=3.0)
    wait_for(ray, pool, lambda s: s.workers == 2, "2 live workers")
    envs = PoolEnvironments(pool)
    sessions = opened(envs, [EnvRequest(None, {}, seed=0)] * 2)
    where = ray.get(pool.session_workers.remote())
    pid = worker_pids(ray, pool)[where[sessions[0]]]
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(EnvSessionLost, match=r"did not answer a call within 4 s"):
            envs.call(sessions[0], [ToolCall("add", {"n": 1})]).result(timeout=WAIT_S)
        stats = wait_for(ray, pool, lambda s: s.workers == 2 and s.replaced == 1, "the hung worker replaced")
        assert (stats.timeouts, stats.sessions_lost) == (1, 1)
        assert envs.call(sessions[1], [ToolCall("add", {"n": 1})]).result(timeout=WAIT_S)[0].content == "1"
    finally:
        try:
            os.kill(pid, signal.SIGCONT)  # if Ray's kill has not reaped it yet
        except ProcessLookupError:
            pass
    kill_pool(ray, pool)


def test_retiring_workers_finish_their_sessions(ray_cluster):
    """Scaling down never cuts a trajectory: a retiring worker takes no new session and goes once its open ones
    have closed (with their rewards)."""
    ray = ray_cluster
    pool = make_pool(ray, "e-retire", COUNTER, n=3)
    wait_for(ray, pool, lambda s: s.workers == 3, "3 live workers")
    envs = PoolEnvironments(pool)
    sessions = opened(envs, [EnvRequest(None, {"start": 1}, seed=0)] * 3)  # one per worker
    stats = ray.get(pool.scale.remote(1))
    assert stats.target_workers == 1 and stats.retiring == 2 and stats.autoscale == "off"
    more = opened(envs, [EnvRequest(None, {}, seed=0)] * 2)
    live = set(ray.get(pool.worker_handles.remote()))
    assert {ray.get(pool.session_workers.remote())[s] for s in more} <= live  # new sessions on the live worker only
    for s in sessions:
        assert envs.call(s, [ToolCall("add", {"n": 1})]).result(timeout=WAIT_S)[0].content == "2"
    closed = envs.close(sessions + more, keep_state=False).result(timeout=WAIT_S)
    assert [c.reward for c in closed] == [2.0, 2.0, 2.0, 0.0, 0.0]
    stats = wait_for(ray, pool, lambda s: s.retiring == 0, "retiring workers drained and killed")
    assert stats.workers == 1 and stats.sessions_lost == 0 and len(ray.get(pool.worker_handles.remote())) == 1
    kill_pool(ray, pool)


def test_rayward_scale_env_workers(ray_cluster):
    """`rayward scale`'s job body (`python -m orchestrator.cli.scale`, what the job the CLI submits through the
    dashboard runs; that route: tests/integration/cluster/test_multinode.py) in a process of its own, against a
    running run's environment pool."""
    from orchestrator.run.cluster import namespace

    ray = ray_cluster
    name = "e-cli"
    pool = make_pool(ray, name, COUNTER, n=1, namespace=namespace(name))
    wait_for(ray, pool, lambda s: s.workers == 1, "the first worker")
    gcs = ray.get_runtime_context().gcs_address

    def scale(*args, run=name, code=0):
        p = subprocess.run([sys.executable, "-m", "orchestrator.cli.scale", run, "--pool", "env", *args],
                           env=client_env(RAY_ADDRESS=gcs), cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
        assert p.returncode == code, p.stderr[-3000:]
        return p.stdout.strip()

    assert json.loads(scale("--count", "3").split(RESULT)[1])["target_workers"] == 3
    wait_for(ray, pool, lambda s: s.workers == 3, "3 live workers")
    assert json.loads(scale("--min", "1", "--max", "2").split(RESULT)[1])["autoscale"] == "1..2"
    stats = wait_for(ray, pool, lambda s: s.target_workers == 2 and s.retiring == 0, "the pool at its new maximum")
    assert stats.decisions == 2
    reasons = [d["reason"] for d in ray.get(pool.decision_log.remote())]
    assert reasons[0] == ("pinned by `rayward scale --env-workers`")  # no autoscaling to pause
    refused = scale("--count", "2", run="no-such-run", code=2)
    assert "no environment pool (no tools or environment_factory) in run 'no-such-run'" in refused
    kill_pool(ray, pool)


def test_start_env_pool_from_the_config(ray_cluster):
    """orchestrator.run.build.start_env_pool: the named pool `NAME/env-pool` in the run's namespace, its workers
    `NAME/env-<i>` with the config's resources, the spec from the config."""
    from orchestrator.builtin.tasks.boxes import boxes_dataset
    from orchestrator.config import parse_config
    from orchestrator.run.agents import env_spec
    from orchestrator.run.build import start_env_pool
    from orchestrator.run.cluster import namespace

    ray = ray_cluster
    cfg = parse_config({"environment_factory": "orchestrator.builtin.tasks.boxes:BoxEnv",
                        "cluster": {"num_env_workers": 1, "env_worker": {"num_cpus": 0.5}}})
    group = start_env_pool(cfg, "e-build", env_spec(cfg))
    wait_for(ray, group.handle, lambda s: s.workers == 1, "the first worker")
    assert ray.get_actor("e-build/env-pool", namespace=namespace("e-build"))
    assert ray.get_actor("e-build/env-0", namespace=namespace("e-build"))
    envs = PoolEnvironments(group.handle)
    sessions = opened(envs, [EnvRequest(None, boxes_dataset(1)[0], seed=0)])
    assert [c.reward for c in envs.close(sessions, keep_state=False).result(timeout=WAIT_S)] == [0.0]  # no submit
    assert group.stats().sessions_closed == 1
    group.kill()
