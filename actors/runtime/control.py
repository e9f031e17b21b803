"""The run's control mailbox, the named actor `<run>/control`: what a client asks of the driver's own loop while the
run trains (`rayward scale RUN --generators N`). The client leaves its request here and returns; the driver takes it
at its next step boundary (orchestrator/loop/fleet.py) and reports the fleet's size back, so a client reads what
the driver did, not only what was asked. A plain class: the driver's group applies ray.remote
(actors/runtime/group.py ControlGroup)."""

from __future__ import annotations

from actors.types import PoolStats


class RunControl:
    """Requests to the driver, each kept until it takes it (a newer one of the same kind replaces it)."""

    def __init__(self, generators: int):
        """generators: the fleet's size when the run starts."""
        self.generators, self.retiring = generators, 0
        self.wanted: int | None = None  # the size a client asked for, not taken by the driver yet

    def scale_generators(self, count: int) -> PoolStats:
        """Ask for `count` generators; answers the fleet as the driver last reported it, heading to `count`."""
        if count < 1:
            raise ValueError(f"a run needs at least 1 generator, not {count}")
        self.wanted = count
        return self.stats()

    def take_generators(self) -> int | None:
        """The driver, at a step boundary: the size asked for since it last took one (None: nothing asked)."""
        wanted, self.wanted = self.wanted, None
        return wanted

    def report(self, generators: int, retiring: int) -> None:
        """The driver: the generators taking work now, and those finishing their calls before they leave."""
        self.generators, self.retiring = generators, retiring

    def stats(self) -> PoolStats:
        target = self.wanted if self.wanted is not None else self.generators
        return PoolStats(workers=self.generators, target_workers=target, starting=max(target - self.generators, 0),
                         retiring=self.retiring, calls_inflight=0, queue_depth=0, worker_s=0.0,
                         utilization=float("nan"), decisions=0, autoscale="off")
