"""RewardPool on a real local Ray cluster: order, scaling mid-batch, dead workers, time bounds, workers that
cannot be placed yet, and autoscaling on a reward that slows down and recovers."""

import json
import os
import signal
import threading
import time
from collections import Counter

import pytest

from actors.rewards.autoscale import AutoscaleSettings
from actors.rewards.pool import RewardPool
from actors.rewards.worker import RewardSpec
from actors.types import RewardBatch, TrainerState


def slow_index(completions, idx, **kw):
    """Latency-bound reward (like a sandbox call): returns the sample's own index."""
    time.sleep(0.05)
    return [float(i) for i in idx]


def hang_on_odd(completions, idx, **kw):
    if idx[0] % 2:
        time.sleep(60)
    return [1.0]


def make_pool(ray, name, specs, n=2, worker_cpus=0.25, autoscale=None):
    return ray.remote(RewardPool).options(name=f"{name}/reward-pool", num_cpus=0, max_concurrency=100).remote(
        specs, run_name=name, num_workers=n, worker_options={"num_cpus": worker_cpus}, sys_path=[],
        autoscale=autoscale,
    )


def wait_for(ray, pool, pred, what, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        stats = ray.get(pool.stats.remote())
        if pred(stats):
            return stats
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}: {stats}")


def batch(n, g=4):
    return RewardBatch(["p"] * n, ["c"] * n, [[1]] * n, {"idx": list(range(n))}, g)


def kill_pool(ray, pool):
    for h in ray.get(pool.worker_handles.remote()).values():
        ray.kill(h)
    ray.kill(pool)


def test_scores_in_order_across_workers(ray_cluster):
    ray = ray_cluster
    pool = make_pool(ray, "t-order", [RewardSpec("idx", f"{__name__}:slow_index")], n=3)
    wait_for(ray, pool, lambda s: s["workers"] == 3, "3 live workers")  # chunks go to live workers only
    out = ray.get(pool.score.remote(batch(48), 1))
    assert out.scores == [[float(i) for i in range(48)]]
    assert len(out.workers) >= 2  # chunks were spread
    kill_pool(ray, pool)


def test_scale_up_and_down_mid_batch_scores_every_sample_once(ray_cluster):
    ray = ray_cluster
    pool = make_pool(ray, "t-scale", [RewardSpec("idx", f"{__name__}:slow_index")], n=2)
    wait_for(ray, pool, lambda s: s["workers"] == 2, "2 live workers")
    ref_a = pool.score.remote(batch(1600), 1)  # 400 chunks of 4 x 50 ms: ~5 s on 2 workers
    time.sleep(0.5)
    stats = ray.get(pool.scale.remote(6))  # mid-batch A
    assert stats["target_workers"] == 6 and stats["workers"] == 2  # new workers count once alive
    wait_for(ray, pool, lambda s: s["workers"] == 6, "6 live workers")
    ref_b = pool.score.remote(batch(1600), 1)  # ~1.7 s on 6 workers
    time.sleep(0.5)
    assert ray.get(pool.scale.remote(3))["target_workers"] == 3  # mid-batch B
    out_a, out_b = ray.get([ref_a, ref_b])
    assert out_a.scores == out_b.scores == [[float(i) for i in range(1600)]]  # all once, in order
    assert len(out_b.workers) > 2  # new workers took chunks
    stats = wait_for(ray, pool, lambda s: s["retiring"] == 0, "retiring workers drained and killed")
    assert stats["workers"] == 3 and stats["target_workers"] == 3 and stats["retries"] == 0
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
    assert stats["retries"] >= 1 and stats["replaced"] >= 1 and stats["target_workers"] == 2
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


def test_a_worker_that_cannot_be_placed_does_not_hold_up_scoring(ray_cluster):
    """Workers asking for more CPUs than are free wait (on an autoscaling cluster: for a new node); scoring goes
    on on the live ones, and shrinking retires a waiting worker first."""
    ray = ray_cluster
    free = ray.available_resources().get("CPU", 0.0)
    per_worker = free / 2.5  # two fit, a third does not
    pool = make_pool(ray, "t-pending", [RewardSpec("idx", f"{__name__}:slow_index")], n=2, worker_cpus=per_worker)
    wait_for(ray, pool, lambda s: s["workers"] == 2, "2 live workers")
    stats = ray.get(pool.scale.remote(3))
    assert stats["target_workers"] == 3 and stats["starting"] == 1
    t0 = time.monotonic()
    out = ray.get(pool.score.remote(batch(64), 1))  # 16 chunks x 50 ms on 2 workers
    assert time.monotonic() - t0 < 10 and out.scores == [[float(i) for i in range(64)]]
    stats = ray.get(pool.stats.remote())
    assert stats["workers"] == 2 and stats["starting"] == 1 and stats["retries"] == 0
    stats = ray.get(pool.scale.remote(2))  # the waiting worker goes, not a live one
    assert stats["target_workers"] == 2 and stats["starting"] == 0 and stats["workers"] == 2
    wait_for(ray, pool, lambda s: s["retiring"] == 0, "the waiting worker killed")
    assert len(ray.get(pool.worker_handles.remote())) == 2
    kill_pool(ray, pool)


# --- autoscaling -------------------------------------------------------------------------------------------


def test_rayward_scale_pins_the_count_and_min_max_resume_autoscaling(ray_cluster):
    """What `rayward scale NAME --reward-workers N` and `--min/--max` call on a running pool."""
    ray = ray_cluster
    spec = RewardSpec("idx", f"{__name__}:slow_index")
    fixed = make_pool(ray, "t-bounds-off", [spec], n=1)
    with pytest.raises(ValueError, match="autoscaling is off for this run: give both --min and --max"):
        ray.get(fixed.set_bounds.remote(2, None))
    stats = ray.get(fixed.set_bounds.remote(2, 3))  # turns it on; 1 is below the new minimum
    assert stats["autoscale"] == "2..3" and stats["target_workers"] == 2
    kill_pool(ray, fixed)

    pool = make_pool(ray, "t-bounds", [spec], n=1, autoscale=AutoscaleSettings(1, 4, upscale_delay_s=0))
    assert ray.get(pool.stats.remote())["autoscale"] == "1..4"
    stats = ray.get(pool.scale.remote(3))
    assert stats["target_workers"] == 3 and stats["autoscale"] == "pinned (bounds 1..4)"
    with pytest.raises(ValueError, match="min_workers <= max_workers"):
        ray.get(pool.set_bounds.remote(5, None))  # above max 4: refused, nothing changes
    assert ray.get(pool.stats.remote())["autoscale"] == "pinned (bounds 1..4)"
    stats = ray.get(pool.set_bounds.remote(None, 2))  # autoscaling again, the target moves into the bounds now
    assert stats["autoscale"] == "1..2" and stats["target_workers"] == 2 and stats["decisions"] == 2
    reasons = [d["reason"] for d in ray.get(pool.decision_log.remote())]
    assert reasons == ["pinned by `rayward scale --reward-workers`; autoscaling paused until `rayward scale "
                       "--min/--max`", "bounds set to 1..2"]
    kill_pool(ray, pool)


# A reward (tests/fixtures/slow_rewards.py: step_latency) whose calls take BASE_S, 8x that from step RISE to
# step DROP, one call at a time per worker. Each step: one batch of PROMPTS x G samples (chunks of one group),
# then REST_S of "generation and training". Delays are seconds, not Serve's minutes, so the test takes ~1 min.
BASE_S, FACTOR, RISE, DROP, STEPS = 0.02, 8, 3, 10, 17
PROMPTS, G, REST_S = 8, 4, 1.5
AUTOSCALE = AutoscaleSettings(min_workers=1, max_workers=4, target_utilization=0.5, look_back_s=3.0,
                              upscale_delay_s=1.0, downscale_delay_s=3.0)


def uid_batch(step: int) -> RewardBatch:
    n = PROMPTS * G
    uids = [step * n + i for i in range(n)]
    return RewardBatch(["p"] * n, ["c"] * n, [[1]] * n, {"uid": uids}, G)


def test_autoscaling_follows_a_reward_that_slows_down_and_recovers(ray_cluster, tmp_path):
    ray = ray_cluster
    record = tmp_path / "scored"
    spec = RewardSpec("slow", "tests.fixtures.slow_rewards:step_latency", kwargs={
        "record_dir": str(record), "base_s": BASE_S, "factor": FACTOR, "rise_step": RISE, "drop_step": DROP})
    pool = make_pool(ray, "t-autoscale", [spec], n=1, autoscale=AUTOSCALE)
    wait_for(ray, pool, lambda s: s["workers"] == 1, "the first worker")
    rows = []
    for step in range(STEPS):
        ray.get(pool.set_state.remote(TrainerState(global_step=step)))  # the learner's push
        t0 = time.monotonic()
        out = ray.get(pool.score.remote(uid_batch(step), 1))
        rows.append({"step": step, "slow": RISE <= step < DROP, "reward_s": time.monotonic() - t0,
                     "workers": out.pool["workers"], "target": out.pool["target_workers"]})
        time.sleep(REST_S)
    # Idle now (the run's end): the pool keeps shrinking to min_workers if it has not yet.
    stats = wait_for(ray, pool, lambda s: s["target_workers"] == AUTOSCALE.min_workers, "min_workers", timeout=20)
    decisions = ray.get(pool.decision_log.remote())
    kill_pool(ray, pool)
    table = "\n".join(f"{r['step']:>2} {'slow' if r['slow'] else 'fast'} target {r['target']} live {r['workers']} "
                      f"reward {r['reward_s']:.2f}s" for r in rows)
    table += "\n" + "\n".join(f"{d['before']} -> {d['after']}: {d['reason']}" for d in decisions)

    # The pool grew while the reward was slow, and the reward phase fell to at most half of the first slow step's.
    slow = [r for r in rows if r["slow"]]
    assert max(r["target"] for r in slow) >= 3, table
    assert min(r["reward_s"] for r in slow[-3:]) <= 0.5 * slow[0]["reward_s"], table
    # After the drop it shrank back to min_workers (or one above it, while the last steps still ran).
    assert rows[-1]["target"] <= AUTOSCALE.min_workers + 1, table
    assert all(d["after"] <= AUTOSCALE.max_workers for d in decisions), table
    assert [d["after"] > d["before"] for d in decisions].count(False) >= 1, table

    # Every sample scored exactly once, under the step it was sent in, and none retried.
    recs = [json.loads(line) for f in record.glob("*.jsonl") for line in f.read_text().splitlines()]
    n = PROMPTS * G
    assert Counter(r["uid"] for r in recs) == Counter(range(STEPS * n)), table
    assert all(r["step"] == r["uid"] // n for r in recs)
    assert stats["retries"] == 0 and stats["start_failures"] == 0, stats

    # Fewer worker-seconds than a fixed pool of max_workers, whose run lasts at least REST_S per step plus the
    # step's reward work spread perfectly over its workers.
    work = [n * BASE_S * (FACTOR if r["slow"] else 1) for r in rows]
    fixed = AUTOSCALE.max_workers * sum(REST_S + w / AUTOSCALE.max_workers for w in work)
    assert stats["worker_s"] < fixed, (stats["worker_s"], fixed, table)
    print(f"\nautoscaling: {stats['worker_s']:.0f} worker-s (a fixed pool of {AUTOSCALE.max_workers}: at least "
          f"{fixed:.0f})\n{table}")
