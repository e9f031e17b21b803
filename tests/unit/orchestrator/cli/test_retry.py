"""`rayward run --max-retries N` (orchestrator/cli/retry.py): the driver as a child process, run again while it
fails retryably, every retry continuing the same run name with `--resume auto`. The driver here is a stand-in
interpreter (a real child process) that records its arguments and exits with scripted codes; `rayward submit
--max-retries` puts the flag in the job's entrypoint. (A resume with nothing to do: test_checkpoints.py.)"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from orchestrator.cli import retry
from tests.conftest import ROOT

FAKE_DRIVER = """#!{python}
import json, sys
calls = {calls!r}
codes = {codes!r}
with open(calls, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
n = sum(1 for _ in open(calls))
sys.exit(codes[min(n, len(codes)) - 1])
"""


def args(**kw) -> argparse.Namespace:
    base = dict(config="configs/demo.yaml", overrides=["grpo.max_steps=3"], name="r1", resume=False, verbose=False,
                debug=False)
    return argparse.Namespace(**{**base, **kw})


@pytest.fixture
def driver(tmp_path, monkeypatch):
    """A stand-in for `python -m orchestrator ...` exiting with the given codes in turn; returns its calls."""
    calls = tmp_path / "calls.jsonl"

    def make(*codes: int):
        exe = tmp_path / "python"
        exe.write_text(FAKE_DRIVER.format(python=sys.executable, calls=str(calls), codes=list(codes)))
        exe.chmod(0o755)
        monkeypatch.setattr(retry.sys, "executable", str(exe))
        monkeypatch.setattr(retry, "RETRY_DELAY_S", 0.0)
        return lambda: [json.loads(x)[2:] for x in calls.read_text().splitlines()]  # after `-m orchestrator`

    return make


def test_a_failed_driver_is_retried_and_continues_the_same_run(driver, capsys):
    calls = driver(1, 137, 0)  # failed, then killed (OOM), then finished
    assert retry.run_with_retries(args(), max_retries=2) == 0
    first, *retries = calls()
    assert first == ["run", "configs/demo.yaml", "grpo.max_steps=3", "--name", "r1"]
    assert retries == [[*first, "--resume", "auto"]] * 2
    err = capsys.readouterr().err
    assert "the driver of run 'r1' exited with 1; retry 1/2" in err and "exited with 137; retry 2/2" in err


@pytest.mark.parametrize("code", [2, 130, 143])
def test_bad_input_ctrl_c_and_sigterm_are_not_retried(driver, code):
    calls = driver(code, 0)
    assert retry.run_with_retries(args(), max_retries=3) == code
    assert len(calls()) == 1


def test_the_budget_spent_ends_with_the_last_exit_code(driver, capsys):
    calls = driver(1)
    assert retry.run_with_retries(args(), max_retries=2) == 1
    assert len(calls()) == 3
    assert "exited with 1; 2 retries spent (--max-retries)" in capsys.readouterr().err


def test_a_run_without_a_name_gets_one_before_the_first_attempt(driver):
    calls = driver(1, 0)
    assert retry.run_with_retries(args(name=None), max_retries=1) == 0
    (a, b) = calls()
    assert a[a.index("--name") + 1] == b[b.index("--name") + 1]


def test_submit_puts_the_retries_in_the_jobs_entrypoint():
    r = subprocess.run([sys.executable, "-m", "orchestrator", "submit", "configs/demo.yaml", "--name", "dry",
                        "--max-retries", "2", "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--max-retries 2" in json.loads(r.stdout)["entrypoint"]
