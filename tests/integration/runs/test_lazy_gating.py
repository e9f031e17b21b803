"""Lazy gating end to end (gate.lazy), as a user runs it: the demo (sync loop, seeded) with a second reward gated by
the letter reward, once called everywhere and once lazily. Same seed, same samples: the lazily gated reward is called
only where the letter reward opens its gate, and every step's advantages, totals and gated values equal the eager
run's to the bit (the completions logs compared row by row). A whole run each: the scenario tier; CI's tier has the
worker's lazy against eager on a chunk (tests/unit/actors/rewards/test_worker.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(900)

STEPS = 6
# The demo's tiny model writes few of the asked letter at first: about a third of its samples score above 0.01.
GATED = "rewards.1={name: short, function: brevity, weight: 0.5, gate: {reward: letter, threshold: 0.01, lazy: %s}}"


def run(tmp_path: Path, lazy: bool) -> tuple[list[dict], list[dict]]:
    name = f"lazy-{str(lazy).lower()}"
    r = subprocess.run([sys.executable, "-m", "orchestrator", "run", "configs/demo.yaml", "--name", name,
                        f"logging.dir={tmp_path}", f"grpo.max_steps={STEPS}", "logging.progress=false",
                        GATED % str(lazy).lower()],
                       cwd=ROOT, capture_output=True, text=True, timeout=800, env={**os.environ, "RAY_ADDRESS": ""})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    read = lambda f: [json.loads(x) for x in (tmp_path / name / f).read_text().splitlines()]  # noqa: E731
    return read("completions.jsonl"), read("metrics.jsonl")


def test_a_lazily_gated_reward_is_called_where_its_gate_is_open_and_the_advantages_are_the_eager_runs(tmp_path):
    eager, eager_steps = run(tmp_path, lazy=False)
    lazy, lazy_steps = run(tmp_path, lazy=True)
    assert len(eager) == len(lazy) > 0 and len(lazy) % STEPS == 0
    for e, z in zip(eager, lazy, strict=True):
        assert e["completion"] == z["completion"]  # the same samples (seeded sync loop)
        assert (e["advantage"], e["total"], e["gated/short"]) == (z["advantage"], z["total"], z["gated/short"])
        open_gate = e["rewards/letter"] >= 0.01
        assert (z["rewards/short"] is None) == (not open_gate)  # not called where the gate was closed
        assert z["rewards/short"] == (e["rewards/short"] if open_gate else None)
    skipped = [s["rewards/short/skipped"] for s in lazy_steps]
    closed = [round(s["gates/short<-letter/closed_frac"] * len(lazy) / STEPS) for s in lazy_steps]
    assert skipped == closed and 0 < sum(skipped) < len(lazy)  # some calls saved, some made
    print(f"lazy gating: {sum(skipped)} of {len(lazy)} calls skipped ({sum(skipped) / len(lazy):.0%})")
    assert [s["loss"] for s in eager_steps] == [s["loss"] for s in lazy_steps]
