"""The collective under weight transfer: a bucket plan, packing, and a process group with a timeout on every op.

Used on both ends: the learner's rank 0 (sender, `actors.weights.sender`) and every vLLM engine worker
(receivers, `actors.weights.receiver`), every tensor-parallel rank included. The group is a second torch
process group beside any the processes already have (vLLM's own TP group, the learner ranks' FSDP group),
built directly on a TCPStore + PrefixStore so it touches neither: `dist.broadcast(group=...)` refuses such a
group ("not registered"), so the backend's own `broadcast` is called.

Ranks: sender 0; engine e's worker with TP rank t is 1 + e * tp + t; world = 1 + engines * tp.
Backends: NCCL where the tensors live on CUDA, gloo on CPU, from the same code.

A timeout leaves the group dead on every end (gloo and NCCL alike): after one, every member makes a new group
under a new prefix on the same store (`WeightGroup.join(..., generation=g + 1)`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from actors.runtime.error_text import one_line
from actors.runtime.net import free_port, node_ip

# Offsets inside a packed bucket are multiples of this, so every tensor's bytes can be viewed as its dtype
# (a view needs an offset divisible by the element size) and start on a cache line.
ALIGN_BYTES = 64
# Tensors of at least this size go on the wire as they are (no copy: the learner's own parameter, or the gathered
# full tensor); smaller ones (norms, biases, small projections) are packed into one buffer per bucket, so a bucket
# costs one op for its small tensors. Packing the large ones too would copy most of the model on the sender for
# nothing, while a direct broadcast's per-op cost is small (bench/README.md, weight sync).
DIRECT_MIN_BYTES = 1 << 20
DIRECT = -1  # TensorMeta.offset of a tensor sent on its own


@dataclass(frozen=True)
class TensorMeta:
    """One tensor of a bucket: its HF name, dtype (torch name, e.g. "float32"), shape, byte size, and its offset
    in the bucket's packed buffer (DIRECT: sent on its own)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Bucket:
    """Tensors broadcast together: the small ones packed into one flat uint8 buffer of `nbytes` (first on the
    wire), then each direct tensor in order."""

    tensors: tuple[TensorMeta, ...]
    nbytes: int  # the packed buffer (0: no small tensors)

    @property
    def wire_bytes(self) -> int:
        return self.nbytes + sum(m.nbytes for m in self.tensors if m.offset == DIRECT)


def _aligned(n: int) -> int:
    return -(-n // ALIGN_BYTES) * ALIGN_BYTES


def plan_buckets(
    shapes: list[tuple[str, torch.dtype, tuple[int, ...]]], bucket_bytes: int, direct_bytes: int | None = None
) -> list[Bucket]:
    """Cut tensors (in order) into buckets of at most `bucket_bytes` (a tensor larger than that is a bucket of
    its own); tensors of at least `direct_bytes` (default: DIRECT_MIN_BYTES, or a quarter of a bucket if that is
    less: such a tensor gains nothing from packing) travel on their own. The plan is made once and sent to the
    receivers once, not with every sync."""
    if direct_bytes is None:
        direct_bytes = min(DIRECT_MIN_BYTES, bucket_bytes // 4)
    buckets: list[Bucket] = []
    cur: list[TensorMeta] = []
    size = packed = 0
    for name, dtype, shape in shapes:
        nbytes = int(torch.Size(shape).numel()) * torch.tensor([], dtype=dtype).element_size()
        if cur and size + nbytes > bucket_bytes:
            buckets.append(Bucket(tuple(cur), packed))
            cur, size, packed = [], 0, 0
        direct = nbytes >= direct_bytes
        cur.append(TensorMeta(name, str(dtype).removeprefix("torch."), tuple(shape), DIRECT if direct else packed,
                              nbytes))
        size += nbytes
        if not direct:
            packed = _aligned(packed + nbytes)
    if cur:
        buckets.append(Bucket(tuple(cur), packed))
    return buckets


def wire_tensors(bucket: Bucket, tensors: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Sender: what goes on the wire for a bucket, in order: the small tensors packed into one buffer (one copy
    each), then every direct tensor as it is (contiguous, no copy)."""
    out = []
    if bucket.nbytes:
        buf = torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)
        for meta, t in zip(bucket.tensors, tensors, strict=True):
            if meta.offset != DIRECT:
                buf[meta.offset : meta.offset + meta.nbytes].view(t.dtype).copy_(t.reshape(-1))
        out.append(buf)
    out += [t.contiguous() for meta, t in zip(bucket.tensors, tensors, strict=True) if meta.offset == DIRECT]
    return out


def receive_buffers(bucket: Bucket, device: torch.device) -> list[torch.Tensor]:
    """Receiver: fresh buffers matching `wire_tensors` one for one."""
    out = [torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)] if bucket.nbytes else []
    out += [
        torch.empty(m.shape, dtype=getattr(torch, m.dtype), device=device)
        for m in bucket.tensors if m.offset == DIRECT
    ]
    return out


def bucket_tensors(bucket: Bucket, bufs: list[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) in plan order from a bucket's received buffers: views, no copy (the loader copies them)."""
    packed = bufs[0] if bucket.nbytes else None
    direct = iter(bufs[1:] if bucket.nbytes else bufs)
    out = []
    for m in bucket.tensors:
        if m.offset == DIRECT:
            out.append((m.name, next(direct)))
        else:
            assert packed is not None
            out.append((m.name, packed[m.offset : m.offset + m.nbytes].view(getattr(torch, m.dtype)).view(m.shape)))
    return out


class WeightTransferError(RuntimeError):
    """A weight-transfer group could not form, or an op on it failed or timed out (the message names the stage)."""


class WeightGroup:
    """This process's membership of the weight-transfer group: rank, backend, the torch process group."""

    def __init__(self, pg: Any, rank: int, world_size: int, device: torch.device, timeout_s: float):
        self.pg, self.rank, self.world_size = pg, rank, world_size
        self.device, self.timeout_s = device, timeout_s

    @staticmethod
    def open_store(world_size: int, timeout_s: float) -> tuple[Any, str, int]:
        """Rank 0: listen for the group's members. Returns (store, host, port); the store must stay alive as
        long as the group (and across re-forms, which reuse it with a new prefix)."""
        host, port = node_ip(), free_port()
        store = torch.distributed.TCPStore(
            host, port, world_size, is_master=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
        )
        return store, host, port

    @classmethod
    def join(
        cls,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        timeout_s: float,
        generation: int,
        store: Any = None,
        host: str | None = None,
        port: int | None = None,
    ) -> WeightGroup:
        """Join generation `generation` of the group (blocks until every member joined, or raises after
        timeout_s). Rank 0 passes its store; the others connect to host:port."""
        import torch.distributed as dist

        timeout = timedelta(seconds=timeout_s)
        try:
            if store is None:
                store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
        except Exception as err:  # noqa: BLE001
            raise WeightTransferError(
                f"rank {rank} of {world_size} could not reach the weight-transfer store at {host}:{port} within "
                f"{timeout_s:.0f} s ({one_line(err)})"
            ) from None
        prefixed = dist.PrefixStore(f"rayward-weights/{generation}", store)
        _rendezvous(prefixed, rank, world_size, timeout)
        try:
            if device.type == "cuda":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
            else:
                pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        except Exception as err:  # noqa: BLE001 - DistStoreError, gloo connect errors: one message
            raise WeightTransferError(
                f"rank {rank} of {world_size} could not join the weight-transfer group within {timeout_s:.0f} s "
                f"({one_line(err)})"
            ) from None
        return cls(pg, rank, world_size, device, timeout_s)

    def broadcast(self, bufs: list[torch.Tensor]) -> list[Any]:
        """Start broadcasting each of `bufs` from rank 0 (into the same buffers on the others), in order;
        returns the works to wait on."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.timeout = timedelta(seconds=self.timeout_s)
        return [self.pg.broadcast([b], opts) for b in bufs]

    def wait(self, works: list[Any], stage: str) -> float:
        """Wait for broadcasts; returns the seconds waited. A failure or timeout names the stage."""
        t0 = time.perf_counter()
        try:
            for work in works:
                work.wait()
        except Exception as err:  # noqa: BLE001
            raise WeightTransferError(
                f"weight transfer failed at {stage} (rank {self.rank} of {self.world_size}, timeout "
                f"{self.timeout_s:.0f} s): {one_line(err)}"
            ) from None
        return time.perf_counter() - t0

    def close(self) -> None:
        pg, self.pg = self.pg, None
        if pg is None:
            return
        try:
            pg.abort()
        except Exception:  # noqa: BLE001 - a dead group may refuse even this
            pass


def _rendezvous(store: Any, rank: int, world_size: int, timeout: timedelta) -> None:
    """Every member announces itself in the store and waits for all the others before any gloo/NCCL connection
    is made. A member that never comes is then a clean error naming the missing ranks: a process group whose
    own rendezvous times out half-way leaves half-connected sockets behind, and gloo's I/O thread later aborts
    the process on them."""
    store.set(f"joined/{rank}", "1")
    keys = [f"joined/{r}" for r in range(world_size)]
    try:
        store.wait(keys, timeout)
    except Exception:  # noqa: BLE001 - DistStoreError on timeout
        try:
            missing = f"ranks {[r for r in range(world_size) if not store.check([f'joined/{r}'])]} never joined"
        except Exception:  # noqa: BLE001 - rank 0 (the store) gave up first and is gone
            missing = "rank 0 gave up waiting for the others first"
        raise WeightTransferError(
            f"rank {rank} of {world_size}: the weight-transfer group did not form within "
            f"{timeout.total_seconds():.0f} s: {missing}"
        ) from None


def plan_to_wire(plan: list[Bucket]) -> list[list[Any]]:
    """The plan as plain lists: vLLM's collective_rpc serialises arguments with msgspec, which carries lists
    intact but not dataclasses."""
    return [[b.nbytes, [[m.name, m.dtype, list(m.shape), m.offset, m.nbytes] for m in b.tensors]] for b in plan]


def plan_from_wire(wire: list[list[Any]]) -> list[Bucket]:
    return [
        Bucket(tuple(TensorMeta(n, d, tuple(s), o, b) for n, d, s, o, b in tensors), int(nbytes))
        for nbytes, tensors in wire
    ]
