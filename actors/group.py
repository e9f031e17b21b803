"""ActorGroup: applies `ray.remote` to a plain role class, names the actors, owns the handles, fans out.

Every fan-out is one batch of `.remote()` calls followed by one `ray.get`, so the group's members work in
parallel and the caller waits for the slowest. Names are `<run>/<role>-<i>` so the dashboard's actor list
reads as the run's parts.

`LearnerGroup` is the learner's group: one member, however many ranks it has (see there).
"""

from __future__ import annotations

import time
from typing import Any

import ray

from actors.net import free_port, node_ip

# How long the learner ranks' placement group may wait for room (an autoscaler may be starting nodes) before the
# build fails, naming what it asked for.
PLACEMENT_TIMEOUT_S = 600
# cluster.learner_placement -> the placement group strategy of the learner ranks: one node, or one node per rank.
PLACEMENT_STRATEGIES = {"pack": "STRICT_PACK", "spread": "STRICT_SPREAD"}
# How often wait_alive asks a restarting actor whether it is back (a vLLM engine takes ~20 s to start).
RESTART_POLL_S = 1.0


class ActorGroup:
    def __init__(
        self,
        cls: type,
        num: int,
        *,
        run_name: str,
        role: str,
        options: dict[str, Any] | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        per_actor_kwargs: list[dict[str, Any]] | None = None,
    ):
        self.role = role
        remote_cls = ray.remote(cls)
        self.handles = []
        for i in range(num):
            name = f"{run_name}/{role}-{i}"
            kw = {**(kwargs or {}), **((per_actor_kwargs or [{}] * num)[i])}
            self.handles.append(remote_cls.options(name=name, **(options or {})).remote(*args, **kw))

    def __len__(self) -> int:
        return len(self.handles)

    def __repr__(self) -> str:
        return f"ActorGroup(role={self.role!r}, size={len(self.handles)})"

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """The same call on every member; results in member order."""
        return ray.get([getattr(h, method).remote(*args, **kwargs) for h in self.handles])

    def call_sharded(self, method: str, items: list[Any], **kwargs: Any) -> list[Any]:
        """Split `items` into contiguous shards, one per member, call `method(shard, **kwargs)` on each, and
        concatenate the (list) results back in item order."""
        return [x for part in ray.get(self.submit_sharded(method, items, **kwargs)) for x in part]

    def submit_sharded(
        self, method: str, items: list[Any], *, aligned: dict[str, list[Any]] | None = None, **kwargs: Any
    ) -> list[Any]:
        """`call_sharded` without waiting: one ObjectRef per non-empty shard, in item order. `aligned`: keyword
        arguments holding one value per item, sharded with the items."""
        n = len(self.handles)
        bounds = [len(items) * i // n for i in range(n + 1)]
        return [
            getattr(h, method).remote(items[lo:hi], **{k: v[lo:hi] for k, v in (aligned or {}).items()}, **kwargs)
            for h, lo, hi in zip(self.handles, bounds, bounds[1:], strict=False)
            if hi > lo
        ]

    def wait_alive(self, timeout_s: float) -> None:
        """Return once every member answers (after Ray restarted one that died). A member that is restarting
        answers ActorUnavailableError at once, so ask again until timeout_s; one out of restarts raises."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ray.get([h.__ray_ready__.remote() for h in self.handles], timeout=max(deadline - time.monotonic(), 1))
                return
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(RESTART_POLL_S)

    def kill(self) -> None:
        for h in self.handles:
            ray.kill(h, no_restart=True)


def _rendezvous() -> str:
    """tcp://<this node's IP>:<a port free on it now>, for rank 0 to listen on (run on rank 0's node; the port
    could be taken before rank 0 binds it, as with any free-port pick)."""
    return f"tcp://{node_ip()}:{free_port()}"


class _AllRanks:
    """Looks like one actor handle: `h.method.remote(*args)` submits the call to every rank, in the same
    order on each (so their collectives line up), and returns rank 0's ObjectRef."""

    def __init__(self, group: LearnerGroup):
        self._group = group

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        group = self._group

        class _Method:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> Any:
                return group.submit(method, *args, **kwargs)[0]

        return _Method()

    def __repr__(self) -> str:
        return f"<all {len(self._group.ranks)} learner ranks>"


class LearnerGroup:
    """The learner, as the loop sees it: one member (`handles == [h]`, `call` returns `[result]`) whatever
    the number of ranks, so the loop drives N ranks as it drives one learner. Every call goes to every rank
    and rank 0's answer comes back (the ranks' metrics are already global; only rank 0 pushes global_step to
    the reward pool, through `rank0_kwargs`).

    strategy "single" (one rank): the learner actor as before, `<run>/learner`. "fsdp": `num` actors
    `<run>/learner-<r>` in a placement group of one bundle per rank (the `options` resources): placement "pack"
    (STRICT_PACK) puts the ranks on one node (NCCL over NVLink/PCIe, not the network), "spread" (STRICT_SPREAD)
    each on its own node. Rank 0's address (its node's IP as Ray knows it, reachable from the other nodes, and
    a port free there) is taken on its node before the actors start and passed to all of them for
    `init_process_group`.
    """

    def __init__(
        self,
        cls: type,
        num: int,
        *,
        run_name: str,
        strategy: str = "single",
        placement: str = "pack",
        options: dict[str, Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        rank0_kwargs: dict[str, Any] | None = None,
        concurrency_groups: dict[str, int] | None = None,
    ):
        """concurrency_groups: Ray concurrency groups of the learner actors ({name: max concurrency}; Ray takes
        them with the class, not in `.options()`)."""
        from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
        from ray.util.scheduling_strategies import (
            NodeAffinitySchedulingStrategy,
            PlacementGroupSchedulingStrategy,
        )

        self.role = "learner"
        self.placement_group = None
        opts, kw = dict(options or {}), dict(kwargs or {})
        remote_cls = ray.remote(concurrency_groups=concurrency_groups)(cls) if concurrency_groups else ray.remote(cls)
        name = (lambda r: f"{run_name}/learner") if num == 1 else (lambda r: f"{run_name}/learner-{r}")
        if strategy == "single":
            if num != 1:
                raise ValueError(f"strategy 'single' runs one learner, not {num}")
            self.ranks = [remote_cls.options(name=name(0), **opts).remote(**kw, **(rank0_kwargs or {}))]
        else:
            bundle = {"CPU": opts.get("num_cpus", 0), "GPU": opts.get("num_gpus", 0), **opts.get("resources", {})}
            bundle = {k: v for k, v in bundle.items() if v}  # Ray rejects zero amounts in a bundle
            pg_strategy = PLACEMENT_STRATEGIES[placement]
            self.placement_group = placement_group([bundle] * num, strategy=pg_strategy, name=f"{run_name}/learner")
            try:
                ray.get(self.placement_group.ready(), timeout=PLACEMENT_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                remove_placement_group(self.placement_group)  # a pending group would hold its claim on the cluster
                where = "one node" if placement == "pack" else f"{num} different nodes"
                raise RuntimeError(
                    f"the cluster could not place {num} learner ranks of {bundle} each ({pg_strategy}: {where}) "
                    f"within {PLACEMENT_TIMEOUT_S} s"
                ) from None
            node = placement_group_table(self.placement_group)["bundles_to_node_id"][0]
            on_node = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            init_method = ray.get(ray.remote(_rendezvous).options(num_cpus=0, scheduling_strategy=on_node).remote())
            self.ranks = [
                remote_cls.options(
                    name=name(r),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self.placement_group, placement_group_bundle_index=r
                    ),
                    **opts,
                ).remote(
                    **kw, **((rank0_kwargs or {}) if r == 0 else {}),
                    strategy=strategy, rank=r, world_size=num, init_method=init_method,
                )
                for r in range(num)
            ]
        self.handles = [_AllRanks(self)]

    def __len__(self) -> int:
        return len(self.handles)

    def __repr__(self) -> str:
        return f"LearnerGroup(ranks={len(self.ranks)})"

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """The call on every rank; ObjectRefs in rank order. Arguments go to the object store once, not once
        per rank (a batch is the largest thing the loop sends)."""
        if len(self.ranks) > 1:
            put = lambda x: x if isinstance(x, ray.ObjectRef) else ray.put(x)  # noqa: E731
            args, kwargs = tuple(put(a) for a in args), {k: put(v) for k, v in kwargs.items()}
        return [getattr(h, method).remote(*args, **kwargs) for h in self.ranks]

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """`[rank 0's result]` once every rank is done. A rank's error is raised as soon as it arrives (the
        other ranks may be blocked in a collective waiting for it)."""
        refs = self.submit(method, *args, **kwargs)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)
        return [ray.get(refs[0])]

    def kill(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for h in self.ranks:
            ray.kill(h, no_restart=True)
        if self.placement_group is not None:
            remove_placement_group(self.placement_group)
