"""Weight transfer, driver side: moving the learner's weights into every generator engine after each update.

One interface (`WeightTransfer`), two backends, chosen when the run is built (`weight_sync.backend`):

- `CollectiveTransfer` (default): the learner's rank 0 broadcasts bucket after bucket over a process group that
  holds every engine worker (every tensor-parallel rank); each worker loads each bucket in place as it arrives
  (`actors.weights.sender` / `receiver` / `collective`). NCCL on GPUs, gloo on CPU. Nothing goes through the
  object store or an RPC argument; every op has a timeout. `connect()` forms the group once, when it is built.
- `ObjectStoreTransfer`: the whole state dict as safetensors bytes through Ray's object store (rayward's first
  path; kept as a fallback where the engines cannot reach the learner's node over TCP, and for comparison).

Both: `push(version)` (blocking) or `submit_async(version)` + `drain()` (pipelined: the sync runs in each
generator's "weights" concurrency group, between two engine steps of generation in flight), and
`rejoin(version)` after a generator restarted. version: the learner's step whose weights these are; the engines
label every token sampled after the load with it (Sample.versions), and a generation call with
min_version=step waits for it. None: each engine's current version + 1 (the label then is not the step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import ray
from ray.exceptions import RayActorError

from actors.runtime.error_text import one_line
from actors.runtime.group import GeneratorGroup, LearnerGroup
from actors.weights.collective import WeightTransferError

# Beyond the collective's own timeout, how long the driver waits for a sync's calls before naming who stalled
# (the calls raise on their own after the collective's timeout; this only bounds the driver).
DRIVER_GRACE_S = 60.0


@dataclass
class SyncStats:
    """One weight sync. seconds: wall time on the driver; the parts are the slowest member's."""

    seconds: float
    gather_s: float = 0.0  # learner: gathering (FSDP) and packing the buckets
    transfer_s: float = 0.0  # learner: waiting on the wire
    load_s: float = 0.0  # engines: loading and post-processing (the slowest engine)
    bytes: float = 0.0

    def metrics(self) -> dict[str, float]:
        return {
            "sync/gather_s": self.gather_s,
            "sync/transfer_s": self.transfer_s,
            "sync/load_s": self.load_s,
            "sync/bytes": self.bytes,
            "sync/gb_per_s": self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0,
        }


class WeightTransfer(Protocol):
    """What the loop calls on the run's backend."""

    last: SyncStats | None  # the latest finished sync (pipelined: logged when it completes)

    def push(self, version: int | None = None) -> SyncStats:
        """New weights (the learner's step `version`) into every engine, waited for."""

    def submit_async(self, version: int | None = None) -> None:
        """Pipelined: a sync submitted to every engine (loaded between two engine steps), not waited for."""

    def drain(self) -> None:
        """Wait for the sync submitted last (the end of a pipelined run)."""

    def rejoin(self, version: int | None = None) -> None:
        """After a generator restarted (fresh engine, initial weights) or the fleet was resized: bring every engine
        the current weights (the collective group re-formed with the generators there are now)."""


@dataclass
class PendingSync:
    learner: list[Any]  # ObjectRefs of every learner rank's part
    generators: list[Any]  # one ObjectRef per generator
    t0: float = field(default_factory=time.perf_counter)


class _Transfer:
    """What both backends share: the groups, the pipelined bookkeeping, naming who failed."""

    def __init__(self, learner: LearnerGroup, generators: GeneratorGroup, *, timeout_s: float):
        self.learner, self.generators, self.timeout_s = learner, generators, timeout_s
        self.last: SyncStats | None = None
        self._pending: PendingSync | None = None

    def rejoin(self, version: int | None = None) -> None:
        self._pending = None  # a pipelined sync the death cut short: superseded by this one
        self.push(version)

    def submit(self, version: int | None = None) -> PendingSync:
        raise NotImplementedError

    def push(self, version: int | None = None) -> SyncStats:
        return self.finish(self.submit(version))

    def finish(self, p: PendingSync) -> SyncStats:
        """Wait for a submitted sync; a failure names the generator (or the learner) and the stage."""
        deadline = self.timeout_s + DRIVER_GRACE_S
        ready, stalled = ray.wait(p.learner + p.generators, num_returns=len(p.learner) + len(p.generators),
                                  timeout=deadline)
        failed = _generator_failures(p.generators, ready)  # a dead generator first: the caller restarts it
        if failed:
            raise WeightTransferError(f"weight sync: {', '.join(failed)}")
        for ref in p.learner:
            if ref in ready:
                try:
                    ray.get(ref)
                except Exception as err:  # noqa: BLE001
                    raise WeightTransferError(f"weight sync: learner: {one_line(err)}") from None
        if stalled:
            who = [f"generator-{i}" for i, r in enumerate(p.generators) if r in stalled]
            who += ["learner"] if any(r in stalled for r in p.learner) else []
            raise WeightTransferError(f"weight sync did not finish within {deadline:.0f} s: stalled: {', '.join(who)}")
        stats = self._stats(ray.get(p.learner[0]), ray.get(p.generators), time.perf_counter() - p.t0)
        self.last = stats
        return stats

    def submit_async(self, version: int | None = None) -> None:
        """Pipelined: submit a sync without waiting; the previous one, if done, is finished (and logged)."""
        if self._pending is not None:
            done, _ = ray.wait(self._pending.learner + self._pending.generators,
                               num_returns=len(self._pending.learner) + len(self._pending.generators), timeout=0)
            if len(done) == len(self._pending.learner) + len(self._pending.generators):
                self.finish(self._pending)
        self._pending = self._submit_pipelined(version)

    def _submit_pipelined(self, version: int | None) -> PendingSync:
        return self.submit(version)

    def drain(self) -> None:
        if self._pending is not None:
            self.finish(self._pending)
            self._pending = None

    def _stats(self, learner: Any, generators: list[Any], seconds: float) -> SyncStats:
        return SyncStats(seconds)


class ObjectStoreTransfer(_Transfer):
    """The learner's safetensors bytes through the object store; every generator pulls them and reloads."""

    def submit(self, version: int | None = None) -> PendingSync:
        exported = self.learner.submit_export_weights()  # every rank (FSDP gathers); rank 0's holds the bytes
        loads = self.generators.submit_load_weights(exported.ref, version)
        return PendingSync(exported.refs, [p.ref for p in loads])


class CollectiveTransfer(_Transfer):
    """Bucketed broadcast from the learner's rank 0 to every engine worker (see the module docstring)."""

    def __init__(
        self, learner: LearnerGroup, generators: GeneratorGroup, *, timeout_s: float, bucket_mb: float, tp_size: int
    ):
        super().__init__(learner, generators, timeout_s=timeout_s)
        self.bucket_mb, self.tp_size = bucket_mb, tp_size
        self.world_size = 1 + len(generators) * tp_size
        self.generation = -1  # the group's current generation; each (re-)form takes the next
        self._plan: list[Any] = []

    def connect(self) -> None:
        """Form the group: the learner makes the bucket plan and listens on a fresh store (nothing of an earlier,
        perhaps broken group is reused), and every engine worker joins as 1 + engine * tp + tp_rank with that
        plan, so sender and receivers always hold the same plan. The world is the generators' as they are now: a
        fleet resized by `rayward scale --generators` re-forms it here, as a restart does (`rejoin`)."""
        self.world_size = 1 + len(self.generators) * self.tp_size
        self._plan = self.learner.weight_plan(self.bucket_mb)
        host, port = self.learner.open_weight_group(self.world_size, self.timeout_s)
        self.generation += 1
        learner = self.learner.submit_join_weight_group(self.generation).refs
        gens = [p.ref for p in self.generators.submit_join_weight_group(
            host, port, rank_offsets=[1 + i * self.tp_size for i in range(len(self.generators))],
            world_size=self.world_size, generation=self.generation, timeout_s=self.timeout_s, plan=self._plan,
        )]
        ready, _ = ray.wait(learner + gens, num_returns=len(learner) + len(gens),
                            timeout=self.timeout_s + DRIVER_GRACE_S)
        missing = [f"generator-{i} (ranks {1 + i * self.tp_size}..{(i + 1) * self.tp_size})"
                   for i, r in enumerate(gens) if r not in ready]
        missing += _generator_failures(gens, ready)
        if missing or not all(r in ready for r in learner):
            try:
                ray.get([r for r in learner if r in ready])
                why = ""
            except Exception as err:  # noqa: BLE001
                why = f"; learner: {one_line(err)}"
            raise WeightTransferError(
                f"the weight-transfer group ({self.world_size} ranks, learner at {host}:{port}) did not form "
                f"within {self.timeout_s:.0f} s: not joined: {', '.join(missing) or 'none'}{why}. Check that the "
                "generator nodes can reach the learner's node over TCP, or set weight_sync.backend: object_store"
            )

    def rejoin(self, version: int | None = None) -> None:
        """Re-form the group first: a failed or timed-out op leaves the old one dead on every end."""
        self.connect()
        super().rejoin(version)

    def submit(self, version: int | None = None) -> PendingSync:
        return PendingSync(self.learner.submit_send_weights().refs, self._receive(version))

    def _receive(self, version: int | None) -> list[Any]:
        return [p.ref for p in self.generators.submit_receive_weights(version)]

    def _stats(self, learner: dict[str, float], generators: list[dict[str, float]], seconds: float) -> SyncStats:
        return SyncStats(
            seconds, gather_s=learner["gather_s"], transfer_s=learner["transfer_s"],
            load_s=max(g["load_s"] for g in generators), bytes=learner["bytes"],
        )


class OverlappedCollectiveTransfer(CollectiveTransfer):
    """The collective transfer for the pipelined loop with one learner rank: the learner sends in the background
    (`Learner.start_send_weights`) and goes on with its next train step, whose forward and backward overlap the
    wire and the engines' load; only its optimizer step waits for the send. Without it the learner sits out every
    sync, waiting for the engines to load (the wire keeps pace with the load). Not with FSDP ranks: their
    per-bucket gathers are collectives that must not interleave with the train step's."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._seq = 0

    def _submit_pipelined(self, version: int | None) -> PendingSync:
        self._seq += 1
        start = self.learner.submit_start_send(self._seq)  # ahead of the next train step
        result = self.learner.submit_send_result(self._seq, self.timeout_s + DRIVER_GRACE_S)
        return PendingSync([result.ref, start.ref], self._receive(version))


def _generator_failures(refs: list[Any], ready: list[Any]) -> list[str]:
    """`generator-i: error` for each finished call of generator i that failed. A generator that died raises
    RayActorError at once: the caller waits for Ray to restart it and then re-forms the group."""
    failed = []
    for i, ref in enumerate(refs):
        if ref in ready:
            try:
                ray.get(ref)
            except RayActorError:
                raise
            except Exception as err:  # noqa: BLE001
                failed.append(f"generator-{i}: {one_line(err)}")
    return failed


__all__ = [
    "CollectiveTransfer", "ObjectStoreTransfer", "OverlappedCollectiveTransfer", "PendingSync", "SyncStats",
    "WeightTransfer", "WeightTransferError",
]
