"""Exact resume on the tiny model (sync loop), on the real CLI: a run resumed at step K from its checkpoint, in a
fresh driver and a fresh Ray, trains steps K+1..N exactly as the uninterrupted run did: the same prompts, the same
completions (per-request sampling seeds from the run seed, step and draw: no engine's global RNG), the same
rewards, losses equal within float tolerance. Everything that decides it comes from the checkpoint: the learner's
weights, optimizer, scheduler and RNGs, the prompt stream, the reward pool's trainer_state.

Two legs, one engine start-up each: the uninterrupted run (it writes checkpoint-K on its way), and a second run
directory seeded with that checkpoint alone, resumed with `--resume` (what a stopped run's next start does)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

K, N = 2, 5
COMPARED = ("loss", "reward", "grad_norm", "entropy", "learning_rate", "reward_global_step", "policy_version")


def _run(logdir: Path, name: str, *extra: str) -> str:
    overrides = [f"logging.dir={logdir}", f"grpo.max_steps={N}", f"grpo.save_steps={K}", "loop.mode=sync",
                 "logging.check_logprob_parity=false"]
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "configs/demo.yaml", *overrides, "--name", name, *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
        env={**os.environ, "RAY_ADDRESS": ""},  # its own embedded cluster, not the test session's
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout + proc.stderr


def _by_step(path: Path, key: str = "step") -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row[key], []).append(row)
    return out


@pytest.fixture(scope="module")
def legs(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("resume")
    _run(logdir, "straight")
    resumed = logdir / "resumed"
    resumed.mkdir()
    shutil.copytree(logdir / "straight" / f"checkpoint-{K}", resumed / f"checkpoint-{K}")
    out = _run(logdir, "resumed", "--resume")
    return logdir / "straight", resumed, out


def test_the_resumed_run_trains_the_same_steps_as_the_uninterrupted_one(legs):
    straight, resumed, out = legs
    assert f"resumed from {resumed / f'checkpoint-{K}'} at step {K}" in out, out[-3000:]
    a, b = _by_step(straight / "metrics.jsonl"), _by_step(resumed / "metrics.jsonl")
    assert sorted(b) == list(range(K + 1, N + 1)), sorted(b)
    for step in range(K + 1, N + 1):
        (ra,), (rb,) = a[step], b[step]
        for key in COMPARED:
            assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-7), (step, key, ra[key], rb[key])


def test_the_same_prompts_completions_and_rewards(legs):
    straight, resumed, _ = legs
    a, b = _by_step(straight / "completions.jsonl"), _by_step(resumed / "completions.jsonl")
    keep = ("prompt_index", "prompt", "completion", "total", "advantage")
    for step in range(K + 1, N + 1):
        sa = [tuple(r[k] for k in keep[:4]) for r in a[step]]
        sb = [tuple(r[k] for k in keep[:4]) for r in b[step]]
        assert sa and sa == sb, step
        adv_a, adv_b = [r["advantage"] for r in a[step]], [r["advantage"] for r in b[step]]
        assert adv_b == pytest.approx(adv_a, rel=1e-5, abs=1e-6), step
