"""Reward-pool autoscaling: a reward that becomes 8x slower for a stretch of steps, an autoscaled pool against a
fixed pool at max_workers (a script, not a test).

    python bench/reward_autoscale.py                      # ~2.5 min on 2 cores
    python bench/reward_autoscale.py --max-workers 6 --rest-s 2 --slow-steps 12

Each "step" is what the synchronous loop does to the pool: the learner's TrainerState push (global_step), one
batch of --prompts x --group-size completions scored in chunks of one group, then --rest-s of generation and
training (a sleep). The reward (bench/bench_rewards.py: step_latency, a factory whose settings travel in its
config kwargs) takes --base-ms per call, --factor times that for global steps [--rise, --rise +
--slow-steps), one call at a time per worker process (a CPU-bound checker), and writes one line per scored
sample, counted afterwards: every sample exactly once.

Printed per step: the latency regime, the pool's target and live workers when the batch was scored, the
reward seconds of both pools; then the autoscaler's decisions with their reasons, and worker-seconds (the
integral of live workers over the steps, from the pool's own accounting) of both pools.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.rewards.pool import RewardPool  # noqa: E402
from actors.rewards.worker import RewardSpec  # noqa: E402
from actors.runtime.autoscale import AutoscaleSettings  # noqa: E402
from actors.types import RewardBatch, TrainerState  # noqa: E402


def batch(step: int, prompts: int, g: int) -> RewardBatch:
    n = prompts * g
    return RewardBatch(["p"] * n, ["c"] * n, [[1]] * n, {"uid": [step * n + i for i in range(n)]}, g)


def wait_live(ray, pool, n: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while ray.get(pool.stats.remote()).workers < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n} reward workers not alive after {timeout:.0f} s")
        time.sleep(0.2)


def run(ray, name: str, args, autoscale: AutoscaleSettings | None, workers: int) -> dict[str, Any]:
    record = Path(tempfile.mkdtemp(prefix=f"rayward-{name}-"))
    spec = RewardSpec("slow", "bench.bench_rewards:step_latency", kwargs={
        "record_dir": str(record), "base_s": args.base_ms / 1000, "factor": args.factor,
        "rise_step": args.rise, "drop_step": args.rise + args.slow_steps})
    pool = (
        ray.remote(RewardPool)
        .options(name=f"{name}/reward-pool", num_cpus=0, max_concurrency=1000)
        .remote([spec], run_name=name, num_workers=workers, worker_options={"num_cpus": args.worker_cpus},
                sys_path=[str(ROOT)], autoscale=autoscale)
    )
    try:
        wait_live(ray, pool, workers)  # both pools start the steps with their initial workers up
        steps = []
        start = ray.get(pool.stats.remote())
        t_start = time.monotonic()
        for step in range(args.steps):
            ray.get(pool.set_state.remote(TrainerState(global_step=step, max_steps=args.steps)))
            t0 = time.monotonic()
            out = ray.get(pool.score.remote(batch(step, args.prompts, args.group_size), 1))
            steps.append({"reward_s": time.monotonic() - t0, "target": out.pool.target_workers,
                          "live": out.pool.workers, "wait_s": out.queue_wait_s})
            time.sleep(args.rest_s)
        end = ray.get(pool.stats.remote())
        decisions = ray.get(pool.decision_log.remote())
        wall = time.monotonic() - t_start
    finally:
        for h in ray.get(pool.worker_handles.remote()).values():
            ray.kill(h)
        ray.kill(pool)
    recs = [json.loads(line) for f in record.glob("*.jsonl") for line in f.read_text().splitlines()]
    n = args.prompts * args.group_size
    once = Counter(r["uid"] for r in recs) == Counter(range(args.steps * n))
    return {"steps": steps, "decisions": decisions, "t0": start, "worker_s": end.worker_s - start.worker_s,
            "wall_s": wall, "exactly_once": once, "records": len(recs), "retries": end.retries}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--rise", type=int, default=4, help="first slow step")
    p.add_argument("--slow-steps", type=int, default=10, help="how many steps the reward stays slow")
    p.add_argument("--factor", type=float, default=8.0, help="latency multiplier while slow")
    p.add_argument("--base-ms", type=float, default=20.0, help="per-call latency (one call per sample)")
    p.add_argument("--prompts", type=int, default=8, help="groups per batch (= chunks: one group per chunk)")
    p.add_argument("--group-size", type=int, default=4, help="G: completions per prompt")
    p.add_argument("--rest-s", type=float, default=1.5, help="seconds of generation + training per step")
    p.add_argument("--min-workers", type=int, default=1)
    p.add_argument("--max-workers", type=int, default=4)
    p.add_argument("--target", type=float, default=0.5, help="target_utilization")
    p.add_argument("--look-back-s", type=float, default=3.0)
    p.add_argument("--upscale-delay-s", type=float, default=1.0)
    p.add_argument("--downscale-delay-s", type=float, default=3.0)
    p.add_argument("--worker-cpus", type=float, default=0.25, help="logical CPUs per worker")
    args = p.parse_args()
    settings = AutoscaleSettings(args.min_workers, args.max_workers, target_utilization=args.target,
                                 look_back_s=args.look_back_s, upscale_delay_s=args.upscale_delay_s,
                                 downscale_delay_s=args.downscale_delay_s)

    import ray

    ray.init(num_cpus=max(8, int(args.max_workers * args.worker_cpus) + 2), include_dashboard=False,
             log_to_driver=False, configure_logging=False, namespace="rayward-bench",
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "RAY_DEDUP_LOGS": "1"}})
    n = args.prompts * args.group_size
    print(f"# {args.steps} steps of {n} samples ({args.prompts} chunks of {args.group_size}), {args.base_ms:g} ms per "
          f"call, x{args.factor:g} for steps {args.rise}..{args.rise + args.slow_steps - 1}, one call at a time per "
          f"worker, {args.rest_s:g} s of generate+train per step; {os.cpu_count()} cores, load avg "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    print(f"# autoscaled: {settings}", flush=True)
    auto = run(ray, f"bench-auto-{time.monotonic_ns() % 10**9}", args, settings, args.min_workers)
    fixed = run(ray, f"bench-fixed-{time.monotonic_ns() % 10**9}", args, None, args.max_workers)
    ray.shutdown()

    print(f"\n{'step':>4} {'latency':>8} {'target':>6} {'live':>4} {'reward_s':>8} {'wait_s':>6} | "
          f"{'fixed ' + str(args.max_workers):>8} {'reward_s':>8}")
    for k, (a, f) in enumerate(zip(auto["steps"], fixed["steps"], strict=True)):
        slow = args.rise <= k < args.rise + args.slow_steps
        lat = f"{args.base_ms * (args.factor if slow else 1):g}ms"
        print(f"{k:>4} {lat:>8} {a['target']:>6} {a['live']:>4} {a['reward_s']:>8.2f} {a['wait_s']:>6.2f} | "
              f"{f['live']:>8} {f['reward_s']:>8.2f}")
    t0 = auto["decisions"][0]["t"] if auto["decisions"] else 0.0
    print("\n# autoscaler decisions (seconds after the first):")
    for d in auto["decisions"]:
        print(f"#   +{d['t'] - t0:6.1f}s  {d['before']} -> {d['after']}: {d['reason']}")
    slow = [s["reward_s"] for k, s in enumerate(auto["steps"]) if args.rise <= k < args.rise + args.slow_steps]
    print(f"\nreward s, first slow step {slow[0]:.2f} -> best of the last 3 slow steps {min(slow[-3:]):.2f} "
          f"({min(slow[-3:]) / slow[0]:.2f}x); final target {auto['steps'][-1]['target']} (min {args.min_workers})")
    for label, r in (("autoscaled", auto), (f"fixed {args.max_workers}", fixed)):
        print(f"{label:>11}: {r['worker_s']:7.1f} worker-s over {r['wall_s']:5.1f} s "
              f"({r['worker_s'] / r['wall_s']:.2f} workers on average); {r['records']} samples scored, "
              f"exactly once: {r['exactly_once']}, retries {r['retries']}")
    print(f"worker-seconds autoscaled / fixed: {auto['worker_s'] / fixed['worker_s']:.2f}; "
          f"wall time autoscaled / fixed: {auto['wall_s'] / fixed['wall_s']:.2f}")
    print(f"# load avg {os.getloadavg()[0]:.1f} at end (shared machine)")
    return 0 if auto["exactly_once"] and fixed["exactly_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
