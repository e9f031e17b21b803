"""The demo on a terminal (a pseudo-terminal, as a user's shell gives it): a live progress bar and rayward's own
lines only; vLLM's, Triton's, NUMA's and the weight loaders' lines are in the run's actors.log instead."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(600)

# Lines the actors write that the terminal must not show (each seen in the demo's output before issue 18).
NOISE = ("Triton", "NUMA", "FutureWarning", "safetensors", "Loading weights", "Writing model shards", "vLLM", "vllm",
         "pid=", "Traceback")
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_on_a_terminal(cmd: list[str], timeout_s: float, columns: int = 120) -> tuple[int, str]:
    """Run `cmd` with stdout and stderr on a pseudo-terminal; its exit code and everything it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**os.environ, "RAY_ADDRESS": "", "TERM": "xterm-256color", "COLUMNS": str(columns)}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return rc, b"".join(chunks).decode("utf-8", "replace")


def screen_lines(raw: str) -> list[str]:
    """What the terminal ends up showing, line by line: a carriage return redraws the line (the live bar)."""
    lines = []
    for line in raw.replace("\r\n", "\n").split("\n"):
        line = re.split(r"\r", line)[-1]
        lines.append(ANSI_RE.sub("", line).rstrip())
    return [x for x in lines if x]


def test_demo_terminal_shows_a_live_bar_and_only_rayward_lines(tmp_path):
    name = "tty-demo"
    rc, raw = run_on_a_terminal(
        [sys.executable, "-m", "orchestrator", "run", "configs/demo.yaml", "--name", name, "grpo.max_steps=3",
         "grpo.save_steps=3", f"logging.dir={tmp_path}"],
        timeout_s=540,
    )
    shown = screen_lines(raw)
    assert rc == 0, "\n".join(shown[-40:])
    for noise in NOISE:
        assert noise not in raw, (noise, "\n".join(shown))
    # the live bar: redrawn in place, ending at 3/3 with the reward, the pace and the ETA
    assert "\r" in raw.replace("\r\n", "")
    bar = [x for x in shown if x.startswith("step 3/3")]
    assert bar and re.search(r"reward [0-9.e-]+ \| [0-9.]+ s/step \| ETA 0:00:00", bar[-1]), shown
    assert not any(re.match(r"^step +\d+/3 \|", x) for x in shown)  # no per-step lines on a terminal
    # the summary at the end, then where the files are
    assert any(x.startswith(f"rayward run '{name}': steps 1-3 in ") for x in shown), shown
    assert any(x.strip().startswith("reward ") for x in shown) and f"rayward plot {tmp_path / name}" in shown[-1]
    # every line is rayward's: its messages, the bar, the summary table
    for line in shown:
        assert (line.startswith(("rayward", "step ", " ", "in ", "see the samples", "plot the run"))
                or set(line) <= set("─ ")), line
    # what was not shown is in the run's actors.log, with the actor that wrote it
    log = (tmp_path / name / "actors.log").read_text()
    assert re.search(r"^\(Generator pid=\d+ stderr\) .*Loading safetensors checkpoint shards", log, re.M), log[-3000:]
    assert "Triton" in log or "NUMA" in log, log[-3000:]
    assert re.search(r"^\(Learner.* pid=\d+.*\) .*Writing model shards", log, re.M), log[-3000:]
