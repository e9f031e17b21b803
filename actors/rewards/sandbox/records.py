"""What a caller gives one sandboxed run (`Limits`) and gets back (`SandboxResult`, or `SandboxError` when the
sandbox itself cannot run)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Limits' defaults: generous for a function-writing task (a few asserts) yet cheap enough to run many
# sandboxes at once on one reward worker.
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_MB = 512  # address space (RLIMIT_AS): Python itself needs ~30 MB virtual
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20  # stdout + stderr; a function task prints little, a runaway loop gigabytes
# RLIMIT_NPROC for the run: room for a small multiprocessing pool. RLIMIT_AS is per process (there is no
# cgroup here), so the run's worst-case memory is max_processes * memory_mb: keep the product sane.
DEFAULT_MAX_PROCESSES = 8
DEFAULT_MAX_FILE_MB = 16  # RLIMIT_FSIZE: the largest file the program may write
DEFAULT_DISK_MB = 64  # size of the tmpfs holding /tmp and the working directory (all it can write)
DEFAULT_MAX_OPEN_FILES = 64  # RLIMIT_NOFILE
POSITIVE_LIMITS = ("timeout_s", "memory_mb", "max_output_bytes", "max_processes", "max_file_mb", "disk_mb",
                   "max_open_files")


class SandboxError(RuntimeError):
    """The sandbox itself could not run (setup failed): a machine problem, never the program's doing."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_processes: int = DEFAULT_MAX_PROCESSES
    max_file_mb: int = DEFAULT_MAX_FILE_MB
    disk_mb: int = DEFAULT_DISK_MB
    max_open_files: int = DEFAULT_MAX_OPEN_FILES
    cpu_s: int | None = None
    """CPU seconds per process; default: the wall-clock timeout rounded up, plus one."""
    python: str | None = None
    """Interpreter for programs; default: the first of this process's Python or the system python3 that
    runs inside the sandbox (the caller's may live in a hidden home, e.g. pyenv under /root)."""
    hide_paths: tuple[str, ...] = ()
    """Extra files or directories to hide from programs (secrets outside the default hidden dirs)."""
    use_namespaces: bool = True
    """False skips every namespace (tests of the fallback path; machines where unshare misbehaves)."""

    def __post_init__(self) -> None:
        for name in POSITIVE_LIMITS:
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be > 0, got {getattr(self, name)!r}")

    @property
    def cpu_seconds(self) -> int:
        return self.cpu_s if self.cpu_s is not None else int(self.timeout_s) + 2


@dataclass
class SandboxResult:
    """What one run did. `returncode` is the program's exit status (negative: killed by that signal),
    None when the sandbox killed it (timeout or output cap) before it exited."""

    returncode: int | None
    stdout: str
    stderr: str
    report: bytes = b""
    """What the program wrote to fd 3 (see the package docstring)."""
    timed_out: bool = False
    output_limited: bool = False
    """stdout + stderr (or the report channel) passed its cap; the run was killed there."""
    elapsed_s: float = 0.0
    uid: int | None = None
    """The uid the program ran as (None: the caller's own)."""
    protections: dict[str, bool] = field(default_factory=dict)
    """What this run actually got (as reported by the harness)."""
    error: str | None = None
    """Set when the program could not be started for lack of resources (e.g. its uid's process budget)."""

    @property
    def ok(self) -> bool:
        """Exited by itself with status 0, within every limit."""
        return self.returncode == 0 and not self.timed_out and not self.output_limited and self.error is None
