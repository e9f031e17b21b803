"""`rayward submit/status/logs/stop/list` against a real Ray head started with `ray start --head --block`
(token auth on: ~/.ray/auth_token exists), driven only through the CLI and HTTP. The pytest process never
calls ray.init here (the session may already hold a Ray connection).

The head is ours: random non-default ports in 30000-39999, its own --temp-dir, stopped by signalling the
`ray start` process and then killing, by pid, whatever it had started (never `ray stop`).

One training run is watched on the metrics endpoint and through the state API while it trains, then followed to
SUCCEEDED; a second one is stopped. ~2.5 min on a quiet 2-core machine (head start ~10 s, the run's start,
vLLM included, 40-90 s, 120 steps ~40 s, head shutdown ~5 s); more when the machine is shared.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(600)

RAYWARD = [shutil.which("rayward") or str(Path(sys.executable).parent / "rayward")]
TOKEN_FILE = Path("~/.ray/auth_token").expanduser()
# What a user's shell would not have: the pytest session's own Ray connection settings.
CLIENT_ENV_DROP = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS",
                   "RAY_API_SERVER_ADDRESS")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def _pick_ports(n: int, worker_range: int) -> tuple[list[int], int]:
    """n free single ports plus the start of a free worker-port range, all in 30000-39999."""
    for _ in range(200):
        base = random.randrange(30000, 39999 - n - worker_range)
        ports = list(range(base, base + n))
        wstart = base + n
        if all(_free(p) for p in ports) and all(_free(p) for p in range(wstart, wstart + worker_range, 7)):
            return ports, wstart
    raise RuntimeError("no free port block in 30000-39999")


def _proc_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _descendants(root: int) -> dict[int, str]:
    """pid -> start time of root and every process below it (to kill them by id, pid reuse excluded)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        start = _proc_start(pid)
        if start is not None:
            out[pid] = start
        todo.extend(children.get(pid, []))
    return out


class RayHead:
    """One `ray start --head --block` owned by this test module."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.proc: subprocess.Popen | None = None
        self.known: dict[int, str] = {}

    def start(self, tries: int = 3) -> RayHead:
        for _ in range(tries):
            (gcs, dash, metrics, client, nm, om, agent_http, agent_grpc, renv), wstart = _pick_ports(9, 100)
            # short: Ray's unix socket paths under it must stay below the 107-byte limit
            self.temp_dir = Path(tempfile.mkdtemp(prefix="rwj"))
            self.address = f"http://127.0.0.1:{dash}"
            self.metrics_url = f"http://127.0.0.1:{metrics}/metrics"
            env = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV_DROP}
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
            env["RAY_metrics_report_interval_ms"] = "2000"  # metrics visible within seconds, not ~10-17 s
            cmd = [
                "ray", "start", "--head", "--block", "--disable-usage-stats", "--num-cpus", "8",
                "--node-ip-address", "127.0.0.1", "--temp-dir", str(self.temp_dir),
                "--port", str(gcs), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
                "--include-dashboard", "true", "--metrics-export-port", str(metrics),
                "--ray-client-server-port", str(client), "--node-manager-port", str(nm),
                "--object-manager-port", str(om), "--dashboard-agent-listen-port", str(agent_http),
                "--dashboard-agent-grpc-port", str(agent_grpc), "--runtime-env-agent-port", str(renv),
                "--min-worker-port", str(wstart), "--max-worker-port", str(wstart + 99),
            ]
            self.log = (self.tmp / f"ray-start-{dash}.log").open("w")
            self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
            if self._wait_ready(90):
                return self
            self.stop()
        raise RuntimeError(f"ray start --head failed {tries} times; last log:\n{self._log_text()[-3000:]}")

    def _log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def _wait_ready(self, timeout_s: float) -> bool:
        token = TOKEN_FILE.read_text().strip()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            req = urllib.request.Request(f"{self.address}/api/jobs/", headers={"Authorization": f"Bearer {token}"})
            try:
                with urllib.request.urlopen(req, timeout=3) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        return False

    def snapshot(self) -> None:
        if self.proc is not None:
            self.known.update(_descendants(self.proc.pid))

    def stop(self) -> None:
        if self.proc is None:
            return
        self.snapshot()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # `ray start --block` shuts its processes down on SIGTERM
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        time.sleep(1)
        for pid, start in self.known.items():  # leftovers we started (job drivers run in their own session)
            if _proc_start(pid) == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc = None
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    if not TOKEN_FILE.is_file():
        pytest.skip("needs ~/.ray/auth_token so that `ray start --head` turns token auth on")
    h = RayHead(tmp_path_factory.mktemp("rayhead")).start()
    yield h
    h.stop()


def client_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV_DROP}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def rayward(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: float = 120
            ) -> subprocess.CompletedProcess:
    return subprocess.run([*RAYWARD, *args], cwd=cwd, env=env or client_env(), capture_output=True, text=True,
                          timeout=timeout)


def job_status(head: RayHead, run: str) -> dict:
    r = rayward("status", run, "--json", "--address", head.address)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def jobs_api(head: RayHead, path: str) -> dict:
    """GET on the Jobs REST API with the token: the wait loops poll this instead of spawning a CLI process every
    two seconds on a 2-core machine (the CLI is checked once at the end of each wait)."""
    req = urllib.request.Request(f"{head.address}/api/jobs/{path}",
                                 headers={"Authorization": f"Bearer {TOKEN_FILE.read_text().strip()}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def wait_status(head: RayHead, run: str, want: set[str], timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        status = jobs_api(head, f"rayward-{run}")["status"]
        if status in want or status in {"SUCCEEDED", "FAILED", "STOPPED"} or time.monotonic() > deadline:
            break
        time.sleep(2)
    st = job_status(head, run)  # through `rayward status`
    if st["status"] not in want:
        logs = rayward("logs", run, "--address", head.address).stdout
        pytest.fail(f"run {run}: {st['status']} (wanted {want}): {st['message']}\n--- logs ---\n{logs[-4000:]}")
    return st


def wait_log(head: RayHead, run: str, pattern: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if re.search(pattern, jobs_api(head, f"rayward-{run}/logs")["logs"], re.M):
            text = rayward("logs", run, "--address", head.address).stdout  # through `rayward logs`
            assert re.search(pattern, text, re.M), text[-4000:]
            return text
        status = jobs_api(head, f"rayward-{run}")["status"]
        assert status in ("PENDING", "RUNNING"), f"run {run} ended ({status}) before {pattern!r}"
        time.sleep(2)
    pytest.fail(f"run {run}: no {pattern!r} in the log after {timeout_s}s")


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format -> (name, labels, value)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = []
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)", line)
        if m and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def series(samples, name: str, run: str, **labels: str) -> list[float]:
    return [v for n, lab, v in samples
            if n == name and lab.get("run") == run and all(lab.get(k) == x for k, x in labels.items())]


# ---------------------------------------------------------------------------------------------------------


# long enough to watch the run (the metrics test needs two exports while it trains), short enough to finish
MAX_STEPS = 80


@pytest.fixture(scope="module")
def demo_run(head, tmp_path_factory):
    """`rayward submit` of the demo; yields (run name, log dir) once the run is training (step 2 logged)."""
    name = f"jt-demo-{random.randrange(16**4):04x}"
    logdir = tmp_path_factory.mktemp("jobruns")
    t0 = time.monotonic()
    r = rayward("submit", "configs/demo.yaml", f"grpo.max_steps={MAX_STEPS}", f"logging.dir={logdir}",
                "--name", name, "--address", head.address)
    assert r.returncode == 0, r.stderr
    assert f"rayward-{name}" in r.stdout and f"{head.address}/#/jobs/rayward-{name}" in r.stdout, r.stdout
    wait_log(head, name, rf"^step +2/{MAX_STEPS}", timeout_s=300)
    print(f"demo job: submit -> training in {time.monotonic() - t0:.0f}s")
    head.snapshot()
    yield name, logdir
    rayward("stop", name, "--address", head.address)


def test_run_actors_through_the_state_api(head, demo_run):
    name, _ = demo_run
    st = job_status(head, name)
    assert st["status"] == "RUNNING", st
    actors = {a["name"]: a for a in st["actors"]}
    expected = {f"{name}/reward-pool", f"{name}/reward-0", f"{name}/reward-1", f"{name}/generator-0", f"{name}/learner"}
    assert expected <= set(actors), sorted(actors)
    assert all(actors[n]["state"] == "ALIVE" and actors[n]["pid"] for n in expected), actors


def test_run_metrics_on_the_nodes_metrics_endpoint(head, demo_run):
    """While the run trains: the driver's step gauges (orchestrator/telemetry/ray_metrics.py) and the reward pool's
    gauges, tagged with the run, on the head's metrics export port; global_step increases between scrapes."""
    name, _ = demo_run
    deadline = time.monotonic() + 15
    first = scrape(head.metrics_url)
    while not series(first, "ray_rayward_global_step", name) and time.monotonic() < deadline:
        time.sleep(1)  # the first export comes within metrics_report_interval_ms (2 s here)
        first = scrape(head.metrics_url)
    steps0 = series(first, "ray_rayward_global_step", name)
    found = sorted({n for n, _, _ in first if n.startswith("ray_rayward")})
    assert steps0, f"no ray_rayward_global_step{{run={name!r}}} on {head.metrics_url}; rayward series: {found}"
    assert series(first, "ray_rayward_reward_workers_alive", name) == [2.0]
    assert len(series(first, "ray_rayward_reward_queue_depth", name)) == 1  # exported for the run (any depth)
    (letter,) = series(first, "ray_rayward_reward_fn_mean", name, reward="letter")
    assert 0.0 <= letter <= 1.0
    for phase in ("generate", "reward", "train", "sync"):
        (sec,) = series(first, "ray_rayward_phase_seconds", name, phase=phase)
        assert 0.0 < sec < 60.0, (phase, sec)
    assert series(first, "ray_rayward_tokens_per_s", name)[0] > 0
    assert 0 < series(first, "ray_rayward_weight_sync_s", name)[0] < 60
    assert series(first, "ray_rayward_logprob_gap_max", name)[0] < 1e-3

    later, deadline = steps0, time.monotonic() + 60
    while max(later) <= max(steps0) and time.monotonic() < deadline:
        time.sleep(1)
        later = series(scrape(head.metrics_url), "ray_rayward_global_step", name) or steps0
    assert max(later) > max(steps0) >= 1, (steps0, later)
    print(f"ray_rayward_global_step{{run={name!r}}}: {max(steps0):.0f} -> {max(later):.0f}")


def test_scale_through_the_dashboard_address_alone(head, demo_run):
    """`rayward scale` with the same --address as every other command (the dashboard URL; the GCS port is never
    given): the running run's reward pool goes to 3 workers and back to 2; the scale jobs are not listed as runs."""
    name, _ = demo_run
    up = rayward("scale", name, "--reward-workers", "3", "--address", head.address)
    assert up.returncode == 0 and f"rayward scale: {name}: reward workers -> 3 (" in up.stdout, up.stderr[-2000:]
    deadline = time.monotonic() + 120
    while len([a for a in job_status(head, name)["actors"]
               if a["name"].startswith(f"{name}/reward-") and a["state"] == "ALIVE"]) < 4:  # the pool + 3 workers
        assert time.monotonic() < deadline, job_status(head, name)["actors"]
        time.sleep(1)
    down = rayward("scale", name, "--reward-workers", "2", "--address", head.address)
    assert down.returncode == 0 and "reward workers -> 2 (" in down.stdout, down.stderr[-2000:]
    nope = rayward("scale", "no-such-run", "--reward-workers", "2", "--address", head.address)
    assert nope.returncode == 2 and "no run named 'no-such-run'" in nope.stderr, nope.stderr
    listed = json.loads(rayward("list", "--json", "--address", head.address).stdout)
    assert not [x for x in listed if "scale" in x["submission_id"]], listed


def test_run_succeeds_and_its_logs_are_readable(head, demo_run):
    name, logdir = demo_run
    st = wait_status(head, name, {"SUCCEEDED"}, timeout_s=240)
    assert st["submission_id"] == f"rayward-{name}" and st["run"] == name and st["actors"] == []
    human = rayward("status", name, "--address", head.address).stdout
    assert f"run {name}: SUCCEEDED" in human and f"{head.address}/#/jobs/rayward-{name}" in human, human

    logs = rayward("logs", name, "--address", head.address)
    assert logs.returncode == 0, logs.stderr
    assert re.search(rf"^step +{MAX_STEPS}/{MAX_STEPS} \| reward", logs.stdout, re.M), logs.stdout[-3000:]
    assert f"rayward run {name!r}" in logs.stdout

    follow = rayward("logs", "-f", name, "--address", head.address)  # a finished job: all of it, exit 0
    assert follow.returncode == 0 and re.search(rf"^step +{MAX_STEPS}/{MAX_STEPS} \|", follow.stdout, re.M), \
        follow.stderr
    assert f"run {name} SUCCEEDED" in follow.stderr

    rows = [json.loads(x) for x in (logdir / name / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, MAX_STEPS + 1))  # the head is this machine

    ls = rayward("list", "--json", "--address", head.address)
    assert ls.returncode == 0, ls.stderr
    assert {"run": name, "submission_id": f"rayward-{name}", "status": "SUCCEEDED"}.items() <= next(
        x for x in json.loads(ls.stdout) if x["run"] == name).items()

    again = rayward("submit", "configs/demo.yaml", "--name", name, "--address", head.address)
    assert again.returncode == 1 and "already exists" in again.stderr


USER_REWARDS = """
import orchestrator

print("rayward code from", orchestrator.__file__, flush=True)


def nonempty(completions, **kwargs):
    return [float(len(c) > 0) for c in completions]
"""


def test_user_project_ships_and_a_running_run_stops(head, tmp_path):
    """Submitted from a user's project directory (its own reward module, rayward not inside): the reward code
    travels as working_dir, rayward's packages as py_modules; then `rayward stop` ends the running job while
    `rayward logs -f` follows it."""
    project = tmp_path / "myproject"
    project.mkdir()
    (project / "my_rewards.py").write_text(USER_REWARDS)
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["rewards"] = [{"name": "nonempty", "function": "my_rewards:nonempty"}]
    cfg["grpo"]["max_steps"] = 500
    (project / "grpo.yaml").write_text(yaml.safe_dump(cfg))
    name = f"jt-stop-{random.randrange(16**4):04x}"
    r = rayward("submit", "grpo.yaml", f"logging.dir={tmp_path / 'runs'}", "--name", name,
                "--address", head.address, cwd=project)
    assert r.returncode == 0, r.stderr
    follower = subprocess.Popen([*RAYWARD, "logs", "-f", name, "--address", head.address], cwd=project,
                                env=client_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The driver's first line comes after it imported the user's reward function (orchestrator.run.build.prepare).
    text = wait_log(head, name, rf"^rayward run '{name}'", timeout_s=180)
    shipped = re.search(r"^rayward code from (\S+)", text, re.M)
    assert shipped and "runtime_resources" in shipped.group(1) and str(ROOT) not in shipped.group(1), text[-2000:]
    head.snapshot()
    r = rayward("stop", name, "--address", head.address)
    assert r.returncode == 0, r.stderr
    assert f"run {name} STOPPED" in r.stdout
    assert job_status(head, name)["status"] == "STOPPED"
    out, err = follower.communicate(timeout=60)  # `logs -f` streamed the live job and ends with it
    assert follower.returncode == 1 and f"run {name} STOPPED" in err, (out[-2000:], err)
    assert f"rayward run {name!r}" in out
    assert "STOPPED" in rayward("stop", name, "--address", head.address).stdout  # again: already stopped, exit 0


TRL_SCRIPT = """\
import os

from datasets import Dataset
from rayward import GRPOConfig, GRPOTrainer


def letter(completions, letter, **kwargs):
    return [sum(ch == want for ch in c) / max(len(c), 1) for c, want in zip(completions, letter)]


dataset = Dataset.from_list([{"prompt": f"Write the letter {c}:", "letter": c} for c in "abcd" * 4])
args = GRPOConfig(output_dir=os.environ["OUT"], use_cpu=True, max_steps=2, per_device_train_batch_size=16,
                  num_generations=4, max_completion_length=8, report_to="none", save_strategy="no")
trainer = GRPOTrainer(model=os.environ["MODEL"],
                      reward_funcs=[letter, lambda completions, **kw: [0.0] * len(completions)],
                      args=args, train_dataset=dataset)
print("TRAINED", trainer.train().global_step)
"""


def test_a_trl_script_is_submitted_with_its_directory(head, tmp_path):
    """`rayward submit my_script.py`: a TRL script whose only change is the rayward import, its reward functions
    (a lambda among them) defined in the script, runs as a Ray job on the cluster, under the script's name."""
    from orchestrator.builtin.models.tiny import ensure_tiny_model

    project = tmp_path / "trlproject"
    project.mkdir()
    (project / "grpo_letters.py").write_text(TRL_SCRIPT)
    name = f"jt-script-{random.randrange(16**4):04x}"
    r = rayward("submit", "grpo_letters.py", "--name", name, "--address", head.address,
                "--env", f"MODEL={ensure_tiny_model()}", "--env", f"OUT={tmp_path / 'out'}", cwd=project)
    assert r.returncode == 0, r.stderr
    wait_status(head, name, {"SUCCEEDED"}, timeout_s=420)
    text = rayward("logs", name, "--address", head.address).stdout
    assert "TRAINED 2" in text and f"rayward run {name!r}" in text, text[-3000:]
    assert (tmp_path / name / "checkpoint-2").is_dir()  # save_strategy "no": the final checkpoint only


def _one_line_error(r: subprocess.CompletedProcess, cmd: str) -> str:
    assert r.returncode != 0
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"rayward {cmd}: "), r.stderr
    return lines[0]


def test_missing_token_is_a_clear_error(head, tmp_path):
    r = rayward("list", "--address", head.address, env=client_env(HOME=str(tmp_path)))
    line = _one_line_error(r, "list")
    assert "requires a token" in line and "RAY_AUTH_TOKEN" in line


def test_wrong_token_is_a_clear_error(head):
    r = rayward("status", "anything", "--address", head.address, env=client_env(RAY_AUTH_TOKEN="not-the-token"))
    assert "rejected the token" in _one_line_error(r, "status")


def test_unknown_run_is_a_clear_error(head):
    for cmd in ("status", "logs", "stop"):
        r = rayward(cmd, "no-such-run", "--address", head.address)
        assert "no run or job 'no-such-run'" in _one_line_error(r, cmd)
