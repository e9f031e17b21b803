"""A judge reward in a real run, as a user runs it: configs/judge.yaml (the demo with the offline tiny judge on a
vLLM engine of its own), gated lazily by a primary reward that closes on about half the samples (its token ids' sum's
parity). CI's tier: one short run; the judge is asked about exactly the samples whose gate is open, its verdicts
are its rubric's, its pool's state is in every step's metrics. The scenario tier: the same run with the judge
asked everywhere (gate.lazy: false), and every step's advantages, totals, gated values and losses equal the lazy
run's to the bit (sync loop, same seed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.builtin.models.judge import verdict
from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(900)

STEPS = 4
N = 64  # judge.yaml's generation_batch_size
PRIMARY = "rewards.2={name: half, function: tests.fixtures.trl_style_rewards:token_sum_parity, weight: 0.1}"


def run(tmp_path: Path, lazy: bool) -> tuple[list[dict], list[dict]]:
    name = f"judge-lazy-{str(lazy).lower()}"
    r = subprocess.run([sys.executable, "-m", "orchestrator", "run", "configs/judge.yaml", "--name", name,
                        f"logging.dir={tmp_path}", f"grpo.max_steps={STEPS}", "logging.progress=false", PRIMARY,
                        f"rewards.1.gate={{reward: half, threshold: 0.5, lazy: {str(lazy).lower()}}}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=800, env={**os.environ, "RAY_ADDRESS": ""})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    read = lambda f: [json.loads(x) for x in (tmp_path / name / f).read_text().splitlines()]  # noqa: E731
    return read("completions.jsonl"), read("metrics.jsonl")


def letter(row: dict) -> str:
    return row["prompt"].rstrip(":")[-1]  # "Write the letter X:"


def test_a_lazy_judge_is_asked_about_the_open_samples_and_says_what_its_rubric_says(tmp_path):
    rows, steps = run(tmp_path, lazy=True)
    assert len(rows) == STEPS * N and len(steps) == STEPS
    asked = [r for r in rows if r["judge/judge"] is not None]
    assert all((r["rewards/half"] >= 0.5) == (r["judge/judge"] is not None) for r in rows)  # asked iff open
    assert 0.25 < len(asked) / len(rows) < 0.75, len(asked)
    assert sum(s["rewards/judge/skipped"] for s in steps) == len(rows) - len(asked)
    right = sum((r["judge/judge"].strip() == "yes") == verdict(r["completion"], letter(r)) for r in asked)
    assert right >= 0.99 * len(asked), f"{right} of {len(asked)}"
    assert all(r["rewards/judge"] == (1.0 if r["judge/judge"].strip() == "yes" else 0.0) for r in asked)
    assert all(s["judge_pool/judge/workers"] == 1 and s["judge_pool/judge/errors"] == 0 for s in steps)
    print(f"judge: asked about {len(asked)} of {len(rows)} samples, {right} verdicts the rubric's")


def test_the_lazy_runs_advantages_are_the_eager_runs_to_the_bit(tmp_path):
    eager, eager_steps = run(tmp_path, lazy=False)
    lazy, lazy_steps = run(tmp_path, lazy=True)
    assert len(eager) == len(lazy) == STEPS * N
    for e, z in zip(eager, lazy, strict=True):
        assert e["completion"] == z["completion"]  # the same samples (seeded sync loop)
        assert (e["advantage"], e["total"], e["gated/judge"]) == (z["advantage"], z["total"], z["gated/judge"])
        assert z["rewards/judge"] == (e["rewards/judge"] if e["rewards/half"] >= 0.5 else None)
    calls = {"eager": sum(r["judge/judge"] is not None for r in eager), "lazy": sum(r["judge/judge"] is not None
                                                                                    for r in lazy)}
    assert calls["eager"] == len(eager) and 0.25 < calls["lazy"] / calls["eager"] < 0.75
    assert [s["loss"] for s in eager_steps] == [s["loss"] for s in lazy_steps]
    print(f"judge calls: eager {calls['eager']}, lazy {calls['lazy']} ({calls['lazy'] / calls['eager']:.0%})")
