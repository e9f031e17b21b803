"""scripts/gpu_smoke.sh on this machine: without CUDA it skips in one line, and `--device cpu` runs every check's
code on the CPU (gloo for NCCL, bfloat16 on the CPU) and passes, so that the kit's first run on a GPU tests the
GPU paths, not the kit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.gpu.smoke import CHECKS

pytestmark = pytest.mark.slow  # runs the kit in a process of its own
ROOT = Path(__file__).resolve().parents[4]
NO_LIMIT = {"RAYWARD_SMOKE_TIMEOUT_S": "86400"}  # the kit's own time limits are for the GPU host, not this machine


def run_kit(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, **NO_LIMIT}
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_smoke.sh"), *args], env=env, capture_output=True,
                          text=True, check=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the path of a machine without CUDA")
def test_without_cuda_the_kit_says_so_in_one_line_and_exits_0():
    out = run_kit()
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 1 and out.stdout.startswith("gpu_smoke: skipped, no CUDA device")


def test_the_dry_run_on_the_cpu_passes_every_check_a_cpu_can_run():
    out = run_kit("--device", "cpu", "--budget-s", "86400")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    rows = {line.split(": ", 2)[1]: line for line in out.stdout.splitlines()
            if line.startswith("gpu_smoke: ") and line.count(": ") >= 2}
    assert set(rows) == {name for name, _ in CHECKS}, sorted(rows)
    assert rows["packing flash-attn"].startswith("gpu_smoke: packing flash-attn: skip") and "needs CUDA" in \
        rows["packing flash-attn"]
    assert all(": ok (" in line for name, line in rows.items() if name != "packing flash-attn"), rows
    table = out.stdout.split("\n\n")[1].splitlines()  # the table: a header and one row per check
    assert table[0].split() == ["check", "result", "time", "detail"] and len(table) == 1 + len(CHECKS)


def test_the_kit_and_the_learner_path_need_none_of_the_packages_a_bare_gpu_host_lacks():
    """With Ray, vLLM, TRL, pydantic, pytest and peft all missing (as `None` in sys.modules:
    importing them fails, find_spec says absent), the kit and every learner module it drives import, and the
    rendezvous address falls back to loopback (actors/runtime/net.py), which the FSDP and weight-group checks need."""
    missing = ["ray", "vllm", "trl", "datasets", "pydantic", "pytest", "hypothesis", "peft"]
    code = "\n".join([
        "import sys",
        *(f"sys.modules[{name!r}] = None" for name in missing),
        "import tests.gpu.smoke, actors.learner.learner, actors.learner.checkpoint, actors.weights.sender",
        "from actors.runtime.net import node_ip",
        "assert node_ip() == '127.0.0.1', node_ip()",
        "print('ok')",
    ])
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
