"""ActorGroup resized as `rayward scale --generators` resizes the generators (orchestrator/loop/fleet.py), on a local
Ray cluster with a plain actor class standing for the generator: members started with their own keyword
arguments and fresh names, retiring members left out of new work, dropped ones killed, and a request the cluster
has no room for named before anything starts."""

from __future__ import annotations

import time

import pytest
import ray

from actors.runtime.group import ActorGroup, actor_info
from tests.integration.conftest import TEST_CLUSTER_CPUS


class Member:
    def __init__(self, seed: int):
        self.seed = seed


def seeds(group: ActorGroup) -> list[int]:
    return group.on_each(lambda m: m.seed)


def test_a_group_grows_retires_and_drops_members(ray_cluster):
    group = ActorGroup(Member, 1, run_name="resize", role="gen", options={"num_cpus": 0.1},
                       per_actor_kwargs=lambda i: {"seed": 100 + i})
    group.wait_started(60)
    assert group.grow(3, timeout_s=60) == ["resize/gen-1", "resize/gen-2"]
    assert seeds(group) == [100, 101, 102] and group.active == 3 and len(group.members()) == 3
    assert {m for m, _ in group.shards(6)} == {0, 1, 2}
    assert group.retire(1) == ["resize/gen-1", "resize/gen-2"]
    assert group.retiring() == [1, 2] and {m for m, _ in group.shards(6)} == {0}  # no new work for them
    assert len(group) == 3  # alive until dropped: they finish their calls
    assert group.grow(2, timeout_s=60) == [] and group.retiring() == [2]  # a retiring member takes work again
    leaving = group._handles[2]
    assert group.drop_retired() == ["resize/gen-2"] and len(group) == 2 and group.retiring() == []
    # ray.kill is asynchronous: a call right after it may still be answered, so wait for the GCS to say DEAD.
    deadline = time.monotonic() + 30
    while actor_info(leaving).get("State") != "DEAD" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert actor_info(leaving).get("State") == "DEAD"
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(leaving.__ray_ready__.remote(), timeout=30)
    assert group.grow(3, timeout_s=60) == ["resize/gen-3"]  # a fresh name: a dropped one may linger in the GCS
    assert seeds(group) == [100, 101, 103]
    group.kill()


def test_no_room_is_named_before_anything_starts(ray_cluster):
    group = ActorGroup(Member, 1, run_name="room", role="gen", options={"num_cpus": 1},
                       per_actor_kwargs=lambda i: {"seed": i})
    group.wait_started(60)
    assert group.room(1) is None
    why = group.room(TEST_CLUSTER_CPUS + 1)
    assert why is not None and why.startswith(f"no room for {TEST_CLUSTER_CPUS + 1} more gen(s): they need {{'CPU'")
    assert len(group) == 1
    group.kill()


class Slow:
    """A member whose constructor takes a while (a generator loading its model), or raises."""

    def __init__(self, seed: int, start_s: float = 0.0):
        time.sleep(start_s)
        if seed < 0:
            raise ValueError("bad seed")
        self.seed = seed


def test_pending_members_join_once_up_and_a_member_without_room_waits_for_it(ray_cluster):
    group = ActorGroup(Slow, 1, run_name="pend", role="gen", options={"num_cpus": 0.1},
                       per_actor_kwargs=lambda i: {"seed": i, "start_s": 3.0 if i else 0.0})
    group.wait_started(60)
    assert group.start_pending(1) == ["pend/gen-1"]
    assert group.pending() == ["pend/gen-1"] and len(group) == 1  # not a member yet: no work, no weight syncs
    assert group.poll_pending(60) == ([], [])  # still in its constructor
    deadline = time.monotonic() + 60
    while not group.pending_ready(60) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group.poll_pending(60) == (["pend/gen-1"], []) and group.active == 2 and seeds(group) == [0, 1]
    # no room: it waits (what makes a Ray autoscaler add a node), is given up after the timeout, and is killed
    big = ActorGroup(Member, 1, run_name="pend-big", role="gen", options={"num_cpus": TEST_CLUSTER_CPUS * 0.6},
                     per_actor_kwargs=lambda i: {"seed": i})
    big.wait_started(60)
    assert big.room(1) is not None
    big.start_pending(1)
    time.sleep(1.0)
    assert not big.pending_ready(60) and big.poll_pending(60) == ([], [])
    joined, failed = big.poll_pending(0.5)
    assert joined == [] and len(failed) == 1
    assert "pend-big/gen-1 did not start within 0 s (PENDING_CREATION" in failed[0]
    assert big.pending() == [] and len(big) == 1
    # a constructor that raises is named, and the group goes on
    group.member_kwargs = lambda i: {"seed": -1}
    group.start_pending(1)
    deadline = time.monotonic() + 60
    while not group.pending_ready(60) and time.monotonic() < deadline:
        time.sleep(0.2)
    joined, failed = group.poll_pending(60)
    assert joined == [] and "pend/gen-2 did not start: ValueError: bad seed" in failed[0] and len(group) == 2
    group.kill()
    big.kill()
