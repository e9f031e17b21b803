"""RewardPool on a real local Ray cluster: order, scaling mid-batch, dead workers, hung rewards, workers that cannot
be placed yet, `rayward scale`'s calls, and autoscaling driven by the pool's own counters.

Nothing here is timed. Where a test must act while a batch is still being scored, the batch's reward calls wait
on a gate file (the `gate` column) that the test creates once it has seen what it waits for, so the order of
events is fixed whatever the machine's speed."""

import os
import signal
import time

import pytest

from actors.rewards.pool import RewardPool
from actors.rewards.worker import RewardSpec
from actors.runtime.autoscale import AutoscaleSettings
from actors.types import RewardBatch, TrainerState
from orchestrator.config import RewardAutoscaleConfig
from tests.fixtures.waiting import wait_for_stats

# Long enough for any wait below on a loaded machine; reached only when what is awaited never happens.
WAIT_S = 180.0
HUNG_S = 600.0  # a hung reward call's sleep: far beyond the test (its worker is killed at the end)


# Scenario tier: a fault or scaling case (CI time); the policies on fakes in the unit tier.


def gated_index(completions, idx, gate, **kw):
    """Returns each sample's `idx`; a sample whose `gate` names a file first waits until that file exists."""
    for path in set(gate):
        while path and not os.path.exists(path):
            time.sleep(0.01)
    return [float(i) for i in idx]


def hang_on_odd(completions, idx, **kw):
    if idx[0] % 2:
        time.sleep(HUNG_S)
    return [1.0]


GATED = RewardSpec("idx", f"{__name__}:gated_index", timeout_s=WAIT_S)


def make_pool(ray, name, specs, n=2, worker_cpus=0.25, autoscale=None):
    return ray.remote(RewardPool).options(name=f"{name}/reward-pool", num_cpus=0, max_concurrency=100).remote(
        specs, run_name=name, num_workers=n, worker_options={"num_cpus": worker_cpus}, sys_path=[],
        autoscale=autoscale,
    )


def wait_for(ray, pool, pred, what, timeout=WAIT_S):
    return wait_for_stats(ray, pool, pred, what, timeout)


def batch(n, g=4, gate=""):
    return RewardBatch(["p"] * n, ["c"] * n, [[1]] * n, {"idx": list(range(n)), "gate": [str(gate)] * n}, g)


def in_order(n):
    return [[float(i) for i in range(n)]]


def settings(min_workers, max_workers, **kw) -> AutoscaleSettings:
    """Autoscaling with the config's defaults but for `kw`."""
    return AutoscaleSettings(**RewardAutoscaleConfig(min_workers=min_workers, max_workers=max_workers,
                                                     **kw).model_dump())


def kill_pool(ray, pool):
    for h in ray.get(pool.worker_handles.remote()).values():
        ray.kill(h)
    ray.kill(pool)


def test_scores_in_order_across_workers(ray_cluster):
    ray = ray_cluster
    pool = make_pool(ray, "t-order", [GATED], n=3)
    wait_for(ray, pool, lambda s: s.workers == 3, "3 live workers")  # chunks go to live workers only
    out = ray.get(pool.score.remote(batch(48), 1))
    assert out.scores == in_order(48)
    assert out.workers == [0, 1, 2]  # 12 chunks, 3 idle workers: each took the least-loaded's share
    kill_pool(ray, pool)


def test_scale_up_and_down_mid_batch_scores_every_sample_once(ray_cluster, tmp_path):
    """Added workers take the queued chunks of the batch in flight; retired ones finish theirs first."""
    ray = ray_cluster
    pool = make_pool(ray, "t-scale", [GATED], n=2)
    wait_for(ray, pool, lambda s: s.workers == 2, "2 live workers")
    gate_a, gate_b = tmp_path / "a", tmp_path / "b"
    ref_a = pool.score.remote(batch(48, gate=gate_a), 1)  # 12 chunks: 2 calls held per worker, the rest queued
    wait_for(ray, pool, lambda s: s.calls_inflight == 4 and s.queue_depth > 0, "batch A holding both workers")
    stats = ray.get(pool.scale.remote(6))  # mid-batch A
    assert stats.target_workers == 6 and stats.workers == 2  # new workers count once alive
    wait_for(ray, pool, lambda s: s.workers == 6 and s.queue_depth == 0, "6 live workers holding all of A")
    gate_a.touch()
    out_a = ray.get(ref_a)
    assert out_a.scores == in_order(48)  # all once, in order
    assert max(out_a.workers) >= 2  # the first two held their calls: only added workers can have taken the rest

    ref_b = pool.score.remote(batch(48, gate=gate_b), 1)  # 12 one-chunk calls: 2 held by each of the 6 workers
    wait_for(ray, pool, lambda s: s.calls_inflight == 12, "batch B held by all 6 workers")
    stats = ray.get(pool.scale.remote(3))  # mid-batch B
    assert stats.target_workers == 3 and stats.retiring == 3
    gate_b.touch()
    out_b = ray.get(ref_b)
    assert out_b.scores == in_order(48)
    assert out_b.workers == [0, 1, 2, 3, 4, 5]  # the retiring workers finished their chunks
    stats = wait_for(ray, pool, lambda s: s.retiring == 0, "retiring workers drained and killed")
    assert stats.workers == 3 and stats.target_workers == 3 and stats.retries == 0
    assert len(ray.get(pool.worker_handles.remote())) == 3
    kill_pool(ray, pool)


def test_sigkilled_worker_is_replaced_and_its_chunks_rerun(ray_cluster, tmp_path):
    ray = ray_cluster
    pool = make_pool(ray, "t-kill", [GATED], n=2)
    wait_for(ray, pool, lambda s: s.workers == 2, "2 live workers")
    victim = ray.get(ray.get(pool.worker_handles.remote())[0].pid.remote())
    gate = tmp_path / "go"
    ref = pool.score.remote(batch(48, gate=gate), 1)
    wait_for(ray, pool, lambda s: s.calls_inflight == 4, "both workers holding chunks")
    os.kill(victim, signal.SIGKILL)  # worker 0 dies holding two calls
    wait_for(ray, pool, lambda s: s.replaced == 1, "the dead worker replaced")
    gate.touch()
    out = ray.get(ref)
    assert out.scores == in_order(48)  # its chunks were scored again elsewhere, each once
    assert 0 not in out.workers  # nothing of the dead worker's arrived
    stats = ray.get(pool.stats.remote())
    assert stats.retries >= 1 and stats.replaced == 1 and stats.target_workers == 2
    kill_pool(ray, pool)


def test_a_stopped_worker_does_not_hold_up_the_learners_state_push(ray_cluster):
    """The learner waits for `set_state` after every optimizer step: a worker that answers nothing (SIGSTOPped,
    idle) must not hang it. The chunk path finds such a worker (test_recovery's chaos run)."""
    ray = ray_cluster
    pool = make_pool(ray, "t-stop", [GATED], n=2)
    wait_for(ray, pool, lambda s: s.workers == 2, "2 live workers")
    victim = ray.get(ray.get(pool.worker_handles.remote())[0].pid.remote())
    os.kill(victim, signal.SIGSTOP)
    try:
        assert ray.get(pool.set_state.remote(TrainerState(global_step=3, max_steps=9)), timeout=WAIT_S) == 3
        assert ray.get(pool.stats.remote()).global_step == 3
    finally:
        kill_pool(ray, pool)  # SIGKILL ends a stopped process too


def test_hung_reward_is_cut_at_its_timeout(ray_cluster):
    """The odd samples' calls sleep far longer than the test: the batch returns with their fallback at the
    reward's timeout while they still hang."""
    ray = ray_cluster
    spec = RewardSpec("h", f"{__name__}:hang_on_odd", timeout_s=2.0, fallback=-5.0)
    pool = make_pool(ray, "t-hang", [spec], n=2)
    out = ray.get(pool.score.remote(batch(16), 1), timeout=HUNG_S / 2)
    assert out.scores == [[1.0 if i % 2 == 0 else -5.0 for i in range(16)]]
    assert out.timeouts == {"h": 8}
    kill_pool(ray, pool)


def test_failing_reward_propagates_a_named_error(ray_cluster):
    ray = ray_cluster
    pool = make_pool(ray, "t-err", [RewardSpec("bad", "tests.unit.actors.rewards.test_worker:raises_on_b")], n=1)
    b = batch(4)
    b.completions = ["a", "b", "a", "a"]
    with pytest.raises(Exception, match=r"reward 'bad' raised on sample 1"):
        ray.get(pool.score.remote(b, 1))
    kill_pool(ray, pool)


def test_a_worker_that_cannot_be_placed_does_not_hold_up_scoring(ray_cluster):
    """Workers asking for more CPUs than are free wait (on an autoscaling cluster: for a new node); scoring goes
    on on the live ones, and shrinking retires a waiting worker first."""
    ray = ray_cluster
    free = ray.available_resources().get("CPU", 0.0)
    per_worker = free / 2.5  # two fit, a third does not
    pool = make_pool(ray, "t-pending", [GATED], n=2, worker_cpus=per_worker)
    wait_for(ray, pool, lambda s: s.workers == 2, "2 live workers")
    stats = ray.get(pool.scale.remote(3))
    assert stats.target_workers == 3 and stats.starting == 1
    out = ray.get(pool.score.remote(batch(64), 1))
    assert out.scores == in_order(64) and out.workers == [0, 1]
    stats = ray.get(pool.stats.remote())
    assert stats.workers == 2 and stats.starting == 1 and stats.retries == 0  # scored while the third waited
    stats = ray.get(pool.scale.remote(2))  # the waiting worker goes, not a live one
    assert stats.target_workers == 2 and stats.starting == 0 and stats.workers == 2
    wait_for(ray, pool, lambda s: s.retiring == 0, "the waiting worker killed")
    assert len(ray.get(pool.worker_handles.remote())) == 2
    kill_pool(ray, pool)


# --- autoscaling -------------------------------------------------------------------------------------------


def test_rayward_scale_pins_the_count_and_min_max_resume_autoscaling(ray_cluster):
    """What `rayward scale NAME --reward-workers N` and `--min/--max` call on a running pool."""
    ray = ray_cluster
    fixed = make_pool(ray, "t-bounds-off", [GATED], n=1)
    with pytest.raises(ValueError, match="autoscaling is off for this run: give both --min and --max"):
        ray.get(fixed.set_bounds.remote(2, None))
    stats = ray.get(fixed.set_bounds.remote(2, 3, fresh=settings(2, 3)))  # turns it on; 1 is below the new minimum
    assert stats.autoscale == "2..3" and stats.target_workers == 2
    kill_pool(ray, fixed)

    pool = make_pool(ray, "t-bounds", [GATED], n=1, autoscale=settings(1, 4, upscale_delay_s=0))
    assert ray.get(pool.stats.remote()).autoscale == "1..4"
    stats = ray.get(pool.scale.remote(3))
    assert stats.target_workers == 3 and stats.autoscale == "pinned (bounds 1..4)"
    with pytest.raises(ValueError, match="min_workers <= max_workers"):
        ray.get(pool.set_bounds.remote(5, None))  # above max 4: refused, nothing changes
    assert ray.get(pool.stats.remote()).autoscale == "pinned (bounds 1..4)"
    stats = ray.get(pool.set_bounds.remote(None, 2))  # autoscaling again, the target moves into the bounds now
    assert stats.autoscale == "1..2" and stats.target_workers == 2 and stats.decisions == 2
    reasons = [d["reason"] for d in ray.get(pool.decision_log.remote())]
    assert reasons == ["pinned by `rayward scale --reward-workers`; autoscaling paused until `rayward scale "
                       "--min/--max`", "bounds set to 1..2"]
    kill_pool(ray, pool)


# Short windows and delays. The policy's behaviour over whole runs (how far and how fast the pool grows for a
# slower reward, worker-seconds against a fixed pool, no flapping) is proven on simulated runs in
# tests/unit/actors/runtime/test_autoscale.py.
AUTOSCALE = settings(1, 3, target_utilization=0.5, look_back_s=1.0, upscale_delay_s=0.0, downscale_delay_s=0.5)


def test_autoscaling_grows_for_a_held_batch_and_shrinks_when_idle(ray_cluster, tmp_path):
    """What only the real pool shows: its own counters drive the policy, the workers it adds start and take the
    queued chunks of the batch in flight, the ones it retires go once drained, and every sample is scored once.
    The held batch keeps its workers busy until the test has seen the pool reach max_workers."""
    ray = ray_cluster
    pool = make_pool(ray, "t-autoscale", [GATED], n=1, autoscale=AUTOSCALE)
    wait_for(ray, pool, lambda s: s.workers == 1, "the first worker")
    for _ in range(2):  # quick one-chunk batches: whole arrival-to-arrival cycles for the policy's window
        assert ray.get(pool.score.remote(batch(4), 1)).scores == in_order(4)
    gate = tmp_path / "go"
    ref = pool.score.remote(batch(24, gate=gate), 1)  # 6 chunks; worker 0 holds 3, the others queue
    wait_for(ray, pool, lambda s: s.workers == AUTOSCALE.max_workers, "the pool grown to max_workers")
    gate.touch()
    out = ray.get(ref)
    assert out.scores == in_order(24)
    assert out.workers == [0, 1, 2]  # worker 0 held its chunks: the added workers scored the queued ones

    # Idle but for one-chunk batches: once the held batch leaves the window, the load asks for min_workers.
    deadline = time.time() + WAIT_S
    while (stats := ray.get(pool.stats.remote())).target_workers > AUTOSCALE.min_workers:
        assert time.time() < deadline, f"the pool did not shrink to min_workers: {stats}"
        assert ray.get(pool.score.remote(batch(4), 1)).scores == in_order(4)
        time.sleep(AUTOSCALE.look_back_s)
    stats = wait_for(ray, pool, lambda s: s.retiring == 0, "retiring workers drained and killed")
    assert stats.workers == 1 and len(ray.get(pool.worker_handles.remote())) == 1
    assert stats.retries == 0 and stats.start_failures == 0
    afters = [d["after"] for d in ray.get(pool.decision_log.remote())]
    assert afters[:2] == [2, 3] and afters[-1] == 1, afters  # grew one measured step at a time, back to min
    kill_pool(ray, pool)
