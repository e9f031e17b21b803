"""SIGTERM (what `ray job stop` sends) before training starts: one line, exit 143, on the real CLI. (A run stopped
by SIGTERM mid-training leaves a checkpoint, says so in one line and resumes exactly:
tests/integration/runs/faults/test_exact_resume.py; where the loop stops, what the checkpoint holds and what --resume
restores: tests/unit/orchestrator/loop/test_loops.py, on fakes; other real resumes: test_lora.py and
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
        [sys.executable, "-m", "orchestrator", "run", "configs/demo.yaml", f"logging.dir={tmp_path}",
         "--name", "early"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert proc.stdout.readline().startswith("rayward run 'early': logs and checkpoints in ")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and err == "rayward: stopped before training started (SIGTERM)\n", (out, err)
    assert not list((tmp_path / "early").glob("checkpoint-*"))


MACHINE_HEAD_TRIES = 2


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# `ray start --head` misses Ray's fixed start-up deadlines (CI's tier twice in four runs); --all runs it alone
def test_without_an_address_a_run_starts_its_own_cluster_beside_the_machines_own(tmp_path):
    """A user's own `ray start --head` on the same machine (Ray records it where a bare ray.init() looks for a
    cluster to join): a run without cluster.address or RAY_ADDRESS starts its own embedded cluster anyway (it
    failed within seconds with Ray's "When connecting to an existing cluster, num_cpus and num_gpus must not be
    provided"), and a group SIGTERM stops it as usual. The machine's cluster is a head of its own here, in its
    own RAY_TMPDIR, so no other test sees it."""
    import shutil
    import tempfile
    import time
    from pathlib import Path

    ray_tmp = Path(tempfile.mkdtemp(prefix="rw-", dir="/tmp"))  # short: Ray's unix sockets live under it
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update(RAY_TMPDIR=str(ray_tmp), RAY_AUTH_MODE="token")
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"

    def start_head() -> tuple[subprocess.Popen, int]:
        theirs = _free_port()
        return subprocess.Popen(
            [ray, "start", "--head", "--block", "--port", str(_free_port()), "--dashboard-port", str(theirs),
             "--num-cpus", "1", "--disable-usage-stats"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        ), theirs

    head, theirs = start_head()
    try:
        deadline, tries = time.monotonic() + 120, 1
        while not (ray_tmp / "ray" / "ray_current_cluster").exists():
            if head.poll() is not None and tries < MACHINE_HEAD_TRIES:
                # `ray start` gives its raylet a fixed 30 s to register; beside the other pytest worker's runs on
                # 2 cores it can miss that ("The current node timed out during startup"): the user's side of
                # the setup, not what is tested, so it gets a second try.
                head, theirs, tries = *start_head(), tries + 1
            assert head.poll() is None and time.monotonic() < deadline, head.stdout.read()[-3000:]
            time.sleep(0.2)
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "run", "configs/demo.yaml", f"logging.dir={tmp_path}",
             "--name", "beside"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
        )
        lines = []
        while not any("Ray dashboard" in line for line in lines):
            line = proc.stdout.readline()
            assert line, (lines, proc.communicate()[1][-3000:])  # ended before its cluster started
            lines.append(line)
        assert f":{theirs}" not in lines[-1] and "sign in with the cluster's token" in lines[-1], lines
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 143 and err.endswith("rayward: stopped before training started (SIGTERM)\n"), err
        assert head.poll() is None, head.stdout.read()[-3000:]  # the machine's cluster is untouched
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)
