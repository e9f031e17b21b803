"""rayward's Jobs-API client without a cluster: the submission it builds (runtime_env, excludes, env, ids),
the step -> gauge mapping, and bad input failing fast with one line (CLI run as a subprocess)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.cli import jobs
from orchestrator.config import ConfigError
from orchestrator.run.cluster import ACTOR_ENV
from tests.conftest import ROOT

DEMO = ROOT / "configs" / "demo.yaml"


@pytest.fixture
def project(tmp_path):
    """A user's project directory: config, reward module, data, and things that must not be uploaded."""
    p = tmp_path / "proj"
    (p / "configs").mkdir(parents=True)
    (p / "configs" / "run.yaml").write_text(DEMO.read_text())
    (p / "my_rewards.py").write_text("def r(completions, **kw):\n    return [0.0] * len(completions)\n")
    (p / "data").mkdir()
    row = '{"prompt": "Write the letter a:", "letter": "a", "pad": "%s"}\n' % ("x" * 1000)
    (p / "data" / "big.jsonl").write_text(row * 3100)  # large (over --max-file-mib 1), but the config's dataset
    (p / "blob.dat").write_bytes(b"x" * (3 * 2**20))  # large, not referenced
    (p / "model.safetensors").write_bytes(b"x" * 10)
    (p / ".git").mkdir()
    (p / ".git" / "HEAD").write_text("ref")
    (p / "runs" / "old").mkdir(parents=True)
    (p / "runs" / "old" / "metrics.jsonl").write_text("{}")
    (p / ".venv" / "lib").mkdir(parents=True)
    (p / ".venv" / "lib" / "x.py").write_text("")
    return p


def uploaded_files(root: Path, excludes: list[str]) -> set[str]:
    """The files Ray's own packaging would zip for this working_dir and excludes."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    files: set[str] = set()
    _dir_travel(root, [_get_excludes(root, excludes)],
                lambda p: files.add(p.relative_to(root).as_posix()) if p.is_file() else None, include_gitignore=True)
    return files


def test_submission_naming_entrypoint_and_metadata(project, monkeypatch):
    monkeypatch.chdir(project)
    sub = jobs.build_submission("configs/run.yaml", ["grpo.max_steps=3", "data.path=data/big.jsonl"], name="exp-1",
                                working_dir=".", environ={}, max_file_mib=1)
    assert sub.submission_id == "rayward-exp-1" == jobs.submission_id("exp-1")
    assert sub.entrypoint == ("python -m orchestrator run configs/run.yaml grpo.max_steps=3 data.path=data/big.jsonl "
                              "cluster.address=auto --name exp-1")
    assert sub.metadata["rayward_run"] == "exp-1"
    flagged = jobs.build_submission("configs/run.yaml", [], name="exp-1", environ={},
                                    run_flags=["--verbose", "--debug"])
    assert flagged.entrypoint.endswith("--name exp-1 --verbose --debug")  # `rayward submit -v --debug`
    assert sub.runtime_env["working_dir"] == str(project)
    assert "py_modules" in sub.runtime_env  # rayward's packages are not inside this working_dir: shipped
    shipped = sorted(Path(m).name for m in sub.runtime_env["py_modules"])
    assert shipped == ["actors", "orchestrator", "rayward"]


def test_a_python_script_is_submitted_with_its_directory_and_its_arguments(project, monkeypatch, tmp_path):
    """`rayward submit train.py args`: a TRL script using rayward.GRPOTrainer, run as `python train.py args` in its
    directory (the default working_dir), the run name handed to its trainer; a syntax error fails here."""
    from orchestrator.trl.trainer import RUN_NAME_ENV

    (project / "scripts").mkdir()
    script = project / "scripts" / "My_GRPO.py"
    script.write_text("from rayward import GRPOConfig, GRPOTrainer\nprint('hi')\n")
    monkeypatch.chdir(tmp_path)  # submitted from elsewhere: the script's directory travels, not the cwd
    sub = jobs.build_submission(str(script), ["--lr", "1e-5"], environ={})
    assert sub.entrypoint == "python My_GRPO.py --lr 1e-5"
    assert sub.runtime_env["working_dir"] == str(project / "scripts")
    assert sub.run_name == "my-grpo" and sub.runtime_env["env_vars"][RUN_NAME_ENV] == "my-grpo"
    assert sub.submission_id == "rayward-my-grpo"
    assert sorted(Path(m).name for m in sub.runtime_env["py_modules"]) == ["actors", "orchestrator", "rayward"]
    whole = jobs.build_submission(str(script), [], name="exp-2", working_dir=str(project), environ={})
    assert whole.entrypoint == "python scripts/My_GRPO.py" and whole.runtime_env["working_dir"] == str(project)
    script.write_text("def broken(:\n")
    with pytest.raises(jobs.JobsError, match="My_GRPO.py: line 1"):
        jobs.build_submission(str(script), [], environ={})
    with pytest.raises(jobs.JobsError, match="not found"):
        jobs.build_submission(str(project / "nope.py"), [], environ={})


def test_excludes_keep_code_and_data_drop_big_files_weights_vcs_and_old_runs(project, monkeypatch):
    monkeypatch.chdir(project)
    sub = jobs.build_submission("configs/run.yaml", ["data.path=data/big.jsonl"], name="x", environ={}, max_file_mib=1)
    files = uploaded_files(project, sub.runtime_env["excludes"])
    assert {"configs/run.yaml", "my_rewards.py", "data/big.jsonl"} <= files
    for gone in ("blob.dat", "model.safetensors", ".git/HEAD", "runs/old/metrics.jsonl", ".venv/lib/x.py"):
        assert gone not in files, gone
    assert sub.excluded_large == ["blob.dat"]


def test_config_outside_working_dir_travels_in_the_environment(project, tmp_path):
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text(DEMO.read_text())
    sub = jobs.build_submission(str(outside), [], name="x", working_dir=project, environ={})
    assert sub.runtime_env["env_vars"][jobs.CONFIG_ENV] == outside.read_text()
    assert f" {jobs.SHIPPED_CONFIG} " in sub.entrypoint
    # The entrypoint really writes the file before the run starts: run it with a stand-in `python`.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").write_text('#!/bin/sh\necho "ARGS $*"\n')
    (bindir / "python").chmod(0o755)
    cwd = tmp_path / "jobcwd"
    cwd.mkdir()
    env = {"PATH": f"{bindir}:/usr/bin:/bin", **sub.runtime_env["env_vars"]}
    out = subprocess.run(sub.entrypoint, shell=True, cwd=cwd, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.startswith(f"ARGS -m orchestrator run {jobs.SHIPPED_CONFIG} cluster.address=auto --name x")
    assert (cwd / jobs.SHIPPED_CONFIG).read_text().strip() == outside.read_text().strip()


def test_rayward_not_shipped_when_the_working_dir_holds_it_or_when_told():
    sub = jobs.build_submission(str(DEMO), [], name="x", working_dir=ROOT, environ={})
    assert "py_modules" not in sub.runtime_env  # this repository: orchestrator/ and actors/ are in working_dir
    assert sub.entrypoint.startswith("python -m orchestrator run configs/demo.yaml ")


def test_env_forwarding():
    environ = {
        "HF_TOKEN": "hf_x", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2", "WANDB_API_KEY": "w",
        "RAYWARD_CACHE": "/c", "MLFLOW_TRACKING_URI": "http://m", "RAY_AUTH_TOKEN": "secret",
        "RAY_AUTH_MODE": "token", "HOME": "/home/me", "PATH": "/bin", "TOKENIZERS_PARALLELISM": "true",
    }
    env = jobs.forwarded_env(environ, ["EXTRA=1", "B=x=y"])
    for k in ("HF_TOKEN", "HF_HUB_OFFLINE", "VLLM_CPU_KVCACHE_SPACE", "WANDB_API_KEY", "RAYWARD_CACHE",
              "MLFLOW_TRACKING_URI"):
        assert env[k] == environ[k]
    assert set(ACTOR_ENV) <= set(env)
    assert env["TOKENIZERS_PARALLELISM"] == "true"  # the local value wins over ACTOR_ENV's default
    assert env["EXTRA"] == "1" and env["B"] == "x=y"
    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE", "HOME", "PATH"):
        assert k not in env
    assert env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"  # init_ray's env_vars must not conflict with the job's
    with pytest.raises(jobs.JobsError, match="KEY=VALUE"):
        jobs.forwarded_env(environ, ["novalue"])


def test_dry_run_masks_secrets():
    sub = jobs.build_submission(str(DEMO), [], name="x", working_dir=ROOT,
                                environ={"HF_TOKEN": "hf_secret", "WANDB_API_KEY": "k",
                                         "TOKENIZERS_PARALLELISM": "false"})
    env = sub.public()["runtime_env"]["env_vars"]
    assert env["HF_TOKEN"] == env["WANDB_API_KEY"] == "***"
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    assert sub.runtime_env["env_vars"]["HF_TOKEN"] == "hf_secret"  # only the printout is masked


def test_bad_input_fails_before_anything_is_sent():
    with pytest.raises(ConfigError, match="grpo.max_stepz"):
        jobs.build_submission(str(DEMO), ["grpo.max_stepz=3"], name="x", working_dir=ROOT, environ={})
    with pytest.raises(jobs.JobsError, match="run name"):
        jobs.build_submission(str(DEMO), [], name="Bad_Name", working_dir=ROOT, environ={})
    with pytest.raises(ConfigError, match="not found"):
        jobs.build_submission("nope.yaml", [], name="x", working_dir=ROOT, environ={})


def test_addresses(monkeypatch):
    assert jobs.normalize_address("10.0.0.1:8265/") == "http://10.0.0.1:8265"
    assert jobs.normalize_address("https://ray.example.com") == "https://ray.example.com"
    for bad in ("ray://head:10001", "auto", ""):
        with pytest.raises(jobs.JobsError, match="dashboard URL"):
            jobs.normalize_address(bad)
    for k in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
        monkeypatch.delenv(k, raising=False)
    assert jobs.default_address() == "http://127.0.0.1:8265"
    monkeypatch.setenv("RAY_ADDRESS", "http://a:8265")
    assert jobs.default_address() == "http://a:8265"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://b:8265")
    assert jobs.default_address() == "http://b:8265"


def test_preflight_times_out_on_a_silent_server():
    """A port that accepts connections but never answers (a black hole) fails within the timeout."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    try:
        t0 = time.monotonic()
        with pytest.raises(jobs.JobsError, match="no answer"):
            jobs.preflight(f"http://127.0.0.1:{srv.getsockname()[1]}", timeout_s=1)
        assert time.monotonic() - t0 < 5
    finally:
        srv.close()


# ---- the CLI, as users run it --------------------------------------------------------------------------


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cli(*args: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    e.update(env)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=ROOT, env=e, capture_output=True,
                       text=True, timeout=60)
    return r, time.monotonic() - t0


def one_line(r: subprocess.CompletedProcess, cmd: str) -> str:
    assert r.returncode != 0, r.stdout
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"rayward {cmd}: "), r.stderr
    return lines[0]


@pytest.mark.parametrize("cmd", [
    ["submit", "configs/demo.yaml", "grpo.max_steps=3"], ["status", "some-run"], ["logs", "-f", "some-run"],
    ["stop", "some-run"], ["list"],
])
def test_unreachable_address_is_one_line_and_fast(cmd):
    """Fast by construction, not by a stopwatch (a loaded machine makes any bound flaky): the line comes from
    rayward's one HTTP probe of the dashboard (a refused connection answers at once), before any Ray client
    starts its retries."""
    r, _ = cli(*cmd, "--address", f"http://127.0.0.1:{closed_port()}")
    assert "cannot reach the Ray dashboard" in one_line(r, cmd[0]) and "(connection refused)" in r.stderr
    assert r.returncode == 1


def test_address_from_the_environment():
    r, _ = cli("list", RAY_ADDRESS=f"http://127.0.0.1:{closed_port()}")
    assert "127.0.0.1" in one_line(r, "list")


def test_token_mode_without_a_token_is_one_line(tmp_path):
    r, _ = cli("list", "--address", f"http://127.0.0.1:{closed_port()}", RAY_AUTH_MODE="token", HOME=str(tmp_path))
    line = one_line(r, "list")
    assert "RAY_AUTH_TOKEN" in line


def test_bad_config_is_rejected_before_contacting_the_cluster():
    r, _ = cli("submit", "configs/demo.yaml", "grpo.max_stepz=3", "--address", f"http://127.0.0.1:{closed_port()}")
    assert r.returncode == 2 and "grpo.max_stepz" in r.stderr and "cannot reach" not in r.stderr


def test_dry_run_prints_the_job():
    r, _ = cli("submit", "configs/demo.yaml", "grpo.max_steps=3", "--name", "dry", "--dry-run")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["submission_id"] == "rayward-dry" and "--name dry" in job["entrypoint"]


def test_the_gpu_preset_dry_run_checks_its_data_and_its_rewards_columns(tmp_path, monkeypatch):
    """`rayward submit configs/gpu-cluster.yaml --dry-run` from a project: a data file missing from the shipped
    directory, then one without accuracy_reward's `solution` column (TRL's own reward, its parameter), are refused
    naming them before anything is shipped; with the column the submission is built."""
    from orchestrator.config import ConfigError

    pytest.importorskip("math_verify")  # accuracy_reward's package (rayward[math], in the test extra)
    project = tmp_path / "proj"
    (project / "configs").mkdir(parents=True)
    (project / "configs" / "gpu.yaml").write_text((ROOT / "configs" / "gpu-cluster.yaml").read_text())
    monkeypatch.chdir(project)
    with pytest.raises(ConfigError, match=r"data.path 'data/train.jsonl': no such file under .*proj, the directory"):
        jobs.build_submission("configs/gpu.yaml", [], name="g", environ={})
    (project / "data").mkdir()
    rows = [{"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"}] * 4
    (project / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=r"rewards\[accuracy\].function: trl.rewards:accuracy_reward takes the "
                                          r"dataset column\(s\) \['solution'\] .* lacks "
                                          r"\(its columns: \['answer', 'prompt'\]\)"):
        jobs.build_submission("configs/gpu.yaml", [], name="g", environ={})
    rows = [{**r, "solution": "4"} for r in rows]
    (project / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sub = jobs.build_submission("configs/gpu.yaml", [], name="g", environ={})
    assert sub.entrypoint.startswith("python -m orchestrator run configs/gpu.yaml") and sub.notes == []


def test_a_reward_package_only_the_image_has_is_a_note_not_an_error(project, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name, *a))
    monkeypatch.chdir(project)
    sub = jobs.build_submission("configs/run.yaml", ["rewards.0.function=accuracy_reward"], name="n", environ={})
    assert len(sub.notes) == 1 and "accuracy_reward needs the `math-verify` package" in sub.notes[0], sub.notes


def test_max_retries_on_a_script_is_refused_saying_what_to_do(project, monkeypatch):
    (project / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(project)
    with pytest.raises(jobs.JobsError, match=r"resume_from_checkpoint='auto'"):
        jobs.build_submission("train.py", [], environ={}, run_flags=["--max-retries", "2"])
