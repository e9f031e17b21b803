"""cluster/: the launcher YAML against Ray's shipped JSON schema, the KubeRay manifests against the fields the
CRDs require, and the Grafana dashboard against the metric names rayward actually exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from actors.rewards.pool import REWARD_POOL
from actors.runtime.pool import pool_metric_names
from orchestrator.telemetry.ray_metrics import GAUGES, METRIC_NAME_RE, REWARD_POOL_METRICS
from tests.conftest import ROOT

CLUSTER = ROOT / "cluster"


def load(name: str):
    docs = list(yaml.safe_load_all((CLUSTER / name).read_text()))
    assert len(docs) == 1 and isinstance(docs[0], dict), name
    return docs[0]


# ---- ray up ----------------------------------------------------------------------------------------------


def test_ray_cluster_yaml_matches_rays_schema():
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    cfg = load("ray-cluster.yaml")
    jsonschema.validate(cfg, schema)  # raises with the offending path


def test_ray_cluster_yaml_has_gpu_and_reward_node_types():
    cfg = load("ray-cluster.yaml")
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] in types
    reward = [t for t in types.values() if "reward_node" in t["resources"]]
    assert reward and all("GPU" not in t["resources"] for t in reward)
    # Reward nodes start from zero: the autoscaler brings them up for reward workers (the pool's autoscaler
    # decides how many) and stops them once idle.
    assert all(t.get("min_workers", 0) == 0 < t["max_workers"] for t in reward)
    assert any(t["node_config"]["InstanceType"].startswith(("g", "p")) for t in types.values())  # AWS GPU family
    assert sum(t.get("max_workers", 0) for n, t in types.items() if n != cfg["head_node_type"]) <= cfg["max_workers"]
    # token auth on every node, metrics on a fixed port Prometheus can scrape
    for cmd in (cfg["head_start_ray_commands"][-1], cfg["worker_start_ray_commands"][-1]):
        assert "RAY_AUTH_MODE=token" in cmd and "--metrics-export-port=" in cmd
    assert "~/.ray/auth_token" in cfg["file_mounts"]


def test_schema_check_can_fail():
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    bad = load("ray-cluster.yaml")
    bad["available_node_types"]["reward_worker"]["resources"]["reward_node"] = "16"  # must be an integer
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


# ---- KubeRay ---------------------------------------------------------------------------------------------


def _require(obj: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in obj or obj[k] is None]
    assert not missing, f"{where}: missing required {missing}"


def _check_pod_template(tpl: dict, where: str) -> list[dict]:
    _require(tpl, ("spec",), where)
    containers = tpl["spec"].get("containers")
    assert containers, f"{where}.spec.containers: required, non-empty"
    for i, c in enumerate(containers):
        _require(c, ("name", "image"), f"{where}.spec.containers[{i}]")
    return containers


def _check_auth_env(container: dict, where: str) -> None:
    env = {e["name"]: e for e in container.get("env", [])}
    assert env.get("RAY_AUTH_MODE", {}).get("value") == "token", f"{where}: RAY_AUTH_MODE=token"
    ref = env.get("RAY_AUTH_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {})
    assert ref.get("name") and ref.get("key"), f"{where}: RAY_AUTH_TOKEN from a Secret"


def check_raycluster_spec(spec: dict, where: str) -> None:
    """Required fields of ray.io/v1 RayClusterSpec (KubeRay CRD: headGroupSpec{rayStartParams, template},
    workerGroupSpecs[]{groupName, minReplicas, maxReplicas, rayStartParams, template}) plus rayward's shape."""
    _require(spec, ("headGroupSpec",), where)
    head = spec["headGroupSpec"]
    _require(head, ("rayStartParams", "template"), f"{where}.headGroupSpec")
    assert all(isinstance(v, str) for v in head["rayStartParams"].values()), "rayStartParams values are strings"
    for c in _check_pod_template(head["template"], f"{where}.headGroupSpec.template"):
        _check_auth_env(c, f"{where}.headGroupSpec {c['name']}")
    groups = spec.get("workerGroupSpecs") or []
    names = [g.get("groupName") for g in groups]
    assert len(set(names)) == len(names), "groupName must be unique"
    gpu = reward = False
    for g in groups:
        w = f"{where}.workerGroupSpecs[{g.get('groupName')}]"
        _require(g, ("groupName", "minReplicas", "maxReplicas", "rayStartParams", "template"), w)
        assert 0 <= g["minReplicas"] <= g.get("replicas", g["minReplicas"]) <= g["maxReplicas"], w
        assert all(isinstance(v, str) for v in g["rayStartParams"].values()), f"{w}: rayStartParams values are strings"
        containers = _check_pod_template(g["template"], f"{w}.template")
        for c in containers:
            _check_auth_env(c, f"{w} {c['name']}")
            gpu |= "nvidia.com/gpu" in (c.get("resources", {}).get("limits") or {})
        res = g["rayStartParams"].get("resources")
        if res:
            parsed = json.loads(json.loads(res))  # KubeRay's format: a quoted JSON object
            if "reward_node" in parsed:
                reward = True
                assert g["minReplicas"] == 0 < g["maxReplicas"], f"{w}: reward pods scale from zero"
    assert gpu, f"{where}: a GPU worker group"
    assert spec.get("enableInTreeAutoscaling") is True, f"{where}: the autoscaler starts reward pods"
    assert reward, f"{where}: a worker group with the reward_node custom resource"


def test_kuberay_raycluster_required_fields():
    doc = load("kuberay-raycluster.yaml")
    _require(doc, ("apiVersion", "kind", "metadata", "spec"), "RayCluster")
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCluster"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    check_raycluster_spec(doc["spec"], "RayCluster.spec")


def test_kuberay_rayjob_required_fields():
    doc = load("kuberay-rayjob.yaml")
    _require(doc, ("apiVersion", "kind", "metadata", "spec"), "RayJob")
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob"
    spec = doc["spec"]
    # KubeRay rejects a RayJob with neither a cluster to create nor one to select, and K8sJobMode needs an entrypoint
    assert ("rayClusterSpec" in spec) != ("clusterSelector" in spec)
    assert spec.get("submissionMode", "K8sJobMode") in ("K8sJobMode", "HTTPMode")
    assert spec["entrypoint"].startswith("python -m orchestrator run ")
    yaml.safe_load(spec["runtimeEnvYAML"])  # a YAML string, parsed by KubeRay
    check_raycluster_spec(spec["rayClusterSpec"], "RayJob.spec.rayClusterSpec")
    for c in _check_pod_template(spec["submitterPodTemplate"], "RayJob.spec.submitterPodTemplate"):
        _check_auth_env(c, "submitter")  # `ray job submit` needs the token too
    if spec.get("shutdownAfterJobFinishes") is not True:
        assert "ttlSecondsAfterFinished" not in spec


def test_kuberay_check_can_fail():
    doc = load("kuberay-raycluster.yaml")
    del doc["spec"]["workerGroupSpecs"][0]["maxReplicas"]
    with pytest.raises(AssertionError, match="maxReplicas"):
        check_raycluster_spec(doc["spec"], "RayCluster.spec")


# ---- Grafana ---------------------------------------------------------------------------------------------


def exported_prometheus_names() -> set[str]:
    """Every series name rayward's metrics produce on Ray's endpoint (ray_ prefix; histogram suffixes)."""
    names = {f"ray_{n}" for n in GAUGES}
    pool = pool_metric_names(REWARD_POOL.metrics, REWARD_POOL.units.unit).values()  # what the reward pool declares
    assert {n for _, n in pool} == set(REWARD_POOL_METRICS), (
        "orchestrator.telemetry.ray_metrics.REWARD_POOL_METRICS is out of date")
    for cls, n in pool:
        names.add(f"ray_{n}")
        if cls == "Histogram":
            names |= {f"ray_{n}_bucket", f"ray_{n}_sum", f"ray_{n}_count"}
    return names


def test_metric_names_are_valid_prometheus_names():
    for n in [*GAUGES, *REWARD_POOL_METRICS]:
        assert METRIC_NAME_RE.match(n), n  # Ray drops invalid names silently


def test_grafana_dashboard_uses_only_exported_metrics():
    dash = json.loads((CLUSTER / "grafana-dashboard.json").read_text())
    assert dash["panels"] and dash["title"]
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v.get("definition")]
    used = {m for e in exprs for m in re.findall(r"\bray_rayward_\w+", e)}
    exported = exported_prometheus_names()
    assert used and used <= exported, sorted(used - exported)
    # the list: step, per-reward means, gates, reward latency, queue depth, workers, phases, tokens/s,
    # weight sync, logprob gap
    for need in ("ray_rayward_global_step", "ray_rayward_reward_fn_mean", "ray_rayward_gate_closed_frac",
                 "ray_rayward_reward_fn_latency_s", "ray_rayward_reward_queue_depth",
                 "ray_rayward_reward_workers_alive", "ray_rayward_phase_seconds", "ray_rayward_tokens_per_s",
                 "ray_rayward_weight_sync_s", "ray_rayward_logprob_gap_max",
                 # reward-pool autoscaling: target / starting workers, utilisation, queue wait, decisions
                 "ray_rayward_reward_workers_target", "ray_rayward_reward_workers_starting",
                 "ray_rayward_reward_utilization", "ray_rayward_reward_queue_wait_s_bucket",
                 "ray_rayward_reward_scale_decisions_total", "ray_rayward_reward_pool_target_workers"):
        assert need in used, need
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


# ---- Prometheus ------------------------------------------------------------------------------------------


def test_prometheus_script_scrapes_rays_service_discovery_file(tmp_path):
    import shutil
    import subprocess

    env = {"PATH": "/usr/bin:/bin", "RAY_TEMP_DIR": "/data/ray", "SCRAPE_INTERVAL": "5s"}
    out = subprocess.run(["bash", str(CLUSTER / "prometheus.sh"), "--print-config"], env=env, capture_output=True,
                         text=True, check=True).stdout
    cfg = yaml.safe_load(out)
    (job,) = cfg["scrape_configs"]
    assert job["file_sd_configs"][0]["files"] == ["/data/ray/prom_metrics_service_discovery.json"]
    assert cfg["global"]["scrape_interval"] == "5s"
    if shutil.which("promtool"):  # Debian's prometheus package ships it
        (tmp_path / "prometheus.yml").write_text(out)
        check = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    missing = subprocess.run(["bash", str(CLUSTER / "prometheus.sh")], env={**env, "PROMETHEUS": "no-such-binary"},
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "apt-get install prometheus" in missing.stderr
