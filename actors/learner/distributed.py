"""The learner ranks' process group and FSDP2 sharding, the state-dict views the weights and checkpoints need,
and the reductions of the step's numbers over ranks.

Several learner ranks (one Ray actor each, or one process each in tests) form one torch.distributed process
group (gloo on CPU, NCCL on CUDA) and shard the policy and the reference model with FSDP2. Each reduction is
the identity on one rank, so a single-rank learner never touches torch.distributed.
"""

from __future__ import annotations

import os
from collections import defaultdict
from datetime import timedelta
from typing import Any

import torch

from actors.learner.specs import ParallelSpec
from actors.runtime.cpus import pick_cores
from actors.runtime.net import free_port, interface_of, node_ip

# Seconds a rank waits in a collective before raising. Long, because the other ranks wait at a barrier
# while rank 0 writes a full checkpoint of a multi-GB model; a rank that raised (its peers block in the
# next collective) surfaces on the others after at most this long. A rank whose process died surfaces
# at once (the peers' connections close).
DIST_TIMEOUT_S = 1800


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """{alias: source} for state_dict entries sharing storage with an earlier one (a tied lm_head ->
    embed_tokens). Taken before sharding: FSDP's full state dict returns the alias as a separate copy."""
    first: dict[int, str] = {}
    out = {}
    for name, t in model.state_dict().items():
        ptr = t.untyped_storage().data_ptr()
        if ptr in first:
            out[name] = first[ptr]
        else:
            first[ptr] = name
    return out


def place(parallel: ParallelSpec, device: str | None) -> tuple[torch.device, list[int]]:
    """This rank's device (`device`, or CUDA when there is one), after joining the ranks' process group
    (FSDP), and the CPU cores a CPU learner may compute on (actors/runtime/cpus.py; none on CUDA)."""
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cores = pick_cores(None) if kind == "cpu" else []
    if parallel.sharded:
        return init_process_group(parallel.rank, parallel.world_size, parallel.init_method, kind), cores
    return torch.device(kind), cores


def init_process_group(rank: int, world_size: int, init_method: str | None, kind: str) -> torch.device:
    """Join the learners' process group (once per process); returns this rank's device."""
    import torch.distributed as dist

    cuda = kind == "cuda"
    # Ray shows each learner actor only its own GPU (index 0); processes spawned on one multi-GPU host
    # (tests) see them all and take GPU `rank`.
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # gloo listens on the address this host's name resolves to, which on many machines is a loopback one
        # (127.0.1.1 in Debian's /etc/hosts): ranks on other nodes could not connect. Bind it to the interface
        # holding the node's address as Ray knows it (the one rank 0's rendezvous address is on), unless set.
        ifname = interface_of(node_ip())
        if ifname is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
        if init_method is None:
            if world_size != 1:
                raise ValueError("world_size > 1 needs init_method (tcp://host:port of rank 0)")
            init_method = f"tcp://127.0.0.1:{free_port()}"
        dist.init_process_group(
            # gloo next to NCCL on CUDA: the metric and checkpoint objects travel as CPU tensors
            backend="cpu:gloo,cuda:nccl" if cuda else "gloo",
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=DIST_TIMEOUT_S),
        )
    return device


def shard(model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """FSDP2 in place: each transformer block (HF's `_no_split_modules` classes) is one unit, all-gathered
    for its forward and backward and resharded after; the root unit holds the rest (embeddings, final norm,
    a tied lm_head once). Gradients are summed over ranks (divide factor 1), not averaged: each rank's
    micro-batch losses already carry the whole step's normalisers."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    # explicit: fully_shard's default mesh is CUDA whenever CUDA exists, even for a CPU learner
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy()  # float32: compute in the parameters' dtype
    if dtype != torch.float32:
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for m in [m for m in model.modules() if type(m).__name__ in blocks]:
        fully_shard(m, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # a plain SUM; factor 1 alone asks for PREMUL_SUM (no gloo)


def gather_metrics(sums: dict[str, list[float]], world_size: int) -> dict[str, list[float]]:
    """Every rank's per-micro-batch metric values, concatenated in rank order (identity on one rank)."""
    if world_size == 1:
        return sums
    import torch.distributed as dist

    parts: list[Any] = [None] * world_size
    dist.all_gather_object(parts, dict(sums))
    merged: dict[str, list[float]] = defaultdict(list)
    for part in parts:
        for k, v in part.items():
            merged[k].extend(v)
    return merged


def gather_records(records: dict[int, list[float]], world_size: int) -> dict[int, list[float]]:
    """Every rank's per-row records merged (each row is one rank's; identity on one rank)."""
    if world_size == 1:
        return records
    import torch.distributed as dist

    parts: list[Any] = [None] * world_size
    dist.all_gather_object(parts, records)
    return {k: v for part in parts for k, v in part.items()}


def sum_over_ranks(values: list[float], world_size: int, op: str = "sum") -> list[float]:
    """Each value summed (op "sum") or maxed ("max") over ranks (identity on one rank)."""
    if world_size == 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)  # a CPU tensor: gloo carries it, also next to NCCL
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t.tolist()
