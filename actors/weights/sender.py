"""Learner side of weight transfer: the policy's tensors, cut into buckets, sent to every engine worker.

Every learner rank holds one `WeightSender`; with FSDP ranks every rank takes part in gathering each bucket's
full tensors (a collective of the learner ranks), and rank 0 alone belongs to the weight-transfer group and
broadcasts. Gathering a bucket completes on all ranks before rank 0 sends it: gathers interleaved with the
send, rank against rank, have hung peers (TRL PR 7131). Extra memory on rank 0: two buckets (the one on the
wire and the next one being packed), never a copy of the model.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from actors.weights.collective import Bucket, WeightGroup, plan_buckets, plan_to_wire, wire_tensors

MB = 1 << 20


class WeightSender:
    def __init__(
        self, model: torch.nn.Module, *, tied: dict[str, str], dtype: torch.dtype, rank: int, device: torch.device
    ):
        """tied: {alias: source} of the model's tied tensors (the alias is not sent: the receiver derives it).
        dtype: the dtype the generators run in (FSDP may hold float32 masters and compute in bfloat16)."""
        self.model, self.tied, self.dtype, self.rank, self.device = model, tied, dtype, rank, device
        self.buckets: list[Bucket] = []
        self.group: WeightGroup | None = None
        self._store: Any = None  # rank 0's TCPStore: outlives every generation of the group
        self._world_size = 0
        self._timeout_s = 0.0

    def _tensors(self) -> dict[str, torch.Tensor]:
        """HF name -> this rank's tensor (a DTensor shard under FSDP), tied aliases dropped."""
        return {k: v for k, v in self.model.state_dict().items() if k not in self.tied}

    def _full(self, t: torch.Tensor) -> torch.Tensor:
        """The whole tensor in the generators' dtype (a collective of all learner ranks for a DTensor)."""
        full = t.full_tensor() if hasattr(t, "full_tensor") else t
        return full.detach().to(self.dtype)

    def plan(self, bucket_mb: float) -> list[list[Any]]:
        """Cut the policy into buckets of at most bucket_mb; returns the plan in wire form (sent once)."""
        shapes = [(name, self.dtype, tuple(t.shape)) for name, t in self._tensors().items()]
        self.buckets = plan_buckets(shapes, int(bucket_mb * MB))
        return plan_to_wire(self.buckets)

    def export_bytes(self) -> bytes:
        """Every tensor as safetensors bytes on rank 0 (b"" elsewhere): the object-store backend."""
        from safetensors.torch import save

        full = {name: self._full(t).cpu() for name, t in self._tensors().items()}
        return save(full) if self.rank == 0 else b""

    def open(self, world_size: int, timeout_s: float) -> tuple[str, int]:
        """Rank 0: start the store the group's members meet at (once per run)."""
        self._world_size, self._timeout_s = world_size, timeout_s
        if self.rank != 0:
            return "", 0
        if self.group is not None:
            self.group.close()
            self.group = None
        self._store, host, port = WeightGroup.open_store(world_size, timeout_s)
        return host, port

    def join(self, generation: int) -> int:
        """Rank 0 joins generation `generation` of the group (returns when every member has joined)."""
        if self.rank != 0:
            return 0
        if self.group is not None:
            self.group.close()
            self.group = None
        self.group = WeightGroup.join(
            rank=0, world_size=self._world_size, device=self.device, timeout_s=self._timeout_s,
            generation=generation, store=self._store,
        )
        return 0

    def send(self) -> dict[str, float]:
        """Broadcast every bucket; the next bucket is gathered and packed while the previous one is on the
        wire. Returns gather_s (gather + pack), transfer_s (waiting on the wire), bytes (rank 0). Large tensors
        go on the wire as they are: on a single learner in the run's dtype, the parameters themselves (nothing
        changes them while the learner actor is inside this call)."""
        if not self.buckets:
            raise RuntimeError("send before plan: the weight transfer was not connected")
        tensors = self._tensors()
        stats = {"gather_s": 0.0, "transfer_s": 0.0, "bytes": 0.0}
        in_flight: tuple[list[Any], int] | None = None  # (works, bucket index) of the bucket on the wire
        for k, bucket in enumerate(self.buckets):
            t0 = time.perf_counter()
            full = [self._full(tensors[m.name]) for m in bucket.tensors]  # every rank, together
            if self.rank != 0:
                continue
            bufs = wire_tensors(bucket, full, self.device)
            del full
            stats["gather_s"] += time.perf_counter() - t0
            if in_flight is not None:
                stats["transfer_s"] += self._wait(*in_flight)
            assert self.group is not None, "rank 0 sends only after joining the group"
            in_flight = (self.group.broadcast(bufs), k)
            stats["bytes"] += bucket.wire_bytes
        if in_flight is not None:
            stats["transfer_s"] += self._wait(*in_flight)
        return stats

    def _wait(self, works: list[Any], k: int) -> float:
        assert self.group is not None
        return self.group.wait(works, f"sending bucket {k + 1}/{len(self.buckets)}")
