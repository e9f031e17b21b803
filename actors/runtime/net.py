"""Network helpers shared by the stages that open their own TCP rendezvous (learner ranks, weight transfer)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on this host now (the OS picks it; another process may take it before it is bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def node_ip() -> str:
    """This node's address as Ray knows it (reachable from the other nodes), or loopback outside Ray (also where Ray
    is not installed: a learner alone on a GPU host, scripts/gpu_smoke.sh)."""
    try:
        import ray
    except ImportError:
        return "127.0.0.1"

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


def interface_of(ip: str) -> str | None:
    """The name of this host's network interface that holds `ip` (e.g. eth0, lo), or None."""
    import socket

    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    return None
