"""The caller's side of one sandboxed run: the program's files in a fresh temp dir, a uid of its own (root
callers), what to hide, the harness (harness.py) started with that, and what came back turned into a
SandboxResult. Also the choice of interpreter for programs (`sandbox_python`)."""

from __future__ import annotations

import errno
import marshal
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from actors.rewards.sandbox.collect import Collected, Pipes, collect, killpg
from actors.rewards.sandbox.records import Limits, SandboxError, SandboxResult

HARNESS = str(Path(__file__).with_name("harness.py"))
SHM_MB = 8  # /dev/shm tmpfs: enough for multiprocessing's semaphores, too small to matter as memory
# The inner harness enforces its own deadline this much after the caller's, in case the caller is gone.
HARNESS_GRACE_S = 2.0

# Root callers run each program under its own uid/gid picked at random from this range (inside the
# 32-bit id space, far above any real account or systemd's dynamic users): RLIMIT_NPROC counts processes
# per uid, so a per-run uid gives each run its own process budget (a fork bomb cannot starve its
# neighbours), and "kill all processes of this uid" only ever hits this run.
SANDBOX_ID_BASE = 0x6A000000
SANDBOX_ID_SPAN = 1 << 24
KERNEL_NPROC_PER_USERNS = (5, 14)  # ucounts: RLIMIT_NPROC counted per user namespace from this release
NOBODY_ID = 65534  # fallback when the range is not mapped (containers with a narrow uid map)
KILL_UID_ROUNDS = 20  # `kill -9 -1` as the run's uid until nothing is left (a fork bomb respawns)

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

PROBE_LIMITS = Limits(timeout_s=10.0, memory_mb=512)  # probing must not fail on a slow, busy machine
PROBE_PROGRAM = "print(6 * 7)"
_python_lock = threading.Lock()
_python_cache: dict[tuple[bool, tuple[str, ...]], str] = {}


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
    data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
    return run(files, data, limits, argv, secret)


def sandbox_python(limits: Limits | None = None) -> str:
    """The interpreter programs run with: `limits.python`, else the first candidate (this process's Python,
    its real path, the venv's base, the system python3) that runs inside the sandbox. Cached per process."""
    limits = limits or Limits()
    if limits.python:
        return limits.python
    key = (limits.use_namespaces, limits.hide_paths)
    with _python_lock:
        if key in _python_cache:
            return _python_cache[key]
        tried = []
        for cand in _python_candidates():
            lim = replace(PROBE_LIMITS, python=cand, use_namespaces=limits.use_namespaces, hide_paths=limits.hide_paths)
            try:
                r = run_probe(lim)
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


def run_probe(limits: Limits) -> SandboxResult:
    """PROBE_PROGRAM (prints 42) with `limits.python`: whether that interpreter runs, and what the run got."""
    assert limits.python is not None
    return run({"main.py": PROBE_PROGRAM}, b"", limits, [limits.python, "-s", "-B", "main.py"], None)


def _python_candidates() -> list[str]:
    out: list[str] = []
    for p in (sys.executable, os.path.realpath(sys.executable), getattr(sys, "_base_executable", ""),
              shutil.which("python3", path=SAFE_PATH) or ""):
        if p and os.path.isabs(p) and p not in out:
            out.append(p)
    return out


def kernel_counts_nproc_per_userns() -> bool:
    """Linux >= 5.14 counts RLIMIT_NPROC per user namespace (ucounts), so an unprivileged caller's
    sandbox, in a user namespace of its own, gets a process budget of its own."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= KERNEL_NPROC_PER_USERNS


# --------------------------------------------------------------------------------------------------------
# One run.


def run(files: dict[str, str | bytes], stdin: bytes, limits: Limits, argv: list[str],
        secret: bytes | None) -> SandboxResult:
    """Run `argv` in a fresh sandbox over `files` (checked names, an absolute argv[0])."""
    ids = _pick_ids()
    uid, gid = ids if ids else (None, None)
    host_dir = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")  # the pid says whose a leftover is
    pipes: Pipes | None = None
    proc: subprocess.Popen[bytes] | None = None
    start = time.monotonic()
    try:
        for name, content in files.items():
            with open(os.path.join(host_dir, name), "wb") as f:
                f.write(content.encode() if isinstance(content, str) else content)
        pipes = Pipes.open(secret=secret is not None)
        cfg = _harness_config(files, limits, argv, pipes, host_dir, uid, gid)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", HARNESS, marshal.dumps(cfg).hex()],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=pipes.harness_ends,
            env={"PATH": SAFE_PATH, "LANG": "C.UTF-8"},
            cwd="/",
            start_new_session=True,  # own process group: one killpg ends harness, program and its children
        )
        pipes.close(*pipes.harness_ends)
        got = collect(proc, pipes, stdin=stdin, secret=secret, deadline=start + limits.timeout_s,
                      max_output_bytes=limits.max_output_bytes)
        return _result(got, proc, uid, gid, time.monotonic() - start)
    finally:
        if proc is not None and proc.poll() is None:
            killpg(proc)
            proc.wait()
        if pipes is not None:
            pipes.close_all()
        _rmtree(host_dir)


def _harness_config(files: dict[str, str | bytes], limits: Limits, argv: list[str], pipes: Pipes, host_dir: str,
                    uid: int | None, gid: int | None) -> dict[str, object]:
    """What harness.py reads (marshalled: plain values only)."""
    mask_dirs, mask_files = _hidden_paths(limits)
    rlimits = [
        ("RLIMIT_AS", limits.memory_mb << 20, limits.memory_mb << 20),
        ("RLIMIT_CPU", limits.cpu_seconds, limits.cpu_seconds + 1),  # soft: SIGXCPU, hard: SIGKILL
        ("RLIMIT_FSIZE", limits.max_file_mb << 20, limits.max_file_mb << 20),
        ("RLIMIT_NOFILE", limits.max_open_files, limits.max_open_files),
        ("RLIMIT_CORE", 0, 0),
    ]
    return {
        "status_fd": pipes.status_w, "report_fd": pipes.report_w, "secret_fd": pipes.secret_r,
        "pass_fds": pipes.harness_ends,
        # stdin/stdout/stderr are the harness's own 0/1/2, handed on to the program
        "stdin_fd": 0, "stdout_fd": 1, "stderr_fd": 2,
        "uid": uid, "gid": gid, "use_ns": limits.use_namespaces, "workdir": host_dir, "files": list(files),
        "sandbox_dir": SANDBOX_DIR, "argv": argv, "env": _minimal_env(), "rlimits": rlimits,
        "mask_dirs": mask_dirs, "mask_files": mask_files, "disk_mb": limits.disk_mb, "shm_mb": SHM_MB,
        "deadline_s": limits.timeout_s + HARNESS_GRACE_S,
        # RLIMIT_NPROC counts a uid's processes, so it is only set where that count is the run's own: a
        # dedicated uid (root caller), or an unprivileged caller's nested user namespace (the harness
        # decides; kernels >= 5.14 count per user namespace, older ones would count all the caller's).
        "nproc": ("RLIMIT_NPROC", limits.max_processes, limits.max_processes),
        "nproc_in_userns": kernel_counts_nproc_per_userns(),
    }


def _result(got: Collected, proc: subprocess.Popen[bytes], uid: int | None, gid: int | None,
            elapsed: float) -> SandboxResult:
    """The run's SandboxResult from what came back; SandboxError when the harness failed to set it up."""
    status = _parse_status(got.status)
    protections: dict[str, bool] = dict(status.get("protections", {}))  # type: ignore[arg-type]
    if uid is not None and gid is not None and got.killed and not protections.get("pid_namespace", False):
        _kill_uid(uid, gid)  # the harness died before its own teardown: kill by the run's uid
    stdout, stderr = got.stdout.decode(errors="replace"), got.stderr.decode(errors="replace")
    error = None
    if "error" in status:
        raise SandboxError(f"sandbox setup failed: {status['error']}")
    if "execfail" in status:
        code, _, text = str(status["execfail"]).partition(" ")
        if code == str(errno.EAGAIN):  # the uid's process budget is used up: the program's doing, not ours
            error = f"program could not start: {text}"
        else:
            raise SandboxError(f"sandbox could not start {text}")
    if "protections" not in status and not got.killed:
        raise SandboxError(f"sandbox harness failed (exit {proc.returncode}): {stderr[-2000:]}")
    timed_out = got.timed_out or "timeout" in status
    returncode = status.get("exit") if not (timed_out or got.output_limited) else None
    protections.update(new_session=True, clean_env=True, rlimits=True)
    protections["rlimit_nproc"] = (uid is not None and uid != NOBODY_ID) or (
        uid is None and protections.get("user_namespace", False) and kernel_counts_nproc_per_userns()
    )
    return SandboxResult(
        returncode=returncode,  # type: ignore[arg-type]
        stdout=stdout,
        stderr=stderr,
        report=got.report,
        timed_out=timed_out,
        output_limited=got.output_limited,
        elapsed_s=elapsed,
        uid=uid,
        protections=protections,
        error=error,
    )


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


# --------------------------------------------------------------------------------------------------------
# Identity, hidden paths, environment, cleanup.


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
    dirs: list[str] = []
    files: list[str] = []
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
    for _ in range(KILL_UID_ROUNDS):
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
