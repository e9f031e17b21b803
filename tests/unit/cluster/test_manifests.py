"""cluster/: the launcher YAML against Ray's shipped JSON schema, the KubeRay manifests against KubeRay's CRD
schemas (vendored in kuberay_crds/) and rayward's shape, the shared volume's claim and the kustomization that
picks the image, and the Grafana dashboard against the metric names rayward actually exports."""

from __future__ import annotations

import functools
import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

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
    # The code comes from the image: the entrypoint runs where cluster/Dockerfile put rayward and its configs/, and
    # no working_dir is shipped (nothing to upload, no placeholder URL).
    workdir = re.search(r"^WORKDIR (\S+)$", (CLUSTER / "Dockerfile").read_text(), re.M).group(1)
    assert re.match(rf"cd {re.escape(workdir)} && python -m orchestrator run configs/\S+\.yaml ", spec["entrypoint"])
    config = spec["entrypoint"].split(" run ")[1].split()[0]
    assert (ROOT / config).is_file(), config
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])  # a YAML string, parsed by KubeRay
    assert "working_dir" not in runtime_env, runtime_env
    check_raycluster_spec(spec["rayClusterSpec"], "RayJob.spec.rayClusterSpec")
    for c in _check_pod_template(spec["submitterPodTemplate"], "RayJob.spec.submitterPodTemplate"):
        _check_auth_env(c, "submitter")  # `ray job submit` needs the token too
    if spec.get("shutdownAfterJobFinishes") is not True:
        assert "ttlSecondsAfterFinished" not in spec


# KubeRay's own schemas (kuberay_crds/README.md: the tag they came from), with the API server's strictness on
# unknown fields: a misspelt field fails here instead of being dropped on `kubectl apply`.
CRDS = Path(__file__).parent / "kuberay_crds"


def strict(schema: dict) -> dict:
    """`schema` with every object that lists its properties closed to others (KubeRay's schemas leave that to the
    API server: `kubectl apply --validate=strict` refuses an unknown field, a lax apply drops it)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(v) for v in schema]
    return schema


@functools.cache
def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    schema = json.loads(gzip.decompress((CRDS / f"{kind.lower()}-v1.schema.json.gz").read_bytes()))
    return jsonschema.Draft7Validator(strict(schema))


def crd_errors(doc: dict) -> list[str]:
    errors = crd_validator(doc["kind"]).iter_errors(doc)
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:200]}" for e in errors)


@pytest.mark.parametrize("name", ["kuberay-raycluster.yaml", "kuberay-rayjob.yaml"])
def test_kuberay_manifests_match_kuberays_crd_schemas(name):
    assert crd_errors(load(name)) == []


def test_crd_schema_check_can_fail():
    bad = load("kuberay-raycluster.yaml")
    bad["spec"]["workerGroupSpecs"][0]["replica"] = 2  # misspelt: KubeRay would run its default instead
    bad["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] = 0  # rayStartParams values are strings
    errors = crd_errors(bad)
    assert any("workerGroupSpecs.0" in e and "'replica'" in e for e in errors), errors
    assert any("rayStartParams.num-gpus" in e for e in errors), errors
    job = load("kuberay-rayjob.yaml")
    job["spec"]["backOffLimit"] = 2  # the field is backoffLimit
    job["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["env"][0]["valueFrom"] = "x"
    errors = crd_errors(job)
    assert any("'backOffLimit'" in e for e in errors) and any("submitterPodTemplate" in e for e in errors), errors


def test_kuberay_check_can_fail():
    doc = load("kuberay-raycluster.yaml")
    del doc["spec"]["workerGroupSpecs"][0]["maxReplicas"]
    with pytest.raises(AssertionError, match="maxReplicas"):
        check_raycluster_spec(doc["spec"], "RayCluster.spec")


# ---- the shared volume and the kustomization -----------------------------------------------------------

# core/v1 PersistentVolumeClaim as the Kubernetes API reference defines it (the fields a claim sets; status and the
# server-set metadata left out), closed to unknown fields as the API server's strict validation is.
QUANTITY = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
PVC_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "v1"}, "kind": {"const": "PersistentVolumeClaim"},
        "metadata": {"type": "object", "additionalProperties": False, "required": ["name"], "properties": {
            "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 253},
            "namespace": {"type": "string"}, "labels": STRING_MAP, "annotations": STRING_MAP}},
        "spec": {"type": "object", "additionalProperties": False, "required": ["accessModes", "resources"],
                 "properties": {
                     "accessModes": {"type": "array", "minItems": 1, "items": {
                         "enum": ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"]}},
                     "resources": {"type": "object", "additionalProperties": False, "properties": {
                         "requests": {"type": "object", "required": ["storage"], "additionalProperties": QUANTITY},
                         "limits": {"type": "object", "additionalProperties": QUANTITY}}},
                     "storageClassName": {"type": "string"}, "volumeMode": {"enum": ["Filesystem", "Block"]},
                     "volumeName": {"type": "string"}, "volumeAttributesClassName": {"type": "string"},
                     "selector": {"type": "object"}, "dataSource": {"type": "object"},
                     "dataSourceRef": {"type": "object"}}},
    },
}


def _walk(obj, key: str):
    """Every value stored under `key` anywhere in obj."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                yield v
            yield from _walk(v, key)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v, key)


KUBERAY = ("kuberay-raycluster.yaml", "kuberay-rayjob.yaml")


def test_pvc_is_the_read_write_many_claim_every_ray_pod_mounts():
    pvc = load("rayward-runs-pvc.yaml")
    jsonschema.validate(pvc, PVC_SCHEMA)
    assert "ReadWriteMany" in pvc["spec"]["accessModes"]  # the driver (head) and the learner (a GPU pod) write it
    for name in KUBERAY:
        doc = load(name)
        claims = {v["claimName"] for v in _walk(doc, "persistentVolumeClaim")}
        assert claims == {pvc["metadata"]["name"]}, (name, claims)
        # the driver (head) and the learner (GPU workers) write the run's directory; reward pods need not
        spec = doc["spec"].get("rayClusterSpec", doc["spec"])
        writers = [spec["headGroupSpec"], *(g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu-workers")]
        for group in writers:
            for container in group["template"]["spec"]["containers"]:
                assert {"name": "runs", "mountPath": "/mnt/shared"} in container.get("volumeMounts", []), (
                    name, container["name"])
    # the GPU config's runs land on it
    gpu_cfg = yaml.safe_load((ROOT / "configs" / "gpu-cluster.yaml").read_text())
    assert gpu_cfg["logging"]["dir"].startswith("/mnt/shared/")


def test_pvc_check_can_fail():
    pvc = load("rayward-runs-pvc.yaml")
    pvc["spec"]["accesModes"] = pvc["spec"].pop("accessModes")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pvc, PVC_SCHEMA)
    pvc = load("rayward-runs-pvc.yaml")
    pvc["spec"]["resources"]["requests"]["storage"] = "200GB"  # not a Kubernetes quantity (200G or 200Gi)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pvc, PVC_SCHEMA)


def _image_names(doc) -> set[str]:
    return {c["image"] for containers in _walk(doc, "containers") for c in containers}


def test_kustomization_picks_every_manifests_image():
    k = load("kustomization.yaml")
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    assert set(k) <= {"apiVersion", "kind", "resources", "images"}, set(k)
    assert all((CLUSTER / r).is_file() for r in k["resources"]), k["resources"]
    assert "rayward-runs-pvc.yaml" in k["resources"] and sum(r in KUBERAY for r in k["resources"]) == 1
    (entry,) = k["images"]
    assert set(entry) == {"name", "newName", "newTag"}, entry
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert entry["newTag"] == f"{version}-gpu", entry  # the tag scheme: {rayward version}-{gpu|cpu}
    for name in KUBERAY:  # the RayJob too: it takes the RayCluster's place in resources
        images = _image_names(load(name))
        assert images and {i.rsplit(":", 1)[0] for i in images} == {entry["name"]}, (name, images)
    for f in CLUSTER.rglob("*"):
        if f.is_file():
            assert "your-org" not in f.read_text(errors="replace"), f"a placeholder organisation in {f}"


def _kustomize() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


@pytest.mark.parametrize("workload", KUBERAY)
def test_kustomize_builds_with_the_image_set_in_one_place(workload, tmp_path):
    """A real kustomize build (kubectl's own, or the kustomize binary) of the kustomization, with the RayCluster
    or (as cluster/kustomization.yaml says to) the RayJob, and the image pointed at a registry: every container
    of every object gets it, the RayJob's submitter included."""
    cmd = _kustomize()
    if cmd is None:
        pytest.skip("no kubectl or kustomize binary")
    for f in CLUSTER.glob("*.yaml"):
        shutil.copy(f, tmp_path)
    k = load("kustomization.yaml")
    k["resources"] = ["rayward-runs-pvc.yaml", workload]
    k["images"][0]["newName"] = "registry.example.com/ml/rayward"
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(k))
    p = subprocess.run([*cmd, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    docs = [d for d in yaml.safe_load_all(p.stdout) if d]
    assert sorted(d["kind"] for d in docs) == sorted(["PersistentVolumeClaim", load(workload)["kind"]])
    built = [d for d in docs if d["kind"] != "PersistentVolumeClaim"][0]
    images = [c["image"] for containers in _walk(built, "containers") for c in containers]
    want = f"registry.example.com/ml/rayward:{k['images'][0]['newTag']}"
    assert images and set(images) == {want}, images
    assert len(images) == len(list(_walk(load(workload), "image")))
    assert crd_errors(built) == []


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
    # the issue's list: step, per-reward means, gates, reward latency, queue depth, workers, phases, tokens/s,
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


def test_cluster_readme_has_a_row_for_every_file():
    """cluster/README.md's table describes each file of cluster/ (a new one gets its row)."""
    rows = set(re.findall(r"^\| `([^`]+)` \|", (CLUSTER / "README.md").read_text(), re.M))
    files = {str(f.relative_to(CLUSTER)) for f in CLUSTER.rglob("*") if f.is_file() and f.name != "README.md"}
    assert files <= rows, sorted(files - rows)
