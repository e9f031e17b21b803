"""The driver's groups of actors: each applies `ray.remote` to a plain role class, names the actors, owns the
handles and fans calls out. The driver reaches every actor through one of them, in one convention:

    group.x(...)          call, wait, return the result
    group.submit_x(...)   call without waiting; returns `Pending` (the typed ObjectRef: `done()`, `result()`)

- `ActorGroup`: N members of one class, the fan-out (the same call on every member, or on each member's shard of
  a batch, or a streaming call on one member), the shard arithmetic, waiting on its members' streams, restarts.
  Its fan-out names methods by string, privately: only the typed groups built on it call it.
- `GeneratorGroup`: the generators, an ActorGroup with the generator's methods named (see there).
- `LearnerGroup`: the learner, one member to the loop whatever its number of ranks, with named methods (see there).
- `RewardPoolGroup`, `EnvPoolGroup`, `JudgePoolGroup`, `TeacherPoolGroup`: the named pool actors (reward,
  environment, a judge's engines, the teacher's engines), each owning its workers.
- `ControlGroup`: the run's control mailbox `<run>/control` (`rayward scale --generators`).

The generator and learner groups keep their actors' handles to themselves. Their health goes out as `members()`:
one `Member` per actor (its name, its id, the GCS's record of it, a ping, a kill), all that the driver's hang and
preemption checks use (orchestrator/run/watchdog.py).

Every fan-out is one batch of `.remote()` calls, so members work in parallel; names are `<run>/<role>-<i>` so the
dashboard's actor list reads as the run's parts. A Ray actor runs its calls in submission order within each of
its concurrency groups: the driver's ordering of generation, weight syncs and evals rests on that (a generator's
weight loads run in their own group, beside generation: generation calls order themselves after a load with
min_version).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayActorError

from actors.runtime import ray_compat
from actors.runtime.net import free_port, node_ip
from actors.types import (
    EnvPoolStats,
    FinishedOuts,
    GroupOut,
    RewardBatch,
    Sampling,
    Scores,
    TrainBatch,
    TrainerState,
    TrainResult,
)

T = TypeVar("T")

# How long the learner ranks' placement group may wait for room (an autoscaler may be starting nodes) before the
# build fails, naming what it asked for.
PLACEMENT_TIMEOUT_S = 600
# cluster.learner_placement -> the placement group strategy of the learner ranks: one node, or one node per rank.
PLACEMENT_STRATEGIES = {"pack": "STRICT_PACK", "spread": "STRICT_SPREAD"}
# How often `recover` asks a restarting actor whether it is back (a vLLM engine loads its model first).
RESTART_POLL_S = 1.0
# The learner actor's concurrency group for `send_result`: it answers while the actor's default group runs a
# train step (the background weight send, actors/weights/transfer.py). Declared when the learner is built.
SEND_GROUP = "weight-send"
# The concurrency group of `ping` (generators, learner ranks): it answers while the actor's default group is busy,
# so only a stopped or wedged process misses it (the driver's hang check, orchestrator/run/watchdog.py).
HEALTH_GROUP = "health"
# While the driver waits for an actor that cannot start yet (no node has room, or a node is on its way), it says
# what it waits for this often.
WAIT_MESSAGE_S = 30.0


def actor_info(handle: ActorHandle) -> dict[str, Any]:
    """The GCS's record of an actor: State (ALIVE, RESTARTING, PENDING_CREATION, DEAD...), NumRestarts, Pid,
    Address.NodeID ({} if the GCS does not know it)."""
    return ray_compat.actor_table(handle)


def death_reason(err: RayActorError) -> str:
    """Ray's one-line reason for an actor's death (the last line of its message that is not a field)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip() and not ln.startswith("\t")]
    reason = lines[-1] if lines else type(err).__name__
    if "Worker exit detail: " in reason:  # Ray appends a paragraph of generic advice: keep what happened
        reason = "its worker process died: " + reason.split("Worker exit detail: ", 1)[1].split(". ", 1)[0]
    return ("its node was preempted; " if getattr(err, "preempted", False) else "") + reason


@dataclass(frozen=True)
class Loss:
    """Why the learner is gone (`LearnerGroup.lost`)."""

    cause: str  # which rank, and what Ray or the hang check says of it
    preempted: bool = False  # Ray says its node was drained for preemption before it died


@dataclass(frozen=True)
class Member:
    """One actor of a group, as the health checks see it (`members()`, orchestrator/run/watchdog.py)."""

    name: str  # <run>/<role>-<i>
    id: str  # its actor id: the same across Ray's restarts of it, another for an actor that replaces it
    info: Callable[[], dict[str, Any]]  # the GCS's record of it now (`actor_info`)
    ping: Callable[[], Pending[None]]  # its `ping`, in HEALTH_GROUP: it answers while the actor computes
    kill: Callable[[], None]  # as a crash would: a generator comes back (Ray restarts it), a learner rank does not


def _member(name: str, handle: ActorHandle, restart: bool) -> Member:
    return Member(
        name, ray_compat.actor_id(handle), lambda: actor_info(handle),
        lambda: Pending(handle.ping.options(concurrency_group=HEALTH_GROUP).remote()),
        lambda: ray.kill(handle, no_restart=not restart),
    )


def _needs(options: dict[str, Any]) -> dict[str, Any]:
    """An actor's resource request, for messages."""
    need = {"CPU": options.get("num_cpus"), "GPU": options.get("num_gpus"), **options.get("resources", {})}
    return {k: v for k, v in need.items() if v}


@dataclass
class _Joining:
    """A member started by `ActorGroup.start_pending`, not in the group yet."""

    handle: ActorHandle
    name: str
    ready: ray.ObjectRef  # its __ray_ready__: done once its constructor ran
    since: float  # time.monotonic() at its start


def wait_started(handles: list[ActorHandle], names: list[str], options: dict[str, Any], timeout_s: float,
                 on_wait: Callable[[str], None] | None) -> None:
    """Return once every actor has run its constructor. Every WAIT_MESSAGE_S, `on_wait` hears which are still
    waiting, what they need and what Ray says of them; after timeout_s, RuntimeError names them."""
    refs = {h.__ray_ready__.remote(): (h, n) for h, n in zip(handles, names, strict=True)}
    deadline = time.monotonic() + timeout_s
    waiting = list(refs)
    while waiting:
        ready, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=min(WAIT_MESSAGE_S, timeout_s))
        ray.get(ready)  # a constructor that raised, or an actor that died meanwhile
        if not waiting:
            return
        states = ", ".join(f"{refs[r][1]} ({actor_info(refs[r][0]).get('State', '?')})" for r in waiting)
        text = f"waiting for {states} to start: each needs {_needs(options)}"
        if time.monotonic() > deadline:
            raise RuntimeError(f"{text}; none came up within {timeout_s:.0f} s (no node with room for it?)")
        if on_wait is not None:
            on_wait(f"{text} (no node has room for it yet, or it is still loading)")


class Pending(Generic[T]):
    """An actor call on its way. `done()` asks without waiting; `result()` waits and returns it, or raises the
    call's error. A call on several learner ranks answers with rank 0's result once every rank is done, and
    raises a rank's error as soon as it arrives (the other ranks may be blocked in a collective waiting for it)."""

    def __init__(self, ref: ray.ObjectRef, others: list[ray.ObjectRef] | None = None):
        self.ref = ref  # the answer's (rank 0's)
        self.refs = [ref, *(others or [])]  # every rank's

    def done(self) -> bool:
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def result(self) -> T:
        waiting = list(self.refs)
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1)
            ray.get(ready)
        return ray.get(self.ref)


@dataclass
class Stream(Generic[T]):
    """One streaming call on one member (`ActorGroup.stream`): its items in order, as the member yields them."""

    member: int | None  # the member that runs it (None: removed from the group with its node, `remove`)
    epoch: int  # the group's `restarts` when it was submitted: a death after that cuts it
    _items: Any  # Ray's ObjectRefGenerator

    def next(self) -> T:
        """The next item (waits for it). StopIteration after the last; RayActorError if the member died."""
        return ray.get(next(self._items))


def shards(num_items: int, members: int, parts: int | None = None) -> list[tuple[int, slice]]:
    """`num_items` items cut into `parts` contiguous shards (default: one per member; never more than the items),
    dealt to the members in turn: (member, slice) per shard, in item order."""
    parts = min(num_items, parts or members)
    bounds = [num_items * i // parts for i in range(parts + 1)] if parts else [0]
    return [(i % members, slice(lo, hi)) for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False))]


class ActorGroup:
    """N actors of one role class: `<run>/<role>-<i>`. Its fan-out (`_call`, `_submit`, `_submit_sharded`,
    `_stream`) names the members' methods by string: the typed groups built on it (GeneratorGroup) name them once,
    in their own methods, and nothing outside this file calls a method by its name."""

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
        per_actor_kwargs: list[dict[str, Any]] | Callable[[int], dict[str, Any]] | None = None,
        concurrency_groups: dict[str, int] | None = None,
        method_groups: dict[str, str] | None = None,
    ):
        """concurrency_groups: Ray concurrency groups of the actors ({name: max concurrency}; Ray takes them with
        the class), e.g. HEALTH_GROUP for `ping`; method_groups: the methods whose calls run in one of them
        ({method: group}), the rest in the default group (e.g. actors/generation/generator.py GENERATOR_GROUPS,
        GENERATOR_METHOD_GROUPS); per_actor_kwargs: each member's own keyword arguments, a list or a function of
        the index in its name (what a member `grow` starts later gets)."""
        self.role = role
        self.restarts = 0  # deaths the group has come back from (`recover`)
        self._method_groups = dict(method_groups or {})
        self.options = dict(options or {})
        remote_cls = ray.remote(concurrency_groups=concurrency_groups)(cls) if concurrency_groups else ray.remote(cls)
        self._handles: list[ActorHandle] = []
        self.names: list[str] = []
        per = per_actor_kwargs or [{}] * num
        # What `grow` starts a member with: the same class, arguments and options, and its own keyword arguments
        self._start_args = (remote_cls, run_name, args, dict(kwargs or {}))
        self.member_kwargs: Callable[[int], dict[str, Any]] = (
            per if callable(per) else lambda i: per[i] if i < len(per) else {})
        self._next_index = 0  # names are never reused: a removed member's name may linger in the GCS a while
        self._pending: list[_Joining] = []  # started, not in the group yet (`start_pending`)
        # the streams it started, by id: `remove` renumbers their members (the loops keep them)
        self._streams: weakref.WeakValueDictionary[int, Stream[Any]] = weakref.WeakValueDictionary()
        self._turn = 0  # `substitute`'s last choice
        self._node_of: dict[str, str] = {}  # actor id -> the node it ran on when last seen up (`lost_with_node`)
        self._start(num)
        self._seen_restarts = [0] * num  # each member's Ray restarts as of the last `recover`
        self.active = num  # members that take new work (`shards`); the ones after them are retiring (`retire`)

    def _start(self, num: int, join: bool = True) -> tuple[list[ActorHandle], list[str]]:
        """Start `num` more members (not waited for), appended to the group (join) or not yet (`start_pending`)."""
        remote_cls, run_name, args, kwargs = self._start_args
        handles, names = [], []
        for i in range(self._next_index, self._next_index + num):
            names.append(f"{run_name}/{self.role}-{i}")
            kw = {**kwargs, **self.member_kwargs(i)}
            handles.append(remote_cls.options(name=names[-1], **self.options).remote(*args, **kw))
        self._next_index += num
        if join:
            self._handles, self.names = self._handles + handles, self.names + names  # new lists: see `members`
        return handles, names

    def __len__(self) -> int:
        return len(self._handles)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(role={self.role!r}, size={len(self._handles)})"

    def _call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """The same call on every member; results in member order."""
        return [p.result() for p in self._submit(method, *args, **kwargs)]

    def _submit(
        self, method: str, *args: Any, per_member: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> list[Pending[Any]]:
        """The call on every member, without waiting; `per_member`: keyword arguments of each member's own."""
        per = per_member or [{}] * len(self._handles)
        return [Pending(self._method(h, method).remote(*args, **kwargs, **p))
                for h, p in zip(self._handles, per, strict=True)]

    def _method(self, handle: ActorHandle, method: str, **options: Any) -> Any:
        """The handle's method with these call options, in its concurrency group (method_groups) if it has one."""
        group = self._method_groups.get(method)
        options = {**options, **({"concurrency_group": group} if group else {})}
        return getattr(handle, method).options(**options) if options else getattr(handle, method)

    def shards(self, num_items: int, parts: int | None = None) -> list[tuple[int, slice]]:
        """How `num_items` items are split over the members that take new work (see `shards`)."""
        return shards(num_items, self.active, parts)

    def _submit_sharded(
        self, method: str, items: list[Any], *, aligned: dict[str, list[Any]] | None = None, **kwargs: Any
    ) -> list[Pending[list[Any]]]:
        """`method(shard, **kwargs)` on each member's contiguous shard of `items`, without waiting: one Pending per
        shard, in item order. `aligned`: keyword arguments holding one value per item, sharded with the items."""
        return [
            Pending(self._method(self._handles[m], method).remote(
                items[s], **{k: v[s] for k, v in (aligned or {}).items()}, **kwargs))
            for m, s in self.shards(len(items))
        ]

    def _stream(self, member: int, method: str, *args: Any, **kwargs: Any) -> Stream[Any]:
        """A streaming call (a generator method) on one member."""
        call = self._method(self._handles[member], method, num_returns="streaming")
        stream: Stream[Any] = Stream(member, self.restarts, call.remote(*args, **kwargs))
        self._streams[id(stream)] = stream
        return stream

    def next_ready(self, streams: list[Stream[Any]], until: Pending[Any] | None = None) -> Stream[Any] | None:
        """Wait until one of `streams` has its next item ready (returns that stream) or `until` is done (None)."""
        by_items = {s._items: s for s in streams}
        ready, _ = ray.wait(list(by_items) + ([until.ref] if until is not None else []), num_returns=1)
        return by_items.get(ready[0])

    def recover(self, timeout_s: float, on_wait: Callable[[str], None] | None = None) -> None:
        """After a member died: return once every member answers again (Ray restarts it; a member that is
        restarting answers ActorUnavailableError at once, or an actor error when its node died under the call, so
        ask again until timeout_s; one that Ray reports DEAD, out of restarts, raises), and count the restart. A member
        that waits for room (its node is gone) is reported to `on_wait` every WAIT_MESSAGE_S, naming it and what it
        needs. Members started and not joined yet are killed first: the dead member's restart must not wait behind
        them for the room it left."""
        if (cancelled := self.cancel_pending()) and on_wait is not None:
            on_wait(f"{', '.join(cancelled)}: not started after all ({self.role} restarts come first)")
        deadline = time.monotonic() + timeout_s
        said = time.monotonic()
        while True:
            try:
                wait_started(self._handles, self.names, self.options, max(deadline - time.monotonic(), 1), on_wait)
                break
            except RayActorError:  # restarting (ActorUnavailableError), or a call to it cut by its node's death
                if time.monotonic() > deadline or any(actor_info(h).get("State") == "DEAD" for h in self._handles):
                    raise
                if on_wait is not None and time.monotonic() - said > WAIT_MESSAGE_S:
                    said = time.monotonic()
                    states = ", ".join(f"{n} ({actor_info(h).get('State', '?')})"
                                       for h, n in zip(self._handles, self.names, strict=True))
                    on_wait(f"waiting for {states} to restart: each needs {_needs(self.options)}")
                time.sleep(RESTART_POLL_S)
        self._seen_restarts = [actor_info(h).get("NumRestarts", 0) for h in self._handles]
        self._remember_nodes(self._handles)
        self.restarts += 1

    def wait_started(self, timeout_s: float, on_wait: Callable[[str], None] | None = None) -> None:
        """Return once every member has run its constructor (a generator: its engine loaded); `on_wait` hears what
        they wait for; RuntimeError after timeout_s."""
        wait_started(self._handles, self.names, self.options, timeout_s, on_wait)
        self._remember_nodes(self._handles)

    def restarted(self) -> bool:
        """Whether Ray restarted a member since the last `recover` (one that died while idle comes back with a
        fresh engine and no call of the driver's failed: the caller must recover before using it)."""
        return any(actor_info(h).get("NumRestarts", 0) > seen
                   for h, seen in zip(self._handles, self._seen_restarts, strict=True))

    def members(self) -> list[Member]:
        """Each member's health (a kill is a crash's: Ray restarts it if it has restarts left). The watchdog asks
        from its own thread while the loop may resize the group (`grow`, `drop_retired`): the members both lists
        hold."""
        names, handles = list(self.names), list(self._handles)
        return [_member(n, h, restart=True) for n, h in zip(names, handles, strict=False)]

    def on_each(self, fn: Callable[[Any], T]) -> list[T]:
        """fn(the member's actor object) run in every member's process, waited for, in member order: what a test or
        a benchmark reads of an actor (its threads, its pid); never the driver's way to call a role's method."""
        return ray.get([h.__ray_call__.remote(fn) for h in self._handles])

    def kill(self) -> None:
        self.cancel_pending()
        for h in self._handles:
            ray.kill(h, no_restart=True)

    # --- resizing (`rayward scale --generators`; the driver's fleet, orchestrator/loop/fleet.py) ---------------

    def room(self, num: int) -> str | None:
        """Why `num` more members cannot start now (the cluster's free resources fall short of what they need), or
        None. A cluster whose autoscaler adds nodes has no room until it does."""
        need = _needs(self.options)
        free = ray.available_resources()
        short = {k: v * num for k, v in need.items() if free.get(k, 0.0) + 1e-9 < v * num}
        if not short:
            return None
        return (f"no room for {num} more {self.role}(s): they need {short}, the cluster has "
                f"{ {k: round(free.get(k, 0.0), 2) for k in short} } free")

    def grow(self, num: int, timeout_s: float, on_wait: Callable[[str], None] | None = None) -> list[str]:
        """Up to `num` members taking work: retiring members first take work again (alive, and in the weight group),
        then new members start (each loads its model: waited for, `on_wait` hearing what they wait for). Returns
        the names started. RuntimeError (the new members killed, the group as it was) when they do not start
        within timeout_s."""
        back = min(num, len(self._handles)) - self.active
        self.active += max(back, 0)
        more = num - len(self._handles)
        if more <= 0:
            return []
        first = len(self._handles)
        handles, names = self._start(more)
        try:
            wait_started(handles, names, self.options, timeout_s, on_wait)
        except Exception:
            for h in handles:
                ray.kill(h, no_restart=True)
            self._handles, self.names = self._handles[:first], self.names[:first]
            raise
        self._seen_restarts += [0] * more
        self.active = len(self._handles)
        self._remember_nodes(handles)
        return names

    def start_pending(self, num: int) -> list[str]:
        """Start `num` more members without waiting for them: each joins the group at the `poll_pending` after its
        constructor ran (a generator: its engine loaded). On a cluster with no room, it waits for some, which is what
        makes the Ray autoscaler add a node where one runs. Not while members retire (a joining member takes the
        index after the active ones); their names."""
        if self.retiring():
            raise RuntimeError(f"{self.role}: members {self.retiring()} are retiring: take them back first (grow)")
        handles, names = self._start(num, join=False)
        now = time.monotonic()
        self._pending += [_Joining(h, n, h.__ray_ready__.remote(), now) for h, n in zip(handles, names, strict=True)]
        return names

    def pending(self) -> list[str]:
        """The members started and not yet joined."""
        return [j.name for j in self._pending]

    def pending_ready(self, timeout_s: float) -> bool:
        """Without waiting: whether `poll_pending` has anything to say (a pending member came up or failed, or one
        waited past timeout_s), so that the caller prepares the join only then."""
        if not self._pending:
            return False
        ready, _ = ray.wait([j.ready for j in self._pending], num_returns=1, timeout=0)
        return bool(ready) or any(time.monotonic() - j.since > timeout_s for j in self._pending)

    def poll_pending(self, timeout_s: float) -> tuple[list[str], list[str]]:
        """Without waiting: (joined, failed). joined: the pending members whose constructor ran, now members taking
        work; failed: a line each for those whose constructor raised or that waited past timeout_s (killed)."""
        if not self._pending:
            return [], []
        ready, _ = ray.wait([j.ready for j in self._pending], num_returns=len(self._pending), timeout=0)
        joined, failed, still = [], [], []
        for j in self._pending:
            if j.ready in ready:
                try:
                    ray.get(j.ready)
                except Exception as err:  # noqa: BLE001 - its constructor's error, named; the group goes on
                    ray.kill(j.handle, no_restart=True)
                    failed.append(f"{j.name} did not start: {str(err).strip().splitlines()[-1]}")
                    continue
                joined.append(j)
            elif time.monotonic() - j.since > timeout_s:
                state = actor_info(j.handle).get("State", "?")
                ray.kill(j.handle, no_restart=True)
                failed.append(f"{j.name} did not start within {timeout_s:.0f} s ({state}; it needs "
                              f"{_needs(self.options)}: no node with room came up)")
            else:
                still.append(j)
        self._pending = still
        if joined:
            self._handles = self._handles + [j.handle for j in joined]  # new lists: see `members`
            self.names = self.names + [j.name for j in joined]
            self._seen_restarts += [0] * len(joined)
            self.active = len(self._handles)
            self._remember_nodes([j.handle for j in joined])
        return [j.name for j in joined], failed

    # --- a member lost with its node: the others go on (orchestrator/loop/phases.py recover_generators) ----------

    def _remember_nodes(self, handles: list[ActorHandle]) -> None:
        """Where these members run, now that they are up (the GCS's record of a member Ray is restarting names
        the node it is placed on next, not the one it died with)."""
        for h in handles:
            info = actor_info(h)
            node = info.get("Address", {}).get("NodeID")
            if info.get("State") == "ALIVE" and node:
                self._node_of[ray_compat.actor_id(h)] = node

    def lost_with_node(self) -> list[int]:
        """The members down because the node they ran on died: Ray restarts such a member only where there is
        room, which may never come (or a node's start later)."""
        dead = {n["NodeID"] for n in ray.nodes() if not n.get("Alive", True)}
        if not dead:
            return []
        return [i for i, h in enumerate(self._handles)
                if self._node_of.get(ray_compat.actor_id(h)) in dead and actor_info(h).get("State") != "ALIVE"]

    def remove(self, members: list[int]) -> list[str]:
        """Take these members out of the group (killed: no restart) and renumber the others, in the streams this
        group started too: a stream of a removed member gets member None. The group's `restarts` counts it (the
        streams it cut are cut by this). Returns their names."""
        gone = sorted(set(members))
        names = [self.names[i] for i in gone]
        for i in gone:
            ray.kill(self._handles[i], no_restart=True)
        keep = [i for i in range(len(self._handles)) if i not in gone]
        renumber = {old: new for new, old in enumerate(keep)}
        self._handles = [self._handles[i] for i in keep]  # new lists: see `members`
        self.names = [self.names[i] for i in keep]
        self._seen_restarts = [self._seen_restarts[i] for i in keep]
        self.active = max(self.active - sum(i < self.active for i in gone), 0)
        for stream in list(self._streams.values()):
            stream.member = renumber.get(stream.member) if stream.member is not None else None
        self.restarts += 1
        return names

    def substitute(self) -> int:
        """A member taking work, in turn: where the work of a removed one goes."""
        self._turn = (self._turn + 1) % max(self.active, 1)
        return self._turn

    def cancel_pending(self) -> list[str]:
        """Kill the members started and not yet joined; their names."""
        gone, self._pending = self._pending, []
        for j in gone:
            ray.kill(j.handle, no_restart=True)
        return [j.name for j in gone]

    def retire(self, num: int) -> list[str]:
        """Members past the first `num` take no new work (`shards` leaves them out); they go on with the calls they
        have, and stay in the group (and its weight syncs) until `drop_retired`. Returns the retiring ones' names."""
        self.active = max(1, min(num, self.active))
        return self.names[self.active:]

    def retiring(self) -> list[int]:
        """The members that take no new work and are not dropped yet."""
        return list(range(self.active, len(self._handles)))

    def drop_retired(self) -> list[str]:
        """Kill the retiring members (the caller knows they hold nothing untrained) and remove them; their names."""
        gone, leaving = self.names[self.active:], self._handles[self.active:]
        self._handles, self.names = self._handles[:self.active], self.names[:self.active]
        self._seen_restarts = self._seen_restarts[:self.active]
        for h in leaving:
            ray.kill(h, no_restart=True)
        return gone


def joined(parts: list[Pending[list[T]]]) -> list[T]:
    """The results of a sharded call (one Pending per shard, in item order), waited for and joined in item order."""
    return [x for p in parts for x in p.result()]


class GeneratorGroup(ActorGroup):
    """The run's generators (actors/generation/generator.py Generator), `<run>/generator-<i>`: the generator's
    methods, named. The sampling calls shard their prompts (or rows) over the members, one call per member, and
    answer in prompt order; the streams run on one member each (the pipelined loop deals the shards itself).

      one turn per sample:  generate(...) -> list[GroupOut]        submit_generate(...) -> [Pending] per shard
                            stream_generate(member, ...) -> Stream[FinishedOuts]
      (a GroupOut: a finished group's SampleInfos and the reference to its token data, actors/payloads.py; the
      generators answer with Generator.generate_groups and the like)
      agentic, with tools:  rollout(...), submit_rollout(...), stream_rollout(member, ...), the same shapes
      weights (actors/weights/transfer.py), every member:
                            submit_load_weights(blob, version), submit_join_weight_group(...),
                            submit_receive_weights(version) -> [Pending] per member
      checks:               sequence_logprobs(token_ids, temperature) -> per member, cpu_threads() -> per member

    min_version: the policy version a call's samples must not be older than (its requests wait for that load);
    pin: no weight load lands until the call is done (an eval of one version)."""

    # --- sampling -----------------------------------------------------------------------------------------------

    def submit_generate(self, prompt_ids: list[list[int]], seeds: list[int], sampling: Sampling, *,
                        min_version: int | None, pin: bool = False, images: list[tuple[Any, ...]] | None = None,
                        ) -> list[Pending[list[GroupOut]]]:
        """Generator.generate_groups on each member's shard of the prompts (seeds, images: one per prompt)."""
        aligned: dict[str, list[Any]] = {"seeds": seeds} if images is None else {"seeds": seeds, "images": images}
        return self._submit_sharded("generate_groups", prompt_ids, aligned=aligned, sampling=sampling,
                                    min_version=min_version, pin=pin)

    def generate(self, prompt_ids: list[list[int]], seeds: list[int], sampling: Sampling, *,
                 min_version: int | None, pin: bool = False, images: list[tuple[Any, ...]] | None = None,
                 ) -> list[GroupOut]:
        return joined(self.submit_generate(prompt_ids, seeds, sampling, min_version=min_version, pin=pin,
                                           images=images))

    def stream_generate(self, member: int, prompt_ids: list[list[int]], seeds: list[int], sampling: Sampling,
                        *, min_version: int | None, images: list[tuple[Any, ...]] | None = None,
                        ) -> Stream[FinishedOuts]:
        """Generator.generate_groups_stream on one member: its groups as they finish."""
        extra = {} if images is None else {"images": images}
        return self._stream(member, "generate_groups_stream", prompt_ids, seeds, sampling, min_version=min_version,
                            **extra)

    def submit_rollout(self, rows: list[dict[str, Any]], seeds: list[int], sampling: Sampling, *,
                       min_version: int | None, pin: bool = False) -> list[Pending[list[GroupOut]]]:
        """Generator.rollout_groups on each member's shard of the rows (seeds: one per row)."""
        return self._submit_sharded("rollout_groups", rows, aligned={"seeds": seeds}, sampling=sampling,
                                    min_version=min_version, pin=pin)

    def rollout(self, rows: list[dict[str, Any]], seeds: list[int], sampling: Sampling, *,
                min_version: int | None, pin: bool = False) -> list[GroupOut]:
        return joined(self.submit_rollout(rows, seeds, sampling, min_version=min_version, pin=pin))

    def stream_rollout(self, member: int, rows: list[dict[str, Any]], seeds: list[int], sampling: Sampling,
                       *, min_version: int | None) -> Stream[FinishedOuts]:
        """Generator.rollout_groups_stream on one member: its rows' groups as they finish."""
        return self._stream(member, "rollout_groups_stream", rows, seeds, sampling, min_version=min_version)

    # --- weights (in the generators' "weights" concurrency group: between two engine steps) ----------------------

    def submit_load_weights(self, blob: Any, version: int | None) -> list[Pending[None]]:
        """Object-store backend: every member loads the safetensors bytes (`blob`: bytes, or the ObjectRef of
        them, fetched once per node)."""
        return self._submit("load_weights", blob, version=version)

    def submit_join_weight_group(self, host: str, port: int, *, rank_offsets: list[int], world_size: int,
                                 generation: int, timeout_s: float, plan: list[list[Any]]) -> list[Pending[list[int]]]:
        """Collective backend: every member's engine workers join the weight-transfer group, member i's first
        worker as rank rank_offsets[i]."""
        return self._submit("join_weight_group", host, port, world_size=world_size, generation=generation,
                            timeout_s=timeout_s, plan=plan, per_member=[{"rank_offset": r} for r in rank_offsets])

    def submit_receive_weights(self, version: int | None) -> list[Pending[dict[str, float]]]:
        """Collective backend: every member receives the buckets the learner broadcasts."""
        return self._submit("receive_weights", version=version)

    # --- checks -------------------------------------------------------------------------------------------------

    def submit_sequence_logprobs(self, token_ids: list[int], temperature: float,
                                 images: tuple[Any, ...] | None = None) -> list[Pending[list[float]]]:
        """Every member's engine logprobs of token_ids[1:] (the parity check, actors/weights/parity.py); images:
        those the ids' placeholders stand for (a vision-language model)."""
        return self._submit("sequence_logprobs", token_ids, temperature, images)

    def sequence_logprobs(self, token_ids: list[int], temperature: float,
                          images: tuple[Any, ...] | None = None) -> list[list[float]]:
        return [p.result() for p in self.submit_sequence_logprobs(token_ids, temperature, images)]

    def sequence_logprobs_and_routes(self, token_ids: list[int], temperature: float,
                                     images: tuple[Any, ...] | None = None) -> list[tuple[list[float], Any]]:
        """Every member's engine logprobs of token_ids[1:] and the routes its MoE layers took (None where it records
        none): the parity check of a run that replays routing. images: as in sequence_logprobs."""
        return [p.result() for p in self._submit("sequence_logprobs_and_routes", token_ids, temperature, images)]

    def cpu_threads(self) -> list[str]:
        """How each member's engine computes, for the start-up log."""
        return self._call("cpu_threads")


def _rendezvous() -> str:
    """tcp://<this node's IP>:<a port free on it now>, for rank 0 to listen on (run on rank 0's node; the port
    could be taken before rank 0 binds it, as with any free-port pick)."""
    return f"tcp://{node_ip()}:{free_port()}"


class LearnerGroup:
    """The learner, as the loop sees it: one member whatever the number of ranks, so the loop drives N ranks as it
    drives one learner. Every method runs on every rank, in the same order on each (so their collectives line up),
    and answers with rank 0's result (the ranks' metrics are already global; only rank 0 pushes global_step to the
    reward pool, through `rank0_kwargs`). Arguments go to the object store once, not once per rank.

        train_step(batch, reward_state) -> TrainResult     submit_train_step(...) -> Pending[TrainResult]
        save_checkpoint(path, extra) -> str                submit_save_checkpoint(...) -> Pending[str]
        load_checkpoint(path) -> dict (the run state)      save_merged(path) -> str (LoRA)
        cpu_threads() -> str                               sequence_logprobs(token_ids) -> list[float]
      weight transfer (actors/weights/transfer.py):
        weight_plan(bucket_mb), open_weight_group(world_size, timeout_s) -> (host, port)
        submit_join_weight_group(generation), submit_send_weights(), submit_export_weights() -> Pending
        submit_start_send(seq), submit_send_result(seq, timeout_s) -> Pending   (one rank: the background send)

    strategy "single" (one rank): the learner actor `<run>/learner`. "fsdp": `num` actors `<run>/learner-<r>` in a
    placement group of one bundle per rank (the `options` resources): placement "pack" (STRICT_PACK) puts the
    ranks on one node (NCCL over NVLink/PCIe, not the network), "spread" (STRICT_SPREAD) each on its own node.
    Rank 0's address (its node's IP as Ray knows it, reachable from the other nodes, and a port free there) is
    taken on its node before the actors start and passed to all of them for `init_process_group`.
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
        on_wait: Callable[[str], None] | None = None,
    ):
        """concurrency_groups: Ray concurrency groups of the learner actors besides HEALTH_GROUP ({name: max
        concurrency}; Ray takes them with the class, not in `.options()`). on_wait: hears what the group waits
        for while its placement group cannot be placed (every WAIT_MESSAGE_S)."""
        from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
        from ray.util.scheduling_strategies import (
            NodeAffinitySchedulingStrategy,
            PlacementGroupSchedulingStrategy,
        )

        self.role = "learner"
        self.placement_group = None
        opts, kw = dict(options or {}), dict(kwargs or {})
        self.options = opts
        remote_cls = ray.remote(concurrency_groups={HEALTH_GROUP: 1, **(concurrency_groups or {})})(cls)
        self.names = [f"{run_name}/learner"] if num == 1 else [f"{run_name}/learner-{r}" for r in range(num)]
        if strategy == "single":
            if num != 1:
                raise ValueError(f"strategy 'single' runs one learner, not {num}")
            self._ranks = [remote_cls.options(name=self.names[0], **opts).remote(**kw, **(rank0_kwargs or {}))]
        else:
            bundle = {"CPU": opts.get("num_cpus", 0), "GPU": opts.get("num_gpus", 0), **opts.get("resources", {})}
            bundle = {k: v for k, v in bundle.items() if v}  # Ray rejects zero amounts in a bundle
            pg_strategy = PLACEMENT_STRATEGIES[placement]
            where = "one node" if placement == "pack" else f"{num} different nodes"
            self.placement_group = placement_group([bundle] * num, strategy=pg_strategy, name=f"{run_name}/learner")
            deadline = time.monotonic() + PLACEMENT_TIMEOUT_S
            while True:
                try:
                    ray.get(self.placement_group.ready(), timeout=min(WAIT_MESSAGE_S, PLACEMENT_TIMEOUT_S))
                    break
                except ray.exceptions.GetTimeoutError:
                    if time.monotonic() > deadline:
                        remove_placement_group(self.placement_group)  # a pending group would hold its claim
                        raise RuntimeError(
                            f"the cluster could not place {num} learner ranks of {bundle} each ({pg_strategy}: "
                            f"{where}) within {PLACEMENT_TIMEOUT_S} s"
                        ) from None
                    if on_wait is not None:
                        on_wait(f"waiting for room for {num} learner ranks of {bundle} each ({where})")
            node = placement_group_table(self.placement_group)["bundles_to_node_id"][0]
            on_node = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            init_method = ray.get(ray.remote(_rendezvous).options(num_cpus=0, scheduling_strategy=on_node).remote())
            self._ranks = [
                remote_cls.options(
                    name=self.names[r],
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

    def __repr__(self) -> str:
        return f"LearnerGroup(ranks={len(self._ranks)})"

    def _submit(self, method: str, *args: Any, **kwargs: Any) -> Pending[Any]:
        if len(self._ranks) > 1:
            put = lambda x: x if isinstance(x, ray.ObjectRef) else ray.put(x)  # noqa: E731
            args, kwargs = tuple(put(a) for a in args), {k: put(v) for k, v in kwargs.items()}
        first, *others = [getattr(h, method).remote(*args, **kwargs) for h in self._ranks]
        return Pending(first, others)

    def _one_rank(self, method: str) -> ActorHandle:
        if len(self._ranks) != 1:
            raise ValueError(f"LearnerGroup.{method}: a background send needs one learner rank, not {len(self._ranks)}")
        return self._ranks[0]

    def wait_started(self, timeout_s: float, on_wait: Callable[[str], None] | None = None) -> None:
        """Return once every rank has loaded its model (see `wait_started`)."""
        wait_started(self._ranks, self.names, self.options, timeout_s, on_wait)

    # --- health -------------------------------------------------------------------------------------------------

    def members(self) -> list[Member]:
        """Each rank's health (a kill is for good: the supervisor rebuilds the learner)."""
        return [_member(n, h, restart=False) for n, h in zip(self.names, self._ranks, strict=True)]

    def on_each(self, fn: Callable[[Any], T]) -> list[T]:
        """fn(the rank's Learner) run in every rank's process, waited for, in rank order (see ActorGroup.on_each)."""
        return ray.get([h.__ray_call__.remote(fn) for h in self._ranks])

    def lost(self, err: BaseException | None, timeout_s: float) -> Loss | None:
        """Whether the learner is gone, and why: `err` (the error that ended the loop) or a ping says a rank died,
        or a rank does not answer a ping within timeout_s (it is hung: killed here). None: every rank answers."""
        members = self.members()
        ids = {m.id: m.name for m in members}
        seen: set[int] = set()
        while err is not None and id(err) not in seen:  # the chain of causes, Ray's task errors unwrapped
            seen.add(id(err))
            if isinstance(err, RayActorError) and err.actor_id in ids:
                return Loss(f"{ids[err.actor_id]} died: {death_reason(err)}", err.preempted)
            err = vars(err).get("cause") or err.__cause__
        pings = {m.ping().ref: m.name for m in members}
        ready, hung = ray.wait(list(pings), num_returns=len(pings), timeout=timeout_s)
        for ref in ready:
            try:
                ray.get(ref)
            except RayActorError as died:
                return Loss(f"{pings[ref]} died: {death_reason(died)}", died.preempted)
        if hung:
            self.kill()
            return Loss(f"{', '.join(pings[r] for r in hung)} did not answer within {timeout_s:.0f} s (hung): killed")
        return None

    # --- the update and checkpoints ---------------------------------------------------------------------------

    def submit_train_step(self, batch: TrainBatch, reward_state: TrainerState | None = None) -> Pending[TrainResult]:
        """reward_state: what rank 0 pushes to the reward pool with each new global_step (max_steps, epoch)."""
        return self._submit("train_step", batch, reward_state=reward_state)

    def train_step(self, batch: TrainBatch, reward_state: TrainerState | None = None) -> TrainResult:
        return self.submit_train_step(batch, reward_state).result()

    def submit_save_checkpoint(self, path: str, extra: dict[str, Any]) -> Pending[str]:
        return self._submit("save_checkpoint", path, extra=extra)

    def save_checkpoint(self, path: str, extra: dict[str, Any]) -> str:
        return self.submit_save_checkpoint(path, extra).result()

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        return self._submit("load_checkpoint", path).result()

    def save_merged(self, path: str) -> str:
        return self._submit("save_merged", path).result()

    def cpu_threads(self) -> str:
        return self._submit("cpu_threads").result()

    def sequence_logprobs(self, token_ids: list[int], routes: Any = None,
                          images: tuple[Any, ...] | None = None) -> list[float]:
        """routes: replay these (numpy int16 [len(token_ids), layers, top_k]; a learner built with routing replay).
        images: the images the ids' placeholders stand for (a vision-language model)."""
        return self._submit("sequence_logprobs", token_ids, routes, images).result()

    # --- weight transfer ----------------------------------------------------------------------------------------

    def weight_plan(self, bucket_mb: float) -> list[Any]:
        return self._submit("weight_plan", bucket_mb).result()

    def open_weight_group(self, world_size: int, timeout_s: float) -> tuple[str, int]:
        return self._submit("open_weight_group", world_size, timeout_s).result()

    def submit_join_weight_group(self, generation: int) -> Pending[int]:
        return self._submit("join_weight_group", generation)

    def submit_send_weights(self) -> Pending[dict[str, float]]:
        return self._submit("send_weights")

    def submit_export_weights(self) -> Pending[bytes]:
        return self._submit("export_weights")

    def submit_start_send(self, seq: int) -> Pending[None]:
        """Start weight sync `seq` in the background, in the actor's default group: ahead of the next train step."""
        return Pending(self._one_rank("submit_start_send").start_send_weights.remote(seq))

    def submit_send_result(self, seq: int, timeout_s: float) -> Pending[dict[str, float]]:
        """Weight sync `seq`'s numbers once it is done, asked in SEND_GROUP: it answers while a train step runs."""
        rank0 = self._one_rank("submit_send_result")
        return Pending(rank0.send_result.options(concurrency_group=SEND_GROUP).remote(seq, timeout_s))

    def kill(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for h in self._ranks:
            ray.kill(h, no_restart=True)
        if self.placement_group is not None:
            remove_placement_group(self.placement_group)
            self.placement_group = None


class PoolGroup:
    """A named pool actor `<run>/<role>-pool` (actors/runtime/pool.py) that owns its workers. `handle` is the pool's
    ActorHandle (`rayward scale` finds the pool by name)."""

    def __init__(self, cls: type, *, run_name: str, role: str, namespace: str, kwargs: dict[str, Any],
                 options: dict[str, Any] | None = None):
        """options: more Ray options of the pool actor (where it runs)."""
        self.handle: ActorHandle = (
            ray.remote(cls)
            .options(name=f"{run_name}/{role}-pool", namespace=namespace, num_cpus=0, max_concurrency=1000,
                     **(options or {}))
            .remote(**kwargs)
        )

    def scaling(self) -> dict[str, Any]:
        """How the pool is sized now (`WorkerPool.scaling_state`), for a checkpoint."""
        return ray.get(self.handle.scaling_state.remote())

    def restore_scaling(self, state: dict[str, Any]) -> None:
        ray.get(self.handle.restore_scaling.remote(state))

    def kill(self) -> None:
        """The pool and its workers (best effort, at teardown)."""
        try:
            for h in ray.get(self.handle.worker_handles.remote(), timeout=10).values():
                ray.kill(h, no_restart=True)
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass
        ray.kill(self.handle, no_restart=True)


class JudgePoolGroup(PoolGroup):
    """The named judge pool `<run>/judge-<reward>-pool` of one judge reward (actors/engines/pool.py): the reward
    pool sends it the samples to judge, never the driver (its stats reach the driver in Scores.judge_pools)."""


class TeacherPoolGroup(PoolGroup):
    """The named teacher pool `<run>/teacher-pool` (actors/engines/pool.py: on-policy distillation): the reward
    pool sends it every sample, never the driver (its stats reach the driver in Scores.teacher_pool)."""


class RewardPoolGroup(PoolGroup):
    """The named reward pool `<run>/<role>-pool` (actors/rewards/pool.py). The learner pushes TrainerState to its
    `handle`. It owns its judge rewards' pools (`judges`) and the distillation teacher's (`teacher`): their sizes
    go into checkpoints with its own, and they go with it."""

    def __init__(self, cls: type, *, judges: dict[str, JudgePoolGroup] | None = None,
                 teacher: TeacherPoolGroup | None = None, **kwargs: Any):
        """judges: per judge reward, its judge pool; teacher: the teacher's pool (already started; the reward pool
        gets their handles)."""
        self.judges = dict(judges or {})
        self.teacher = teacher
        kwargs["kwargs"] = {**kwargs["kwargs"], "judges": {n: g.handle for n, g in self.judges.items()},
                            **({"teacher": teacher.handle} if teacher is not None else {})}
        super().__init__(cls, **kwargs)

    def scaling(self) -> dict[str, Any]:
        state = super().scaling()
        if self.judges:
            state["judges"] = {n: g.scaling() for n, g in self.judges.items()}
        if self.teacher is not None:
            state["teacher"] = self.teacher.scaling()
        return state

    def restore_scaling(self, state: dict[str, Any]) -> None:
        state = dict(state)
        judges = state.pop("judges", {})
        teacher = state.pop("teacher", None)
        super().restore_scaling(state)
        for n, s in judges.items():
            if n in self.judges:  # a judge the resumed config no longer has keeps nothing
                self.judges[n].restore_scaling(s)
        if teacher is not None and self.teacher is not None:
            self.teacher.restore_scaling(teacher)

    def kill(self) -> None:
        for g in [*self.judges.values(), *([self.teacher] if self.teacher is not None else [])]:
            g.kill()
        super().kill()

    def submit_score(self, batch: RewardBatch, chunk_groups: int, state: TrainerState | None = None) -> Pending[Scores]:
        """Score a batch in chunks of `chunk_groups` groups; state: the trainer_state the rewards see (default: the
        pool's, the learner's latest)."""
        return Pending(self.handle.score.remote(batch, chunk_groups, state=state))

    def score(self, batch: RewardBatch, chunk_groups: int, state: TrainerState | None = None) -> Scores:
        return self.submit_score(batch, chunk_groups, state).result()

    def set_state(self, state: TrainerState) -> None:
        """The trainer_state the rewards see from now on (a restored checkpoint's; the learner pushes the next)."""
        ray.get(self.handle.set_state.remote(state))


class ControlGroup:
    """The run's control mailbox `<run>/control` (actors/runtime/control.py RunControl): `rayward scale
    --generators` leaves a request there, the driver takes it at a step boundary and reports the fleet back."""

    def __init__(self, *, run_name: str, namespace: str, generators: int):
        from actors.runtime.control import RunControl

        self.handle: ActorHandle = (ray.remote(RunControl)
                                    .options(name=f"{run_name}/control", namespace=namespace, num_cpus=0)
                                    .remote(generators))

    def take_generators(self) -> int | None:
        return ray.get(self.handle.take_generators.remote())

    def report(self, generators: int, retiring: int) -> None:
        self.handle.report.remote(generators, retiring)  # not waited for: the next request reads it

    def kill(self) -> None:
        ray.kill(self.handle, no_restart=True)


class EnvPoolGroup(PoolGroup):
    """The named environment pool `<run>/env-pool` (actors/envs/pool.py). The generators reach it through its
    `handle` (actors.envs.client.PoolEnvironments), never through the driver."""

    def stats(self) -> EnvPoolStats:
        return ray.get(self.handle.stats.remote())
