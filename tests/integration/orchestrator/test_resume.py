"""SIGTERM (what `ray job stop` sends) before training starts: one line, exit 143, on the real CLI. (A run stopped
by SIGTERM mid-training leaves a checkpoint, says so in one line and resumes exactly:
tests/integration/faults/test_exact_resume.py; where the loop stops, what the checkpoint holds and what --resume
restores: tests/unit/orchestrator/test_loop.py, on fakes; other real resumes: test_lora.py and
tests/integration/cluster/test_multinode_learner.py.)"""

import os
import signal
import subprocess
import sys

from tests.conftest import ROOT


def test_sigterm_while_starting_is_one_line(tmp_path):
    """SIGTERM before the loop (here: as soon as the run printed its first line, before Ray starts) ends the run
    at once: nothing to checkpoint, one line, exit 143."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "configs/demo.yaml", f"logging.dir={tmp_path}", "--name", "early"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert proc.stdout.readline().startswith("rayward run 'early': logs and checkpoints in ")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and err == "rayward: stopped before training started (SIGTERM)\n", (out, err)
    assert not list((tmp_path / "early").glob("checkpoint-*"))
