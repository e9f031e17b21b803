"""Ray in one place: starting or joining a cluster, run names and namespaces, the actors' resource options."""

from __future__ import annotations

import os
import secrets
from typing import Any

from orchestrator.config import ClusterConfig, ConfigError, Resources

NAMESPACE_PREFIX = "rayward-"
# Environment every rayward process needs (driver and actors): torch tensors through the object store
# without pickling copies, and the token-auth mode clients must see to send the token (Ray 2.60).
# vLLM logs every weight reload (and a harmless "RotaryEmbedding: Failed to load weights" warning, rotary
# has no weights); ERROR keeps the driver's progress lines readable. Set VLLM_LOGGING_LEVEL to see more.
ACTOR_ENV = {
    "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "RAY_DEDUP_LOGS": "1",
}


def new_run_name(prefix: str = "run") -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def namespace(run_name: str) -> str:
    return f"{NAMESPACE_PREFIX}{run_name}"


def actor_options(res: Resources, **extra: Any) -> dict[str, Any]:
    """Ray `.options()` for one actor from its Resources section (pure; unit-tested)."""
    opts: dict[str, Any] = {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus}
    if res.resources:
        opts["resources"] = dict(res.resources)
    opts.update(extra)
    return opts


def generator_options(res: Resources, tensor_parallel_size: int, max_restarts: int, **extra: Any) -> dict[str, Any]:
    """A generator actor's `.options()`: its engine's tensor-parallel workers are processes of the actor, so the
    actor holds the GPUs of all of them (one node), and Ray restarts it after a crash."""
    opts = actor_options(res, max_restarts=max_restarts, **extra)
    opts["num_gpus"] = res.num_gpus * tensor_parallel_size
    return opts


def check_learner_placement(cfg: ClusterConfig, nodes: list[dict[str, Any]]) -> None:
    """`learner_placement: spread` against the cluster's nodes (`ray.nodes()`: Alive, Resources totals): it needs
    num_learners live nodes that can each hold one rank. Raises ConfigError naming the field (pure; called when Ray
    has started, before any actor)."""
    if cfg.learner_placement != "spread":
        return
    bundle = {"CPU": cfg.learner.num_cpus, "GPU": cfg.learner.num_gpus, **cfg.learner.resources}
    fit = [n for n in nodes if n.get("Alive") and all(n["Resources"].get(k, 0) >= v for k, v in bundle.items() if v)]
    if len(fit) < cfg.num_learners:
        need = {k: v for k, v in bundle.items() if v}
        raise ConfigError(
            f"cluster.learner_placement: spread puts each of the {cfg.num_learners} learner ranks on its own node, "
            f"but the cluster has {len(fit)} live node(s) with room for one rank ({need}) of {len(nodes)} node(s); "
            "use learner_placement: pack (one node), or add nodes"
        )


def run_sys_path() -> list[str]:
    """Directories reward workers put on sys.path: the run directory, as `python -m` would."""
    return [os.getcwd()]


# An embedded cluster's GCS keeps the events of at most this many tasks for the dashboard (Ray's default, 100,000,
# is sized for a shared cluster): a run submits thousands of tasks a step (agentic: a few per tool call), and the
# gcs_server grows with every one kept until the cap (bench/README.md "The long runs"). The dashboard's task table and
# `ray list tasks` show at most 10,000 (the state API's limit), so nothing they can show is dropped.
# Set through the environment the embedded cluster's processes start with (its GCS and its dashboard's task-event
# store both read it); the user's own RAY_task_events_max_num_task_in_gcs wins, and a cluster the run joins keeps
# its own setting.
EMBEDDED_TASK_EVENTS = 10_000
TASK_EVENTS_ENV = "RAY_task_events_max_num_task_in_gcs"

# How long a client command waits for a TCP connection to a Ray address before saying it is unreachable
# (ray.init itself retries for ~20 s+ and then blames the network in a long traceback).
CONNECT_TIMEOUT_S = 3.0


class UnreachableError(ConnectionError):
    """Nothing answers at the given Ray address."""


def check_reachable(address: str) -> None:
    """Raise UnreachableError unless host:port (GCS, or http://host:port dashboard) accepts a TCP connection."""
    import socket
    from urllib.parse import urlparse

    if address in ("auto", "local", ""):
        return
    hostport = urlparse(address).netloc if "://" in address else address
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except (OSError, ValueError) as err:
        raise UnreachableError(f"cannot reach a Ray cluster at {address} ({err})") from None


def ray_address(cfg: ClusterConfig) -> tuple[str | None, str]:
    """Which Ray cluster a run uses, and why: cluster.address, else $RAY_ADDRESS (set inside a Ray job, or by the
    user), else None: an embedded cluster of its own, whatever other Ray cluster this machine runs (ray.init
    without an address would join one it finds here)."""
    if cfg.address is not None:
        return cfg.address, "cluster.address"
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    return None, "embedded"


def init_ray(cfg: ClusterConfig, run_name: str) -> dict[str, Any]:
    """Join the cluster `ray_address` names, or start an embedded local one; returns ray.init's context info."""
    for k, v in ACTOR_ENV.items():
        os.environ.setdefault(k, v)
    import ray

    env_vars = {k: os.environ[k] for k in ACTOR_ENV}
    # Actors import the run directory's modules (user reward functions) like the driver does.
    env_vars["PYTHONPATH"] = os.pathsep.join(p for p in (*run_sys_path(), os.environ.get("PYTHONPATH")) if p)
    kwargs: dict[str, Any] = dict(
        namespace=namespace(run_name),
        runtime_env={"env_vars": env_vars},
        log_to_driver=True,
        configure_logging=False,
    )
    address, _ = ray_address(cfg)
    if address is None:
        kwargs.update(address="local", num_cpus=cfg.local_num_cpus or os.cpu_count() or 2, include_dashboard=True)
        os.environ.setdefault(TASK_EVENTS_ENV, str(EMBEDDED_TASK_EVENTS))
    else:
        kwargs["address"] = address
    ctx = ray.init(**kwargs)
    return {"dashboard_url": getattr(ctx, "dashboard_url", None), "address": getattr(ctx, "address_info", {})}
