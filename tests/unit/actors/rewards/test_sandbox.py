"""The sandbox against a corpus of hostile programs, for real (no mocks): each must fail within its limit,
leave the caller and its neighbours alive, leave no process behind, change nothing outside its own
directory and leak no secret. Every attack names the protections it needs; where this machine lacks one
(see probe()), that attack is skipped for that mode rather than passing vacuously.

Two modes: the full sandbox, and (as root) the namespace-free fallback that only drops the uid and sets
rlimits, so the fallback path is exercised on a machine that has namespaces.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from actors.rewards.sandbox import (
    PROTECTIONS,
    Limits,
    SandboxError,
    SandboxResult,
    describe_protections,
    probe,
    run_sandboxed,
    warn_missing_protections,
)

# Small limits keep the corpus fast on 2 cores.
TIMEOUT_S = 2.0
# The attacks that must be killed (they never end by themselves) wait out this shorter limit: containment does not
# depend on its length, and honest programs keep TIMEOUT_S for a loaded machine's start-up.
KILLED_TIMEOUT_S = 1.0
# How long killed processes may take to finish exiting after a run: the check returns as soon as none is left,
# so the bound only ends a failing test (a loaded 2-core box needs seconds to reap a fork bomb).
LEFTOVER_WAIT_S = 30.0
LIMITS = Limits(timeout_s=TIMEOUT_S, memory_mb=256, max_output_bytes=64 << 10, max_processes=16, max_file_mb=8,
                disk_mb=32)
FALLBACK = Limits(**{**LIMITS.__dict__, "use_namespaces": False})
MARKER = "ATTACK-SUCCEEDED"
pytestmark = pytest.mark.slow  # every test runs real sandbox processes

try:
    PROBES = {"sandbox": probe(LIMITS), "fallback": probe(FALLBACK)}
except SandboxError as err:  # no interpreter runs in the sandbox here: nothing below can run
    pytest.skip(f"sandbox unusable on this machine: {err}", allow_module_level=True)
MODES = {"sandbox": LIMITS, "fallback": FALLBACK}


# ------------------------------------------------------------------------------------------------------
# Decoys: a secret in the environment, in a home-like token file, in a world-readable token file named by
# RAY_AUTH_TOKEN_PATH, in another process's environment and command line; files outside the sandbox (one
# directory world-writable, so only a read-only root protects it); a listening port; a neighbour process.


@dataclass
class Decoys:
    secret: str
    home_token: Path
    token_path: Path
    outside: Path
    open_dir: Path
    files: dict[Path, str]
    neighbour: subprocess.Popen[bytes]
    port: int
    listener: socket.socket

    def fingerprint(self) -> dict[str, str]:
        out = {}
        for p in sorted(self.outside.rglob("*")):
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in (self.home_token, self.token_path):
            out[str(p)] = p.read_text()
        return out


def _outside_parent() -> Path:
    """A directory outside /tmp and the homes (which the sandbox hides anyway), so that only the uid and
    the read-only root protect what the test puts there."""
    for cand in ("/opt", "/srv", "/var/lib", "/mnt"):
        if os.access(cand, os.W_OK) and os.path.isdir(cand):
            return Path(cand)
    pytest.skip("no writable directory outside /tmp for decoys")


@pytest.fixture(scope="module")
def decoys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Decoys]:
    secret = f"secret-decoy-{uuid.uuid4().hex}"
    home = tmp_path_factory.mktemp("home")
    home_token = home / ".ray" / "auth_token"
    home_token.parent.mkdir()
    home_token.write_text(secret)
    home_token.chmod(0o644)
    outside = Path(tempfile.mkdtemp(prefix="rayward-decoy-", dir=_outside_parent()))
    outside.chmod(0o755)
    token_path = outside / "ray_token"
    token_path.write_text(secret)
    token_path.chmod(0o644)  # world-readable on purpose: only hiding it protects it
    open_dir = outside / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # world-writable on purpose: only a read-only root protects it
    files = {outside / "keep.txt": "keep me", open_dir / "keep-too.txt": "keep me too"}
    for p, text in files.items():
        p.write_text(text)
        p.chmod(0o666 if p.parent == open_dir else 0o644)
    env = pytest.MonkeyPatch()  # undone in the finally below
    env.setenv("RAY_AUTH_TOKEN", secret)
    env.setenv("RAY_AUTH_TOKEN_PATH", str(token_path))
    env.setenv("HOME", str(home))
    # A neighbour with the secret in its environment and on its (world-readable) command line.
    neighbour = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", secret],
                                 env={**os.environ}, stdout=subprocess.DEVNULL)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    try:
        yield Decoys(secret, home_token, token_path, outside, open_dir, files, neighbour,
                     listener.getsockname()[1], listener)
    finally:
        listener.close()
        neighbour.kill()
        neighbour.wait()
        env.undo()
        shutil.rmtree(outside, ignore_errors=True)


# ------------------------------------------------------------------------------------------------------
# The corpus. Each program prints MARKER only if its attack worked, and lets any failure escape so the
# run fails. `needs` says which protections stop it (any one of a group suffices).


@dataclass(frozen=True)
class Attack:
    name: str
    code: str
    needs: tuple[tuple[str, ...], ...] = ()  # all groups required; within a group, any protection
    killed: bool = False  # the sandbox must kill it (timeout or output cap), not wait for it to fail


ISOLATED_OR_DROPPED = ("drop_uid", "pid_namespace")
ATTACKS = [
    Attack("fork_bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
           needs=(("rlimit_nproc", "pid_namespace"),), killed=True),
    Attack("infinite_loop", "while True:\n    pass\n", killed=True),
    Attack("sleep_forever", "import time\ntime.sleep(3600)\n", killed=True),
    Attack("allocate_8gb", "x = bytearray(8 << 30)\nx[-1] = 1\nprint('{marker}')\n", needs=(("rlimits",),)),
    Attack("fill_disk_one_file",
           "with open('big.bin', 'wb') as f:\n    for _ in range(4096):\n        f.write(b'0' * (1 << 20))\n"
           "print('{marker}')\n", needs=(("rlimits",),)),
    Attack("fill_disk_many_files",
           "import os\nfor d in ['.', '/tmp', '/dev/shm', '/var/tmp', '{open_dir}']:\n"
           "    for i in range(256):\n"
           "        with open(os.path.join(d, 'fill%d.bin' % i), 'wb') as f:\n"
           "            f.write(b'0' * (4 << 20))\nprint('{marker}')\n",
           needs=(("mount_isolation",),)),
    Attack("print_a_gigabyte", "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n"
           "    sys.stdout.write(chunk)\nprint('{marker}')\n", killed=True),
    Attack("read_environment", "import os\nprint(os.environ['RAY_AUTH_TOKEN'])\nprint('{marker}')\n",
           needs=(("clean_env",),)),
    Attack("read_home_token", "print(open('{home_token}').read())\nprint('{marker}')\n",
           needs=(("drop_uid", "mount_isolation"),)),
    Attack("read_token_path", "data = open('{token_path}').read()\nassert data\nprint(data)\nprint('{marker}')\n",
           needs=(("mount_isolation",),)),
    Attack("read_proc_environ",
           "import os\nfound = []\nfor pid in os.listdir('/proc'):\n    try:\n"
           "        data = open('/proc/%s/environ' % pid, 'rb').read()\n    except OSError:\n        continue\n"
           "    if b'secret-decoy' in data:\n        found.append(data)\n"
           "assert found\nprint(found)\nprint('{marker}')\n",
           needs=(("drop_uid", "proc_isolation"),)),
    Attack("read_proc_cmdline",
           "import os\nfound = []\nfor pid in os.listdir('/proc'):\n    try:\n"
           "        data = open('/proc/%s/cmdline' % pid, 'rb').read()\n    except OSError:\n        continue\n"
           "    if b'secret-decoy' in data:\n        found.append(data)\n"
           "assert found\nprint(found)\nprint('{marker}')\n",
           needs=(("proc_isolation",),)),
    Attack("connect_local_port",
           "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'hi')\n"
           "print('{marker}')\n", needs=(("network_namespace",),)),
    Attack("kill_parent", "import os\nos.kill(os.getppid(), 9)\nprint('{marker}')\n", needs=(ISOLATED_OR_DROPPED,)),
    Attack("kill_neighbour", "import os\nos.kill({neighbour_pid}, 9)\nprint('{marker}')\n",
           needs=(ISOLATED_OR_DROPPED,)),
    Attack("killpg_own_group", "import os\nos.killpg(os.getpgid(0), 9)\nprint('{marker}')\n",
           needs=(ISOLATED_OR_DROPPED,)),
    Attack("kill_everything", "import os\nos.system('kill -9 -1')\nos.kill(-1, 9)\nprint('{marker}')\n",
           needs=(ISOLATED_OR_DROPPED,)),
    Attack("rm_rf_outside_files",
           "import os\nos.system('rm -rf {outside}/keep.txt {token_path}')\n"
           "assert not os.path.exists('{outside}/keep.txt')\nprint('{marker}')\n",
           needs=(("drop_uid", "mount_isolation"),)),
    Attack("rm_rf_outside_dir",  # its world-writable subdirectory is fair game without a read-only root
           "import os\nos.system('rm -rf {outside}')\nassert not os.path.exists('{open_dir}/keep-too.txt')\n"
           "print('{marker}')\n", needs=(("mount_isolation",),)),
    Attack("write_outside",
           "open('{outside}/keep.txt', 'w').write('pwned')\nprint('{marker}')\n",
           needs=(("drop_uid", "mount_isolation"),)),
    Attack("write_world_writable_outside",
           "open('{open_dir}/keep-too.txt', 'w').write('pwned')\nopen('{open_dir}/new.txt', 'w').write('x')\n"
           "print('{marker}')\n", needs=(("mount_isolation",),)),
    Attack("daemon_outlives_run",
           "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
           "        time.sleep(600)\n    os._exit(0)\nraise SystemExit(3)\n",
           needs=(("pid_namespace", "rlimit_nproc"),)),
]


def _supported(attack: Attack, mode: str) -> bool:
    got = PROBES[mode]
    return all(any(got.get(p, False) for p in group) for group in attack.needs)


def _params() -> list[object]:
    out = []
    for mode in MODES:
        for a in ATTACKS:
            marks = [] if _supported(a, mode) else [pytest.mark.skip(reason=f"{mode}: machine lacks {a.needs}")]
            out.append(pytest.param(mode, a, id=f"{mode}-{a.name}", marks=marks))
    return out


# ------------------------------------------------------------------------------------------------------
# What "contained" means, checked after every attack.


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, real uid, state) for every process on the machine."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        table[int(entry)] = (int(fields["PPid"]), int(fields["Uid"].split()[0]), fields["State"].strip()[:1])
    return table


def _descendants(pid: int, table: dict[int, tuple[int, int, str]]) -> set[int]:
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, (pp, _, _) in table.items() if pp in frontier} - out
        out |= frontier
    return out


def _live_leftovers(result: SandboxResult, allowed: set[int]) -> list[int]:
    table = _proc_table()
    alive = {p for p, (_, _, state) in table.items() if state != "Z"}
    left = (_descendants(os.getpid(), table) - allowed) & alive
    if result.uid is not None:
        left |= {p for p in alive if table[p][1] == result.uid}
    return sorted(left)


def our_children() -> set[int]:
    """Processes this test process already had (e.g. multiprocessing's resource tracker from earlier tests)."""
    return _descendants(os.getpid(), _proc_table())


def assert_contained(
    result: SandboxResult, decoys: Decoys, before: dict[str, str], logs: str, existing: set[int] = frozenset()
) -> None:
    assert not result.ok, f"hostile program succeeded: {result}"
    assert MARKER not in result.stdout
    # Nothing left running: the kernel tears down a PID namespace synchronously; the uid sweep of the
    # fallback needs a moment for SIGKILLed processes to finish exiting.
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while (left := _live_leftovers(result, {decoys.neighbour.pid, *existing})) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind: {left}"
    assert decoys.neighbour.poll() is None, "the neighbour process was killed"
    assert decoys.fingerprint() == before, "files outside the sandbox changed"
    assert not list(decoys.open_dir.glob("fill*")) and not (decoys.open_dir / "new.txt").exists()
    with pytest.raises(BlockingIOError):
        decoys.listener.accept()  # nobody connected
    for text in (result.stdout, result.stderr, result.report.decode(errors="replace"), repr(result), logs):
        assert decoys.secret not in text
    assert not [p for p in Path(tempfile.gettempdir()).glob(f"rayward-sandbox-{os.getpid()}-*") if p.is_dir()]


@pytest.mark.parametrize(("mode", "attack"), _params())
def test_hostile_program_is_contained(mode: str, attack: Attack, decoys: Decoys, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    code = attack.code.format(marker=MARKER, home_token=decoys.home_token, token_path=decoys.token_path,
                              outside=decoys.outside, open_dir=decoys.open_dir, port=decoys.port,
                              neighbour_pid=decoys.neighbour.pid)
    before, existing = decoys.fingerprint(), our_children()
    limits = MODES[mode]
    if attack.killed:
        limits = dataclasses.replace(limits, timeout_s=KILLED_TIMEOUT_S)
    result = run_sandboxed(code, limits=limits)
    assert_contained(result, decoys, before, caplog.text, existing)
    if attack.killed:
        assert result.timed_out or result.output_limited
        assert result.returncode is None


# ------------------------------------------------------------------------------------------------------
# Honest programs, results and plumbing.


@pytest.mark.parametrize("mode", list(MODES))
def test_honest_program_runs_with_stdin_and_files(mode: str):
    files = {"main.py": "import sys, data\nprint(sys.stdin.read().upper(), data.X)\n", "data.py": "X = 41 + 1\n"}
    r = run_sandboxed(files, stdin="hello", limits=MODES[mode])
    assert r.ok, r
    assert r.stdout.strip() == "HELLO 42"


def test_exit_status_and_stderr_are_reported():
    r = run_sandboxed("import sys\nprint('out')\nsys.stderr.write('err')\nsys.exit(3)\n", limits=LIMITS)
    assert (r.returncode, r.stdout.strip(), r.stderr, r.ok) == (3, "out", "err", False)
    r = run_sandboxed("def f(:\n", limits=LIMITS)
    assert r.returncode == 1 and "SyntaxError" in r.stderr


def test_secret_and_report_channels():
    code = "import os\nsecret = os.read(4, 100)\nos.write(3, secret[::-1])\n"
    r = run_sandboxed(code, limits=LIMITS, secret=b"abc123")
    assert r.ok and r.report == b"321cba"
    # the secret is on no file, argument or environment variable of the program
    nonce = os.urandom(8).hex().encode()
    code = ("import os, sys\nblob = open('/proc/self/cmdline','rb').read() + open('/proc/self/environ','rb').read()\n"
            "blob += b''.join(open(f,'rb').read() for f in os.listdir('.'))\n"
            f"print(bytes.fromhex({nonce.hex()!r}) in blob)\n")  # the program must not contain it verbatim
    assert run_sandboxed(code, limits=LIMITS, secret=nonce).stdout.strip() == "False"


def test_program_output_cannot_pose_as_the_harness():
    # The harness reports on a pipe the program never holds; nothing it prints is taken for a setup error.
    code = ("import sys\nprint('error setup: boom')\n"
            "sys.stderr.write('execfail 2 nope\\nready drop_uid=0\\n')\nsys.exit(125)\n")
    r = run_sandboxed(code, limits=LIMITS)
    assert r.returncode == 125 and r.error is None
    assert r.protections == run_sandboxed("pass", limits=LIMITS).protections


def test_output_is_capped():
    r = run_sandboxed("print('y' * 10_000_000)", limits=LIMITS)
    assert r.output_limited and not r.ok
    assert len(r.stdout) <= LIMITS.max_output_bytes


def test_each_run_gets_a_fresh_directory_and_uid():
    code = "import os\nprint(os.listdir('.'), os.getuid())\nopen('left.txt', 'w').write('x')\n"
    a, b = run_sandboxed(code, limits=LIMITS), run_sandboxed(code, limits=LIMITS)
    assert a.stdout.split("]")[0] == b.stdout.split("]")[0] == "['main.py'"
    if PROBES["sandbox"]["rlimit_nproc"] and os.geteuid() == 0:
        assert a.uid != b.uid and a.uid != 0


def test_rejects_odd_file_names():
    with pytest.raises(ValueError):
        run_sandboxed({"../escape.py": "pass"}, limits=LIMITS)


def test_probe_reports_every_protection_and_describes_them():
    got = probe(LIMITS)
    assert set(got) == set(PROTECTIONS)
    assert all(isinstance(v, bool) for v in got.values())
    text = describe_protections(LIMITS)
    assert all(name in text for name in PROTECTIONS) and "Missing:" in text


@pytest.mark.skipif(os.geteuid() != 0, reason="the fallback without namespaces still runs as root's own uid")
def test_missing_protections_are_warned_not_silent(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING, logger="rayward.sandbox")
    missing = warn_missing_protections(FALLBACK, force=True)
    assert "network_namespace" in missing and "pid_namespace" in missing
    assert "network_namespace" in caplog.text and "pid_namespace" in caplog.text


NON_ROOT_UID = 4242  # an unused uid to play an unprivileged rayward user
SANDBOX_PACKAGE = Path(__file__).resolve().parents[4] / "actors" / "rewards" / "sandbox"


@pytest.fixture
def readable_sandbox() -> Iterator[Path]:
    """The sandbox package alone (stdlib only; its harness a script beside it) in a directory any uid may
    read: the checkout may sit in a private home (mode 0700) that the unprivileged caller cannot enter."""
    root = Path(tempfile.mkdtemp(prefix="rayward-readable-", dir="/tmp"))
    try:
        shutil.copytree(SANDBOX_PACKAGE, root / "actors" / "rewards" / "sandbox",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for pkg in (root / "actors", root / "actors" / "rewards"):
            (pkg / "__init__.py").touch()
        for p in [root, *root.rglob("*")]:  # whatever the umask of the checkout
            p.chmod(0o755 if p.is_dir() else 0o644)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
                    reason="needs root, setpriv and a system python3 to act as an unprivileged caller")
def test_unprivileged_caller_survives_kill_everything(readable_sandbox: Path):
    """An unprivileged caller gets what user namespaces allow; a program's `kill -9 -1` must not reach it
    whenever a PID namespace is available (without one, the sandbox warns and this attack is unstoppable)."""
    script = (
        "from actors.rewards.sandbox import probe, run_sandboxed, Limits\n"
        "lim = Limits(timeout_s=2, memory_mb=256)\n"
        "got = probe(lim)\n"
        "print('PID_NS', got['pid_namespace'], 'NET_NS', got['network_namespace'], flush=True)\n"
        "if got['pid_namespace']:\n"
        "    r = run_sandboxed(\"import os\\nos.system('kill -9 -1')\\nos.kill(-1, 9)\\n\", limits=lim)\n"
        "print('CALLER_ALIVE', flush=True)\n"
    )
    r = subprocess.run(["setpriv", f"--reuid={NON_ROOT_UID}", f"--regid={NON_ROOT_UID}", "--clear-groups",
                        "/usr/bin/python3", "-c", script], capture_output=True, text=True, timeout=60, cwd="/",
                       env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": str(readable_sandbox)})
    assert "CALLER_ALIVE" in r.stdout, r.stdout + r.stderr
    assert "PID_NS" in r.stdout


def _userns_allowed() -> bool:
    try:
        return int(Path("/proc/sys/user/max_user_namespaces").read_text()) > 0
    except (OSError, ValueError):
        return False


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not _userns_allowed(),
                    reason="needs root, setpriv and user namespaces")
def test_root_without_cap_sys_admin_keeps_every_protection():
    """A container's root usually lacks CAP_SYS_ADMIN: the harness goes through a user namespace of its
    own (identity-mapped) and must lose nothing."""
    script = ("import json, sys\nfrom actors.rewards.sandbox import probe, Limits\n"
              "print(json.dumps(probe(Limits(timeout_s=5, memory_mb=256))))\n")
    r = subprocess.run(["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", sys.executable, "-c", script],
                       capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[4])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == PROBES["sandbox"]


@pytest.mark.parametrize("program", [
    "import time\ntime.sleep(0.3)\nprint('done')\n",
])
def test_runs_concurrently_from_threads(program: str):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: run_sandboxed(program, limits=LIMITS), range(4)))
    assert all(r.ok and r.stdout.strip() == "done" for r in results)
    if results[0].uid is not None and PROBES["sandbox"]["rlimit_nproc"]:
        assert len({r.uid for r in results}) == 4
