"""The sandbox harness: a script the caller runs as `python -I -S -B harness.py CONFIG` (never imported). It
isolates itself in layers (see the package docstring), then execs the program.

Self-contained on purpose: only builtin or tiny standard-library modules, all imported at start, before it
hides directories (the interpreter's own files may live in one, e.g. pyenv under /root). `-I` keeps the
caller's environment, user site-packages and this file's directory off sys.path.

CONFIG: a marshalled dict, hex-encoded (built by run.py). Status lines go to cfg["status_fd"], a pipe the
program never holds: `ready <protection>=0|1 ...`, `exit <status>`, `timeout`, `execfail <errno> <text>`,
`error <what>: <text>`. Exit statuses of the harness itself are below.
"""

import ctypes
import fcntl
import marshal
import os
import resource
import signal
import sys

# mount(2) flags, prctl(2) options, unshare(2) namespace flags (linux/mount.h, linux/prctl.h, linux/sched.h).
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
NEWNS, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET = (
    0x00020000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
NAMESPACES = (NEWNS, NEWNET, NEWPID, NEWIPC, NEWUTS)  # besides the user namespace
# statvfs f_flag bits -> the mount flags that keep them (nosuid, nodev, noexec, noatime, nodiratime, relatime):
# a remount must repeat the flags a user namespace locked.
ST_TO_MS = ((2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC), (1024, 1024), (2048, 2048), (4096, 1 << 21))
ENOENT = 2
# The harness's own exit statuses: a setup step failed, the program could not be exec'd, the deadline passed.
EXIT_SETUP, EXIT_EXECFAIL, EXIT_TIMEOUT = 125, 126, 124
EXIT_NOEXEC = 127  # the program's child when exec failed
ERR_FD = 5  # the program's close-on-exec pipe for errors before exec
HIGH_FD = 256  # fds are moved above this before being placed at 0-5, so no dup2 clobbers another
TEARDOWN_ROUNDS = 100  # kill(-1) as the sandbox uid until none of its processes is left (fork bombs respawn)


class Harness:
    """One run's harness process (and, after the forks, its inner level): the config and what it achieved."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.status_fd = cfg["status_fd"]
        self.root = os.geteuid() == 0
        self.uid, self.gid = cfg["uid"], cfg["gid"]  # the program's ids (root callers only)
        self.outer_uid, self.outer_gid = os.geteuid(), os.getegid()  # before a user namespace changes them
        self.ns = 0  # the unshare flags that took
        self.pid1 = False  # PID 1 of a new PID namespace
        self.got: dict = {}  # protection -> granted, reported on the `ready` line

    # --- plumbing -----------------------------------------------------------------------------------------

    def say(self, line: str) -> None:
        os.write(self.status_fd, (line.replace("\n", " ") + "\n").encode())

    def fail(self, what: str, err: BaseException) -> None:
        self.say(f"error {what}: {type(err).__name__}: {err}")
        os._exit(EXIT_SETUP)

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"{os.strerror(e)} ({what})")

    def mount(self, src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        def enc(s: str | None) -> bytes | None:
            return None if s is None else s.encode()

        rc = self.libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
        self.check(rc, f"mount {target}")

    def mirror(self, child: int) -> None:
        """Wait for the next harness level and exit with its status (the caller reads the harness's exit)."""
        for fd in self.cfg["pass_fds"]:  # the status pipe among them: only the inner harness reports
            os.close(fd)
        _, st = os.waitpid(child, 0)
        os._exit(os.waitstatus_to_exitcode(st) & 0xFF)

    # --- 1. namespaces ------------------------------------------------------------------------------------

    def enter_namespaces(self) -> None:
        """Together when possible. Root: else through a user namespace, else one by one (some may be
        allowed). Unprivileged callers need a user namespace first, mapping themselves to its root."""
        if self.cfg["use_ns"]:
            wanted = sum(NAMESPACES)
            if self.root:
                self._enter_as_root(wanted)
            elif self.libc.unshare(NEWUSER | wanted) == 0:
                self.ns = NEWUSER | wanted
                try:  # map the caller to root of the new user namespace (the only mapping it may write)
                    write_proc("self", "setgroups", "deny")
                    write_proc("self", "uid_map", f"0 {self.outer_uid} 1")
                    write_proc("self", "gid_map", f"0 {self.outer_gid} 1")
                except OSError as err:
                    self.fail("user namespace", err)
        self.got["network_namespace"] = bool(self.ns & NEWNET)
        self.got["user_namespace"] = bool(self.ns & NEWUSER)

    def _enter_as_root(self, wanted: int) -> None:
        if self.libc.unshare(wanted) == 0:
            self.ns = wanted
            return
        self.ns = NEWUSER if self._identity_userns() else 0
        if self.libc.unshare(wanted) == 0:
            self.ns |= wanted
            return
        for flag in NAMESPACES:
            if self.libc.unshare(flag) == 0:
                self.ns |= flag

    def _identity_userns(self) -> bool:
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
            self.mirror(child)
        os.close(ready_r)
        os.close(go_w)
        entered = self.libc.unshare(NEWUSER) == 0
        os.write(ready_w, b"1" if entered else b"0")
        mapped = os.read(go_r, 1) == b"1"
        if entered and not mapped:
            self.fail("user namespace", OSError("could not write the uid/gid maps"))
        return entered

    # --- 2. the inner harness: PID 1, mounts, the program's directory -------------------------------------

    def become_inner(self) -> None:
        """Fork: the child is PID 1 of the new PID namespace and goes on; this process only mirrors its exit."""
        inner = os.fork()
        if inner:
            self.mirror(inner)
        # Dies with the outer harness (the caller kills the process group; this covers a lone kill).
        self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        self.pid1 = os.getpid() == 1
        self.got["pid_namespace"] = self.pid1

    def prepare_workdir(self) -> str:
        """The program's directory with its files: a private tmpfs behind hidden homes and a read-only root
        when there is a mount namespace, else the caller's temp dir. Returns its path."""
        workdir = self.cfg["workdir"]
        self.got["proc_isolation"] = False
        self.got["mount_isolation"] = False
        try:
            if self.ns & NEWNS:
                workdir = self._isolate_mounts()
            if self.root:  # the program's own dir and files belong to its uid
                for name in self.cfg["files"]:
                    os.chown(os.path.join(workdir, name), self.uid, self.gid)
                os.chown(workdir, self.uid, self.gid)
        except OSError as err:
            self.fail("setup", err)
        return workdir

    def _isolate_mounts(self) -> str:
        cfg = self.cfg
        self.mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here leaks back to the host
        if self.pid1:
            try:
                self.mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                self.got["proc_isolation"] = True
            except OSError:
                pass  # reported as missing; the PID namespace still limits what can be signalled
        contents = {}
        for name in cfg["files"]:  # read before /tmp (where the caller's workdir lives) is replaced
            with open(os.path.join(cfg["workdir"], name), "rb") as f:
                contents[name] = f.read()
        self.mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['disk_mb']}m,mode=1777")
        workdir = cfg["sandbox_dir"]
        os.mkdir(workdir, 0o700)
        for name, data in contents.items():
            fd = os.open(os.path.join(workdir, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, data)
            os.close(fd)
        self.got["mount_isolation"] = self._hide_and_seal()
        return workdir

    def _hide_and_seal(self) -> bool:
        """Hide the configured files and directories, give /dev/shm a small tmpfs, remount / read-only.
        Returns whether all of it took (a path that does not exist needs no hiding)."""
        isolated = True
        for path in self.cfg["mask_files"]:  # files first: a hidden directory may contain them
            try:
                self.mount("/dev/null", path, None, MS_BIND)
            except OSError as err:
                isolated = isolated and err.errno == ENOENT
        for path in self.cfg["mask_dirs"]:
            try:
                self.mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=755")
            except OSError as err:
                isolated = isolated and err.errno == ENOENT
        try:
            self.mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={self.cfg['shm_mb']}m,mode=1777")
        except OSError:
            isolated = False
        # Read-only root, keeping the flags it has (a user namespace may not drop locked ones).
        keep = sum(ms for st, ms in ST_TO_MS if os.statvfs("/").f_flag & st)
        try:
            self.mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        except OSError:
            isolated = False
        return isolated

    # --- 3. the program -----------------------------------------------------------------------------------

    def start_program(self, workdir: str) -> tuple[int, bytes]:
        """Fork the program; returns its pid and what went wrong before its exec (empty: it runs)."""
        err_r, err_w = os.pipe()
        child = os.fork()
        if child == 0:
            self._exec_program(workdir, err_w)
        os.close(err_w)
        for fd in self.cfg["pass_fds"]:
            if fd != self.status_fd:
                os.close(fd)
        for fd in (self.cfg["stdin_fd"], self.cfg["stdout_fd"], self.cfg["stderr_fd"]):
            if fd > 2:
                os.close(fd)
        problem = b""
        while True:
            chunk = os.read(err_r, 4096)
            if not chunk:
                break
            problem += chunk
        os.close(err_r)
        self.got["no_new_privs"] = not problem
        self.got["drop_uid"] = self.root and not problem
        return child, problem

    def _exec_program(self, workdir: str, err_w: int) -> None:
        """In the program's process: its fds, rlimits, credentials, then exec. Never returns; an error before
        the exec goes to ERR_FD (close-on-exec, so it reads empty once the exec succeeded)."""
        cfg = self.cfg
        try:
            wanted_fds = [(cfg["stdin_fd"], 0), (cfg["stdout_fd"], 1), (cfg["stderr_fd"], 2),
                          (cfg["report_fd"], 3), (cfg["secret_fd"], 4), (err_w, ERR_FD)]
            high = [(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD), to) for fd, to in wanted_fds if fd >= 0]
            for fd, to in high:
                os.dup2(fd, to, inheritable=to != ERR_FD)
            os.closerange(ERR_FD + 1, 1 << 20)
            os.chdir(workdir)
            os.umask(0o022)
            rlimits = list(cfg["rlimits"])
            if self.root or (self.ns & NEWUSER and cfg["nproc_in_userns"]):
                rlimits.append(cfg["nproc"])
            for res, soft, hard in rlimits:
                resource.setrlimit(getattr(resource, res), (soft, hard))
            if self.root:
                os.setgroups([])
                os.setgid(self.gid)
                os.setuid(self.uid)
            elif self.ns & NEWUSER:
                # A nested user + mount namespace locks the mounts above: the program (root of its own
                # user namespace) cannot unmount the tmpfs hiding the caller's files.
                self.check(self.libc.unshare(NEWUSER | NEWNS), "lock mounts")
            self.check(self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
            self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
            argv = cfg["argv"]
            os.execve(argv[0], argv, dict(cfg["env"], TMPDIR=workdir))
        except BaseException as err:  # noqa: BLE001 - any failure is reported, then the child exits
            code = getattr(err, "errno", None) or 0
            os.write(ERR_FD, f"{code} {type(err).__name__}: {err}".encode()[:1000])
        os._exit(EXIT_NOEXEC)

    def wait_program(self, child: int) -> int | None:
        """Report `ready`, wait for the program (as PID 1 reaping every orphan too) within the harness's own
        deadline, report its `exit` status."""
        self.say("ready " + " ".join(f"{k}={int(v)}" for k, v in self.got.items()))
        signal.signal(signal.SIGALRM, self._on_deadline)
        signal.setitimer(signal.ITIMER_REAL, self.cfg["deadline_s"])
        status = None
        while status is None:
            try:
                wpid, st = os.waitpid(-1 if self.pid1 else child, 0)
            except ChildProcessError:
                break
            if wpid == child:
                status = os.waitstatus_to_exitcode(st)
        signal.setitimer(signal.ITIMER_REAL, 0)
        self.say(f"exit {status}")
        return status

    def _on_deadline(self, signum: int, frame: object) -> None:
        self.say("timeout")
        self.teardown()
        os._exit(EXIT_TIMEOUT)

    def teardown(self) -> None:
        """Kill what the program left: as PID 1, every other process of the namespace; as root without one,
        every process of the run's dedicated uid."""
        if self.pid1:
            try:
                os.kill(-1, signal.SIGKILL)  # PID 1: every other process of this namespace, nothing else
            except ProcessLookupError:
                pass  # none left
        elif self.root:
            for _ in range(TEARDOWN_ROUNDS):
                helper = os.fork()
                if helper == 0:
                    os.setgroups([])
                    os.setgid(self.gid)
                    os.setuid(self.uid)
                    try:
                        os.kill(-1, signal.SIGKILL)
                    except ProcessLookupError:
                        os._exit(0)
                    os._exit(1)
                _, st = os.waitpid(helper, 0)
                if os.waitstatus_to_exitcode(st) == 0:
                    break


def write_proc(pid: str, name: str, text: str) -> None:
    fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def main(encoded: str) -> None:
    h = Harness(marshal.loads(bytes.fromhex(encoded)))
    h.enter_namespaces()
    h.become_inner()
    workdir = h.prepare_workdir()
    child, problem = h.start_program(workdir)
    if problem:
        code, _, text = problem.decode(errors="replace").partition(" ")
        h.say(f"execfail {code} {text}")
        os.waitpid(child, 0)
        os._exit(EXIT_EXECFAIL)
    h.wait_program(child)
    h.teardown()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
