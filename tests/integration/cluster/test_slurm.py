"""cluster/slurm/rayward.sbatch on a real SLURM: munged, slurmctld and slurmd of this test's own on this machine
(tests/fixtures/slurm.py; skipped, saying why, where they cannot be had), the demo sbatch'ed through the launcher.

  cancelled   the demo (N steps) is sbatch'ed; past STOP_AFTER steps it is `scancel`led: SLURM sends SIGTERM to
              every process of the job (the Ray head's step too) and SIGKILL KillWait later. The driver finishes
              its step and checkpoints (exit 143) while the Ray processes, SIGTERM blocked, hold on; the job ends
              CANCELLED, before KillWait (its Ray node ended itself), and none of its processes is left.
  requeued    the same sbatch line again (same --name): it continues from that checkpoint (`--resume auto`). Past
              STOP_AFTER more steps the batch shell gets SIGUSR1, what `#SBATCH --signal=B:USR1@S` sends S
              seconds before the time limit (here by `scancel --batch --signal=USR1`): checkpoint, exit 143, the
              job requeues itself, and its second start continues from the second checkpoint to step N: COMPLETED.
  shared      two jobs on one node at once, each granted one CPU, each a `python script.py` driver (the TRL
              drop-in's way in: RAY_ADDRESS): each joins its own cluster (its own ports) of one CPU.
Checks across the first two: metrics.jsonl holds steps 1..N once each, in order (each start continued from the
checkpoint of the one before: no step trained twice, none skipped), the job states from `sacct -c`, and the driver's
exit codes from the job output. The Ray token comes from RAY_AUTH_TOKEN_PATH (a file of this test's own)."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures.cluster import client_env
from tests.fixtures.slurm import KILL_WAIT_S, LocalSlurm, SlurmUnavailable

pytestmark = pytest.mark.timeout(1800)

SBATCH = ROOT / "cluster" / "slurm" / "rayward.sbatch"
RUN = "slurm-demo"
N = 30  # the run's steps: a few seconds of training on this machine, the rest is each start's Ray and vLLM
STOP_AFTER = 3  # steps each start trains before the test interrupts it
JOB_CPUS = 2  # the demo's actors ask for 1.5 CPUs (learner, generator, two reward workers)
START_S = 600  # a start's Ray head, vLLM engine and learner on a loaded 2-core machine, with a retry of `ray start`
SHARED_S = 300  # the two script jobs, both up at once


@pytest.fixture(scope="module")
def slurm(request: pytest.FixtureRequest):
    failed_before = request.session.testsfailed
    s = LocalSlurm()
    try:
        s.up()
    except SlurmUnavailable as err:
        s.down()
        pytest.skip(f"no local SLURM: {err}")
    try:
        yield s
    finally:
        s.down()
        if request.session.testsfailed > failed_before:
            print(f"\nSLURM state and logs kept in {s.dir}")
        else:
            shutil.rmtree(s.dir, ignore_errors=True)


@pytest.fixture
def job_env(tmp_path: Path) -> dict[str, str]:
    """What a user's login shell hands sbatch (it exports it to the job): this checkout importable, a token file."""
    token = tmp_path / "ray_token"
    token.write_text(secrets.token_hex(16))
    token.chmod(0o600)
    env = client_env()
    env.pop("RAY_AUTH_TOKEN", None)
    return {**env, "RAY_AUTH_TOKEN_PATH": str(token)}


def _steps(metrics: Path) -> list[int]:
    if not metrics.exists():
        return []
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.endswith("}")]


def _wait(pred, what: str, timeout: float, out: Path, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for: {what}\n--- job output ---\n{_tail(out)}")


def _tail(path: Path, n: int = 6000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no output yet)"


def _left_over(job: int) -> list[str]:
    """Processes of the job's Ray nodes still alive (their temp dir names the job)."""
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if f"/tmp/rayward-{job}" in line and "ps -eo" not in line]


def test_scancel_checkpoints_and_the_resubmitted_job_requeues_itself_and_finishes(slurm, job_env, tmp_path):
    runs = tmp_path / "runs"
    metrics = runs / RUN / "metrics.jsonl"

    def submit() -> tuple[int, Path]:
        job = slurm.sbatch(["--cpus-per-task", str(JOB_CPUS), "-o", str(tmp_path / "job-%j.out"), str(SBATCH),
                            "--python", sys.executable, str(ROOT / "configs" / "demo.yaml"),
                            f"grpo.max_steps={N}", f"logging.dir={runs}", "--name", RUN], cwd=tmp_path, env=job_env)
        return job, tmp_path / f"job-{job}.out"

    def training_past(step: int, job: int, out: Path) -> bool:
        if len(_steps(metrics)) >= step:
            return True
        assert slurm.active(job), f"job {job} ended before step {step}:\n{_tail(out)}"
        return False

    # 1. scancel mid-run: checkpoint, exit 143, CANCELLED, and gone before KillWait's SIGKILL
    a, out_a = submit()
    _wait(lambda: training_past(STOP_AFTER, a, out_a), f"job {a} past step {STOP_AFTER}", START_S, out_a)
    slurm.scancel(str(a))
    t_cancel = time.monotonic()
    _wait(lambda: slurm.active(a) is None, f"job {a} to leave the queue", KILL_WAIT_S * 3, out_a)
    t_gone = time.monotonic() - t_cancel
    text_a = out_a.read_text()
    k = _steps(metrics)[-1]
    assert _steps(metrics) == list(range(1, k + 1)), _steps(metrics)
    assert (f"rayward: stopped at step {k} (SIGTERM); checkpoint" in text_a
            and (runs / RUN / f"checkpoint-{k}").is_dir()), (
        f"no checkpoint at the step the cancelled run reached ({k}): did Ray's processes die with SIGTERM?\n"
        f"{_tail(out_a)}")
    assert "rayward-slurm: driver exited with 143" in text_a, _tail(out_a)
    assert [s for s, _ in slurm.records(a)] == ["CANCELLED"], slurm.records(a)
    # Its Ray node ended itself once the driver was done: SLURM's SIGKILL (KillWait after the SIGTERM) was not needed.
    assert t_gone < KILL_WAIT_S, f"job {a} took {t_gone:.0f}s to end after scancel (KillWait {KILL_WAIT_S}s)"
    assert not _left_over(a), _left_over(a)

    # 2. the same sbatch again: continues from checkpoint-k; the time-limit warning checkpoints and requeues it
    b, out_b = submit()
    _wait(lambda: training_past(k + STOP_AFTER, b, out_b), f"job {b} past step {k + STOP_AFTER}", START_S, out_b)
    slurm.scancel("--batch", "--signal=USR1", str(b))
    _wait(lambda: slurm.restarts(b) >= 1, f"job {b} to requeue itself", START_S, out_b)
    _wait(lambda: slurm.active(b) is None, f"job {b}'s second start to finish the run", 2 * START_S, out_b)
    text_b = out_b.read_text()
    k2 = int(re.search(r"rayward: stopped at step (\d+) \(SIGTERM\); checkpoint", text_b).group(1))
    assert k < k2 < N and (runs / RUN / f"checkpoint-{k2}").is_dir(), (k, k2)
    assert f"rayward: resumed from {runs / RUN}/checkpoint-{k} at step {k}" in text_b, _tail(out_b)
    assert f"rayward: resumed from {runs / RUN}/checkpoint-{k2} at step {k2}" in text_b, _tail(out_b)
    assert "got SIGUSR1 (time limit near)" in text_b and f"requeued job {b}" in text_b, _tail(out_b)
    exits = re.findall(r"rayward-slurm: driver exited with (\d+)", text_b)
    assert exits == ["143", "0"], exits
    recs = slurm.records(b)
    # the requeue is logged as the state the job went back to (PENDING here; REQUEUED with slurmdbd)
    assert len(recs) == 2 and recs[0][0] in ("PENDING", "REQUEUED") and recs[1] == ("COMPLETED", "0:0"), recs

    # 3. three starts, one run: every step once, in order
    assert _steps(metrics) == list(range(1, N + 1)), _steps(metrics)
    assert not _left_over(b), _left_over(b)


SCRIPT = '''
import json, os, sys, time
from pathlib import Path
import ray
ray.init(log_to_driver=False)  # RAY_ADDRESS, set by the launcher: this job's cluster
here = Path(sys.argv[1])
(here / f"{os.environ['SLURM_JOB_ID']}.json").write_text(json.dumps({
    "address": os.environ["RAY_ADDRESS"], "gcs": ray.get_runtime_context().gcs_address,
    "nodes": sum(n["Alive"] for n in ray.nodes()), "cpus": ray.cluster_resources().get("CPU")}))
deadline = time.monotonic() + float(sys.argv[2])
while len(list(here.glob("*.json"))) < 2:  # both jobs' clusters up at once
    assert time.monotonic() < deadline, "the other job's cluster never came up"
    time.sleep(1)
'''


def test_two_jobs_on_one_node_run_their_own_clusters(slurm, job_env, tmp_path):
    script = tmp_path / "my_script.py"
    script.write_text(SCRIPT)
    seen = tmp_path / "seen"
    seen.mkdir()
    jobs = [slurm.sbatch(["--cpus-per-task", "1", "-o", str(tmp_path / "job-%j.out"), str(SBATCH),
                          "--python", sys.executable, "--", sys.executable, str(script), str(seen), str(SHARED_S)],
                         cwd=tmp_path, env=job_env) for _ in range(2)]
    outs = [tmp_path / f"job-{j}.out" for j in jobs]
    for j, out in zip(jobs, outs, strict=True):
        _wait(lambda j=j: slurm.active(j) is None, f"job {j} to finish", START_S, out)
    for j, out in zip(jobs, outs, strict=True):
        assert slurm.records(j) == [("COMPLETED", "0:0")], f"{slurm.records(j)}\n{_tail(out)}"
    info = [json.loads((seen / f"{j}.json").read_text()) for j in jobs]
    assert info[0]["gcs"] == info[0]["address"] and info[1]["gcs"] == info[1]["address"], info
    assert info[0]["address"] != info[1]["address"], info  # each its own port block
    assert all(i["nodes"] == 1 and i["cpus"] == 1.0 for i in info), info  # the one CPU SLURM granted each
