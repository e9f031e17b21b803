"""cluster/prometheus.sh against a real run: Prometheus scrapes Ray's nodes while the letter curriculum trains,
and every PromQL query of cluster/grafana-dashboard.json returns data for that run.

Skipped where no `prometheus` binary is installed (Debian/Ubuntu: apt-get install prometheus; scripts/install.sh
does it where it can). The run is a subprocess with its own embedded Ray cluster in its own temp dir
(RAY_TMPDIR), so the service-discovery file Prometheus reads is this run's alone; Ray exports every 2 s here
(RAY_metrics_report_interval_ms) and Prometheus scrapes, and re-reads the discovery file, every 2 s (a counter's
rate() needs two scrapes of the node while the ~30 s run lives: with the script's old 10 s re-read the node was
found late and a short run could be scraped once). The config exercises every panel: gates
(letter gates brevity), KL (beta > 0), and reward errors (a weight-0 reward with on_error: fallback that raises
on half the samples: the events counter has no series before its first error).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="no prometheus binary (apt-get install prometheus)"),
]

DASHBOARD = ROOT / "cluster" / "grafana-dashboard.json"
# How long after the run the queries may take to see its data (Ray's export + Prometheus' scrape + rule lag).
SETTLE_S = 60
# How long Prometheus may take to start serving (TSDB set-up on a loaded 2-core machine).
READY_S = 60


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, path: str, **params: str) -> dict:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
    with urllib.request.urlopen(url, timeout=30) as r:
        out = json.loads(r.read())
    assert out["status"] == "success", out
    return out["data"]


def has_data(base: str, expr: str, start: float, end: float) -> bool:
    data = api(base, "query_range", query=expr, start=f"{start:.0f}", end=f"{end:.0f}", step="2")
    return any(series["values"] for series in data["result"])


def wait_ready(base: str, prom: subprocess.Popen, log: Path) -> None:
    """Until Prometheus serves: a run started before would lose its first scrapes, and a counter needs two
    scrapes inside the dashboard's rate() window to show at all."""
    deadline = time.time() + READY_S
    while True:
        assert prom.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.time() < deadline, f"Prometheus not ready after {READY_S} s:\n{log.read_text()[-2000:]}"
        time.sleep(0.5)


def scrapes(base: str, start: float, end: float) -> str:
    """How often Prometheus reached Ray's nodes while the run lived, for a failure message: a rate() panel needs
    two scrapes of its series."""
    window = f"{end - start:.0f}s"

    def value(expr: str) -> float | None:
        result = api(base, "query", query=expr, time=f"{end:.0f}")["result"]
        return float(result[0]["value"][1]) if result else None

    lines = []
    for series in api(base, "series", **{"match[]": 'up{job="ray"}', "start": f"{start:.0f}", "end": f"{end:.0f}"}):
        sel = f'up{{job="ray",instance="{series["instance"]}"}}'
        first = value(f"min_over_time(timestamp({sel})[{window}:1s])")
        lines.append(f"  {series['instance']}: {value(f'count_over_time({sel}[{window}])')} scrapes, "
                     f"{value(f'sum_over_time({sel}[{window}])')} up, the first "
                     + (f"{first - start:.0f} s after the run started" if first is not None else "never"))
    return "\n".join(lines) or "  no Ray target scraped"


def curriculum_config(path: Path) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "letter-curriculum.yaml").read_text())
    cfg["grpo"]["beta"] = 0.04
    cfg["grpo"]["max_steps"] = 20  # past the schedule's switch at step 10; every panel has data well before
    cfg["rewards"].append({"name": "flaky", "function": "tests.fixtures.bad_rewards:raises_on_odd_lengths",
                           "weight": 0.0, "on_error": "fallback"})
    # a small held-out eval, so the dashboard's eval panel has data too
    cfg["eval"] = {"data": {"path": "toy"}, "every_n_steps": 5, "at_start": True, "num_generations": 2,
                   "max_samples": 8}
    # a pool that scales itself, with no delays: fast rewards leave it idle, so it retires a worker and the
    # autoscaling panel has a decision to show
    cfg["cluster"]["reward_autoscale"] = {"min_workers": 1, "max_workers": 2, "look_back_s": 2.0,
                                          "upscale_delay_s": 0.0, "downscale_delay_s": 0.0}
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_every_dashboard_query_has_data_for_a_run(tmp_path):
    tmp = Path(tempfile.mkdtemp(prefix="rwp", dir="/tmp"))  # short: Ray's socket paths live under it
    (tmp / "ray").mkdir()
    prom_url = f"http://127.0.0.1:{free_port()}"
    prom_env = {**os.environ, "RAY_TEMP_DIR": str(tmp / "ray"), "PROMETHEUS_ADDRESS": prom_url[7:],
                "PROMETHEUS_DATA": str(tmp / "prometheus"), "SCRAPE_INTERVAL": "2s"}
    prom_log = (tmp_path / "prometheus.log").open("w")
    prom = subprocess.Popen(["bash", str(ROOT / "cluster" / "prometheus.sh")], env=prom_env, stdout=prom_log,
                            stderr=subprocess.STDOUT)
    name = "prom-curriculum"
    try:
        wait_ready(prom_url, prom, tmp_path / "prometheus.log")
        run_env = {**os.environ, "RAY_ADDRESS": "", "RAY_TMPDIR": str(tmp), "RAY_metrics_report_interval_ms": "2000"}
        t0 = time.time()
        r = subprocess.run(
            [sys.executable, "-m", "orchestrator", "run", str(curriculum_config(tmp_path / "cfg.yaml")), "--name", name,
             f"logging.dir={tmp_path / 'runs'}"],
            cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=720,
        )
        t1 = time.time()
        assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
        assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()
        queries = [(title, expr.replace("$run", name)) for title, expr in dashboard_queries()]
        assert len(queries) >= 20
        deadline, missing = time.time() + SETTLE_S, queries
        while True:
            missing = [(t, q) for t, q in missing if not has_data(prom_url, q, t0, time.time())]
            if not missing or time.time() > deadline:
                break
            time.sleep(3)
        assert not missing, (
            "dashboard queries without data:\n" + "\n".join(f"  {t}: {q}" for t, q in missing)
            + f"\nthe run lasted {t1 - t0:.0f} s; Ray's targets:\n" + scrapes(prom_url, t0, t1)
        )
        # the dashboard's $run variable: label_values(ray_rayward_global_step, run)
        assert name in api(prom_url, "label/run/values", **{"match[]": "ray_rayward_global_step"})
    finally:
        prom.terminate()  # the script exec'd prometheus: this is its pid
        try:
            prom.wait(30)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        prom_log.close()
        shutil.rmtree(tmp, ignore_errors=True)
