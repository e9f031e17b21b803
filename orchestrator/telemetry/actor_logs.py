"""The actors' output: all of it in `<run dir>/actors.log`, only rayward's own lines on the terminal.

Ray forwards what every actor of the job writes (and what the processes they start write: vLLM's engine, its
Triton and NUMA warnings, weight-loading bars), from every node, to the driver, which prints it. rayward keeps
the forwarding (`log_to_driver=True`, so a cluster's remote nodes are covered too) and replaces the printing
with `ActorOutput`: each line goes to the log file with the actor that wrote it; on the terminal appear only
lines that start with `rayward` (an actor's own messages, e.g. the code sandbox's missing protections) and their
indented continuation lines, each message once however many workers print it. With `--verbose` Ray's own
printing stays as well. The driver's `ray` logger (Ray's warnings in this process) goes to the same file.

Ray has no public switch for this: the hook is its log dispatcher (actors/runtime/ray_compat.py `log_dispatcher`). If a
Ray version lacks it, actors' output is printed as before and a line says so.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.runtime import ray_compat

HANDLER_NAME = "rayward_actor_output"
# Before Ray shuts down: the actors' last lines (a final checkpoint's, a crash's) are still on their way from the
# nodes' log monitors (each polls its node's files every 0.1 s when idle, then publishes through the GCS); wait
# until none came for DRAIN_QUIET_S, at most DRAIN_MAX_S.
DRAIN_QUIET_S = 1.0
DRAIN_MAX_S = 3.0
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# A line that is rayward's: "rayward: ..." or "rayward <command>: ..." at the start of the line.
RAYWARD_LINE_RE = re.compile(r"^rayward\b")


def rayward_messages(lines: list[str]) -> list[str]:
    """The rayward messages in a batch of an actor's lines: a `rayward...` line plus the indented lines that
    directly follow it (a multi-line warning), each message joined into one string."""
    out: list[str] = []
    current: list[str] | None = None
    for raw in lines:
        line = ANSI_RE.sub("", raw).rstrip()
        if RAYWARD_LINE_RE.match(line):
            if current:
                out.append("\n".join(current))
            current = [line]
        elif current is not None and line[:1] in (" ", "\t") and line.strip():
            current.append(line)
        else:
            if current:
                out.append("\n".join(current))
            current = None
    if current:
        out.append("\n".join(current))
    return out


def as_shown(line: str) -> str:
    """A line as a terminal would leave it: colours removed, a progress bar redrawn with carriage returns reduced
    to its last state (a bare \r in the file would read as a line break to most tools)."""
    parts = [p for p in ANSI_RE.sub("", line).split("\r") if p.strip()]
    return parts[-1] if parts else ""


def autoscaler_events(lines: list[str]) -> list[str]:
    """The autoscaler's events only, as Ray prints them (its status report comes every few seconds)."""
    return ray_compat.autoscaler_events(lines)


def source_of(data: dict[str, Any]) -> str:
    """Who wrote a batch of lines, as Ray names it: `Generator pid=123`, `raylet`, `autoscaler`."""
    pid = data.get("pid")
    if pid in ("raylet", "autoscaler"):
        return str(pid)
    who = data.get("actor_name") or data.get("task_name") or "worker"
    return f"{who} pid={pid}"


class ActorOutput:
    """Ray's log-dispatcher handler: every line to the log file, rayward's messages to `echo` (once each)."""

    def __init__(self, path: Path, echo: Callable[[str], None] | None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.echo = echo
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - closed by close(), lines flushed as written
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._ray_logger_state: tuple[list[logging.Handler], bool] | None = None
        self._attached = False
        self._unroute_errors: Callable[[], None] | None = None
        self._last_line_at = time.monotonic()

    def __call__(self, data: dict[str, Any]) -> None:
        lines = [ln for ln in data.get("lines", []) if isinstance(ln, str)]
        if data.get("pid") == "autoscaler":
            lines = autoscaler_events(lines)
        if not lines:
            return
        who = source_of(data)
        stream = " stderr" if data.get("is_err") else ""
        self._last_line_at = time.monotonic()
        with self._lock:
            if self._file.closed:
                return
            self._file.write("".join(f"({who}{stream}) {as_shown(ln)}\n" for ln in lines))
            fresh = [m for m in rayward_messages(lines) if m not in self._seen]
            self._seen.update(fresh)
        if self.echo is not None:
            for message in fresh:
                self.echo(message)

    def capture_ray_logger(self) -> None:
        """The driver's `ray` logger into the file instead of stderr (Ray's own warnings in this process)."""
        ray_logger = logging.getLogger("ray")
        self._ray_logger_state = (list(ray_logger.handlers), ray_logger.propagate)
        handler = logging.StreamHandler(self._file)
        handler.setFormatter(logging.Formatter("(driver) %(asctime)s %(levelname)s %(name)s: %(message)s"))
        ray_logger.handlers = [handler]
        ray_logger.propagate = False

    def attach(self, *, keep_ray_printing: bool) -> bool:
        """Hook into Ray's log dispatcher (after ray.init); False if this Ray has no such hook."""
        dispatcher = ray_compat.log_dispatcher()
        if dispatcher is None:
            return False
        if not keep_ray_printing:
            dispatcher.remove_handler(ray_compat.RAY_PRINT_HANDLER)
            # Ray's own words on what rayward handles (a worker died: the learner is rebuilt, a generator
            # restarts) go to the file with the rest; rayward says what happened in its own line.
            self._unroute_errors = ray_compat.route_error_messages(self)
        dispatcher.add_handler(HANDLER_NAME, self)
        self._attached = True
        return True

    def drain(self, quiet_s: float = DRAIN_QUIET_S, max_s: float = DRAIN_MAX_S) -> None:
        """Wait for the actors' last lines (call before ray.shutdown, which stops the forwarding)."""
        if not self._attached:
            return
        start = time.monotonic()
        while time.monotonic() < start + max_s and time.monotonic() - max(self._last_line_at, start) < quiet_s:
            time.sleep(0.05)

    def close(self) -> None:
        """Unhook (after ray.shutdown, which stops the forwarding thread), restore the `ray` logger, close."""
        if self._attached:
            ray_compat.log_dispatcher().remove_handler(HANDLER_NAME)
            self._attached = False
        if self._unroute_errors is not None:
            self._unroute_errors()
            self._unroute_errors = None
        if self._ray_logger_state is not None:
            ray_logger = logging.getLogger("ray")
            ray_logger.handlers, ray_logger.propagate = self._ray_logger_state
            self._ray_logger_state = None
        with self._lock:
            if not self._file.closed:
                self._file.close()
