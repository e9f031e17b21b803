"""The caller's side of a running sandbox: feed stdin and the secret, read stdout, stderr, the report channel
and the harness's status with caps, and kill the run's process group at the deadline or the output cap."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field

# Grace after the program's own exit for its output to drain (only matters without a PID namespace, where
# a daemonized child may keep the pipes open), and after a kill for the pipes to close.
EXIT_DRAIN_S = 0.5
KILL_DRAIN_S = 2.0
# Cap on the fd-3 report channel: results are a line per test, this bounds a program that floods it.
MAX_REPORT_BYTES = 1 << 20
READ_CHUNK = 1 << 16
# The longest one select() waits, so the deadline is checked at least this often.
POLL_S = 0.5


@dataclass
class Pipes:
    """A run's pipes besides stdin/stdout/stderr (Popen's own): the harness's status lines, the program's
    report (its fd 3) and secret (its fd 4; -1 without one). The harness gets the `harness_ends`; the caller
    keeps the others and closes every end once (`close`)."""

    status_r: int
    status_w: int
    report_r: int
    report_w: int
    secret_r: int = -1
    secret_w: int = -1
    closed: set[int] = field(default_factory=set)

    @classmethod
    def open(cls, secret: bool) -> Pipes:
        return cls(*os.pipe(), *os.pipe(), *(os.pipe() if secret else (-1, -1)))

    @property
    def harness_ends(self) -> list[int]:
        return [fd for fd in (self.status_w, self.report_w, self.secret_r) if fd >= 0]

    def close(self, *fds: int) -> None:
        for fd in fds:
            if fd >= 0 and fd not in self.closed:
                self.closed.add(fd)
                try:
                    os.close(fd)
                except OSError:
                    pass

    def close_all(self) -> None:
        self.close(self.status_r, self.status_w, self.report_r, self.report_w, self.secret_r, self.secret_w)


@dataclass
class Collected:
    """What came back from a run, each stream capped (stdout + stderr together at the caller's cap)."""

    stdout: bytes
    stderr: bytes
    status: str  # the harness's status lines
    report: bytes
    timed_out: bool  # the deadline passed before the harness reported the program's exit
    output_limited: bool  # stdout + stderr or the report passed its cap
    killed: bool  # the caller killed the process group (deadline or cap)


def killpg(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def collect(
    proc: subprocess.Popen[bytes], pipes: Pipes, *, stdin: bytes, secret: bytes | None, deadline: float,
    max_output_bytes: int,
) -> Collected:
    """Feed stdin and the secret, read every pipe with caps until the run ends or is killed (at `deadline`,
    monotonic, or at a cap), then reap the harness."""
    assert proc.stdout is not None and proc.stderr is not None
    out_fds = (proc.stdout.fileno(), proc.stderr.fileno())
    bufs = {fd: bytearray() for fd in (*out_fds, pipes.status_r, pipes.report_r)}
    writes: dict[int, memoryview] = {}
    if stdin and proc.stdin is not None:
        writes[proc.stdin.fileno()] = memoryview(stdin)
    if secret is not None:
        writes[pipes.secret_w] = memoryview(secret)
    sel = selectors.DefaultSelector()
    for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
    for fd in writes:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_WRITE)
    timed_out = output_limited = killed = False
    open_readers = len(bufs)

    def close_writer(fd: int) -> None:
        sel.unregister(fd)
        writes.pop(fd, None)
        if fd == pipes.secret_w:
            pipes.close(fd)
        elif proc.stdin is not None:
            proc.stdin.close()

    try:
        while open_readers:
            now = time.monotonic()
            if now >= deadline:
                if killed:
                    break  # pipes still open after the kill grace: stop reading
                timed_out = b"exit " not in bufs[pipes.status_r]
                killpg(proc)
                killed = True
                deadline = now + KILL_DRAIN_S
                continue
            for key, _ in sel.select(timeout=min(deadline - now, POLL_S)):
                fd = key.fd
                if fd in writes:
                    try:
                        n = os.write(fd, writes[fd][:READ_CHUNK])
                        writes[fd] = writes[fd][n:]
                        if not len(writes[fd]):
                            close_writer(fd)
                    except OSError:  # BrokenPipeError among them: the program closed its end
                        close_writer(fd)
                    continue
                chunk = os.read(fd, READ_CHUNK)
                if not chunk:
                    sel.unregister(fd)
                    open_readers -= 1
                    continue
                bufs[fd] += chunk
                if fd == pipes.status_r and b"exit " in bufs[fd] and not killed:
                    # The program ended; whatever it left behind gets a short grace to flush, then dies.
                    deadline = min(deadline, time.monotonic() + EXIT_DRAIN_S)
                over = (fd in out_fds and sum(len(bufs[f]) for f in out_fds) > max_output_bytes) or (
                    fd == pipes.report_r and len(bufs[fd]) > MAX_REPORT_BYTES
                )
                if over and not killed:
                    output_limited = True
                    killpg(proc)
                    killed = True
                    deadline = time.monotonic() + KILL_DRAIN_S
    finally:
        sel.close()
    _reap(proc, killed)
    return Collected(
        stdout=bytes(bufs[out_fds[0]][:max_output_bytes]), stderr=bytes(bufs[out_fds[1]][:max_output_bytes]),
        status=bufs[pipes.status_r].decode(errors="replace"), report=bytes(bufs[pipes.report_r]),
        timed_out=timed_out, output_limited=output_limited, killed=killed,
    )


def _reap(proc: subprocess.Popen[bytes], killed: bool) -> None:
    if killed or proc.poll() is None:
        killpg(proc)
    try:
        proc.wait(timeout=KILL_DRAIN_S)
    except subprocess.TimeoutExpired:
        killpg(proc)
        proc.wait()
