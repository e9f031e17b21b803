"""Every use of Ray's private APIs, in one place: what rayward needs that Ray 2.60 has no public API for.

Checked on Ray CHECKED_RAY_VERSION (pyproject pins it). A Ray upgrade reviews this file alone: each function
names the private module it reaches into, and what rayward does when it is gone. Nothing else in rayward imports
`ray._private`, `ray._raylet` or reads a handle's `_actor_id` (tests/unit/test_imports.py checks).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CHECKED_RAY_VERSION = "2.60.0"


def actor_id(handle: Any) -> str:
    """An actor handle's id, hex (as `RayActorError.actor_id` and the GCS's actor table name it)."""
    return handle._actor_id.hex()


def actor_table(handle: Any) -> dict[str, Any]:
    """The GCS's record of an actor (`ray._private.state`): State (ALIVE, RESTARTING, PENDING_CREATION, DEAD...),
    NumRestarts, Pid, Address.NodeID; {} if the GCS does not know it. (ray.util.state's list_actors is public but
    goes through the dashboard's HTTP server, which a run may not have.)"""
    from ray._private.state import state

    return state.actor_table(actor_id(handle)) or {}


def draining_nodes() -> dict[str, int]:
    """The nodes the cluster is draining (`ray._private.state.get_draining_nodes`): {node id: deadline in ms since
    the epoch, 0 = none}."""
    from ray._private.state import state

    return state.get_draining_nodes()


@contextlib.contextmanager
def ray_init_keeps_sigterm() -> Iterator[None]:
    """ray.init's first act is to install its own SIGTERM handler (`ray._private.utils.set_sigterm_handler`,
    sys.exit(15)); inside this block it installs none, and the caller's stays. Without that function: no-op."""
    import ray._private.utils as ray_utils

    install = getattr(ray_utils, "set_sigterm_handler", None)
    if install is None:
        yield
        return
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = install


def log_dispatcher() -> Any | None:
    """The driver's dispatcher of the actors' forwarded output (`ray._private.ray_logging`): add_handler(name, fn),
    remove_handler(name); Ray's own printer is registered under RAY_PRINT_HANDLER. None if this Ray has none."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher
    except ImportError:
        return None
    return global_worker_stdstream_dispatcher


# The name of Ray's own printer in the dispatcher (ray._private.worker.connect).
RAY_PRINT_HANDLER = "ray_print_logs"


def autoscaler_events(lines: list[str]) -> list[str]:
    """The autoscaler's events among its forwarded lines (`ray._private.worker.filter_autoscaler_events`; without
    it, or without a GCS to ask which autoscaler runs: the V1 marker)."""
    try:
        from ray._private.worker import filter_autoscaler_events

        return list(filter_autoscaler_events(lines))
    except Exception:  # noqa: BLE001 - no such helper, or no GCS to ask
        return [ln.split(":event_summary:", 1)[1] for ln in lines if ":event_summary:" in ln]


def walk_upload(root: Path, excludes: list[str], handler: Callable[[Path], None], logger: logging.Logger) -> None:
    """Call `handler` on every path Ray's job submission would upload from `root` (`ray._private.runtime_env.
    packaging`: excludes, .gitignore, .rayignore applied as Ray applies them)."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    _dir_travel(root, [_get_excludes(root, excludes)], handler, include_gitignore=True, logger=logger)


def refresh_config() -> None:
    """Ray caches RAY_AUTH_MODE in its config when `ray` is imported; re-read it (`ray._raylet.Config`, as Ray's
    own _enable_token_auth does)."""
    from ray._raylet import Config

    Config.initialize("")


def shutdown_without_grace() -> None:
    """ray.shutdown() for an embedded cluster whose processes were started with SIGTERM blocked (so that a
    signal for the whole job reaches the driver alone: orchestrator/run/signals.py). Ray's graceful stop sends each
    process SIGTERM and waits a second for it before SIGKILL; here it goes straight to SIGKILL (the driver has
    already disconnected; the workers die with their raylet: kernel fate-sharing). `ray._private.worker.
    _global_node.kill_all_processes`'s allow_graceful; without that node: a plain ray.shutdown()."""
    import ray
    from ray._private import worker

    node = getattr(worker, "_global_node", None)
    if node is not None and hasattr(node, "kill_all_processes"):
        graceful = node.kill_all_processes

        def kill_all_processes(*args: Any, **kwargs: Any) -> Any:
            return graceful(*args, **{**kwargs, "allow_graceful": False})

        node.kill_all_processes = kill_all_processes
    ray.shutdown()


def route_error_messages(handler: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
    """Send the errors Ray publishes to the driver (a worker died or was killed, an actor's OOM, ...: printed by
    `ray._private.worker.listen_error_messages` through the module's `print_to_stdstream`, beside the log
    dispatcher) to `handler` instead of the terminal; the same {"lines", "pid", "is_err"} records. Returns what
    puts Ray's printer back."""
    from ray._private import worker

    printer = worker.print_to_stdstream
    worker.print_to_stdstream = lambda data, ignore_prefix=False: handler(data)

    def restore() -> None:
        worker.print_to_stdstream = printer

    return restore
