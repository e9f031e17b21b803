"""LLM judges: rayward's judge pool against calling the judge once per sample from reward workers, and the judge
pool autoscaling under a burst against a fixed single engine (a script, not a test).

    python bench/judge_pool.py                          # ~12 min on 2 cores
    python bench/judge_pool.py --skip-throughput        # the burst alone, ~3 min
    python bench/judge_pool.py --engines 1 2 --samples 128 --skip-burst

The judge is the offline tiny judge (orchestrator/builtin/models/judge.py) on vLLM CPU engines, the answers what a
letter-task policy writes. Both ways score the same RewardBatch through rayward's reward pool (chunks of one
group), so they differ only in how the judge is asked:

* per sample (what a TRL user writes): a reward function that holds the judge (a vLLM engine per reward worker,
  built on its first call) and asks it about each completion on its own, one request at a time;
  bench/bench_rewards.py:judge_per_sample. N engines = N reward workers.
* judge pool: a judge reward (`rewards[].judge`): the reward pool sends each scored chunk's samples to the judge
  pool, which spreads them over N engines, each batching what it holds.

Printed: samples/s of both at each engine count (best of --repeats batches after a warm-up batch; the machine's
core count bounds what more engines can add on CPU), then the burst: --steps steps of --samples answers, the
judge --slow-s slower per answer for steps [--rise, --rise + --slow-steps), --rest-s of "generation + training"
between steps, judge-phase seconds per step (--burst-samples answers: a judge slowed by latency, not compute, which more
engines on a 2-core box could not share) for the autoscaled pool (1..--max-engines) and a fixed single engine.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.engines.judge import JudgeSpec  # noqa: E402
from actors.engines.pool import JudgePool  # noqa: E402
from actors.rewards.pool import RewardPool  # noqa: E402
from actors.rewards.worker import RewardSpec  # noqa: E402
from actors.runtime.autoscale import AutoscaleSettings  # noqa: E402
from actors.runtime.cpus import SHARED_CORES_ENV  # noqa: E402
from actors.types import RewardBatch  # noqa: E402
from orchestrator.builtin.models.judge import TEMPLATE, ensure_tiny_judge  # noqa: E402
from orchestrator.builtin.tasks.letters import LETTERS  # noqa: E402

GROUP = 8
ENGINE = {"max_model_len": 128, "kv_cache_gib": 0.5}


def answers(n: int, seed: int) -> RewardBatch:
    rng = random.Random(seed)
    letters = [rng.choice(LETTERS) for _ in range(n)]
    completions = [rng.choice(LETTERS) * rng.randint(1, 8) if rng.random() < 0.5 else
                   "".join(rng.choice(LETTERS + " xyz,") for _ in range(rng.randint(1, 16))) for _ in range(n)]
    return RewardBatch(["Write the letter:"] * n, completions, [[1]] * n, {"letter": letters}, GROUP)


def wait_live(ray, pool, n: int, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while ray.get(pool.stats.remote()).workers < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n} workers not alive after {timeout:.0f} s")
        time.sleep(0.2)


def kill(ray, *pools: Any) -> None:
    for pool in pools:
        for h in ray.get(pool.worker_handles.remote()).values():
            ray.kill(h)
        ray.kill(pool)


def judge_spec(model: str, parser: str | None = None) -> JudgeSpec:
    labels = None if parser else {"yes": 1.0, "no": 0.0}
    return JudgeSpec(reward="judge", model=model, template=TEMPLATE, max_tokens=3, labels=labels, parser=parser,
                     timeout_s=600.0)


def judge_pool(ray, name: str, spec: JudgeSpec, n: int, autoscale: AutoscaleSettings | None = None) -> Any:
    return ray.remote(JudgePool).options(name=f"{name}/judge-judge-pool", num_cpus=0, max_concurrency=1000).remote(
        spec, run_name=name, role="judge-judge", num_engines=n, engine_options={"num_cpus": 0.25},
        engine_kwargs=ENGINE, autoscale=autoscale, sys_path=[str(ROOT)])


def reward_pool(ray, name: str, specs: list[RewardSpec], n: int, judges: dict[str, Any] | None = None) -> Any:
    return ray.remote(RewardPool).options(name=f"{name}/reward-pool", num_cpus=0, max_concurrency=1000).remote(
        specs, run_name=name, num_workers=n, worker_options={"num_cpus": 0.25}, sys_path=[str(ROOT)], judges=judges)


def throughput(ray, pool: Any, samples: int, repeats: int) -> float:
    ray.get(pool.score.remote(answers(samples, seed=0)))  # warm-up: the per-sample judges build their engines
    best = float("inf")
    for k in range(repeats):
        t0 = time.monotonic()
        ray.get(pool.score.remote(answers(samples, seed=k + 1)))
        best = min(best, time.monotonic() - t0)
    return samples / best


def per_sample(ray, model: str, n: int, samples: int, repeats: int) -> float:
    name = f"bench-ps-{n}-{time.monotonic_ns() % 10**9}"
    spec = RewardSpec("judge", "bench.bench_rewards:judge_per_sample", timeout_s=600.0,
                      kwargs={"model": model, "template": TEMPLATE})
    pool = reward_pool(ray, name, [spec], n)
    wait_live(ray, pool, n)
    try:
        return throughput(ray, pool, samples, repeats)
    finally:
        kill(ray, pool)


def pooled(ray, model: str, n: int, samples: int, repeats: int) -> float:
    name = f"bench-jp-{n}-{time.monotonic_ns() % 10**9}"
    judges = judge_pool(ray, name, judge_spec(model), n)
    pool = reward_pool(ray, name, [RewardSpec("judge", timeout_s=600.0, judge=judge_spec(model))], 1,
                       {"judge": judges})
    wait_live(ray, judges, n)
    wait_live(ray, pool, 1)
    try:
        return throughput(ray, pool, samples, repeats)
    finally:
        kill(ray, pool, judges)


def burst(ray, model: str, args, autoscale: AutoscaleSettings | None, slow_file: Path) -> dict[str, Any]:
    name = f"bench-burst-{'auto' if autoscale else 'fixed'}-{time.monotonic_ns() % 10**9}"
    spec = judge_spec(model, parser="bench.bench_rewards:slow_judge_labels")
    judges = judge_pool(ray, name, spec, 1, autoscale)
    pool = reward_pool(ray, name, [RewardSpec("judge", timeout_s=600.0, judge=spec)], 1, {"judge": judges})
    wait_live(ray, judges, 1)
    wait_live(ray, pool, 1)
    ray.get(pool.score.remote(answers(args.burst_samples, seed=0)))  # warm-up
    time.sleep(args.rest_s)
    steps = []
    for k in range(args.steps):
        slow_file.write_text(str(args.slow_s if args.rise <= k < args.rise + args.slow_steps else 0.0))
        t0 = time.monotonic()
        ray.get(pool.score.remote(answers(args.burst_samples, seed=k + 1)))
        judge_s = time.monotonic() - t0
        s = ray.get(judges.stats.remote())
        steps.append({"judge_s": judge_s, "live": s.workers, "target": s.target_workers})
        time.sleep(args.rest_s)
    decisions = ray.get(judges.decision_log.remote())
    kill(ray, pool, judges)
    return {"steps": steps, "decisions": decisions}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engines", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--samples", type=int, default=256, help="answers per batch (groups of 8)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--skip-burst", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--burst-samples", type=int, default=32, help="answers per step in the burst")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rise", type=int, default=3)
    p.add_argument("--slow-steps", type=int, default=8)
    p.add_argument("--slow-s", type=float, default=0.3, help="seconds per answer while the judge is slow")
    p.add_argument("--rest-s", type=float, default=2.0, help="seconds of generation + training per step")
    p.add_argument("--max-engines", type=int, default=4)
    args = p.parse_args()
    model = str(ensure_tiny_judge())
    slow_file = Path(tempfile.mkdtemp(prefix="rayward-judge-bench-")) / "slow"
    slow_file.write_text("0")

    import ray

    ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False, configure_logging=False,
             namespace="rayward-bench", runtime_env={"env_vars": {
                 "PYTHONPATH": str(ROOT), "RAY_DEDUP_LOGS": "1", "RAYWARD_BENCH_JUDGE_SLOW": str(slow_file),
                 **SHARED_CORES_ENV}})  # as a run's CPU engines: passive OpenMP waits
    print(f"# {args.samples} answers per batch, chunks of {GROUP}; tiny judge on vLLM CPU engines; "
          f"{os.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f}", flush=True)
    print(f"{'engines':>7} {'per-sample/s':>12} {'pool/s':>8} {'pool/per-sample':>15}", flush=True)
    for n in [] if args.skip_throughput else args.engines:
        a = per_sample(ray, model, n, args.samples, args.repeats)
        b = pooled(ray, model, n, args.samples, args.repeats)
        print(f"{n:>7} {a:>12.1f} {b:>8.1f} {b / a:>14.1f}x", flush=True)
    if not args.skip_burst:
        settings = AutoscaleSettings(1, args.max_engines, target_utilization=0.5, look_back_s=3.0,
                                     upscale_delay_s=1.0, downscale_delay_s=3.0)
        print(f"\n# burst: {args.burst_samples} answers a step, {args.slow_s:g} s more per answer for steps "
              f"{args.rise}..{args.rise + args.slow_steps - 1}"
              f", {args.rest_s:g} s between steps; autoscaled {settings}", flush=True)
        auto = burst(ray, model, args, settings, slow_file)
        fixed = burst(ray, model, args, None, slow_file)
        print(f"{'step':>4} {'slow':>5} {'target':>6} {'live':>4} {'judge_s':>8} | {'fixed 1':>8}")
        for k, (a, f) in enumerate(zip(auto["steps"], fixed["steps"], strict=True)):
            slow = args.rise <= k < args.rise + args.slow_steps
            print(f"{k:>4} {'yes' if slow else '':>5} {a['target']:>6} {a['live']:>4} {a['judge_s']:>8.2f} | "
                  f"{f['judge_s']:>8.2f}")
        window = range(args.rise, args.rise + args.slow_steps)
        a_slow = sum(auto["steps"][k]["judge_s"] for k in window)
        f_slow = sum(fixed["steps"][k]["judge_s"] for k in window)
        print(f"\njudge seconds over the slow steps: autoscaled {a_slow:.1f}, fixed 1 engine {f_slow:.1f} "
              f"({a_slow / f_slow:.2f}x); last slow step {auto['steps'][window[-1]]['judge_s']:.2f} vs "
              f"{fixed['steps'][window[-1]]['judge_s']:.2f}; final target {auto['steps'][-1]['target']}")
        for d in auto["decisions"]:
            print(f"#   {d['before']} -> {d['after']}: {d['reason']}")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
