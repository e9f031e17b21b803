"""Weight transfer, driver side: moving the learner's weights into every generator engine after each update.

One interface, two backends, chosen when the run is built (`weight_sync.backend`):

- `CollectiveTransfer` (default): the learner's rank 0 broadcasts bucket after bucket over a process group that
  holds every engine worker (every tensor-parallel rank); each worker loads each bucket in place as it arrives
  (`actors.weights.sender` / `receiver` / `collective`). NCCL on GPUs, gloo on CPU. Nothing goes through the
  object store or an RPC argument; every op has a timeout.
- `ObjectStoreTransfer`: the whole state dict as safetensors bytes through Ray's object store (rayward's first
  path; kept as a fallback where the engines cannot reach the learner's node over TCP, and for comparison).

Both: `connect()` once, then `push()` (blocking) or `submit()` + `finish()` (pipelined: the sync queues on the
generators behind generation already submitted), and `rejoin()` after a generator restarted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError

from actors.weights.collective import WeightTransferError

# Beyond the collective's own timeout, how long the driver waits for a sync's calls before naming who stalled
# (the calls raise on their own after the collective's timeout; this only bounds the driver).
DRIVER_GRACE_S = 60.0
# The learner actor's concurrency group for `send_result` (OverlappedCollectiveTransfer): it answers while the
# actor's default group runs a train step. Declared when the learner is built (`concurrency_groups`).
SEND_GROUP = "weight-send"


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


@dataclass
class PendingSync:
    learner: list[Any]  # ObjectRefs of every learner rank's part
    generators: list[Any]  # one ObjectRef per generator
    t0: float = field(default_factory=time.perf_counter)


class _Transfer:
    """What both backends share: the groups, the pipelined bookkeeping, naming who failed."""

    def __init__(self, learner: Any, generators: Any, *, timeout_s: float):
        self.learner, self.generators, self.timeout_s = learner, generators, timeout_s
        self.last: SyncStats | None = None  # the latest finished sync (pipelined: logged when it completes)
        self._pending: PendingSync | None = None

    def connect(self) -> None:
        pass

    def rejoin(self) -> None:
        """After a generator restarted (fresh engine, initial weights): connect again (the collective backend
        re-forms its group: a failed or timed-out op leaves the old one dead on every end), then bring every
        engine the current weights."""
        self._pending = None  # a pipelined sync the death cut short: superseded by this one
        self.connect()
        self.push()

    def submit(self) -> PendingSync:
        raise NotImplementedError

    def push(self) -> SyncStats:
        return self.finish(self.submit())

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
                    raise WeightTransferError(f"weight sync: learner: {_short(err)}") from None
        if stalled:
            who = [f"generator-{i}" for i, r in enumerate(p.generators) if r in stalled]
            who += ["learner"] if any(r in stalled for r in p.learner) else []
            raise WeightTransferError(f"weight sync did not finish within {deadline:.0f} s: stalled: {', '.join(who)}")
        stats = self._stats(ray.get(p.learner[0]), ray.get(p.generators), time.perf_counter() - p.t0)
        self.last = stats
        return stats

    def submit_async(self) -> None:
        """Pipelined: submit a sync without waiting; the previous one, if done, is finished (and logged)."""
        if self._pending is not None:
            done, _ = ray.wait(self._pending.learner + self._pending.generators,
                               num_returns=len(self._pending.learner) + len(self._pending.generators), timeout=0)
            if len(done) == len(self._pending.learner) + len(self._pending.generators):
                self.finish(self._pending)
        self._pending = self._submit_pipelined()

    def _submit_pipelined(self) -> PendingSync:
        return self.submit()

    def drain(self) -> None:
        """Wait for the sync submitted last (end of a pipelined run)."""
        if self._pending is not None:
            self.finish(self._pending)
            self._pending = None

    def _stats(self, learner: Any, generators: list[Any], seconds: float) -> SyncStats:
        return SyncStats(seconds)


class ObjectStoreTransfer(_Transfer):
    """The learner's safetensors bytes through the object store; every generator pulls them and reloads."""

    def submit(self) -> PendingSync:
        refs = self.learner.submit("export_weights")  # every rank (FSDP gathers); rank 0's holds the bytes
        return PendingSync(refs, [g.load_weights.remote(refs[0]) for g in self.generators.handles])


class CollectiveTransfer(_Transfer):
    """Bucketed broadcast from the learner's rank 0 to every engine worker (see the module docstring)."""

    def __init__(self, learner: Any, generators: Any, *, timeout_s: float, bucket_mb: float, tp_size: int):
        super().__init__(learner, generators, timeout_s=timeout_s)
        self.bucket_mb, self.tp_size = bucket_mb, tp_size
        self.world_size = 1 + len(generators.handles) * tp_size
        self.generation = -1  # the group's current generation; each (re-)form takes the next
        self._plan: list[Any] = []

    def connect(self) -> None:
        """Form the group: the learner makes the bucket plan and listens on a fresh store (nothing of an earlier,
        perhaps broken group is reused), and every engine worker joins as 1 + engine * tp + tp_rank with that
        plan, so sender and receivers always hold the same plan."""
        self._plan = ray.get(self.learner.submit("weight_plan", self.bucket_mb)[0])
        host, port = ray.get(self.learner.submit("open_weight_group", self.world_size, self.timeout_s)[0])
        self.generation += 1
        learner = self.learner.submit("join_weight_group", self.generation)
        gens = [
            g.join_weight_group.remote(host, port, 1 + i * self.tp_size, self.world_size, self.generation,
                                       self.timeout_s, self._plan)
            for i, g in enumerate(self.generators.handles)
        ]
        ready, _ = ray.wait(learner + gens, num_returns=len(learner) + len(gens), timeout=self.timeout_s + DRIVER_GRACE_S)
        missing = [f"generator-{i} (ranks {1 + i * self.tp_size}..{(i + 1) * self.tp_size})"
                   for i, r in enumerate(gens) if r not in ready]
        missing += _generator_failures(gens, ready)
        if missing or not all(r in ready for r in learner):
            try:
                ray.get([r for r in learner if r in ready])
                why = ""
            except Exception as err:  # noqa: BLE001
                why = f"; learner: {_short(err)}"
            raise WeightTransferError(
                f"the weight-transfer group ({self.world_size} ranks, learner at {host}:{port}) did not form "
                f"within {self.timeout_s:.0f} s: not joined: {', '.join(missing) or 'none'}{why}. Check that the "
                "generator nodes can reach the learner's node over TCP, or set weight_sync.backend: object_store"
            )

    def submit(self) -> PendingSync:
        return PendingSync(
            self.learner.submit("send_weights"), [g.receive_weights.remote() for g in self.generators.handles]
        )

    def _stats(self, learner: dict[str, float], generators: list[dict[str, float]], seconds: float) -> SyncStats:
        return SyncStats(
            seconds, gather_s=learner["gather_s"], transfer_s=learner["transfer_s"],
            load_s=max(g["load_s"] for g in generators), bytes=learner["bytes"],
        )


class OverlappedCollectiveTransfer(CollectiveTransfer):
    """The collective transfer for the pipelined loop with one learner rank: the learner sends in the background
    (`Learner.start_send_weights`) and goes on with its next train step, whose forward and backward overlap the
    wire and the engines' load; only its optimizer step waits for the send. Without it the learner sits out every
    sync, waiting for the engines to load (the wire keeps pace with the load, ~0.5 s per step for 100M on CPU).
    Not with FSDP ranks: their per-bucket gathers are collectives that must not interleave with the train step's."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._seq = 0

    def _submit_pipelined(self) -> PendingSync:
        self._seq += 1
        rank0 = self.learner.ranks[0]
        start = rank0.start_send_weights.remote(self._seq)  # in the default group: ahead of the next train step
        result = rank0.send_result.options(concurrency_group=SEND_GROUP).remote(
            self._seq, self.timeout_s + DRIVER_GRACE_S
        )
        return PendingSync([result, start], [g.receive_weights.remote() for g in self.generators.handles])


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
                failed.append(f"generator-{i}: {_short(err)}")
    return failed


def _short(err: BaseException) -> str:
    """The innermost message of a Ray task error, one line."""
    cause = getattr(err, "cause", None) or err
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}"


__all__ = ["CollectiveTransfer", "ObjectStoreTransfer", "PendingSync", "SyncStats", "WeightTransferError"]
