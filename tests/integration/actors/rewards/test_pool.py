"""RewardPool on a real local Ray cluster: order, scaling mid-batch, dead workers, time bounds."""

import os
import signal
import threading
import time

import pytest

from actors.rewards.pool import RewardPool
from actors.rewards.worker import RewardSpec
from actors.types import RewardBatch


def slow_index(completions, idx, **kw):
    """Latency-bound reward (like a sandbox call): returns the sample's own index."""
    time.sleep(0.05)
    return [float(i) for i in idx]


def hang_on_odd(completions, idx, **kw):
    if idx[0] % 2:
        time.sleep(60)
    return [1.0]


def make_pool(ray, name, specs, n=2):
    return ray.remote(RewardPool).options(name=f"{name}/reward-pool", num_cpus=0, max_concurrency=100).remote(
        specs, run_name=name, num_workers=n, worker_options={"num_cpus": 0.25}, sys_path=[]
    )


def batch(n, g=4):
    return RewardBatch(["p"] * n, ["c"] * n, [[1]] * n, {"idx": list(range(n))}, g)


def kill_pool(ray, pool):
    for h in ray.get(pool.worker_handles.remote()).values():
        ray.kill(h)
    ray.kill(pool)


def test_scores_in_order_across_workers(ray_cluster):
    ray = ray_cluster
    pool = make_pool(ray, "t-order", [RewardSpec("idx", f"{__name__}:slow_index")], n=3)
    out = ray.get(pool.score.remote(batch(48), 1))
    assert out.scores == [[float(i) for i in range(48)]]
    assert len(out.workers) >= 2  # chunks were spread
    kill_pool(ray, pool)


def test_scale_up_and_down_mid_batch_scores_every_sample_once(ray_cluster):
    ray = ray_cluster
    pool = make_pool(ray, "t-scale", [RewardSpec("idx", f"{__name__}:slow_index")], n=2)
    ray.get(pool.score.remote(batch(8), 1))  # workers warm
    ref = pool.score.remote(batch(400), 1)  # 100 chunks of 4 x 50 ms
    time.sleep(1.0)
    assert ray.get(pool.scale.remote(6))["workers"] == 6
    time.sleep(1.0)
    assert ray.get(pool.scale.remote(3))["workers"] == 3
    out = ray.get(ref)
    assert out.scores == [[float(i) for i in range(400)]]  # all once, in order
    assert len(out.workers) > 2  # new workers took chunks
    deadline = time.time() + 20
    while ray.get(pool.stats.remote())["retiring"] and time.time() < deadline:
        time.sleep(0.2)
    stats = ray.get(pool.stats.remote())
    assert stats["workers"] == 3 and stats["retiring"] == 0 and stats["retries"] == 0
    kill_pool(ray, pool)


def test_sigkilled_worker_is_replaced_and_its_chunks_rerun(ray_cluster):
    ray = ray_cluster
    pool = make_pool(ray, "t-kill", [RewardSpec("idx", f"{__name__}:slow_index")], n=2)
    ray.get(pool.score.remote(batch(8), 1))
    victim = ray.get(pool.worker_handles.remote())
    pid = ray.get(next(iter(victim.values())).pid.remote())
    ref = pool.score.remote(batch(1200), 1)  # 300 chunks of 4 x 50 ms: seconds of work, so the kill lands mid-batch
    threading.Timer(0.8, lambda: os.kill(pid, signal.SIGKILL)).start()
    out = ray.get(ref)
    assert out.scores == [[float(i) for i in range(1200)]]
    stats = ray.get(pool.stats.remote())
    assert stats["retries"] >= 1 and stats["replaced"] >= 1 and stats["workers"] == 2
    kill_pool(ray, pool)


def test_hung_reward_is_cut_at_its_timeout(ray_cluster):
    ray = ray_cluster
    spec = RewardSpec("h", f"{__name__}:hang_on_odd", timeout_s=1.0, fallback=-5.0)
    pool = make_pool(ray, "t-hang", [spec], n=2)
    ray.get(pool.score.remote(batch(4), 1))  # warm (2 samples hang -> 1 s)
    t0 = time.monotonic()
    out = ray.get(pool.score.remote(batch(16), 1))
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0 + 3.0, elapsed  # timeout plus margin, not 60 s
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
