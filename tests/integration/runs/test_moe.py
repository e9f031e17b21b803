"""A mixture-of-experts policy end to end, as a user runs it: `rayward run configs/moe.yaml` (the tiny Qwen3-MoE with
rollout routing replay), its own embedded Ray, real vLLM (its CPU MoE backend), reward pool and learner. The letter
task learns, with a held-out eval, and the routing and parity numbers are in metrics.jsonl and on the terminal; the
near-tie model without and with replay; no replay; a parity gap above the limit stopping the run.

Scenario tier (whole runs, about two minutes of 2 cores each): CI covers MoE with the real engine and learner
(tests/integration/actors/generation/test_moe_engine.py), through Ray's weight transfer
(tests/integration/actors/weights/test_transfer.py) and the learner's paths (tests/unit/actors/learner/test_moe.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(900)

PARITY = re.compile(r"logprob parity after sync: max abs diff ([0-9.e+-]+)")


def run(tmp_path: Path, name: str, *overrides: str, config: str = "configs/moe.yaml"
        ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", config, f"logging.dir={tmp_path}", "logging.progress=false",
         *overrides, "--name", name],
        cwd=ROOT, capture_output=True, text=True, timeout=800, env={**os.environ, "RAY_ADDRESS": ""},
    )
    metrics = tmp_path / name / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    return r, rows


def mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def test_the_moe_config_learns_with_rollout_routing_replay(tmp_path):
    r, all_rows = run(tmp_path, "moe", "grpo.max_steps=20",
                      "eval={data: {path: toy}, every_n_steps: 10, at_start: true, max_samples: 32, "
                      "num_generations: 2}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [x for x in all_rows if "eval/reward" not in x]
    evals = [x for x in all_rows if "eval/reward" in x]
    assert [e["step"] for e in evals] == [0, 10, 20] and evals[-1]["eval/reward"] > evals[0]["eval/reward"]
    gap = float(PARITY.search(r.stdout + r.stderr).group(1))
    assert gap <= 1e-4  # float32: the engine's MoE and the learner's agree as the dense model's do
    assert len(rows) == 20
    first, last = mean(rows[:5], "rewards/letter/mean"), mean(rows[-5:], "rewards/letter/mean")
    print(f"letter reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert last > max(0.15, 3 * first)
    # The engine's routes reached the learner (every step measured them) and, on this model, equal its own.
    assert all(row["routing/agreement"] == 1.0 for row in rows)
    assert max(row["sampling/sampling_logp_difference/mean"] for row in rows) < 1e-4


def test_near_tied_routers_without_and_with_replay(tmp_path):
    """The near-tie model: without replay the parity check finds the two implementations a nat apart and stops the
    run, naming routing replay; let through, the per-step logprob gap stays far above rounding; with R3 the parity
    check replays the engine's routing and passes, and the learner trains at the dense model's gap."""
    common = ("model.name_or_path=tiny-moe-ties", "grpo.max_steps=12")
    r, rows = run(tmp_path, "ties-stop", *common, "grpo.router_replay=null")
    assert r.returncode == 2 and not rows
    assert "grpo.router_replay: R3 replays the engine's routing" in r.stdout + r.stderr
    r, plain = run(tmp_path, "ties-plain", *common, "grpo.router_replay=null", "logging.max_logprob_parity_gap=5")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r, replayed = run(tmp_path, "ties-r3", *common)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert float(PARITY.search(r.stdout + r.stderr).group(1)) <= 1e-4
    without = mean(plain, "sampling/sampling_logp_difference/mean")
    with_replay = mean(replayed, "sampling/sampling_logp_difference/mean")
    print(f"per-step logprob gap: without replay {without:.2e}, with R3 {with_replay:.2e}; routing agreement "
          f"{mean(replayed, 'routing/agreement'):.3f}")
    assert without > 1e-2 and with_replay < 1e-4
    assert mean(replayed, "routing/agreement") < 0.99
    assert mean(replayed, "routing/logp_difference_without_replay/mean") > 1e-2


def test_an_moe_learns_without_replay_and_a_parity_gap_above_the_limit_stops_the_run(tmp_path):
    r, rows = run(tmp_path, "moe-plain", "grpo.router_replay=null", "grpo.max_steps=24")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert mean(rows[-5:], "rewards/letter/mean") > max(0.15, 3 * mean(rows[:5], "rewards/letter/mean"))
    assert "routing/agreement" not in rows[0]
    r, rows = run(tmp_path, "moe-strict", "logging.max_logprob_parity_gap=1e-12", "grpo.max_steps=2")
    assert r.returncode != 0 and not rows
    assert "above logging.max_logprob_parity_gap = 1e-12" in r.stdout + r.stderr
