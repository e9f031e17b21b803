"""actors/group.py's shard arithmetic: how items are split over the members (the Ray side: tests/integration)."""

from actors.group import shards


def test_one_contiguous_shard_per_member_in_item_order():
    assert shards(10, 3) == [(0, slice(0, 3)), (1, slice(3, 6)), (2, slice(6, 10))]
    assert shards(4, 1) == [(0, slice(0, 4))]


def test_more_parts_than_members_are_dealt_in_turn():
    assert shards(8, 2, parts=4) == [(0, slice(0, 2)), (1, slice(2, 4)), (0, slice(4, 6)), (1, slice(6, 8))]


def test_never_more_shards_than_items_and_none_for_no_items():
    assert shards(2, 4) == [(0, slice(0, 1)), (1, slice(1, 2))]
    assert shards(3, 2, parts=8) == [(0, slice(0, 1)), (1, slice(1, 2)), (0, slice(2, 3))]
    assert shards(0, 2) == []


def test_death_reason_keeps_what_happened_not_rays_advice():
    from ray.exceptions import RayActorError

    from actors.group import death_reason

    err = RayActorError(error_msg=(
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
        "Worker unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the "
        "process was killed by the OOM killer"))
    assert death_reason(err) == "its worker process died: Worker unexpectedly exits with a connection error code 2"
    assert death_reason(RayActorError(error_msg="The actor died because its node has died.")) == (
        "The actor died because its node has died.")
