"""The difficulty sampler against the uniform one: steps to a stated eval reward (a script, not a test: it runs
configs/curriculum.yaml end to end, twice).

    python bench/curriculum.py                    # 2 runs of 80 steps, ~6 min on 2 cores
    python bench/curriculum.py --target 0.2 --steps 100

Both runs are configs/curriculum.yaml (the letter task with broken references: 5 rows in 8 score 0 whatever is
written), same seed and budget, one with data.sampler=uniform. The eval (the clean letter task, 32 prompts x 4,
every 5 steps) measures both on the same prompts. Printed: each run's eval/reward curve, the first eval step at or
above --target, and the ratio uniform / difficulty (the goal: at least 1.3; a run that never reaches the target
within the budget counts as needing more than it); and `rayward plot` writes each run's PNG beside its metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = {"uniform": ["data.sampler=uniform"], "difficulty": []}
GOAL = 1.3


def run(name: str, steps: int, out: Path) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "orchestrator", "run", "configs/curriculum.yaml", "--name", name,
                        f"logging.dir={out}", f"grpo.max_steps={steps}", "logging.progress=false", *RUNS[name]],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "RAY_ADDRESS": ""})
    if r.returncode:
        raise SystemExit(f"{name}: {(r.stdout + r.stderr)[-2000:]}")
    subprocess.run([sys.executable, "-m", "orchestrator", "plot", str(out / name)], cwd=ROOT, capture_output=True)
    return [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--target", type=float, default=0.25)
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        results = {name: run(name, args.steps, out) for name in RUNS}
        reached = {}
        for name, rows in results.items():
            curve = [(r["step"], r["eval/reward"]) for r in rows if "eval/reward" in r]
            reached[name] = next((s for s, v in curve if v >= args.target), None)
            drawn = [r.get("curriculum/draws/learnable", 0) for r in rows]
            print(f"{name:<11} eval/reward: " + " ".join(f"{s}:{v:.3f}" for s, v in curve))
            print(f"{'':<11} first step at >= {args.target}: {reached[name]}"
                  + (f"; learnable draws per step (mean) {sum(drawn) / len(drawn):.2f}"
                     if name == "difficulty" else ""))
        if args.out:
            print(f"plots: {out}/<run>/*.png")
        u, d = reached["uniform"], reached["difficulty"]
        if d is None:
            print(f"difficulty did not reach {args.target} in {args.steps} steps: raise --steps or lower --target")
            return
        if u is None:  # censored: uniform needs more than the budget
            best = max(r["eval/reward"] for r in results["uniform"] if "eval/reward" in r)
            print(f"uniform did not reach {args.target} in {args.steps} steps (its best eval/reward {best:.3f}); "
                  f"difficulty did at step {d}: more than {args.steps / d:.2f}x fewer steps (goal >= {GOAL}: "
                  f"{'met' if args.steps / d >= GOAL else 'NOT met'})")
            return
        print(f"uniform / difficulty steps to {args.target}: {u} / {d} = {u / d:.2f}x (goal >= {GOAL}: "
              f"{'met' if u / d >= GOAL else 'NOT met'})")


if __name__ == "__main__":
    main()
