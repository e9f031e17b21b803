"""A judge pool of real vLLM engines in a real run (configs/judge.yaml, the tiny judge), faulted and loaded the
way a user's cluster does it. The judge's parser (tests/fixtures/judges.py) holds or slows the engines' calls on
the test's signal and records every answer it parses:

- an engine killed (SIGKILL) while it holds requests mid-step: the pool replaces it, its requests are answered
  by the live engines, every sample of the run is judged, and each answer is parsed exactly once (the killed
  engine parsed none);
- a judge that turns slow: the pool grows from 1 engine while it is slow and shrinks back to 1 once it is fast.

Whole runs: the scenario tier."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(1200)

N = 64  # judge.yaml's generation_batch_size
WAIT_S = 600.0
JUDGE = ["rewards.1.judge.labels=null", "rewards.1.judge.parser=tests.fixtures.judges:yes_no", "rewards.1.gate=null",
         "logging.progress=false", "cluster.local_num_cpus=4"]  # logical CPUs: room for 3 engines


def start(tmp_path: Path, name: str, steps: int, *overrides: str) -> subprocess.Popen:
    signals = tmp_path / "signals"
    signals.mkdir(exist_ok=True)
    env = {**os.environ, "RAY_ADDRESS": "", "RAYWARD_TEST_JUDGE_DIR": str(signals)}
    return subprocess.Popen([sys.executable, "-m", "orchestrator", "run", "configs/judge.yaml", "--name", name,
                             f"logging.dir={tmp_path}", f"grpo.max_steps={steps}", *JUDGE, *overrides],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def until(pred, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + WAIT_S
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"never: {what}")
        time.sleep(0.1)


def finish(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, out[-3000:]


def read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_an_engine_killed_mid_step_loses_no_sample_and_no_answer_is_parsed_twice(tmp_path):
    signals = tmp_path / "signals"
    signals.mkdir()
    proc = start(tmp_path, "judge-kill", 6, "rewards.1.judge.engines.num_engines=2")

    metrics = tmp_path / "judge-kill" / "metrics.jsonl"

    def parsed() -> list[int]:
        return [int(x) for x in (signals / "parsed").read_text().split()] if (signals / "parsed").exists() else []

    def between_steps() -> bool:
        """Both engines have answered (the second may start a step later) and every answer of the steps done is
        parsed, none of the next step's: no engine call is half done."""
        return len(set(parsed())) == 2 and len(parsed()) == len(read(metrics)) * N

    until(between_steps, "both engines answering, between two steps", proc)
    (signals / "hold").touch()  # from now on every parse waits: both engines hold requests of the next step
    before = len(parsed())
    until(lambda: len(list(signals.glob("held-*"))) == 2, "both engines holding requests", proc)
    victim = int(sorted(signals.glob("held-*"))[0].name.split("-")[1])
    os.kill(victim, signal.SIGKILL)
    (signals / "hold").unlink()
    (signals / "release").touch()
    finish(proc)
    rows, steps = read(tmp_path / "judge-kill" / "completions.jsonl"), read(tmp_path / "judge-kill" / "metrics.jsonl")
    assert len(rows) == 6 * N and all(r["judge/judge"] is not None for r in rows)  # every sample judged
    after = parsed()[before:]
    assert victim not in after and len(parsed()) == len(rows)  # each answer parsed once, by a live engine
    assert steps[-1]["judge_pool/judge/retries"] >= 1 and steps[-1]["judge_pool/judge/replaced"] >= 1
    assert all(s["rewards/judge/errors"] == 0 for s in steps)


def test_the_judge_pool_grows_while_the_judge_is_slow_and_shrinks_back_when_it_is_fast(tmp_path):
    signals = tmp_path / "signals"
    signals.mkdir()
    # s per answer, 16 answers a step (2 prompts), 4 calls at a time per engine: the slow steps want 3 engines at
    # the default target; fast, the engines' compute is a fraction of the rest of the step.
    (signals / "slow").write_text("0.2")
    autoscale = ("rewards.1.judge.engines.autoscale={min_workers: 1, max_workers: 3, upscale_delay_s: 0, "
                 "downscale_delay_s: 5, look_back_s: 5}")
    proc = start(tmp_path, "judge-scale", 80, autoscale, "generation.generation_batch_size=16",
                 "grpo.per_device_train_batch_size=16")
    metrics = tmp_path / "judge-scale" / "metrics.jsonl"
    until(lambda: any(s["judge_pool/judge/workers"] >= 2 for s in read(metrics)), "a second live engine", proc)
    grown = len(read(metrics))
    (signals / "slow").unlink()
    until(lambda: any(s["judge_pool/judge/target_workers"] == 1 for s in read(metrics)[grown:]),
          "the pool back at one engine", proc)
    finish(proc)
    steps = read(metrics)
    back = next(i for i, s in enumerate(steps) if i >= grown and s["judge_pool/judge/target_workers"] == 1) + 1
    assert steps[0]["judge_pool/judge/workers"] == 1 and steps[-1]["judge_pool/judge/target_workers"] == 1
    assert all(s["rewards/judge/errors"] == 0 and s["rewards/judge/timeouts"] == 0 for s in steps)
    print(f"judge pool: 1 -> {steps[grown - 1]['judge_pool/judge/workers']} live engines at step {grown} while slow, "
          f"back to 1 by step {back}")
