"""A run stopped by SIGTERM (what `ray job stop` sends) leaves a checkpoint and says so in one line (exit 143,
no traceback), on the real CLI with its own embedded Ray. (Where the loop stops, what the checkpoint holds and
what --resume restores: tests/unit/orchestrator/test_loop.py, on fakes; a real resume: test_lora.py and
tests/integration/cluster/test_multinode_learner.py.)"""

import json
import os
import signal
import subprocess
import sys
import time

from tests.conftest import ROOT


def test_sigterm_checkpoints_and_says_how_to_continue(tmp_path):
    name = "resume-me"
    overrides = [f"logging.dir={tmp_path}", "grpo.save_steps=1000", "logging.check_logprob_parity=false"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "configs/demo.yaml", *overrides, "--name", name],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "RAY_ADDRESS": ""},  # its own embedded cluster, not the test session's
    )
    metrics = tmp_path / name / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in out, out[-3000:]
    last = json.loads(metrics.read_text().splitlines()[-1])["step"]
    ckpt = tmp_path / name / f"checkpoint-{last}"
    assert out.rstrip().splitlines()[-1] == (
        f"rayward: stopped at step {last} (SIGTERM); checkpoint {ckpt} (continue with --name {name} --resume)"
    ), out[-3000:]
    assert json.loads((ckpt / "rayward_state.json").read_text())["global_step"] == last


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
