"""The hand-off records: slicing by group and joining keep every per-sample field aligned."""

from __future__ import annotations

from actors.payloads import resolve_rewards
from actors.types import RewardBatch
from tests.fixtures.records import completion_ids, reward_batch, rollouts, scores


def test_take_groups_keeps_rows_aligned():
    r = rollouts(3).take_groups([2, 0])
    assert completion_ids(r) == [[4], [5], [0], [1]] and r.columns["uid"] == [4, 5, 0, 1]
    assert r.prompts == ["p2", "p2", "p0", "p0"] and r.truncated == [False, False, True, False]
    assert r.num_groups == 2 and r.policy_version == 3
    s = scores(6).take_groups([2, 0], group_size=2)
    assert s.scores[0] == [4.0, 5.0, 0.0, 1.0] and s.extra["x"] == [4, 5, 0, 1] and len(s) == 4


def test_concat_adds_counters_and_keeps_order():
    r = rollouts(1).concat(rollouts(1, start=2))
    assert completion_ids(r) == [[0], [1], [2], [3]] and r.columns["uid"] == [0, 1, 2, 3]
    s = scores(2, worker=0).concat(scores(2, start=2, step=6, worker=1))
    assert s.scores[0] == [0.0, 1.0, 2.0, 3.0] and s.timeouts == {"a": 2, "b": 0} and s.errors == {"a": 0, "b": 4}
    assert s.workers == [0, 1] and s.busy_s == 2.0 and s.global_step == 5 and s.pool.workers == 1
    assert s.metrics == {"m": [1.0, 1.0]} and s.metric_means() == {"m": 1.0}


def test_concat_averages_queue_wait_per_sample():
    a, b = scores(2), scores(6, start=2, worker=1)
    a.queue_wait_s, b.queue_wait_s = 4.0, 0.0
    assert a.concat(b).queue_wait_s == 1.0  # (4 x 2 + 0 x 6) / 8


def test_concat_fills_log_extra_columns_one_side_lacks():
    a, b = scores(2), scores(1)
    b.extra = {"y": ["q"]}
    s = a.concat(b)
    assert s.extra == {"x": [0, 1, None], "y": [None, None, "q"]}


def test_reward_batch_chunks_are_whole_groups_with_offsets():
    rb = reward_batch(rollouts(3))
    chunks = rb.chunks(4)
    assert [len(c) for c in chunks] == [4, 2] and [c.offset for c in chunks] == [0, 4]
    assert chunks[1].columns["uid"] == [4, 5] and chunks[1].group_size == 2
    assert isinstance(chunks[0], RewardBatch) and [len(c.payloads) for c in chunks] == [2, 1]
    resolved = resolve_rewards(chunks[1])  # each chunk carries its own groups' payloads
    assert resolved.completions == ["c4", "c5"] and resolved.completion_ids == [[4], [5]]
    assert resolved.payloads is None and resolved.prompts == ["p2", "p2"]


def test_lost_groups_follow_their_rows_through_take_groups_and_concat():
    a, b = scores(4), scores(2, start=4)
    a.lost = [False, False, True, True]  # a's second group's payload was lost; b has none lost
    s = a.concat(b)
    assert s.lost == [False, False, True, True, False, False] and s.lost_groups(2) == [1]
    assert s.take_groups([1, 2], group_size=2).lost_groups(2) == [0]
    assert scores(2).concat(scores(2)).lost == [] and scores(2).lost_groups(2) == []


def test_a_samples_policy_version_is_its_oldest_model_tokens():
    from actors.types import Sample

    nan = float("nan")
    spanning = Sample([1, 2, 3, 4], [-0.1, nan, -0.2, -0.3], "", "stop", versions=[5, -1, 6, 6])
    assert spanning.policy_version == 5
    assert Sample([1, 2], [nan, -0.1], "", "stop", versions=[-1, 7]).policy_version == 7  # tool tokens carry none
    assert Sample([1], [-0.1], "", "stop").policy_version is None  # no versions recorded
    assert Sample([1], [nan], "", "env_error", versions=[-1]).policy_version is None  # no model token


def test_lazily_skipped_samples_follow_their_rows_through_take_groups_and_concat():
    a, b = scores(4), scores(2, start=4)
    a.skipped = {"b": [True, False, False, True]}  # b lazily gated; the other chunk had no entry for it
    s = a.concat(b)
    assert s.skipped == {"b": [True, False, False, True, False, False]}
    assert s.take_groups([1, 0], group_size=2).skipped == {"b": [False, True, True, False]}

