"""The generator fleet resized while the run trains (issue 50), on the real tiny model: a run of the pipelined
config in each of the async and pipelined loops (the CLI, its own embedded Ray, real vLLM engines, learner and
reward workers), scaled 1 -> 2 by `rayward scale RUN --generators 2`'s job body (`python -m orchestrator.cli.scale`,
what the job the CLI submits through the dashboard runs, in a process of its own joined to the run's cluster: it
leaves the request in the run's control mailbox), a generator process SIGKILLed while there are two, then scaled
back to 1. The run must finish every step with a whole batch, train no prompt draw twice, and the engines must hold
the learner's weights after the new one joined (the parity check, run again at the join). The bookkeeping on fakes:
tests/unit/orchestrator/loop/test_fleet.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.cli.scale import RESULT
from tests.conftest import ROOT

NAME = "fleet-scale"
# Long enough for a new engine to load its model while the run trains (the run does not wait for it; a step of the
# tiny model is a fraction of an engine's start) and for the scale-down after it.
MAX_STEPS = 300
DEADLINE_S = 600  # the whole run with two engine start-ups and two scale jobs, on a loaded 2-core machine
SCALE_S = 240  # one `rayward scale` (a job whose driver starts on the run's cluster beside it)
PARITY_LIMIT = 1e-3  # the float32 tiny model's (orchestrator/run/train.py PARITY_LIMIT)


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _generators(root: psutil.Process) -> list[psutil.Process]:
    """The run's generator processes (Ray titles them `ray::Generator...`), descendants of its driver only."""
    out = []
    for p in root.children(recursive=True):
        try:
            if p.cmdline()[:1] and p.cmdline()[0].startswith("ray::Generator"):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _gcs_address(root: psutil.Process) -> str | None:
    """The run's own embedded cluster's GCS address, from its raylet's command line (other Ray clusters may run on
    this machine: only the driver's descendants are looked at)."""
    for p in root.children(recursive=True):
        try:
            found = [a.split("=", 1)[1] for a in p.cmdline() if a.startswith("--gcs-address=")]
        except psutil.Error:
            continue
        if found:
            return found[0]
    return None


@pytest.mark.parametrize("mode", ["async", "pipelined"])
def test_scaling_the_generators_up_and_down_mid_run_keeps_every_batch_whole_and_every_draw_once(tmp_path, mode):
    log = open(tmp_path / "driver.out", "w+")
    overrides = [f"logging.dir={tmp_path}", f"grpo.max_steps={MAX_STEPS}", f"loop.mode={mode}",
                 "logging.check_logprob_parity=true"]
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "run", "configs/pipelined.yaml", *overrides,
                             "--name", NAME], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "RAY_ADDRESS": ""})  # its own embedded cluster
    root, run_dir, t0 = psutil.Process(proc.pid), tmp_path / NAME, time.monotonic()

    def out() -> str:
        if not log.closed:
            log.flush()
        return (tmp_path / "driver.out").read_text()

    def wait(what, cond):
        while not (got := cond()):
            assert proc.poll() is None, f"the run ended while waiting for {what}:\n{out()[-4000:]}"
            assert time.monotonic() - t0 < DEADLINE_S, f"timed out waiting for {what}:\n{out()[-4000:]}"
            time.sleep(0.3)
        return got

    def step() -> int:
        return max((r["step"] for r in _rows(run_dir / "metrics.jsonl") if "loss" in r), default=0)

    def scale(n: int) -> dict:
        p = subprocess.run([sys.executable, "-m", "orchestrator.cli.scale", NAME, "--pool", "generators", "--count",
                            str(n)], cwd=ROOT, capture_output=True, text=True, timeout=SCALE_S,
                           env={**os.environ, "RAY_ADDRESS": gcs})
        assert p.returncode == 0, p.stdout + p.stderr
        return json.loads(p.stdout.split(RESULT)[1].splitlines()[0])

    try:
        gcs = wait("the run's cluster", lambda: _gcs_address(root))
        wait("step 2", lambda: step() >= 2)
        answer = scale(2)
        assert (answer["workers"], answer["target_workers"]) == (1, 2)
        wait("the second engine to start", lambda: "generator-1 starting" in out())
        wait("the second engine to join", lambda: "generators: 1 -> 2" in out())
        grown = step()
        assert len(_generators(root)) == 2
        wait("two steps on two engines", lambda: step() >= grown + 2)
        _generators(root)[-1].send_signal(signal.SIGKILL)  # one engine dies mid-run: Ray restarts it
        wait("the killed engine's restart", lambda: [r for r in _rows(run_dir / "faults.jsonl")
                                                     if r["kind"] == "generator_restarted"])
        restarted = step()
        wait("a step after the restart", lambda: step() > restarted)
        assert scale(1)["target_workers"] == 1
        wait("the second engine leaving", lambda: re.search(r"generators: \S+generator-\d+ left", out()))
        rc = proc.wait(timeout=max(DEADLINE_S - (time.monotonic() - t0), 1))
    finally:
        if proc.poll() is None:  # a failed wait: the driver and everything it started (its own Ray)
            tree = root.children(recursive=True)
            proc.kill()
            proc.wait()
            for p in tree:
                try:
                    p.kill()
                except psutil.Error:
                    pass
        log.close()
    text = out()
    assert rc == 0, text[-4000:]
    assert "generators: 2 -> 1" in text
    rows = {r["step"]: r for r in _rows(run_dir / "metrics.jsonl") if "loss" in r}
    assert sorted(rows) == list(range(1, MAX_STEPS + 1))
    assert all(r["batch/groups"] == 8 for r in rows.values())  # every step a whole batch (8 prompts x 8)
    counts = [rows[s]["generators/count"] for s in sorted(rows)]
    assert counts[0] == 1 and max(counts) == 2 and counts[-1] == 1
    # back at one engine, the feed's calls end with a step's batch again: no group dropped as too stale step after
    # step (calls resized to the fleet left half a call behind every other step); one drop where the loop stalled
    # on a loaded machine is the async loop's rule at work
    if mode == "async":
        late = [rows[s]["async/dropped_stale"] for s in sorted(rows)[-10:]]
        assert sum(d > 0 for d in late) <= 2, late
    # no prompt draw trained twice: each step's draws (prompt_index, a group's samples share it), over the run
    per_step: dict[int, set[int]] = {}
    for r in _rows(run_dir / "completions.jsonl"):
        per_step.setdefault(r["step"], set()).add(r["prompt_index"])
    assert sorted(per_step) == list(range(1, MAX_STEPS + 1)) and all(len(d) == 8 for d in per_step.values())
    draws = [d for s in per_step.values() for d in s]
    assert len(draws) == len(set(draws))
    # the weights every engine holds are the learner's: at the start, and again once the new engine joined
    gaps = [float(g) for g in re.findall(r"logprob parity after sync: max abs diff (\S+?)[;)\s]", text)]
    assert len(gaps) == 2 and max(gaps) < PARITY_LIMIT, gaps
