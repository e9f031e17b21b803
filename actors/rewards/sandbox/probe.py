"""What this machine grants a sandboxed run, found by a real run: `probe()` per protection, warnings naming the
missing ones (`warn_missing_protections`, at a reward's start-up), and the same in words (`describe_protections`,
printed by `python -m actors.rewards.sandbox`)."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import replace

from actors.rewards.sandbox.records import Limits
from actors.rewards.sandbox.run import PROBE_LIMITS, run_probe, sandbox_python

logger = logging.getLogger("rayward.sandbox")

# Protections probe() reports, with what it means when one is missing (for warnings and the README).
PROTECTIONS: dict[str, str] = {
    "new_session": "own session and process group, killed as a whole",
    "clean_env": "empty environment (no RAY_*, no tokens, no HOME)",
    "rlimits": "rlimits: address space, CPU seconds, file size, open files, no core files",
    "rlimit_nproc": "process-count limit of its own (a dedicated uid per run)",
    "drop_uid": "runs as an unprivileged uid: cannot read or change the caller's files nor signal its processes",
    "network_namespace": "no network (own network namespace, loopback down)",
    "pid_namespace": "own PID namespace: sees and signals only its own processes; all die with the run",
    "proc_isolation": "own /proc (host processes and their command lines invisible)",
    "mount_isolation": "private size-limited /tmp, hidden homes/run dirs and Ray token/session files, read-only /",
    "no_new_privs": "no_new_privs: setuid binaries cannot raise privileges",
}

_lock = threading.Lock()
_cache: dict[tuple[str, bool], dict[str, bool]] = {}
_warned = False


def probe(limits: Limits | None = None) -> dict[str, bool]:
    """Which protections this machine grants a sandboxed run (keys of PROTECTIONS), from a real run.
    Cached per process. Raises SandboxError when no sandboxed program can run at all."""
    limits = limits or Limits()
    python = sandbox_python(limits)
    key = (python, limits.use_namespaces)
    with _lock:
        if key not in _cache:
            r = run_probe(replace(PROBE_LIMITS, python=python, use_namespaces=limits.use_namespaces))
            _cache[key] = {k: bool(r.protections.get(k, False)) for k in PROTECTIONS}
        return dict(_cache[key])


def missing_protections(limits: Limits | None = None) -> list[str]:
    """Names of the protections this machine does not grant."""
    return [k for k, v in probe(limits).items() if not v]


def warn_missing_protections(limits: Limits | None = None, *, force: bool = False) -> list[str]:
    """Log (once per process, or always with force) a warning naming each missing protection; returns them.
    Call it when a reward using the sandbox starts, so a weaker sandbox is never a silent downgrade."""
    global _warned
    missing = missing_protections(limits)
    if missing and (force or not _warned):
        _warned = True
        lines = [f"  - {k}: {PROTECTIONS[k]}" for k in missing]
        hint = ""
        if os.geteuid() != 0 and "drop_uid" in missing:
            hint = " (run the reward workers as root to get a dedicated uid per program)"
        logger.warning(
            "rayward: code sandbox: this machine does not grant %d protection(s) to sandboxed programs%s:\n%s",
            len(missing), hint, "\n".join(lines),
        )
    return missing


def describe_protections(limits: Limits | None = None) -> str:
    """Plain text for the README: which protections this machine grants, which it does not."""
    got = probe(limits)
    python = sandbox_python(limits)
    lines = [f"Sandbox on this machine (caller uid {os.geteuid()}, programs run with {python}):"]
    for k, desc in PROTECTIONS.items():
        lines.append(f"  [{'x' if got.get(k) else ' '}] {k}: {desc}")
    missing = [k for k, v in got.items() if not v]
    lines.append("Missing: " + (", ".join(missing) if missing else "none"))
    return "\n".join(lines)
