"""ActorGroup: applies `ray.remote` to a plain role class, names the actors, owns the handles, fans out.

Every fan-out is one batch of `.remote()` calls followed by one `ray.get`, so the group's members work in
parallel and the caller waits for the slowest. Names are `<run>/<role>-<i>` so the dashboard's actor list
reads as the run's parts.
"""

from __future__ import annotations

from typing import Any

import ray


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
            name = f"{run_name}/{role}" if num == 1 and role == "learner" else f"{run_name}/{role}-{i}"
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
        n = len(self.handles)
        bounds = [len(items) * i // n for i in range(n + 1)]
        refs = [
            getattr(h, method).remote(items[lo:hi], **kwargs)
            for h, lo, hi in zip(self.handles, bounds, bounds[1:], strict=False)
            if hi > lo
        ]
        return [x for part in ray.get(refs) for x in part]

    def kill(self) -> None:
        for h in self.handles:
            ray.kill(h, no_restart=True)
