"""Async generation against pipelined on a long-tailed workload (issue 50): the same run in `loop.mode: pipelined`
and `async` at the same `loop.max_staleness`, side by side.

    python bench/async_generation.py                        # the long-tail letter task, 40 steps per loop
    python bench/async_generation.py --steps 60 --max-staleness 4
    python bench/async_generation.py --set grpo.learning_rate=1e-3
    python bench/async_generation.py --agentic              # also the box task with tools (configs/tools.yaml)

The workload (bench/long_tail.py): the demo (configs/pipelined.yaml: the letter task, the random tiny model, one
generator) with completion lengths drawn from a log-normal distribution by each sequence's seed (median 40 tokens,
sigma 0.8, cap 320; a batch of 64 has its longest at ~4.5x its mean), imposed by a vLLM logits processor given to
the generators (`generation.engine_kwargs`). Each run is `rayward run` of that config with the loop overridden, on
its own embedded Ray, one after the other (nothing else should run on the machine). Per run it prints: steps/s
over steps 2..N (step 1 fills the pipeline), the engine's occupancy (running sequences per engine step), busy share
and tokens/s, the learner's wait for data as a share of the step, groups dropped as too stale, the trained
completions' lengths, and the reward curve by tenths of the trained samples; then async's speed-up and whether its
reward reached the pipelined run's final (mean of its last WINDOW steps) within the same samples.

`--agentic` runs configs/tools.yaml (TRL's environment class, the box task) in both loops the same way: turns of
varied count and length, a long tail of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bench.long_tail import MAX_TOKENS, quantiles  # noqa: E402

WINDOW = 5  # steps averaged for a run's final reward (a step's reward is a batch of 64 samples' mean)


def run(name: str, config: str, overrides: list[str], out: Path) -> tuple[list[dict], list[int], float]:
    """One `rayward run`; its step rows, the trained completions' lengths and its wall time."""
    t0 = time.monotonic()
    log = out / f"{name}.out"
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "orchestrator", "run", config, *overrides, f"logging.dir={out}",
                             "logging.progress=false", "--name", name], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            env={**os.environ, "RAY_ADDRESS": ""}).returncode
    if rc != 0:
        raise SystemExit(f"{name}: exit {rc}, see {log}")
    rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "loss" in r]
    lengths = [json.loads(x)["completion_length"] for x in (out / name / "completions.jsonl").read_text().splitlines()
               if x.strip()]
    return rows, lengths, time.monotonic() - t0


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def summary(mode: str, rows: list[dict], lengths: list[int], wall: float, reward: str) -> dict:
    timed = rows[1:]  # step 1 holds the pipeline's fill (and the first engine's warm-up)
    step_s = sum(r["time/step"] for r in timed)
    return {
        "mode": mode, "steps": len(rows), "wall_s": wall, "steps_per_s": len(timed) / step_s,
        "occupancy": mean([r["generators/occupancy"] for r in timed if "generators/occupancy" in r]),
        "busy": mean([r["generators/busy"] for r in timed if "generators/busy" in r]),
        "tokens_per_s": mean([r["generators/tokens_per_s_per_engine"] for r in timed
                              if "generators/tokens_per_s_per_engine" in r]),
        "wait_share": sum(r.get("time/wait_rollouts", 0.0) for r in timed) / step_s,
        "dropped": sum(r.get("async/dropped_stale", 0) for r in rows),
        "lag": max((r.get("async/version_lag/max", r.get("policy_staleness", 0)) for r in rows), default=0),
        "lengths": quantiles(lengths), "rewards": [r[reward] for r in rows],
        "samples_per_step": len(lengths) // len(rows),  # the completions log: a row per trained sample
    }


def curve(rewards: list[float], parts: int = 10) -> list[float]:
    """The reward averaged over each tenth of the steps (each step trains the same number of samples)."""
    n = len(rewards)
    return [round(mean(rewards[i * n // parts:(i + 1) * n // parts]), 3) for i in range(parts)]


def compare(task: str, config: str, overrides: list[str], reward: str, args: argparse.Namespace, out: Path) -> None:
    results = {}
    for mode in ("pipelined", "async"):
        rows, lengths, wall = run(f"{task}-{mode}", config, [*overrides, *args.set, f"loop.mode={mode}",
                                                               f"loop.max_staleness={args.max_staleness}",
                                                               f"grpo.max_steps={args.steps}"], out)
        results[mode] = summary(mode, rows, lengths, wall, reward)
        print(f"[{task}] {mode}: {args.steps} steps in {wall:.0f} s", flush=True)
    p, a = results["pipelined"], results["async"]
    print(f"\n[{task}] max_staleness {args.max_staleness}, {args.steps} steps of {p['samples_per_step']} samples")
    print(f"  {'':10} {'steps/s':>8} {'occupancy':>9} {'busy':>6} {'tok/s/eng':>9} {'wait':>6} {'dropped':>7} "
          f"{'max lag':>7}  completion lengths")
    for r in (p, a):
        print(f"  {r['mode']:10} {r['steps_per_s']:8.3f} {r['occupancy']:9.1f} {r['busy']:6.0%} "
              f"{r['tokens_per_s']:9.0f} {r['wait_share']:6.0%} {r['dropped']:7d} {r['lag']:7d}  {r['lengths']}")
    print(f"  async / pipelined: {a['steps_per_s'] / p['steps_per_s']:.2f}x steps/s")
    print(f"  reward by tenths of the samples ({reward}):")
    for r in (p, a):
        print(f"    {r['mode']:10} {curve(r['rewards'])}")
    final = mean(p["rewards"][-WINDOW:])
    smooth = [mean(a["rewards"][max(0, i - WINDOW + 1):i + 1]) for i in range(len(a["rewards"]))]
    reached = next((i + 1 for i, v in enumerate(smooth) if i + 1 >= WINDOW and v >= final), None)
    print(f"  pipelined's final reward (last {WINDOW} steps): {final:.3f}; async's last {WINDOW}: "
          f"{mean(a['rewards'][-WINDOW:]):.3f}; async reached it "
          + (f"at step {reached} ({reached * a['samples_per_step']} samples of {args.steps * a['samples_per_step']})"
             if reached else "not within the run"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--max-staleness", type=int, default=2)
    ap.add_argument("--agentic", action="store_true", help="also the box task with tools (configs/tools.yaml)")
    ap.add_argument("--only-agentic", action="store_true", help="the box task alone")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for both loops' runs (e.g. grpo.learning_rate=1e-3)")
    ap.add_argument("--dir", default="/tmp/rayward-async-bench")
    args = ap.parse_args()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    if not args.only_agentic:
        cfg = yaml.safe_load((ROOT / "configs" / "pipelined.yaml").read_text())
        cfg["generation"].update(max_completion_length=MAX_TOKENS,
                                 engine_kwargs={"logits_processors": ["bench.long_tail:LogNormalLengths"]})
        config = out / "long-tail.yaml"
        config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        compare("long-tail", str(config), [], "rewards/letter/mean", args, out)
    if args.agentic or args.only_agentic:
        compare("tools", "configs/tools.yaml", [], "rewards/BoxEnv/mean", args, out)


if __name__ == "__main__":
    main()
