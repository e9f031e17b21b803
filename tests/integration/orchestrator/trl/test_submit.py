"""`python -m orchestrator submit train_grpo.py`: TRL's documented quick start, its GRPOConfig with every
TRL default (bf16 on, no use_cpu), as a Ray job on a head without a GPU (a `ray start --head` of this machine,
token auth on, as tests/integration/orchestrator/cli/test_jobs.py starts it): the script runs on the head,
where TRL would refuse its config, and trains there."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.fixtures.trl_scripts.run_script import HERE, model_path, script_source
from tests.integration.orchestrator.cli import test_jobs
from tests.integration.orchestrator.cli.test_jobs import RayHead, client_env, jobs_api

pytestmark = pytest.mark.timeout(900)

# The job's start on the head (Ray's runtime env, then the run's: a vLLM engine, the workers) and its 6 steps,
# on a shared 2-core machine.
JOB_TIMEOUT_S = 600
ENDED = {"SUCCEEDED", "FAILED", "STOPPED"}


# A `ray start --head` of this module's own, as test_jobs.py starts its (skipped without a Ray token).
head = test_jobs.head


def wait_ended(head: RayHead, job: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while (info := jobs_api(head, job))["status"] not in ENDED and time.monotonic() < deadline:
        time.sleep(3)
    return info


def test_trls_documented_quickstart_is_submitted_and_trains_on_a_head_without_a_gpu(head, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train_grpo.py").write_text(script_source(HERE / "docs_quickstart.py", "rayward"))
    name = f"trl-docs-{random.randrange(16**4):04x}"
    out = tmp_path / "out"
    # this checkout's rayward submits (and ships) it; HF_* go with the job, --env the rest
    env = client_env(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                     TRANSFORMERS_OFFLINE="1")
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", "submit", "train_grpo.py", "--name", name,
         "--address", head.address, "--env", f"MODEL={model_path('tiny')}", "--env", f"OUTPUT_DIR={out}",
         "--env", "OMP_NUM_THREADS=1"],
        cwd=project, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    head.snapshot()
    info = wait_ended(head, f"rayward-{name}", JOB_TIMEOUT_S)
    logs = jobs_api(head, f"rayward-{name}/logs")["logs"]
    assert info["status"] == "SUCCEEDED", f"{info['status']}: {info.get('message')}\n{logs[-4000:]}"
    result = json.loads([x for x in logs.splitlines() if x.startswith("RESULT ")][-1][len("RESULT "):])
    assert result["defaults"] == {"bf16": True, "use_cpu": False}
    assert result["global_step"] == result["max_steps"] == 6, result
    # the run is named as submitted: its files beside output_dir, under that name
    rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "loss" in row] == list(range(1, 7))
