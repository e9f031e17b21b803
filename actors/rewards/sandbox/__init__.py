"""Run untrusted programs (model completions) in a throw-away local sandbox: stdlib only, no daemon.

`run_sandboxed(files, stdin, limits)` runs one program and returns its exit status and capped output;
`probe()` reports which protections this machine grants, `describe_protections()` says it in words
(`python -m actors.rewards.sandbox` prints it).

    records.py   Limits, SandboxResult, SandboxError: what a caller gives and gets
    run.py       the caller's side of a run: files, uid, hidden paths, the harness started, the result
    harness.py   the script that isolates itself and execs the program (run by path, never imported)
    collect.py   feeding and reading the run's pipes with caps; the kill at the deadline or the cap
    probe.py     which protections this machine grants; warnings and a description

How a run is isolated (each layer is used when the machine allows it; `probe()` says which did):

    calling process (a reward worker thread)
      └─ harness, outer   `python -I -S -B harness.py`, as the caller's user, in a new session (own process
           │              group) with an empty environment and only the pipes it needs
           │  unshare(2): new network, PID, mount, IPC and UTS namespaces. A caller that may not create
           │  them directly (not root, or a container's root without CAP_SYS_ADMIN) first enters a user
           │  namespace of its own, which lets it create the others
           └─ harness, inner  PID 1 of the new PID namespace: mounts a fresh /proc; a size-limited tmpfs on
                │             /tmp holding the program's working directory; empty read-only tmpfs over
                │             /root, /home, /run, /var/tmp, the caller's $HOME and Ray's temp dir; /dev/null
                │             over Ray's token file; remounts / read-only
                └─ program    rlimits (address space, CPU seconds, processes, file size, open files, no core
                              files); as root, a dedicated uid/gid with no supplementary groups; no_new_privs;
                              then execve(python ...)

Teardown: the inner harness is PID 1, and when PID 1 of a namespace exits the kernel kills every process
in it, so nothing the program started (daemons, fork bombs, `setsid` escapees) outlives the run. The caller
kills the whole process group at the wall-clock deadline or when output passes the cap; the inner harness
has its own deadline in case the caller itself dies. Without a PID namespace, a root caller's run uses a
uid no other process has, so "kill every process of that uid" is the teardown.

Not covered: memory is bounded per process (RLIMIT_AS; no cgroup is created), so a run's worst case is
max_processes * memory_mb; CPU time per process (RLIMIT_CPU) within the wall-clock timeout; no seccomp
filter, so the kernel's full syscall surface remains (this is a sandbox for model-written code, not a
boundary against kernel exploits: use a VM or gVisor for that).

What the program sees: no network at all (even 127.0.0.1 is unreachable: the new namespace's loopback is
down), no processes but its own, no secrets of the caller (no environment, hidden home and temp dirs),
nothing it can write outside its own /tmp and /dev/shm (size-limited tmpfs that die with the run).

Result channels: stdout/stderr are captured (capped). A caller may also pass `secret` bytes, readable once
on fd 4 inside the sandbox, and read back what the program writes to fd 3 (`SandboxResult.report`): the
code_tests reward uses them to deliver its tests and a per-run nonce out of band, so a program cannot fake
its results by printing. Harness status (ready, exit status, setup errors) travels on a pipe the program
never holds, so no program output can pose as the harness.
"""

from actors.rewards.sandbox.probe import (
    PROTECTIONS,
    describe_protections,
    missing_protections,
    probe,
    warn_missing_protections,
)
from actors.rewards.sandbox.records import Limits, SandboxError, SandboxResult
from actors.rewards.sandbox.run import run_sandboxed, sandbox_python

__all__ = [
    "PROTECTIONS",
    "Limits",
    "SandboxError",
    "SandboxResult",
    "describe_protections",
    "missing_protections",
    "probe",
    "run_sandboxed",
    "sandbox_python",
    "warn_missing_protections",
]
