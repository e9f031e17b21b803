"""`rayward run --max-retries N` (and `rayward submit --max-retries N`, whose job runs it): the run's driver as a
child process under a small supervisor, restarted when it fails, each time continuing the same run from its
latest checkpoint (`--resume auto`: a retry that finds no checkpoint starts the run afresh).

What is retried: a driver that failed (exit 1: the run failed, orchestrator/run/errors.py), could not reach its cluster
(3), or died by a signal other than SIGTERM and SIGINT (an OOM kill, a lost node under the driver). What is not:
success (0), bad input or nothing left to train (2), Ctrl-C (130) and SIGTERM (143): a person or the job system
asked the run to stop. SIGTERM to the supervisor goes to the driver, which checkpoints at its step boundary
(orchestrator/run/train.py), and no retry follows.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from typing import Any

# Exit codes a retry would not change (orchestrator/cli/main.py): success, bad input, Ctrl-C, SIGTERM.
NO_RETRY = (0, 2, 130, 143)
# Between a failed driver and its successor: Ray releases the dead driver's actors and their names (a job's
# actors die with their driver) before the next one asks for them again (AReaL waits the same).
RETRY_DELAY_S = 10.0


def run_name(args: argparse.Namespace) -> str:
    """The run's name, fixed before the first attempt so that every retry continues the same run: --name, the
    config's, or a new one."""
    from orchestrator.config import load_config
    from orchestrator.run.cluster import new_run_name

    return args.name or load_config(args.config, args.overrides).name or new_run_name()


def driver_args(args: argparse.Namespace, name: str, retry: bool) -> list[str]:
    """`rayward run` arguments of one attempt: the user's, the fixed name, and on a retry `--resume auto`."""
    out = ["run", args.config, *args.overrides, "--name", name]
    if retry or args.resume == "auto":
        out += ["--resume", "auto"]
    elif args.resume:
        out.append("--resume")
    return out + [f for f, on in (("--verbose", args.verbose), ("--debug", args.debug)) if on]


def exit_code(rc: int) -> int:
    """A child's return code as a process exit code (killed by signal s: 128 + s)."""
    return 128 - rc if rc < 0 else rc


def retryable(rc: int) -> bool:
    return exit_code(rc) not in NO_RETRY


def run_with_retries(args: argparse.Namespace, max_retries: int) -> int:
    """Run the driver, and again up to max_retries times while it fails retryably; returns the last exit code."""
    name = run_name(args)
    stopping = threading.Event()
    proc: list[Any] = [None]

    def on_term(signum: int, frame: Any) -> None:
        stopping.set()
        if proc[0] is not None and proc[0].poll() is None:
            proc[0].send_signal(signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    attempt = 0
    try:
        while True:
            cmd = [sys.executable, "-m", "orchestrator", *driver_args(args, name, retry=attempt > 0)]
            proc[0] = subprocess.Popen(cmd)
            rc = _wait(proc[0])
            if stopping.is_set() or not retryable(rc):
                return exit_code(rc)
            if attempt == max_retries:
                print(f"rayward: the driver of run {name!r} exited with {exit_code(rc)}; {max_retries} retries "
                      "spent (--max-retries)", file=sys.stderr, flush=True)
                return exit_code(rc)
            attempt += 1
            print(f"rayward: the driver of run {name!r} exited with {exit_code(rc)}; retry {attempt}/{max_retries}"
                  f" in {RETRY_DELAY_S:g} s, resuming from its latest checkpoint", file=sys.stderr, flush=True)
            if stopping.wait(RETRY_DELAY_S):
                return exit_code(rc)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _wait(p: subprocess.Popen) -> int:
    """The child's return code; Ctrl-C reaches the child (the terminal's process group), the supervisor waits."""
    while True:
        try:
            return p.wait()
        except KeyboardInterrupt:
            continue
