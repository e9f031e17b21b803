"""The agent endpoint against the environment-class path: the box task through both, one invocation (a script, not
a test: it runs configs/agent.yaml and configs/tools.yaml end to end).

    python bench/agent_endpoint.py                 # 2 runs of 30 steps, ~5 min on 2 cores
    python bench/agent_endpoint.py --steps 60

* env-class: configs/tools.yaml (TRL's environment_factory=BoxEnv; the agent loop runs in the generator, the tools
  in the environment workers)
* endpoint: configs/agent.yaml (orchestrator/builtin/tasks/box_agent.py, written against the `openai` SDK, streamed
  requests; it runs in the environment workers and calls its trajectory's endpoint on the generator)

Same model (tiny-tools), seed, prompts (the agent's tool schemas are the ones TRL makes of BoxEnv's methods),
sample counts and budgets. Printed per run: steps/s (1 / the median time/step after the first WARMUP steps),
the median generation phase (time/generate_busy), the reward over the first and last 5 steps, and for the endpoint
the mean time it added per request beyond the engine (agent/endpoint_ms_per_request: reading and rendering the
request, parsing and writing the answer, waiting for the server's thread) and requests per trajectory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = {"env-class": "configs/tools.yaml", "endpoint": "configs/agent.yaml"}
WARMUP = 2  # steps left out of the timing (engine and worker start-up, first weight sync)
EDGE = 5  # steps averaged at each end for the reward
GOAL = 0.15  # the endpoint within this fraction of the environment-class path's steps/s


def run(name: str, steps: int, out: Path) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "orchestrator", "run", RUNS[name], "--name", name, f"logging.dir={out}",
                        f"grpo.max_steps={steps}", "logging.progress=false"],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "RAY_ADDRESS": ""})
    if r.returncode:
        raise SystemExit(f"{name}: {(r.stdout + r.stderr)[-2000:]}")
    return [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: run(name, args.steps, Path(tmp)) for name in RUNS}
    rate = {}
    print(f"{'path':<11}{'steps/s':>9}{'generate s':>12}{'reward (first 5 -> last 5)':>30}{'ms/request':>12}"
          f"{'requests':>10}")
    for name, rows in results.items():
        timed = rows[WARMUP:]
        rate[name] = 1 / statistics.median(r["time/step"] for r in timed)
        gen = statistics.median(r["time/generate_busy"] for r in timed)
        rewards = [r["reward"] for r in rows]
        reward = f"{statistics.mean(rewards[:EDGE]):.3f} -> {statistics.mean(rewards[-EDGE:]):.3f}"
        ms = [r["agent/endpoint_ms_per_request"] for r in timed if "agent/endpoint_ms_per_request" in r]
        req = [r["agent/requests"] for r in timed if "agent/requests" in r]
        print(f"{name:<11}{rate[name]:>9.3f}{gen:>12.2f}{reward:>30}"
              f"{(f'{statistics.mean(ms):.1f}' if ms else '-'):>12}"
              f"{(f'{statistics.mean(req):.2f}' if req else '-'):>10}")
    ratio = rate["endpoint"] / rate["env-class"]
    print(f"endpoint / env-class steps/s: {ratio:.3f} (goal >= {1 - GOAL:.2f}: "
          f"{'met' if ratio >= 1 - GOAL else 'NOT met'})")


if __name__ == "__main__":
    main()
