"""One real run of the demo (the CLI, its own embedded Ray, a real vLLM engine, real learner and reward workers)
that outlives three faults, injected from outside as the machine would: the learner SIGKILLed, the generator
SIGSTOPped, a reward worker SIGSTOPped. The run must come back from each by itself and finish with exit 0:

- the learner is rebuilt from the latest checkpoint, its weight-transfer group re-formed, the reward pool given
  the checkpoint's trainer_state, the prompt stream rewound; one record in faults.jsonl with its cause and the
  steps it lost, within cluster.max_failures; the lost step, trained again, equals the one that was lost;
- a stopped generator does not answer the driver's ping within cluster.hang_timeout_s: it is killed (named) and
  Ray restarts it;
- a stopped reward worker does not return its chunk within its rewards' timeout plus cluster.hang_timeout_s: the
  pool kills it (named) and re-runs the chunk elsewhere.

One run for all of it (one engine start-up). The budget and the rewind's bookkeeping on fakes:
tests/unit/orchestrator/run/test_supervisor.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT

NAME = "chaos-small"
MAX_STEPS, SAVE_STEPS = 12, 3
HANG_S = 8  # cluster.hang_timeout_s: short, so the test waits little for each hang to be declared
REWARD_TIMEOUT_S = 4  # the letter reward's timeout_s: a stopped reward worker's chunk is overdue after 4 + 8 s
DEADLINE_S = 420  # the whole run with its three faults, on a loaded 2-core machine


def _actor_procs(root: psutil.Process, cls: str) -> list[psutil.Process]:
    """The run's processes of one actor class (Ray titles them `ray::<Class>...`): descendants of the driver only,
    so other runs on the machine are never touched."""
    out = []
    for p in root.children(recursive=True):
        try:
            if p.cmdline()[:1] and p.cmdline()[0].startswith(f"ray::{cls}"):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


class _Run:
    def __init__(self, tmp: Path):
        overrides = [
            f"logging.dir={tmp}", f"grpo.max_steps={MAX_STEPS}", f"grpo.save_steps={SAVE_STEPS}",
            "cluster.max_failures=1", f"cluster.hang_timeout_s={HANG_S}", f"rewards.0.timeout_s={REWARD_TIMEOUT_S}",
            "logging.check_logprob_parity=false",
        ]
        self.log = open(tmp / "driver.out", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "run", "configs/demo.yaml", *overrides, "--name", NAME],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "RAY_ADDRESS": ""},  # its own embedded cluster, not the test session's
        )
        self.root = psutil.Process(self.proc.pid)
        self.dir = tmp / NAME
        self.t0 = time.monotonic()

    def out(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def wait(self, what: str, cond, timeout_s: float = DEADLINE_S):
        while True:
            got = cond()
            if got:
                return got
            assert self.proc.poll() is None, f"the run ended while waiting for {what}:\n{self.out()[-4000:]}"
            assert time.monotonic() - self.t0 < timeout_s, f"timed out waiting for {what}:\n{self.out()[-4000:]}"
            time.sleep(0.3)

    def step(self) -> int:
        rows = _rows(self.dir / "metrics.jsonl")
        return max((r["step"] for r in rows if "loss" in r or "train/loss" in r or "rewards/letter/mean" in r),
                   default=0)

    def faults(self, kind: str) -> list[dict]:
        return [r for r in _rows(self.dir / "faults.jsonl") if r["kind"] == kind]

    def one(self, cls: str) -> psutil.Process:
        return self.wait(f"a live ray::{cls}", lambda: next(iter(_actor_procs(self.root, cls)), None))


@pytest.fixture(scope="module")
def chaos(tmp_path_factory):
    """The run, with its faults injected in turn; yields what the assertions read once it has ended."""
    run = _Run(tmp_path_factory.mktemp("faults"))
    try:
        # 1. the learner, killed after the first checkpoint and a step beyond it
        run.wait("step 4", lambda: run.step() >= SAVE_STEPS + 1)
        learner = run.one("Learner")
        killed_at = run.step()
        learner.send_signal(signal.SIGKILL)
        run.wait("the learner's recovery", lambda: run.faults("learner_recovered"))
        # 2. the generator, stopped (alive to the OS and to Ray, but answering nothing)
        run.wait("a step after the recovery", lambda: run.step() > killed_at)
        gen = run.one("Generator")
        gen.send_signal(signal.SIGSTOP)
        run.wait("the hung generator's kill", lambda: run.faults("hung_killed"))
        # 3. a reward worker, stopped while the run scores
        run.wait("a step after the generator came back", lambda: len(run.faults("generator_restarted")) > 0
                 and run.step() > killed_at + 1)
        worker = run.one("RewardWorker")
        worker.send_signal(signal.SIGSTOP)
        rc = run.proc.wait(timeout=max(DEADLINE_S - (time.monotonic() - run.t0), 1))
        yield {"rc": rc, "out": run.out(), "dir": run.dir, "killed_at": killed_at, "worker": worker.pid}
    finally:
        if run.proc.poll() is None:  # a failed wait: the driver and everything it started (its own Ray)
            tree = run.root.children(recursive=True)
            run.proc.kill()
            run.proc.wait()
            for p in tree:
                try:
                    p.kill()
                except psutil.Error:
                    pass
        run.log.close()


def test_the_run_finishes_every_step(chaos):
    assert chaos["rc"] == 0, chaos["out"][-4000:]
    steps = [r["step"] for r in _rows(chaos["dir"] / "metrics.jsonl") if "rewards/letter/mean" in r]
    assert steps and steps[-1] == MAX_STEPS and set(range(1, MAX_STEPS + 1)) <= set(steps), steps


def test_a_killed_learner_is_rebuilt_from_the_last_checkpoint(chaos):
    (rec,) = [r for r in _rows(chaos["dir"] / "faults.jsonl") if r["kind"] == "learner_recovered"]
    lost_at = rec["failed_at_step"]
    assert rec["checkpoint"] == f"checkpoint-{rec['restored_step']}" and rec["restored_step"] % SAVE_STEPS == 0
    assert 0 <= rec["steps_lost"] == lost_at - rec["restored_step"] < SAVE_STEPS + 1
    assert "learner" in rec["cause"] and (rec["failures"], rec["max_failures"]) == (1, 1)
    assert "rebuilding the learner (1/1)" in chaos["out"]
    # The lost step, trained again by the rebuilt learner, is the step that was lost: the checkpoint's weights,
    # optimizer and RNGs, the same prompts (the rewound stream), the same completions (seeded requests), the
    # reward pool back at the checkpoint's step.
    twice = [r for r in _rows(chaos["dir"] / "metrics.jsonl") if r["step"] == lost_at]
    assert len(twice) == 2 and twice[0]["reward_global_step"] == twice[1]["reward_global_step"] == lost_at - 1
    for key in ("loss", "reward", "grad_norm", "entropy"):
        assert twice[1][key] == pytest.approx(twice[0][key], rel=1e-5, abs=1e-7), key
    samples = [(r["prompt"], r["completion"], r["total"]) for r in _rows(chaos["dir"] / "completions.jsonl")
               if r["step"] == lost_at]
    half = len(samples) // 2
    assert half and samples[:half] == samples[half:]
    assert "learner back at step" in chaos["out"] and "step(s) lost" in chaos["out"]


def test_a_stopped_generator_is_killed_by_name_and_comes_back(chaos):
    (rec,) = [r for r in _rows(chaos["dir"] / "faults.jsonl") if r["kind"] == "hung_killed"]
    assert rec["actor"] == f"{NAME}/generator-0", rec
    assert f"{NAME}/generator-0 did not answer within {HANG_S} s (hung)" in chaos["out"]


def test_a_stopped_reward_worker_is_killed_by_name_and_replaced(chaos):
    actors = (chaos["dir"] / "actors.log").read_text()
    assert f"worker {NAME}/reward-" in actors and "(hung)" in actors and "replacing it" in actors, actors[-3000:]
    assert not psutil.pid_exists(chaos["worker"]) or psutil.Process(chaos["worker"]).status() == "zombie"
