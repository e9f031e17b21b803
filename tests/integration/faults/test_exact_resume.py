"""Exact resume on the tiny model (sync loop), on the real CLI: a run resumed at step K from its checkpoint, in a
fresh driver and a fresh Ray, trains steps K+1..N exactly as the uninterrupted run did: the same prompts, the same
completions (per-request sampling seeds from the run seed, step and draw: no engine's global RNG), the same
rewards, losses equal within float tolerance. Everything that decides it comes from the checkpoint: the learner's
weights, optimizer, scheduler and RNGs, the prompt stream, the reward pool's trainer_state.

Two legs, one engine start-up each, both stopped by SIGTERM (what `ray job stop` sends) once past step N: the
uninterrupted run (it writes checkpoint-K on its way), and a second run directory seeded with that checkpoint
alone, resumed with `--resume` (what a stopped run's next start does). Each stop leaves a checkpoint at its last
step and says so in one line (exit 143, no traceback)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

K, N = 2, 5
COMPARED = ("loss", "reward", "grad_norm", "entropy", "learning_rate", "reward_global_step", "policy_version")
START_S = 240  # the run's start-up and its first N steps, on a loaded 2-core machine


@dataclass
class Leg:
    run_dir: Path
    rc: int
    out: str


def _run_past_n_then_sigterm(logdir: Path, name: str, *extra: str) -> Leg:
    """The demo (its 40 steps, so both legs share the learning-rate schedule), SIGTERMed once it has logged step
    N."""
    overrides = [f"logging.dir={logdir}", f"grpo.save_steps={K}", "loop.mode=sync", "logging.check_logprob_parity=false"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "configs/demo.yaml", *overrides, "--name", name, *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "RAY_ADDRESS": ""},  # its own embedded cluster, not the test session's
    )
    metrics = logdir / name / "metrics.jsonl"
    deadline = time.monotonic() + START_S
    while not (metrics.exists() and any(json.loads(x)["step"] >= N for x in metrics.read_text().splitlines())):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{name}: no step {N} (rc {proc.poll()}):\n{proc.communicate()[0][-4000:]}")
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    return Leg(logdir / name, proc.returncode, out)


def _by_step(path: Path, key: str = "step") -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row[key], []).append(row)
    return out


@pytest.fixture(scope="module")
def legs(tmp_path_factory) -> tuple[Leg, Leg]:
    logdir = tmp_path_factory.mktemp("resume")
    straight = _run_past_n_then_sigterm(logdir, "straight")
    assert (straight.run_dir / f"checkpoint-{K}").is_dir(), straight.out[-3000:]
    (logdir / "resumed").mkdir()
    shutil.copytree(straight.run_dir / f"checkpoint-{K}", logdir / "resumed" / f"checkpoint-{K}")
    return straight, _run_past_n_then_sigterm(logdir, "resumed", "--resume")


def test_sigterm_checkpoints_and_says_how_to_continue(legs):
    for leg in legs:
        name = leg.run_dir.name
        assert leg.rc == 143 and "Traceback" not in leg.out, leg.out[-3000:]
        last = json.loads((leg.run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"]
        ckpt = leg.run_dir / f"checkpoint-{last}"
        assert last >= N and leg.out.rstrip().splitlines()[-1] == (
            f"rayward: stopped at step {last} (SIGTERM); checkpoint {ckpt} (continue with --name {name} --resume)"
        ), leg.out[-3000:]
        assert json.loads((ckpt / "rayward_state.json").read_text())["global_step"] == last


def test_the_resumed_run_trains_the_same_steps_as_the_uninterrupted_one(legs):
    straight, resumed = legs
    assert f"resumed from {resumed.run_dir / f'checkpoint-{K}'} at step {K}" in resumed.out, resumed.out[-3000:]
    a, b = _by_step(straight.run_dir / "metrics.jsonl"), _by_step(resumed.run_dir / "metrics.jsonl")
    assert min(b) == K + 1 and sorted(b) == list(range(K + 1, max(b) + 1)), sorted(b)
    for step in range(K + 1, min(max(a), max(b)) + 1):  # N at least: both legs were stopped past it
        (ra,), (rb,) = a[step], b[step]
        for key in COMPARED:
            assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-7), (step, key, ra[key], rb[key])


def test_the_same_prompts_completions_and_rewards(legs):
    straight, resumed = legs
    a, b = _by_step(straight.run_dir / "completions.jsonl"), _by_step(resumed.run_dir / "completions.jsonl")
    keep = ("prompt_index", "prompt", "completion", "total", "advantage")
    for step in range(K + 1, min(max(a), max(b)) + 1):
        sa = [tuple(r[k] for k in keep[:4]) for r in a[step]]
        sb = [tuple(r[k] for k in keep[:4]) for r in b[step]]
        assert sa and sa == sb, step
        adv_a, adv_b = [r["advantage"] for r in a[step]], [r["advantage"] for r in b[step]]
        assert adv_b == pytest.approx(adv_a, rel=1e-5, abs=1e-6), step
