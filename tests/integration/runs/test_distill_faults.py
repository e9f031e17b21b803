"""The distillation teacher's pool of real vLLM engines in a real run (configs/distill.yaml, the tiny teacher), an
engine killed the way a node's OOM killer or an operator does it: SIGKILL while the engine is inside a call (its
Ray process title names the method it runs). The pool replaces it and re-sends the call's requests to the live
engine: every step's samples all have the teacher's log-probs (no `distill/teacher_failures`), the run finishes
and the pool is back at its size.
Whole runs: the scenario tier."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(1200)

WAIT_S = 600.0
STEPS = 8


def busy_teacher_engines() -> list[int]:
    """Pids of teacher engine actors inside a call (Ray titles a busy actor's process ray::Class.method)."""
    out = subprocess.run(["pgrep", "-f", "ray::TeacherEngine.logprobs"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_a_teacher_engine_killed_inside_a_call_loses_no_sample(tmp_path):
    name = "distill-kill"
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "configs/distill.yaml", "--name", name,
         f"logging.dir={tmp_path}", f"grpo.max_steps={STEPS}", "logging.progress=false",
         "distillation.engines.num_engines=2", "cluster.local_num_cpus=4"],
        cwd=ROOT, env={**os.environ, "RAY_ADDRESS": ""}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / name / "metrics.jsonl"
    steps = lambda: [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []  # noqa: E731
    deadline = time.monotonic() + WAIT_S
    killed = None
    while killed is None:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "no teacher engine was ever seen inside a call"
        busy = busy_teacher_engines()
        if busy and len(steps()) >= 2:  # both engines up and answering by now
            killed = busy[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, out[-3000:]
    rows = steps()
    assert len(rows) == STEPS
    assert all(r["distill/teacher_failures"] == 0 for r in rows), [r["distill/teacher_failures"] for r in rows]
    assert rows[-1]["teacher_pool/replaced"] >= 1 and rows[-1]["teacher_pool/retries"] >= 1, rows[-1]
    assert rows[-1]["teacher_pool/target_workers"] == 2  # replaced (its engine may still be loading: a vLLM start)
    print(f"killed teacher engine pid {killed} at step "
          f"{next(i for i, r in enumerate(rows) if r['teacher_pool/replaced'])}"
          f"; retries {rows[-1]['teacher_pool/retries']}, replaced {rows[-1]['teacher_pool/replaced']}")
