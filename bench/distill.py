"""On-policy distillation on the demo task: how far each form moves the student towards the teacher, and what the
teacher costs a step (a script, not a test: it runs configs/distill.yaml end to end).

    python bench/distill.py                     # 4 runs of 40 steps, ~9 min on 2 cores
    python bench/distill.py --runs advantage loss --steps 20

Runs (same seed, same teacher: the offline tiny teacher, orchestrator/builtin/models/teacher.py):

* advantage: configs/distill.yaml as shipped (the letter reward + the teacher as a per-token advantage, slime's OPD)
* loss: the same with `distillation.mode=loss` (TRL's server-distillation loss term)
* distill-only: the advantage form with the letter reward's weight 0 (the teacher is the only signal)
* no-teacher: the demo alone (configs/demo.yaml): the reward without distillation, and the step time without it

Printed per run: the mean of `distill/reverse_kl` and of the letter reward over the first and the last 5 steps,
and the median step time (time/step) and reward phase (time/reward, where the teacher's scoring runs).
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

RUNS = {
    "advantage": ("configs/distill.yaml", []),
    "loss": ("configs/distill.yaml", ["distillation.mode=loss"]),
    "distill-only": ("configs/distill.yaml", ["rewards.0.weight=0"]),
    "no-teacher": ("configs/demo.yaml", []),
}
EDGE = 5  # steps averaged at each end


def run(name: str, steps: int, out: Path) -> list[dict]:
    config, overrides = RUNS[name]
    r = subprocess.run([sys.executable, "-m", "orchestrator", "run", config, "--name", name, f"logging.dir={out}",
                        f"grpo.max_steps={steps}", "logging.progress=false", *overrides],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "RAY_ADDRESS": ""})
    if r.returncode:
        raise SystemExit(f"{name}: {(r.stdout + r.stderr)[-2000:]}")
    return [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]


def ends(rows: list[dict], key: str) -> str:
    xs = [r[key] for r in rows if key in r]
    if not xs:
        return "-"
    return f"{statistics.mean(xs[:EDGE]):.3f} -> {statistics.mean(xs[-EDGE:]):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: run(name, args.steps, Path(tmp)) for name in args.runs}
    print(f"{'run':<14}{'reverse KL (first 5 -> last 5)':<34}{'letter reward':<20}{'step s':>8}{'reward s':>10}")
    for name, rows in results.items():
        step = statistics.median(r["time/step"] for r in rows)
        reward = statistics.median(r["time/reward"] for r in rows)
        print(f"{name:<14}{ends(rows, 'distill/reverse_kl'):<34}{ends(rows, 'rewards/letter/mean'):<20}"
              f"{step:>8.2f}{reward:>10.2f}")


if __name__ == "__main__":
    main()
