"""Run untrusted programs (model completions) in a throw-away local sandbox: stdlib only, no daemon.

`run_sandboxed(files, stdin, limits)` runs one program and returns its exit status and capped output;
`probe()` reports which protections this machine grants, `describe_protections()` says it in words.

How a run is isolated (each layer is used when the machine allows it; `probe()` says which did):

    calling process (a reward worker thread)
      └─ harness, outer   `python -I -S -B` running `_harness` below, as the caller's user, in a new session
           │              (own process group) with an empty environment and only the pipes it needs
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

from __future__ import annotations

import errno
import inspect
import logging
import os
import pwd
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

logger = logging.getLogger("rayward.sandbox")

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
SHM_MB = 8  # /dev/shm tmpfs: enough for multiprocessing's semaphores, too small to matter as memory

# Grace after the program's own exit for its output to drain (only matters without a PID namespace, where
# a daemonized child may keep the pipes open), and after a kill for the pipes to close.
EXIT_DRAIN_S = 0.5
KILL_DRAIN_S = 2.0
# The inner harness enforces its own deadline this much after the caller's, in case the caller is gone.
HARNESS_GRACE_S = 2.0
# Cap on the fd-3 report channel: results are a line per test, this bounds a program that floods it.
MAX_REPORT_BYTES = 1 << 20
READ_CHUNK = 1 << 16

# Root callers run each program under its own uid/gid picked at random from this range (inside the
# 32-bit id space, far above any real account or systemd's dynamic users): RLIMIT_NPROC counts processes
# per uid, so a per-run uid gives each run its own process budget (a fork bomb cannot starve its
# neighbours), and "kill all processes of this uid" only ever hits this run.
SANDBOX_ID_BASE = 0x6A000000
SANDBOX_ID_SPAN = 1 << 24
KERNEL_NPROC_PER_USERNS = (5, 14)  # ucounts: RLIMIT_NPROC counted per user namespace from this release
NOBODY_ID = 65534  # fallback when the range is not mapped (containers with a narrow uid map)

# Directories hidden (empty read-only tmpfs) inside the sandbox: homes (Ray's token at ~/.ray/auth_token,
# cloud credentials, ssh keys) and runtime dirs (sockets). /tmp (Ray's session dirs /tmp/ray) is replaced
# by the sandbox's own tmpfs. The caller's $HOME, $RAY_TMPDIR, $TMPDIR and RAY_AUTH_TOKEN_PATH are added
# at run time.
HIDDEN_DIRS = ("/root", "/home", "/run", "/var/tmp", "/var/lib/ray")
# Never hidden even if $HOME or a configured path names them: the sandbox needs a working system.
NEVER_HIDE = frozenset(
    {"/", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/etc", "/dev", "/proc", "/sys", "/tmp"}
)
TEMP_PREFIX = "rayward-sandbox-"  # the caller's per-run temp dirs: rayward-sandbox-<pid>-<random>
SANDBOX_DIR = "/tmp/sandbox"  # the program's cwd when it has a private /tmp
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"

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
        for name in ("timeout_s", "memory_mb", "max_output_bytes", "max_processes", "max_file_mb", "disk_mb",
                     "max_open_files"):
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
    """What the program wrote to fd 3 (see the module docstring)."""
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


# --------------------------------------------------------------------------------------------------------
# The harness. Its source is sent to a fresh `python -I -S` as `-c` text, so it must be self-contained
# (imports inside), import everything before it hides directories (the interpreter may live under /root),
# and stay cheap to start: only builtin or tiny modules.


def _harness(encoded: str) -> None:
    import ctypes
    import fcntl
    import marshal
    import os
    import resource
    import signal

    cfg = marshal.loads(bytes.fromhex(encoded))
    libc = ctypes.CDLL(None, use_errno=True)
    status_fd = cfg["status_fd"]
    got: dict[str, bool] = {}

    def say(line: str) -> None:
        os.write(status_fd, (line.replace("\n", " ") + "\n").encode())

    def fail(what: str, err: BaseException) -> None:
        say(f"error {what}: {type(err).__name__}: {err}")
        os._exit(125)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"{os.strerror(e)} ({what})")

    def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        enc = (lambda s: None if s is None else s.encode())  # noqa: E731
        check(libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")

    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
    MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
    PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
    NEWNS, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET = (
        0x00020000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)

    root = os.geteuid() == 0
    uid, gid = cfg["uid"], cfg["gid"]
    outer_uid, outer_gid = os.geteuid(), os.getegid()

    def write_proc(pid: str, name: str, text: str) -> None:
        fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def mirror(child: int) -> None:
        """Wait for the next harness level and exit with its status (the caller reads the harness's exit)."""
        for fd in cfg["pass_fds"]:  # the status pipe among them: only the inner harness reports
            os.close(fd)
        _, st = os.waitpid(child, 0)
        os._exit(os.waitstatus_to_exitcode(st) & 0xFF)

    def identity_userns() -> bool:
        """Root without CAP_SYS_ADMIN (a container's usual lot) may still create a user namespace, in which
        it may create the others. Only a process outside it may map every uid into it (the sandbox's
        dedicated uids included), so: fork; the child enters a new user namespace; this process writes
        the child's identity maps, then only mirrors its exit. Returns (in the child) whether it worked."""
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        child = os.fork()
        if child:
            os.close(ready_w)
            os.close(go_r)
            ok = os.read(ready_r, 1) == b"1"
            if ok:
                try:
                    for name in ("uid_map", "gid_map"):
                        write_proc(str(child), name, "0 0 4294967295")
                except OSError:
                    ok = False
            os.write(go_w, b"1" if ok else b"0")
            mirror(child)
        os.close(ready_r)
        os.close(go_w)
        entered = libc.unshare(NEWUSER) == 0
        os.write(ready_w, b"1" if entered else b"0")
        mapped = os.read(go_r, 1) == b"1"
        if entered and not mapped:
            fail("user namespace", OSError("could not write the uid/gid maps"))
        return entered

    # 1. Namespaces. Together when possible. Root: else through a user namespace, else one by one (some
    # may be allowed). Unprivileged callers need a user namespace first, mapping themselves to its root.
    ns = 0
    if cfg["use_ns"]:
        wanted = [NEWNS, NEWNET, NEWPID, NEWIPC, NEWUTS]
        if root:
            if libc.unshare(sum(wanted)) == 0:
                ns = sum(wanted)
            else:
                ns = NEWUSER if identity_userns() else 0
                if libc.unshare(sum(wanted)) == 0:
                    ns |= sum(wanted)
                else:
                    for flag in wanted:
                        if libc.unshare(flag) == 0:
                            ns |= flag
        elif libc.unshare(NEWUSER | sum(wanted)) == 0:
            ns = NEWUSER | sum(wanted)
            try:  # map the caller to root of the new user namespace (the only mapping it may write)
                write_proc("self", "setgroups", "deny")
                write_proc("self", "uid_map", f"0 {outer_uid} 1")
                write_proc("self", "gid_map", f"0 {outer_gid} 1")
            except OSError as err:
                fail("user namespace", err)
    got["network_namespace"] = bool(ns & NEWNET)
    got["user_namespace"] = bool(ns & NEWUSER)

    # 2. Fork: the child is PID 1 of the new PID namespace. The outer harness only mirrors its exit.
    inner = os.fork()
    if inner:
        mirror(inner)

    # Dies with the outer harness (the caller kills the process group; this covers a lone kill).
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    pid1 = os.getpid() == 1
    got["pid_namespace"] = pid1
    workdir = cfg["workdir"]
    files: list[str] = cfg["files"]
    got["proc_isolation"] = False
    got["mount_isolation"] = False
    try:
        if ns & NEWNS:
            mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount leaks back to the host
            if pid1:
                try:
                    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                    got["proc_isolation"] = True
                except OSError:
                    pass  # reported as missing; PID namespace still limits what can be signalled
            contents = {}
            for name in files:  # read before /tmp (where the caller's workdir lives) is replaced
                with open(os.path.join(workdir, name), "rb") as f:
                    contents[name] = f.read()
            mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['disk_mb']}m,mode=1777")
            workdir = cfg["sandbox_dir"]
            os.mkdir(workdir, 0o700)
            for name, data in contents.items():
                fd = os.open(os.path.join(workdir, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                os.write(fd, data)
                os.close(fd)
            isolated = True
            for path in cfg["mask_files"]:  # files first: a hidden directory may contain them
                try:
                    mount("/dev/null", path, None, MS_BIND)
                except OSError as err:
                    isolated = isolated and err.errno == 2  # ENOENT: nothing to hide
            for path in cfg["mask_dirs"]:
                try:
                    mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=755")
                except OSError as err:
                    isolated = isolated and err.errno == 2
            try:
                mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['shm_mb']}m,mode=1777")
            except OSError:
                isolated = False
            # Read-only root, keeping the flags it has (a user namespace may not drop locked ones).
            st_to_ms = ((2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC), (1024, 1024), (2048, 2048), (4096, 1 << 21))
            keep = sum(ms for st, ms in st_to_ms if os.statvfs("/").f_flag & st)
            try:
                mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
            except OSError:
                isolated = False
            got["mount_isolation"] = isolated
        if root:  # the program's own dir (a private tmpfs, or the caller's temp dir without one)
            for name in files:
                os.chown(os.path.join(workdir, name), uid, gid)
            os.chown(workdir, uid, gid)
    except OSError as err:
        fail("setup", err)

    # 3. The program: rlimits, credentials, exec. Errors before exec come back on a close-on-exec pipe.
    err_r, err_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            wanted_fds = [(cfg["stdin_fd"], 0), (cfg["stdout_fd"], 1), (cfg["stderr_fd"], 2),
                          (cfg["report_fd"], 3), (cfg["secret_fd"], 4), (err_w, 5)]
            high = [(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 256), to) for fd, to in wanted_fds if fd >= 0]
            for fd, to in high:
                os.dup2(fd, to, inheritable=to != 5)
            os.closerange(6, 1 << 20)
            os.chdir(workdir)
            os.umask(0o022)
            rlimits = list(cfg["rlimits"])
            if root or (ns & NEWUSER and cfg["nproc_in_userns"]):
                rlimits.append(cfg["nproc"])
            for res, soft, hard in rlimits:
                resource.setrlimit(getattr(resource, res), (soft, hard))
            if root:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
            elif ns & NEWUSER:
                # A nested user + mount namespace locks the mounts above: the program (root of its own
                # user namespace) cannot unmount the tmpfs hiding the caller's files.
                check(libc.unshare(NEWUSER | NEWNS), "lock mounts")
            check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
            argv = cfg["argv"]
            os.execve(argv[0], argv, dict(cfg["env"], TMPDIR=workdir))
        except BaseException as err:  # noqa: BLE001 - any failure is reported, then the child exits
            code = getattr(err, "errno", None) or 0
            os.write(5, f"{code} {type(err).__name__}: {err}".encode()[:1000])
        os._exit(127)
    os.close(err_w)
    for fd in cfg["pass_fds"]:
        if fd != status_fd:
            os.close(fd)
    for fd in (cfg["stdin_fd"], cfg["stdout_fd"], cfg["stderr_fd"]):
        if fd > 2:
            os.close(fd)
    problem = b""
    while True:
        chunk = os.read(err_r, 4096)
        if not chunk:
            break
        problem += chunk
    os.close(err_r)
    got["no_new_privs"] = not problem
    got["drop_uid"] = root and not problem

    def teardown() -> None:
        if pid1:
            try:
                os.kill(-1, signal.SIGKILL)  # PID 1: every other process of this namespace, nothing else
            except ProcessLookupError:
                pass  # none left
        elif root:
            for _ in range(100):  # a dedicated uid: kill all its processes until none is left
                helper = os.fork()
                if helper == 0:
                    os.setgroups([])
                    os.setgid(gid)
                    os.setuid(uid)
                    try:
                        os.kill(-1, signal.SIGKILL)
                    except ProcessLookupError:
                        os._exit(0)
                    os._exit(1)
                _, st = os.waitpid(helper, 0)
                if os.waitstatus_to_exitcode(st) == 0:
                    break

    def on_deadline(signum: int, frame: object) -> None:
        say("timeout")
        teardown()
        os._exit(124)

    if problem:
        code, _, text = problem.decode(errors="replace").partition(" ")
        say(f"execfail {code} {text}")
        os.waitpid(child, 0)
        os._exit(126)
    say("ready " + " ".join(f"{k}={int(v)}" for k, v in got.items()))
    signal.signal(signal.SIGALRM, on_deadline)
    signal.setitimer(signal.ITIMER_REAL, cfg["deadline_s"])
    status = None
    while status is None:
        try:
            # As PID 1, reap every orphan too; otherwise only the program.
            wpid, st = os.waitpid(-1 if pid1 else child, 0)
        except ChildProcessError:
            break
        if wpid == child:
            status = os.waitstatus_to_exitcode(st)
    signal.setitimer(signal.ITIMER_REAL, 0)
    say(f"exit {status}")
    teardown()
    os._exit(0)


_HARNESS_SOURCE = textwrap.dedent(inspect.getsource(_harness)) + "\n_harness(__import__('sys').argv[1])\n"


# --------------------------------------------------------------------------------------------------------
# Caller side.


def _id_mapped(path: str, wanted_lo: int, wanted_hi: int) -> bool:
    """Whether ids [lo, hi) are all inside one extent of /proc/self/{uid,gid}_map."""
    try:
        with open(path) as f:
            for line in f:
                inside, _outside, count = (int(x) for x in line.split())
                if inside <= wanted_lo and wanted_hi <= inside + count:
                    return True
    except (OSError, ValueError):
        return False
    return False


def _pick_ids() -> tuple[int, int] | None:
    """(uid, gid) for the next run: a fresh one per run when the id range is mapped, else nobody; None
    when the caller is not root (it cannot change uid)."""
    if os.geteuid() != 0:
        return None
    hi = SANDBOX_ID_BASE + SANDBOX_ID_SPAN
    if _id_mapped("/proc/self/uid_map", SANDBOX_ID_BASE, hi) and _id_mapped("/proc/self/gid_map", SANDBOX_ID_BASE, hi):
        n = SANDBOX_ID_BASE + secrets.randbelow(SANDBOX_ID_SPAN)
        return n, n
    return NOBODY_ID, NOBODY_ID


def _kernel_counts_nproc_per_userns() -> bool:
    """Linux >= 5.14 counts RLIMIT_NPROC per user namespace (ucounts), so an unprivileged caller's
    sandbox, in a user namespace of its own, gets a process budget of its own."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= KERNEL_NPROC_PER_USERNS


def _hidden_paths(limits: Limits) -> tuple[list[str], list[str]]:
    """(directories, files) to hide: the fixed list plus the caller's home, Ray's temp dir and token file."""
    candidates = list(HIDDEN_DIRS)
    for var in ("HOME", "RAY_TMPDIR", "TMPDIR", "RAY_AUTH_TOKEN_PATH"):
        if os.environ.get(var):
            candidates.append(os.environ[var])
    try:
        candidates.append(pwd.getpwuid(os.geteuid()).pw_dir)
    except KeyError:
        pass
    candidates += limits.hide_paths
    dirs, files = [], []
    for p in candidates:
        real = os.path.realpath(p)
        if real in NEVER_HIDE or real.startswith("/tmp/") or real.startswith("/proc/"):
            continue  # /tmp is replaced wholesale by the sandbox's own
        if os.path.isdir(real):
            if real not in dirs:
                dirs.append(real)
        elif os.path.exists(real) and real not in files:
            files.append(real)
    return dirs, files


def _minimal_env() -> dict[str, str]:
    """The whole environment a program gets: nothing inherited from the caller (the harness adds TMPDIR,
    the program's own directory)."""
    return {
        "PATH": SAFE_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        # Programs run as `python -s -B` (not -I, which would stop a script importing its sibling files),
        # so these apply; nothing else from the environment reaches them anyway.
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONUNBUFFERED": "1",
    }


def _kill_uid(uid: int, gid: int) -> None:
    """Kill every process of a dedicated sandbox uid, from a helper running as that uid (kill(-1) as a
    plain user reaches exactly that user's processes). Used when the harness itself was killed and there
    is no PID namespace to take the program's processes with it."""
    sh = shutil.which("sh", path=SAFE_PATH)
    if sh is None:
        return
    for _ in range(20):
        r = subprocess.run([sh, "-c", "kill -9 -1"], user=uid, group=gid, extra_groups=[], env={"PATH": SAFE_PATH},
                           cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        if r.returncode != 0:  # ESRCH: nothing left to kill
            return


def _rmtree(path: str) -> None:
    def unlock(func: object, p: str, exc: object) -> None:  # a program may chmod 000 its own dirs
        if os.path.islink(p):
            return  # never chmod through a link the program planted
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.unlink(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=unlock)


def _parse_status(text: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "ready":
            out["protections"] = {k: v == "1" for k, v in (kv.split("=") for kv in rest.split())}
        elif kind == "exit":
            out["exit"] = None if rest == "None" else int(rest)
        elif kind in ("error", "execfail", "timeout"):
            out[kind] = rest
    return out


def run_sandboxed(
    code_or_files: str | Mapping[str, str | bytes],
    stdin: str | bytes | None = None,
    limits: Limits | None = None,
    *,
    argv: Sequence[str] | None = None,
    secret: bytes | None = None,
) -> SandboxResult:
    """Run a program in a fresh sandbox and return what it did (never raises for anything the program does).

    code_or_files: Python source (run as `main.py`), or {file name: content} written to the program's
        working directory (flat names only); then `argv` says what to run (default: `python main.py`).
    stdin: bytes or text fed to the program's stdin (default: empty).
    secret: bytes the program can read once from fd 4 (it is closed after them); what it writes to fd 3
        comes back as `SandboxResult.report`.
    Raises SandboxError only when the sandbox itself cannot be set up (a machine problem).
    """
    limits = limits or Limits()
    files = {"main.py": code_or_files} if isinstance(code_or_files, str) else dict(code_or_files)
    for name in files:
        if not name or "/" in name or name.startswith(".") or "\0" in name:
            raise ValueError(f"sandbox file names must be plain names, got {name!r}")
    python = limits.python or sandbox_python(limits)
    argv = list(argv) if argv is not None else [python, "-s", "-B", "main.py"]
    if not os.path.isabs(argv[0]):
        found = shutil.which(argv[0], path=SAFE_PATH)
        if found is None:
            raise SandboxError(f"program {argv[0]!r} not found on {SAFE_PATH}")
        argv[0] = found
    return _run(files, stdin, limits, argv, secret)


def _run(
    files: dict[str, str | bytes], stdin: str | bytes | None, limits: Limits, argv: list[str], secret: bytes | None
) -> SandboxResult:
    ids = _pick_ids()
    uid, gid = ids if ids else (None, None)
    host_dir = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")  # the pid says whose a leftover is
    pipes: list[int] = []
    proc: subprocess.Popen[bytes] | None = None
    start = time.monotonic()
    try:
        for name, content in files.items():
            with open(os.path.join(host_dir, name), "wb") as f:
                f.write(content.encode() if isinstance(content, str) else content)
        mask_dirs, mask_files = _hidden_paths(limits)
        status_r, status_w = os.pipe()
        report_r, report_w = os.pipe()
        secret_r, secret_w = os.pipe() if secret is not None else (-1, -1)
        pipes += [status_r, status_w, report_r, report_w, secret_r, secret_w]
        pass_fds = [fd for fd in (status_w, report_w, secret_r) if fd >= 0]
        rlimits = [
            ("RLIMIT_AS", limits.memory_mb << 20, limits.memory_mb << 20),
            ("RLIMIT_CPU", limits.cpu_seconds, limits.cpu_seconds + 1),  # soft: SIGXCPU, hard: SIGKILL
            ("RLIMIT_FSIZE", limits.max_file_mb << 20, limits.max_file_mb << 20),
            ("RLIMIT_NOFILE", limits.max_open_files, limits.max_open_files),
            ("RLIMIT_CORE", 0, 0),
        ]
        # RLIMIT_NPROC counts a uid's processes, so it is only set where that count is the run's own:
        # a dedicated uid (root caller), or an unprivileged caller's nested user namespace (the harness
        # decides; kernels >= 5.14 count per user namespace, older ones would count all the caller's).
        nproc = ("RLIMIT_NPROC", limits.max_processes, limits.max_processes)
        cfg = {
            "status_fd": status_w, "report_fd": report_w, "secret_fd": secret_r, "pass_fds": pass_fds,
            # stdin/stdout/stderr are the harness's own 0/1/2, handed on to the program
            "stdin_fd": 0, "stdout_fd": 1, "stderr_fd": 2,
            "uid": uid, "gid": gid, "use_ns": limits.use_namespaces, "workdir": host_dir, "files": list(files),
            "sandbox_dir": SANDBOX_DIR, "argv": argv, "env": _minimal_env(), "rlimits": rlimits,
            "mask_dirs": mask_dirs, "mask_files": mask_files, "disk_mb": limits.disk_mb, "shm_mb": SHM_MB,
            "deadline_s": limits.timeout_s + HARNESS_GRACE_S, "nproc": nproc,
            "nproc_in_userns": _kernel_counts_nproc_per_userns(),
        }
        import marshal

        encoded = marshal.dumps(cfg).hex()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", _HARNESS_SOURCE, encoded],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=pass_fds,
            env={"PATH": SAFE_PATH, "LANG": "C.UTF-8"},
            cwd="/",
            start_new_session=True,  # own process group: one killpg ends harness, program and its children
        )
        for fd in pass_fds:
            os.close(fd)
            pipes.remove(fd)
        return _collect(proc, limits, stdin, secret, secret_w, status_r, report_r, uid, gid, start, pipes)
    finally:
        if proc is not None and proc.poll() is None:
            _killpg(proc)
            proc.wait()
        for fd in pipes:
            try:
                os.close(fd)
            except OSError:
                pass
        _rmtree(host_dir)


def _killpg(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _collect(
    proc: subprocess.Popen[bytes],
    limits: Limits,
    stdin: str | bytes | None,
    secret: bytes | None,
    secret_w: int,
    status_r: int,
    report_r: int,
    uid: int | None,
    gid: int | None,
    start: float,
    pipes: list[int],
) -> SandboxResult:
    """Feed stdin and the secret, read every pipe with caps until the run ends or is killed."""
    assert proc.stdout is not None and proc.stderr is not None
    bufs: dict[int, bytearray] = {}
    names = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr", status_r: "status", report_r: "report"}
    writes: dict[int, memoryview] = {}
    if stdin and proc.stdin is not None:
        writes[proc.stdin.fileno()] = memoryview(stdin.encode() if isinstance(stdin, str) else stdin)
    if secret is not None:
        writes[secret_w] = memoryview(secret)
    sel = selectors.DefaultSelector()
    for fd in names:
        bufs[fd] = bytearray()
        sel.register(fd, selectors.EVENT_READ)
    for fd in writes:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_WRITE)
    deadline = start + limits.timeout_s
    timed_out = output_limited = killed = False
    open_readers = len(names)
    out_fds = (proc.stdout.fileno(), proc.stderr.fileno())

    def close_writer(fd: int) -> None:
        sel.unregister(fd)
        writes.pop(fd, None)
        if fd == secret_w:
            os.close(fd)
            pipes.remove(fd)
        elif proc.stdin is not None:
            proc.stdin.close()

    try:
        while open_readers:
            now = time.monotonic()
            if now >= deadline:
                if killed:
                    break  # pipes still open after the kill grace: stop reading
                timed_out = b"exit " not in bufs[status_r]
                _killpg(proc)
                killed = True
                deadline = now + KILL_DRAIN_S
                continue
            for key, _ in sel.select(timeout=min(deadline - now, 0.5)):
                fd = key.fd
                if fd in writes:
                    try:
                        n = os.write(fd, writes[fd][:READ_CHUNK])
                        writes[fd] = writes[fd][n:]
                        if not len(writes[fd]):
                            close_writer(fd)
                    except (BrokenPipeError, OSError):
                        close_writer(fd)
                    continue
                chunk = os.read(fd, READ_CHUNK)
                if not chunk:
                    sel.unregister(fd)
                    open_readers -= 1
                    continue
                bufs[fd] += chunk
                if fd == status_r and b"exit " in bufs[fd] and not killed:
                    # The program ended; whatever it left behind gets a short grace to flush, then dies.
                    deadline = min(deadline, time.monotonic() + EXIT_DRAIN_S)
                over = (fd in out_fds and sum(len(bufs[f]) for f in out_fds) > limits.max_output_bytes) or (
                    fd == report_r and len(bufs[fd]) > MAX_REPORT_BYTES
                )
                if over and not killed:
                    output_limited = True
                    _killpg(proc)
                    killed = True
                    deadline = time.monotonic() + KILL_DRAIN_S
    finally:
        sel.close()
    if killed or proc.poll() is None:
        _killpg(proc)
    try:
        proc.wait(timeout=KILL_DRAIN_S)
    except subprocess.TimeoutExpired:
        _killpg(proc)
        proc.wait()
    status = _parse_status(bufs[status_r].decode(errors="replace"))
    protections: dict[str, bool] = dict(status.get("protections", {}))  # type: ignore[arg-type]
    if uid is not None and gid is not None and killed and not protections.get("pid_namespace", False):
        _kill_uid(uid, gid)  # the harness died before its own teardown: kill by the run's uid
    elapsed = time.monotonic() - start
    stdout = bytes(bufs[out_fds[0]][: limits.max_output_bytes]).decode(errors="replace")
    stderr = bytes(bufs[out_fds[1]][: limits.max_output_bytes]).decode(errors="replace")
    error = None
    if "error" in status:
        raise SandboxError(f"sandbox setup failed: {status['error']}")
    if "execfail" in status:
        code, _, text = str(status["execfail"]).partition(" ")
        if code == str(errno.EAGAIN):  # the uid's process budget is used up: the program's doing, not ours
            error = f"program could not start: {text}"
        else:
            raise SandboxError(f"sandbox could not start {text}")
    if "protections" not in status and not killed:
        raise SandboxError(f"sandbox harness failed (exit {proc.returncode}): {stderr[-2000:]}")
    if "timeout" in status:
        timed_out = True
    returncode = status.get("exit") if not (timed_out or output_limited) else None
    protections.update(new_session=True, clean_env=True, rlimits=True)
    protections["rlimit_nproc"] = (uid is not None and uid != NOBODY_ID) or (
        uid is None and protections.get("user_namespace", False) and _kernel_counts_nproc_per_userns()
    )
    return SandboxResult(
        returncode=returncode,  # type: ignore[arg-type]
        stdout=stdout,
        stderr=stderr,
        report=bytes(bufs[report_r]),
        timed_out=timed_out,
        output_limited=output_limited,
        elapsed_s=elapsed,
        uid=uid,
        protections=protections,
        error=error,
    )


# --------------------------------------------------------------------------------------------------------
# Probing, interpreter choice, warnings.

_probe_lock = threading.Lock()
_python_cache: dict[tuple[bool, tuple[str, ...]], str] = {}
_probe_cache: dict[tuple[str | None, bool], dict[str, bool]] = {}
_warned = False
PROBE_LIMITS = Limits(timeout_s=10.0, memory_mb=512)  # probing must not fail on a slow, busy machine
PROBE_PROGRAM = "print(6 * 7)"


def _python_candidates() -> list[str]:
    out: list[str] = []
    for p in (sys.executable, os.path.realpath(sys.executable), getattr(sys, "_base_executable", ""),
              shutil.which("python3", path=SAFE_PATH) or ""):
        if p and os.path.isabs(p) and p not in out:
            out.append(p)
    return out


def sandbox_python(limits: Limits | None = None) -> str:
    """The interpreter programs run with: `limits.python`, else the first candidate (this process's Python,
    its real path, the venv's base, the system python3) that runs inside the sandbox. Cached per process."""
    limits = limits or Limits()
    if limits.python:
        return limits.python
    key = (limits.use_namespaces, limits.hide_paths)
    with _probe_lock:
        if key in _python_cache:
            return _python_cache[key]
        tried = []
        for cand in _python_candidates():
            lim = replace(PROBE_LIMITS, python=cand, use_namespaces=limits.use_namespaces, hide_paths=limits.hide_paths)
            try:
                r = _run({"main.py": PROBE_PROGRAM}, None, lim, [cand, "-s", "-B", "main.py"], None)
            except SandboxError as err:
                tried.append(f"{cand}: {err}")
                continue
            if r.ok and r.stdout.strip() == "42":
                _python_cache[key] = cand
                return cand
            tried.append(f"{cand}: exit {r.returncode} {r.stderr.strip()[-300:]}")
        raise SandboxError(
            "no Python interpreter runs inside the sandbox (the caller's may live in a hidden directory such "
            "as /root or /home, or be unreadable by the sandbox uid); install a system python3 or set "
            "`python` in the limits. Tried: " + "; ".join(tried)
        )


def probe(limits: Limits | None = None) -> dict[str, bool]:
    """Which protections this machine grants a sandboxed run (keys of PROTECTIONS), from a real run.
    Cached per process. Raises SandboxError when no sandboxed program can run at all."""
    limits = limits or Limits()
    python = sandbox_python(limits)
    key = (python, limits.use_namespaces)
    with _probe_lock:
        if key not in _probe_cache:
            lim = replace(PROBE_LIMITS, python=python, use_namespaces=limits.use_namespaces)
            r = _run({"main.py": PROBE_PROGRAM}, None, lim, [python, "-s", "-B", "main.py"], None)
            _probe_cache[key] = {k: bool(r.protections.get(k, False)) for k in PROTECTIONS}
        return dict(_probe_cache[key])


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


def _main() -> None:
    print(describe_protections())


if __name__ == "__main__":
    _main()
