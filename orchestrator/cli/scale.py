"""`rayward scale RUN ...`: resize a running run's pool (reward workers, environment workers, a judge's or the
teacher's engines) or set its autoscaling bounds, or resize its generator fleet (`--generators N`: left in the run's
control mailbox `RUN/control`, applied by the driver at its next step boundary, orchestrator/loop/fleet.py), through
the dashboard address like every other client command.

The client (`scale`) submits a small Ray job whose driver joins the cluster from inside it and calls the pool's
`scale` or `set_bounds` (`apply`: this module run as `python -m orchestrator.cli.scale`), waits for the job, and
reads the pool's answer from its log: the laptop needs only the dashboard port (8265, what `kubectl port-forward` and
an ssh tunnel forward) and the token, never the GCS port. The job ships rayward's own packages as `rayward submit`
does, so the cluster runs the client's code; it is deleted once answered and never listed as a run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from actors.runtime.autoscale import AutoscaleSettings
from actors.types import PoolStats
from orchestrator.cli.jobs import (
    TERMINAL,
    JobsError,
    ScaleRefused,
    _one_line,
    _ray_errors,
    connect,
    rayward_modules,
)
from orchestrator.config import (
    DEFAULT_DOWNSCALE_DELAY_S,
    DEFAULT_LOOK_BACK_S,
    DEFAULT_TARGET_UTILIZATION,
    DEFAULT_UPSCALE_DELAY_S,
)

POOLS = ("reward", "env", "judge", "teacher")
# What is pinned at a count only (no autoscaling bounds): the generator fleet, resized by the driver itself.
FLEETS = ("generators",)
# The job's answer on its log, one line each (the job's driver prints exactly one of them).
RESULT = "RAYWARD_SCALE_RESULT "
REFUSED = "RAYWARD_SCALE_REFUSED "
# Submission ids `scale-<run>-<random>`: not `rayward-`, so `rayward list` never shows one as a run.
JOB_PREFIX = "scale-"
# The job: a Python process with Ray starting on the head (seconds; more while a run loads models beside it), one
# pool call, the answer. Past this the job is stopped and the command fails saying so.
SCALE_TIMEOUT_S = 180.0
POLL_S = 0.5


@dataclass(frozen=True)
class ScaleRequest:
    """One `rayward scale`: a pool pinned at `count`, or its autoscaling bounds set (min_workers, max_workers)."""

    run: str
    pool: str = "reward"  # one of POOLS, or FLEETS (a count only)
    count: int | None = None
    min_workers: int | None = None
    max_workers: int | None = None
    judge: str | None = None  # the judge reward whose engines (pool "judge"); None: the run's only one

    def argv(self) -> list[str]:
        """The job's arguments (`main`'s)."""
        out = [self.run, "--pool", self.pool]
        for flag, value in (("--count", self.count), ("--min", self.min_workers), ("--max", self.max_workers),
                            ("--judge", self.judge)):
            if value is not None:
                out += [flag, str(value)]
        return out


def fresh_autoscale(request: ScaleRequest) -> AutoscaleSettings | None:
    """With both bounds: the settings a pool without autoscaling starts from (the config's defaults); ScaleRefused
    for bounds out of order, before anything is asked of the cluster."""
    lo, hi = request.min_workers, request.max_workers
    if lo is None or hi is None:
        return None
    if not 1 <= lo <= hi:
        raise ScaleRefused(f"{request.run}: {request.pool} autoscaling needs 1 <= min_workers <= max_workers, got "
                           f"{lo}..{hi}")
    return AutoscaleSettings(lo, hi, target_utilization=DEFAULT_TARGET_UTILIZATION, look_back_s=DEFAULT_LOOK_BACK_S,
                             upscale_delay_s=DEFAULT_UPSCALE_DELAY_S, downscale_delay_s=DEFAULT_DOWNSCALE_DELAY_S)


# --- the client: a job through the dashboard ---------------------------------------------------------------


def scale(address: str, request: ScaleRequest, timeout_s: float = SCALE_TIMEOUT_S) -> PoolStats:
    """The request applied by a job on the cluster at dashboard `address`; returns the pool's state after it.
    JobsError when the dashboard cannot be reached or the job fails; ScaleRefused for a run or pool that does not
    exist or a change the pool refuses (its own message)."""
    fresh_autoscale(request)  # bad bounds fail before anything is sent
    client = connect(address)
    sid = f"{JOB_PREFIX}{request.run}-{uuid.uuid4().hex[:8]}"
    entrypoint = " ".join(["python", "-m", "orchestrator.cli.scale", *request.argv()])
    with _ray_errors(address):
        client.submit_job(entrypoint=entrypoint, submission_id=sid, entrypoint_num_cpus=0,
                          runtime_env={"py_modules": rayward_modules()}, metadata={"rayward_scale": request.run})
    try:
        status = _wait(client, address, sid, timeout_s)
        with _ray_errors(address):
            log = client.get_job_logs(sid)
    finally:
        try:
            client.delete_job(sid)
        except Exception:  # noqa: BLE001 - a job left listed is harmless; the answer is what matters
            pass
    return _answer(log, status, address)


def _wait(client: Any, address: str, sid: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status = str(client.get_job_status(sid))
        except Exception as err:  # noqa: BLE001
            raise JobsError(_one_line(err, address)) from None
        if status.rsplit(".", 1)[-1] in TERMINAL:
            return status
        if time.monotonic() > deadline:
            client.stop_job(sid)
            raise JobsError(f"the scale job {sid} did not finish within {timeout_s:.0f}s on {address} (status "
                            f"{status}): is the cluster short of room to start a driver?")
        time.sleep(POLL_S)


def _answer(log: str, status: str, address: str) -> PoolStats:
    for line in log.splitlines():
        if line.startswith(RESULT):  # the pool's own record (a reward pool's adds global_step): the common fields
            answer = json.loads(line[len(RESULT):])
            return PoolStats(**{f.name: answer[f.name] for f in dataclasses.fields(PoolStats) if f.name in answer})
        if line.startswith(REFUSED):
            raise ScaleRefused(line[len(REFUSED):])
    last = next((x for x in reversed(log.splitlines()) if x.strip()), "(no output)")
    raise JobsError(f"the scale job on {address} ended {status.rsplit('.', 1)[-1]} without an answer: {last}")


# --- the job: inside the cluster ---------------------------------------------------------------------------


def apply(request: ScaleRequest, address: str = "auto") -> PoolStats:
    """Join the cluster (inside a job: its own) and apply the request to the run's pool; returns its state after.
    ScaleRefused for no such run or pool, or a change the pool refuses."""
    import ray
    from ray.exceptions import RayTaskError

    from orchestrator.run.cluster import namespace

    fresh = fresh_autoscale(request)
    if not ray.is_initialized():
        ray.init(address=address, namespace=namespace(request.run), log_to_driver=False)
    run = request.run
    if request.pool in FLEETS:
        return _scale_generators(run, request.count)
    role = _judge_role(run, request.judge) if request.pool == "judge" else request.pool
    try:
        handle = ray.get_actor(f"{run}/{role}-pool", namespace=namespace(run))
    except ValueError:
        what = {"reward": "no run named", "env": "no environment pool (no tools or environment_factory) in run",
                "teacher": "no distillation teacher in run"}.get(request.pool,
                                                                 f"no judge reward {request.judge!r} in run")
        raise ScaleRefused(f"{what} {run!r} on this cluster (no actor {run}/{role}-pool)") from None
    try:
        if request.count is not None:
            return ray.get(handle.scale.remote(request.count))
        return ray.get(handle.set_bounds.remote(request.min_workers, request.max_workers, fresh=fresh))
    except RayTaskError as err:  # the pool refused (e.g. bounds out of order): its message, not a traceback
        raise ScaleRefused(f"{run}: {getattr(err, 'cause', None) or err}") from None


def _scale_generators(run: str, count: int | None) -> PoolStats:
    """Leave the request in the run's control mailbox; its answer: the fleet as the driver last reported it,
    heading to `count` (the driver applies it at its next step boundary and says so in its log)."""
    import ray
    from ray.exceptions import RayTaskError

    from orchestrator.run.cluster import namespace

    if count is None:
        raise ScaleRefused(f"{run}: the generator fleet takes a count (--generators N), not autoscaling bounds")
    try:
        handle = ray.get_actor(f"{run}/control", namespace=namespace(run))
    except ValueError:
        raise ScaleRefused(f"no run named {run!r} on this cluster (no actor {run}/control)") from None
    try:
        return ray.get(handle.scale_generators.remote(count))
    except RayTaskError as err:  # e.g. fewer than one generator: the mailbox's message
        raise ScaleRefused(f"{run}: {getattr(err, 'cause', None) or err}") from None


def _judge_role(run: str, judge: str | None) -> str:
    """The pool role of the run's judge reward `judge` (`judge-<reward>`); None: the run's only judge reward's
    (ScaleRefused when it has none or several)."""
    if judge is not None:
        return f"judge-{judge}"
    from ray.util import list_named_actors

    from orchestrator.run.cluster import namespace

    prefix = f"{run}/judge-"
    names = [a["name"] if isinstance(a, dict) else a for a in list_named_actors(all_namespaces=True)
             if not isinstance(a, dict) or a.get("namespace") == namespace(run)]
    found = sorted(n[len(prefix):-len("-pool")] for n in names if n.startswith(prefix) and n.endswith("-pool"))
    if len(found) != 1:
        raise ScaleRefused(f"{run}: " + ("no judge reward in this run" if not found else
                                         f"the run has judge rewards {found}: name one with --judge REWARD"))
    return f"judge-{found[0]}"


def main(argv: list[str] | None = None) -> int:
    """The job's driver: one request, its answer as one RESULT or REFUSED line; exit 0 or 2."""
    p = argparse.ArgumentParser(prog="python -m orchestrator.cli.scale")
    p.add_argument("run")
    p.add_argument("--pool", choices=POOLS + FLEETS, default="reward")
    p.add_argument("--count", type=int)
    p.add_argument("--min", dest="min_workers", type=int)
    p.add_argument("--max", dest="max_workers", type=int)
    p.add_argument("--judge")
    request = ScaleRequest(**vars(p.parse_args(argv)))
    from orchestrator.cli.auth import prepare_client_auth

    prepare_client_auth()  # a job's driver inherits the token's place, as any client finds it
    try:
        stats = apply(request)
    except ScaleRefused as err:
        print(REFUSED + str(err), flush=True)
        return 2
    print(RESULT + json.dumps(asdict(stats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
