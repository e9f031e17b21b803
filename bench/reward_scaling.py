"""Reward-pool scaling: scoring throughput against the number of reward workers (a script, not a test).

    python bench/reward_scaling.py                      # 1, 2, 4, 8, 16 workers; latency- and CPU-bound
    python bench/reward_scaling.py --chunk-groups 2 --kinds latency --samples 1024

For each worker count it builds a fresh RewardPool (the real actor, as `rayward run` does), warms every worker
(imports, first TrainerState), then times `pool.score(batch)` on a fixed batch and prints samples/s, speedup
over 1 worker and efficiency (speedup / workers). Rewards (bench/bench_rewards.py, TRL signature,
per-sample calls as configured by default):
  latency: sleeps --latency-ms per sample, no CPU (a sandbox or judge call)
  cpu:     --cpu-ms of pure-Python work per sample (holds the GIL), calibrated on this machine first
Embedded `ray.init` with enough logical CPUs for 16 workers at --worker-cpus each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.rewards.pool import CHUNKS_PER_WORKER, RewardPool  # noqa: E402
from actors.rewards.worker import RewardSpec  # noqa: E402
from actors.types import RewardBatch  # noqa: E402
from bench.bench_rewards import spin  # noqa: E402


def calibrate_cpu(ms: float) -> int:
    """Loop iterations of bench_rewards.spin that take `ms` here (best of 5, so others' load counts less)."""
    n = 200_000
    best = min(_timed(spin, n) for _ in range(5))
    return max(1, int(n * ms / 1000 / best))


def machine_parallelism(iters: int, procs: int) -> float:
    """How many cores this (shared) machine gives right now: throughput of `procs` plain processes running
    bench_rewards.spin at once over one process's. The ceiling for the CPU-bound rows, measured without Ray."""
    import multiprocessing as mp

    pool = mp.get_context("spawn").Pool(procs)  # spawn: no Ray state (threads, signal handlers) in the children
    try:
        pool.map(spin, [1] * procs)  # children up
        one = _timed(spin, iters * 4)
        t0 = time.perf_counter()
        pool.map(spin, [iters * 4] * procs, chunksize=1)
        many = time.perf_counter() - t0
    finally:
        pool.close()
        pool.join()
    return procs * one / many


def _timed(fn, *a) -> float:
    t0 = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t0


def batch(n: int, g: int) -> RewardBatch:
    return RewardBatch(["p"] * n, ["c"] * n, [[1, 2, 3]] * n, {}, g)


def measure(ray, spec: RewardSpec, workers: int, args, pool_cls) -> tuple[float, float]:
    """(median seconds, best seconds) to score args.samples samples with `workers` workers."""
    name = f"bench-{spec.name}-{workers}-{time.monotonic_ns() % 10**9}"
    pool = (
        ray.remote(pool_cls)
        .options(name=f"{name}/reward-pool", num_cpus=0, max_concurrency=1000)
        .remote([spec], run_name=name, num_workers=workers, worker_options={"num_cpus": args.worker_cpus},
                sys_path=[str(ROOT)])
    )
    try:
        handles = ray.get(pool.worker_handles.remote())
        ray.get([h.pid.remote() for h in handles.values()], timeout=300)  # every worker process is up
        # Warm every worker (imports, TrainerState): one chunk per slot.
        ray.get(pool.score.remote(batch(workers * CHUNKS_PER_WORKER * args.group_size, args.group_size), 1))
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = ray.get(pool.score.remote(batch(args.samples, args.group_size), args.chunk_groups))
            times.append(time.perf_counter() - t0)
            assert len(out.scores[0]) == args.samples and not any(out.timeouts.values())
        return statistics.median(times), min(times)
    finally:
        for h in ray.get(pool.worker_handles.remote()).values():
            ray.kill(h)
        ray.kill(pool)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", default="1,2,4,8,16", help="comma-separated worker counts")
    p.add_argument("--kinds", default="latency,cpu", help="latency, cpu, noop (overhead only), comma-separated")
    p.add_argument("--samples", type=int, default=512, help="samples per timed batch (fixed for every point)")
    p.add_argument("--group-size", type=int, default=8, help="G: completions per prompt")
    p.add_argument("--chunk-groups", type=int, default=1, help="groups per chunk (cluster.reward_chunk_groups)")
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--cpu-ms", type=float, default=20.0)
    p.add_argument("--repeats", type=int, default=3, help="timed batches per point (median reported)")
    p.add_argument("--worker-cpus", type=float, default=0.25, help="logical CPUs per worker (cluster.reward_worker)")
    args = p.parse_args()
    counts = [int(x) for x in args.workers.split(",")]

    import ray

    env = {"PYTHONPATH": str(ROOT), "RAY_DEDUP_LOGS": "1"}
    ray.init(num_cpus=max(32, int(max(counts) * args.worker_cpus) + 1), include_dashboard=False,
             log_to_driver=False, configure_logging=False, namespace="rayward-bench",
             runtime_env={"env_vars": env})
    kinds = {}
    if "latency" in args.kinds:
        kinds["latency"] = (RewardSpec("latency", "bench.bench_rewards:sleepy",
                                       kwargs={"delay_s": args.latency_ms / 1000}), f"{args.latency_ms:g} ms sleep")
    if "noop" in args.kinds:  # no work: what is left is the pool's own overhead per batch
        kinds["noop"] = (RewardSpec("noop", "bench.bench_rewards:sleepy", kwargs={"delay_s": 0.0}), "no work")
    if "cpu" in args.kinds:
        iters = calibrate_cpu(args.cpu_ms)
        kinds["cpu"] = (RewardSpec("cpu", "bench.bench_rewards:cpu_bound", kwargs={"iters": iters}),
                        f"{args.cpu_ms:g} ms pure Python ({iters} iters)")
    pool_cls = RewardPool
    load = os.getloadavg()[0]
    print(f"# {args.samples} samples per point, G={args.group_size}, chunk_groups={args.chunk_groups} "
          f"({args.group_size * args.chunk_groups} samples/chunk), CHUNKS_PER_WORKER={CHUNKS_PER_WORKER}, "
          "worker=RewardWorker, "
          f"{os.cpu_count()} cores, load avg {load:.1f} at start", flush=True)
    for kind, (spec, what) in kinds.items():
        print(f"\n## {kind}-bound reward: {what} per sample")
        if kind == "cpu":
            cores = os.cpu_count() or 1
            print(f"# without Ray, {cores} plain processes run {machine_parallelism(spec.kwargs['iters'], cores):.2f}x "
                  f"one process's throughput right now (the ceiling for this table)")
        print(f"{'workers':>7} {'seconds':>8} {'samples/s':>10} {'speedup':>8} {'efficiency':>10}")
        base = None
        for n in counts:
            med, best = measure(ray, spec, n, args, pool_cls)
            rate = args.samples / med
            base = base or rate / n  # per-worker rate of the first point (1 worker by default)
            speedup = rate / base
            print(f"{n:>7} {med:>8.3f} {rate:>10.1f} {speedup:>8.2f} {speedup / n:>10.2f}", flush=True)
        if kind == "cpu":
            print(f"# again now: {machine_parallelism(spec.kwargs['iters'], os.cpu_count() or 1):.2f}x")
    print(f"\n# load avg {os.getloadavg()[0]:.1f} at end (this machine is shared: CPU-bound rows are noisy)")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
