"""`rayward view` as a user starts it: the command prints the page's URL and serves the run until stopped."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from tests.unit.orchestrator.view.synthetic import SyntheticRun

ROOT = Path(__file__).resolve().parents[3]
# The command imports the CLI (config, pydantic) before it serves: seconds on a loaded 2-core machine.
START_S = 120


def test_view_prints_its_url_and_serves(tmp_path):
    run = SyntheticRun(tmp_path / "runs" / "mine").write(range(1, 4))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # a run name under --dir, and a port of the system's choosing
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "view", "mine", "--dir", str(tmp_path / "runs"),
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        lines: list[str] = []

        def read_until_url() -> None:
            for line in proc.stdout:
                lines.append(line)
                if "http://" in line:
                    return

        reader = threading.Thread(target=read_until_url, daemon=True)  # bounded by the join's timeout
        reader.start()
        reader.join(timeout=START_S)
        url = re.search(r"http://127\.0\.0\.1:\d+/", "".join(lines))
        assert url, "".join(lines)
        with urllib.request.urlopen(url.group(0) + "api/runs", timeout=START_S) as resp:
            runs = json.loads(resp.read())
        assert [r["name"] for r in runs] == ["mine"] and runs[0]["dir"] == str(run.dir)
        with urllib.request.urlopen(url.group(0), timeout=START_S) as resp:
            assert b"rayward view" in resp.read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_view_of_a_missing_run_says_so(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "orchestrator", "view", "nothing-here", "--dir", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=START_S)
    assert out.returncode == 2 and "rayward view: no run 'nothing-here'" in out.stderr
