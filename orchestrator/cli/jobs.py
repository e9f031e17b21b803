"""Runs on a shared Ray cluster through the Ray Jobs API: submit, status, logs (-f), stop, list (and `rayward
scale`, orchestrator/cli/scale.py, a small job of its own): every command takes the dashboard address.

`rayward submit CONFIG [overrides] --address http://HEAD:8265` validates the config here first (a typo fails
on the laptop, not after an upload), then submits `python -m orchestrator run CONFIG overrides --name NAME`
with submission id `rayward-<NAME>`, so every other command takes the run name.
`rayward submit SCRIPT.py [args]` submits a Python script (a TRL script using `rayward.GRPOTrainer`) as
`python SCRIPT.py args` with the script's directory as working_dir (compiled here first, so a syntax error fails
on the laptop); RAYWARD_RUN_NAME tells its trainer the run name (default: the script's name).

What travels (runtime_env):
  * working_dir = the current directory (the user's reward-function modules, local datasets, the config when
    it lives there), minus DEFAULT_EXCLUDES, .gitignore/.rayignore entries and files over --max-file-mib.
    A config outside the directory is sent in the env var RAYWARD_SUBMIT_CONFIG and written next to the
    driver. The driver's cwd is the unpacked working_dir, so `module:callable` rewards import as they do
    locally.
  * py_modules = rayward's own packages (`orchestrator`, `actors`) from this installation, unless the
    working_dir already holds them. The cluster therefore always runs the rayward code of the submitting
    client (no version skew between laptop and image) without the image having to install rayward. The
    image still needs rayward's dependencies: `pip install rayward[gpu]` (or [cpu]) in the image provides
    both; the shipped packages then simply take precedence on sys.path. `--no-ship-rayward` relies on the
    image's installed rayward alone.
  * env_vars = the set RAYWARD_*, HF_*, VLLM_*, WANDB_*, MLFLOW_* variables, rayward's ACTOR_ENV, and --env
    KEY=VALUE. Ray shows a job's runtime_env in the dashboard: anyone with dashboard access sees these
    values (HF_TOKEN, WANDB_API_KEY). Ray's auth token is never forwarded.

Authentication: clients send the token only with RAY_AUTH_MODE=token; orchestrator.cli.auth finds the token
where Ray looks for it (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token). Every command first asks
the dashboard's public /api/authentication_mode (5 s timeout), so an unreachable address or a missing
token is one clear line within seconds instead of a hang or a traceback.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import re
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.cli.auth import AuthError, explain_auth_failure, find_token, prepare_client_auth
from orchestrator.config import (
    RUN_NAME_PATTERN,
)

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
SUBMISSION_PREFIX = "rayward-"
RUN_NAME_RE = re.compile(RUN_NAME_PATTERN)
FORWARD_PREFIXES = ("RAYWARD_", "HF_", "VLLM_", "WANDB_", "MLFLOW_")
NEVER_FORWARD = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")
CONFIG_ENV = "RAYWARD_SUBMIT_CONFIG"
SHIPPED_CONFIG = ".rayward-submit-config.yaml"
# gitignore-style patterns, relative to working_dir (Ray matches them against paths without a trailing /).
DEFAULT_EXCLUDES = [
    ".git", ".venv*", "venv", "__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis",
    "*.egg-info", "/build", "/dist", "/runs", "/.cache", "wandb", "mlruns", "node_modules",
    "*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.onnx", "*.h5", "*.msgpack", "*.npz",
]
DEFAULT_MAX_FILE_MIB = 20.0
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
PREFLIGHT_TIMEOUT_S = 5.0


class JobsError(RuntimeError):
    """A one-line, user-facing failure of a jobs command."""


class ScaleRefused(JobsError):
    """`rayward scale` asked for something this cluster or run cannot do (no such run, bad bounds)."""


# ---------------------------------------------------------------------------------------------------------
# Pure parts: names, addresses, the submission (unit-tested without a cluster)
# ---------------------------------------------------------------------------------------------------------


def submission_id(run_name: str) -> str:
    return f"{SUBMISSION_PREFIX}{run_name}"


def default_address() -> str:
    return os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS


def normalize_address(address: str) -> str:
    """The dashboard's HTTP URL: `host:8265` -> `http://host:8265` (`ray://`, GCS `auto` are not Jobs URLs)."""
    address = address.strip().rstrip("/")
    if address in ("", "auto") or address.startswith("ray://"):
        raise JobsError(f"--address {address or '(empty)'!r} is not the dashboard URL; use http://HEAD:8265")
    if "://" not in address:
        address = f"http://{address}"
    return address


def dashboard_job_url(address: str, sub_id: str) -> str:
    return f"{address}/#/jobs/{sub_id}"


def forwarded_env(environ: dict[str, str] | None = None, extra: list[str] | None = None) -> dict[str, str]:
    """Environment the run needs on the cluster: set RAYWARD_/HF_/VLLM_/WANDB_/MLFLOW_ variables, rayward's
    ACTOR_ENV (the local value when set), and KEY=VALUE extras. Never the Ray auth token."""
    from orchestrator.run.cluster import ACTOR_ENV

    environ = dict(os.environ if environ is None else environ)
    env = {k: environ.get(k, v) for k, v in ACTOR_ENV.items()}
    env.update({k: v for k, v in environ.items() if k.startswith(FORWARD_PREFIXES)})
    for item in extra or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise JobsError(f"--env {item!r} is not KEY=VALUE")
        env[k] = v
    # init_ray (in the job's driver) passes env_vars to ray.init too; the job's values are the same ones, so
    # let the driver's runtime_env win instead of failing on the "conflict".
    env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] = "1"
    for k in NEVER_FORWARD:
        env.pop(k, None)
    return env


def large_files(root: Path, excludes: list[str], max_bytes: int) -> list[str]:
    """Files under root that Ray would upload (after excludes, .gitignore, .rayignore) larger than max_bytes,
    as paths relative to root."""
    from actors.runtime.ray_compat import walk_upload

    root = root.resolve()
    found: list[str] = []

    def handler(p: Path) -> None:
        if p.is_file() and not p.is_symlink() and p.stat().st_size > max_bytes:
            found.append(p.relative_to(root).as_posix())

    quiet = logging.getLogger("rayward.jobs.scan")
    quiet.setLevel(logging.WARNING)
    walk_upload(root, excludes, handler, quiet)
    return sorted(found)


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


@dataclass
class Submission:
    """Everything sent to the Jobs API (built and checked locally; `rayward submit --dry-run` prints it)."""

    run_name: str
    submission_id: str
    entrypoint: str
    runtime_env: dict[str, Any]
    metadata: dict[str, str]
    excluded_large: list[str] = field(default_factory=list)
    entrypoint_num_cpus: float | None = None
    notes: list[str] = field(default_factory=list)  # what could not be checked here (run/build/checks.py)

    def public(self) -> dict[str, Any]:
        """As JSON for --dry-run, secret-looking env values masked."""
        env = {
            k: ("***" if re.search(r"(^|_)(TOKEN|KEY|SECRET|PASSWORD|CREDENTIALS?)(_|$)", k) else v)
            for k, v in self.runtime_env.get("env_vars", {}).items()
        }
        return {
            "submission_id": self.submission_id, "entrypoint": self.entrypoint,
            "runtime_env": {**self.runtime_env, "env_vars": env}, "metadata": self.metadata,
            "excluded_large_files": self.excluded_large, "entrypoint_num_cpus": self.entrypoint_num_cpus,
        }


def build_submission(
    config: str,
    overrides: list[str] | None = None,
    *,
    name: str | None = None,
    working_dir: str | Path | None = None,
    extra_excludes: list[str] | None = None,
    extra_env: list[str] | None = None,
    max_file_mib: float = DEFAULT_MAX_FILE_MIB,
    ship_rayward: bool = True,
    entrypoint_num_cpus: float | None = None,
    environ: dict[str, str] | None = None,
    run_flags: list[str] | None = None,
) -> Submission:
    """Validate the config (+ overrides) locally and build the job: raises ConfigError / JobsError.
    run_flags: `rayward run` options for the driver (`--verbose`, `--debug`)."""
    from orchestrator.config import load_config
    from orchestrator.run.cluster import new_run_name

    if str(config).endswith(".py"):
        if "--max-retries" in (run_flags or []):
            raise JobsError("--max-retries restarts `rayward run` drivers; a script continues its run when started "
                            "again if it calls trainer.train(resume_from_checkpoint='auto') (submit it again, or "
                            "loop over it in the script)")
        return _script_submission(
            Path(config), list(overrides or []), name=name, working_dir=working_dir, extra_excludes=extra_excludes,
            extra_env=extra_env, max_file_mib=max_file_mib, ship_rayward=ship_rayward,
            entrypoint_num_cpus=entrypoint_num_cpus, environ=environ,
        )
    working_dir = "." if working_dir is None else working_dir
    overrides = list(overrides or [])
    cfg = load_config(config, overrides)  # ConfigError names the bad field before anything is uploaded
    run_name = name or cfg.name or new_run_name()
    if not RUN_NAME_RE.match(run_name):
        raise JobsError(f"run name {run_name!r} must match {RUN_NAME_RE.pattern} (lowercase, digits, dashes)")
    root = Path(working_dir).resolve()
    if not root.is_dir():
        raise JobsError(f"working dir {working_dir} is not a directory")
    notes = _checked_here(cfg, root)

    env = forwarded_env(environ, extra_env)
    cfg_path = Path(config)
    if _inside(cfg_path, root):
        cfg_arg = cfg_path.resolve().relative_to(root).as_posix()
        prefix = ""
    else:  # ship the file's text; the entrypoint writes it into the job's working dir
        env[CONFIG_ENV] = cfg_path.read_text()
        cfg_arg = SHIPPED_CONFIG
        prefix = f'printf "%s\\n" "${CONFIG_ENV}" > {SHIPPED_CONFIG} && '
    if cfg.cluster.address is None:
        # Inside a job RAY_ADDRESS names the cluster; the driver joins it instead of starting its own.
        overrides.append("cluster.address=auto")
    args = ["python", "-m", "orchestrator", "run", cfg_arg, *overrides, "--name", run_name, *(run_flags or [])]
    entrypoint = prefix + " ".join(shlex.quote(a) for a in args)

    excludes = DEFAULT_EXCLUDES + list(extra_excludes or [])
    if not Path(cfg.logging.dir).is_absolute() and Path(cfg.logging.dir).as_posix() != ".":  # old runs' logs
        excludes.append("/" + Path(cfg.logging.dir).as_posix().strip("/"))
    excludes = list(dict.fromkeys(excludes))
    data = cfg.data.path
    keep = {Path(data).as_posix()} if data is not None and not Path(data).is_absolute() else set()
    big = [p for p in large_files(root, excludes, int(max_file_mib * 2**20)) if p not in keep]
    excludes += ["/" + p for p in big]

    runtime_env: dict[str, Any] = {"working_dir": str(root), "excludes": excludes, "env_vars": env}
    _ship_rayward(runtime_env, root, ship_rayward)
    metadata = {"rayward_run": run_name, "rayward_config": str(config), "rayward_overrides": json.dumps(overrides)}
    return Submission(
        run_name, submission_id(run_name), entrypoint, runtime_env, metadata, big, entrypoint_num_cpus, notes
    )


def _checked_here(cfg: Any, root: Path) -> list[str]:
    """The run's checks that can be made on this machine before anything is shipped (the data and the rewards'
    columns, orchestrator/run/build/checks.py check_submission), from the shipped directory as the job's driver
    will see it; their notes on what could not be checked here."""
    from orchestrator.run.build.checks import check_submission

    before = Path.cwd()
    os.chdir(root)
    try:
        return check_submission(cfg, root)
    finally:
        os.chdir(before)


def rayward_modules() -> list[str]:
    """rayward's own packages' directories (a job's py_modules), found without importing them (importing rayward
    imports TRL, torch and PEFT: seconds before a submit that needs none of them)."""
    return [str(Path(importlib.util.find_spec(name).origin).parent) for name in ("orchestrator", "actors", "rayward")]


def _ship_rayward(runtime_env: dict[str, Any], root: Path, ship: bool) -> None:
    if not ship:
        return
    modules = [m for m in rayward_modules() if not _inside(Path(m), root)]
    if modules:
        runtime_env["py_modules"] = modules


def _script_submission(
    script: Path, script_args: list[str], *, name: str | None, working_dir: str | Path | None,
    extra_excludes: list[str] | None, extra_env: list[str] | None, max_file_mib: float, ship_rayward: bool,
    entrypoint_num_cpus: float | None, environ: dict[str, str] | None,
) -> Submission:
    """A Python script as a job: its directory (or working_dir) shipped, `python SCRIPT args` its entrypoint."""
    from orchestrator.trl.trainer import RUN_NAME_ENV

    if not script.is_file():
        raise JobsError(f"script {script} not found")
    try:
        compile(script.read_text(), str(script), "exec")
    except SyntaxError as err:
        raise JobsError(f"script {script}: line {err.lineno}: {err.msg}") from None
    root = Path(working_dir if working_dir is not None else script.parent).resolve()
    if not root.is_dir():
        raise JobsError(f"working dir {working_dir} is not a directory")
    if not _inside(script, root):
        raise JobsError(f"script {script} is not inside the working dir {root}")
    run_name = name or re.sub(r"[^a-z0-9\-]+", "-", script.stem.lower()).strip("-")
    if not RUN_NAME_RE.match(run_name):
        raise JobsError(f"run name {run_name!r} must match {RUN_NAME_RE.pattern} (lowercase, digits, dashes)")
    env = {**forwarded_env(environ, extra_env), RUN_NAME_ENV: run_name}
    args = ["python", script.resolve().relative_to(root).as_posix(), *script_args]
    excludes = list(dict.fromkeys(DEFAULT_EXCLUDES + list(extra_excludes or [])))
    big = large_files(root, excludes, int(max_file_mib * 2**20))
    excludes += ["/" + p for p in big]
    runtime_env: dict[str, Any] = {"working_dir": str(root), "excludes": excludes, "env_vars": env}
    _ship_rayward(runtime_env, root, ship_rayward)
    metadata = {"rayward_run": run_name, "rayward_script": str(script), "rayward_overrides": json.dumps(script_args)}
    return Submission(run_name, submission_id(run_name), " ".join(shlex.quote(a) for a in args), runtime_env,
                      metadata, big, entrypoint_num_cpus)


# ---------------------------------------------------------------------------------------------------------
# Talking to the cluster
# ---------------------------------------------------------------------------------------------------------


def preflight(address: str, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> str:
    """Reach the dashboard's public auth-mode endpoint and set up this process's token; returns the mode.
    Raises JobsError (unreachable, not a Ray dashboard) or AuthError (token required but none found)."""
    import requests

    try:
        r = requests.get(f"{address}/api/authentication_mode", timeout=(timeout_s, timeout_s))
    except requests.exceptions.Timeout:
        raise JobsError(f"no answer from the Ray dashboard at {address} within {timeout_s:.0f}s "
                        "(wrong host/port, or a firewall); the Jobs address is http://HEAD:8265") from None
    except requests.exceptions.RequestException as err:
        text = str(err).lower()
        reason = ("connection refused" if "refused" in text else
                  "unknown host" if "resolve" in text or "name or service" in text else type(err).__name__)
        raise JobsError(f"cannot reach the Ray dashboard at {address} ({reason}); is the cluster up, and is this "
                        "its dashboard address (http://HEAD:8265)?") from None
    try:
        mode = r.json().get("authentication_mode", "disabled") if r.status_code == 200 else None
    except ValueError:
        mode = None
    if mode is None:
        raise JobsError(f"{address}/api/authentication_mode answered HTTP {r.status_code}: not the dashboard of "
                        "a Ray >= 2.52 cluster (the Jobs address is http://HEAD:8265)")
    prepare_client_auth()
    if mode == "token" and os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        _, where = find_token()
        raise AuthError(f"the Ray cluster at {address} requires a token and none was found ({where}); set "
                        "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH (get it with `ray get-auth-token` on the head), "
                        "or put it in ~/.ray/auth_token")
    return mode


def _one_line(err: BaseException, address: str) -> str:
    auth = explain_auth_failure(err, address)
    if auth:
        return auth
    text = str(err).strip()
    m = re.search(r"status code (\d+): (.*)", text, re.S)
    if m:
        text = f"HTTP {m.group(1)}: {m.group(2)}"
    return text.splitlines()[0].rstrip(".") if text else type(err).__name__


@contextmanager
def _ray_errors(address: str) -> Iterator[None]:
    """Ray's exceptions as one-line JobsErrors."""
    try:
        yield
    except (JobsError, AuthError, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - ConnectionError, AuthenticationError, RuntimeError(HTTP ...)
        raise JobsError(_one_line(err, address)) from None


def connect(address: str):
    """A JobSubmissionClient for the dashboard at `address` (checked with preflight first)."""
    preflight(address)
    from ray.job_submission import JobSubmissionClient

    # RAY_API_SERVER_ADDRESS overrides the client's address argument (Ray 2.60); make them agree.
    saved = os.environ.get("RAY_API_SERVER_ADDRESS")
    os.environ["RAY_API_SERVER_ADDRESS"] = address
    try:
        with _ray_errors(address):
            return JobSubmissionClient(address)
    finally:
        if saved is None:
            os.environ.pop("RAY_API_SERVER_ADDRESS", None)
        else:
            os.environ["RAY_API_SERVER_ADDRESS"] = saved


def _is_404(err: BaseException) -> bool:
    return "status code 404" in str(err) or "does not exist" in str(err)


def resolve(client, address: str, run: str):
    """JobDetails of a run name (`rayward-<run>`), a submission id or a Ray job id; JobsError if none."""
    tried = []
    for candidate in dict.fromkeys([submission_id(run), run]):
        tried.append(candidate)
        try:
            return client.get_job_info(candidate)
        except Exception as err:  # noqa: BLE001
            if not _is_404(err):
                raise JobsError(_one_line(err, address)) from None
    raise JobsError(f"no run or job {run!r} on the cluster at {address} (tried {', '.join(tried)}); "
                    "`rayward list` shows the runs")


def _fmt_time(ms: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"


def run_name_of(info) -> str:
    meta = info.metadata or {}
    sid = info.submission_id or ""
    return meta.get("rayward_run") or (sid[len(SUBMISSION_PREFIX):] if sid.startswith(SUBMISSION_PREFIX) else sid)


def run_actors(address: str, run_name: str) -> list[dict[str, Any]]:
    """The run's actors (namespace rayward-<run>) from Ray's state API: name, class, state, pid, node."""
    from ray.util.state import list_actors

    from orchestrator.run.cluster import namespace

    with _ray_errors(address):
        actors = list_actors(
            address=address, filters=[("ray_namespace", "=", namespace(run_name))], limit=1000,
            timeout=15, raise_on_missing_output=False,
        )
    return [
        {"name": a.name, "class_name": a.class_name, "state": a.state, "pid": a.pid, "node_id": a.node_id}
        for a in actors
    ]


# ---------------------------------------------------------------------------------------------------------
# Commands (each returns the process exit code; JobsError / AuthError / ConfigError go to the CLI)
# ---------------------------------------------------------------------------------------------------------


def submit(sub: Submission, address: str, *, follow: bool = False, out=sys.stdout) -> int:
    client = connect(address)
    try:
        client.get_job_info(sub.submission_id)
    except Exception as err:  # noqa: BLE001
        if not _is_404(err):
            raise JobsError(_one_line(err, address)) from None
    else:
        raise JobsError(f"a job {sub.submission_id!r} already exists on {address}: pick another --name "
                        f"(or `rayward stop {sub.run_name}` / delete it first)")
    if sub.excluded_large:
        print(f"rayward submit: not uploading {len(sub.excluded_large)} large file(s): "
              f"{', '.join(sub.excluded_large[:5])}{' ...' if len(sub.excluded_large) > 5 else ''}", file=sys.stderr)
    with _ray_errors(address):
        sid = client.submit_job(
            entrypoint=sub.entrypoint, submission_id=sub.submission_id, runtime_env=sub.runtime_env,
            metadata=sub.metadata, entrypoint_num_cpus=sub.entrypoint_num_cpus,
        )
    print(f"rayward submit: run {sub.run_name!r} submitted as job {sid}", file=out)
    print(f"  dashboard: {dashboard_job_url(address, sid)}", file=out)
    print(f"  follow:    rayward logs -f {sub.run_name} --address {address}", file=out, flush=True)
    if follow:
        return logs(address, sub.run_name, follow=True, out=out)
    return 0


def status(address: str, run: str, *, show_actors: bool = True, as_json: bool = False, out=sys.stdout) -> int:
    client = connect(address)
    info = resolve(client, address, run)
    name = run_name_of(info)
    actors = run_actors(address, name) if show_actors and info.status == "RUNNING" else []
    if as_json:
        print(json.dumps({
            "run": name, "submission_id": info.submission_id, "status": str(info.status), "message": info.message,
            "start_time": info.start_time, "end_time": info.end_time, "entrypoint": info.entrypoint,
            "actors": actors,
        }), file=out)
        return 0
    print(f"run {name}: {info.status}  (job {info.submission_id})", file=out)
    if info.message:
        print(f"  message:   {info.message.strip().splitlines()[0]}", file=out)
    print(f"  started:   {_fmt_time(info.start_time)}   ended: {_fmt_time(info.end_time)}", file=out)
    print(f"  dashboard: {dashboard_job_url(address, info.submission_id)}", file=out)
    if actors:
        print(f"  actors ({len(actors)}, namespace rayward-{name}):", file=out)
        for a in sorted(actors, key=lambda a: a["name"] or ""):
            print(f"    {a['name'] or '-':32s} {a['class_name']:14s} {a['state']:10s} pid {a['pid']}", file=out)
    return 0


def logs(address: str, run: str, *, follow: bool = False, out=sys.stdout) -> int:
    """Print the job's driver log; with follow, stream it until the job ends and exit with its outcome
    (0 SUCCEEDED, 1 FAILED or STOPPED)."""
    client = connect(address)
    info = resolve(client, address, run)
    sid = info.submission_id
    if not follow:
        with _ray_errors(address):
            out.write(client.get_job_logs(sid))
        out.flush()
        return 0

    async def tail() -> None:
        async for chunk in client.tail_job_logs(sid):
            out.write(chunk)
            out.flush()

    with _ray_errors(address):
        asyncio.run(tail())
        final = client.get_job_info(sid)
    print(f"rayward: run {run_name_of(final)} {final.status}"
          + (f": {final.message.strip().splitlines()[0]}" if final.message and final.status != "SUCCEEDED" else ""),
          file=sys.stderr)
    return 0 if final.status == "SUCCEEDED" else 1


def stop(address: str, run: str, *, wait_s: float = 30.0, out=sys.stdout) -> int:
    client = connect(address)
    info = resolve(client, address, run)
    sid, name = info.submission_id, run_name_of(info)
    if info.status in TERMINAL:
        print(f"rayward stop: run {name} already {info.status}", file=out)
        return 0
    with _ray_errors(address):
        client.stop_job(sid)
        deadline = time.monotonic() + wait_s
        st = client.get_job_status(sid)
        while st not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.5)
            st = client.get_job_status(sid)
    if st in TERMINAL:
        print(f"rayward stop: run {name} {st}", file=out)
        return 0
    hint = " (a job PENDING for resources ignores stop until RAY_JOB_START_TIMEOUT_SECONDS)" if st == "PENDING" else ""
    print(f"rayward stop: asked run {name} to stop; still {st} after {wait_s:.0f}s{hint}", file=out)
    return 1


def list_runs(address: str, *, show_all: bool = False, as_json: bool = False, out=sys.stdout) -> int:
    client = connect(address)
    with _ray_errors(address):
        jobs = client.list_jobs()
    rows = []
    for j in sorted(jobs, key=lambda j: j.start_time or 0):
        sid = j.submission_id or ""
        if not show_all and not ((j.metadata or {}).get("rayward_run") or sid.startswith(SUBMISSION_PREFIX)):
            continue
        rows.append({"run": run_name_of(j) if sid else "-", "submission_id": sid or j.job_id,
                     "status": str(j.status), "start_time": j.start_time, "end_time": j.end_time})
    if as_json:
        print(json.dumps(rows), file=out)
        return 0
    if not rows:
        print(f"no rayward runs on {address}" + ("" if show_all else " (--all lists every job)"), file=out)
        return 0
    print(f"{'RUN':28s} {'STATUS':10s} {'STARTED':19s}  SUBMISSION ID", file=out)
    for r in rows:
        print(f"{r['run']:28s} {r['status']:10s} {_fmt_time(r['start_time']):19s}  {r['submission_id']}", file=out)
    return 0


def guarded(command: str, fn, *args: Any, **kwargs: Any) -> int:
    """Run a jobs command for the CLI: known failures become `rayward COMMAND: message` and exit 1."""
    from orchestrator.config import ConfigError

    try:
        return fn(*args, **kwargs)
    except ConfigError:
        raise  # the CLI prints it (multi-line: every bad field) and exits 2
    except (JobsError, AuthError) as err:
        print(f"rayward {command}: {err}", file=sys.stderr)
        return 1
