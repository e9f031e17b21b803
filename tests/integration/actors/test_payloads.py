"""The data plane with Ray's object store (actors/payloads.py): a generator actor keeps its groups' token data
(`ray.put` in its own process), the driver holds references; when that actor is gone its payloads are gone
(Ray's ownership: ObjectLostError / OwnerDiedError), and everything that reads them names exactly the lost groups
instead of failing: the reward worker scores the rest (Scores.lost), a judge or teacher stage skips them, the
learner's batch raises PayloadLost naming them (TrainResult.lost), the completions log keeps their rows."""

from __future__ import annotations

import math
import time

import pytest

from actors.payloads import (
    PayloadLost,
    fetch,
    payload_store,
    resolve_available,
    resolve_rewards,
    resolve_training,
)
from actors.rewards.worker import RewardSpec, RewardWorker
from actors.runtime.completions import with_completions
from actors.types import GroupOut, RewardBatch, Sample, TrainBatch

G = 2
POLL_S = 0.2
DEATH_WAIT_S = 60  # a killed actor's process exits within seconds; bounds the wait on a stuck one


class Holder:
    """A generator's part in the data plane: puts its groups' payloads in the object store and answers GroupOuts."""

    def groups(self, texts: list[list[str]]) -> list[GroupOut]:
        from actors.payloads import group_out

        put = payload_store()
        return [group_out(i, [Sample([10 + k], [-0.5], t, "stop") for k, t in enumerate(g)], put, prompt_ids=[1, 2])
                for i, g in enumerate(texts)]


def starts_with_a(completions, **kw):
    return [float(c.startswith("a")) for c in completions]


@pytest.fixture()
def two_holders(ray_cluster):
    """Two generator-like actors, each holding one group's payload; the first is then killed."""
    ray = ray_cluster
    holders = [ray.remote(Holder).options(num_cpus=0.1).remote() for _ in range(2)]
    outs = [o for h, texts in zip(holders, (["ab", "b"], ["ax", "ay"]), strict=True)
            for o in ray.get(h.groups.remote([texts]))]
    # Both there while their holders live, read where a stage reads them.
    assert ray.get(ray.remote(fetch).options(num_cpus=0.1).remote([o.payload for o in outs]))[1].samples[0].text == "ax"
    ray.kill(holders[0], no_restart=True)  # asynchronous
    gone_after(outs[0].payload, DEATH_WAIT_S)
    yield outs
    ray.kill(holders[1], no_restart=True)


def gone_after(payload, wait_s: float) -> None:
    """Ray frees a dead owner's objects shortly after the owner is known dead (a read in between still gets the
    copy in the node's store): wait, bounded, until a read fails as every reader would then see it fail."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fetch([payload])
        except PayloadLost:
            return
        assert time.monotonic() < deadline, f"a dead owner's payload still readable after {wait_s} s"
        time.sleep(POLL_S)


def batch_of(outs: list[GroupOut]) -> RewardBatch:
    n = sum(len(o.infos) for o in outs)
    return RewardBatch(["p"] * n, [], [], {}, G, payloads=[o.payload for o in outs])


def test_a_dead_holders_payloads_are_lost_by_name_and_the_rest_scored(two_holders):
    outs = two_holders
    with pytest.raises(PayloadLost) as lost:
        resolve_rewards(batch_of(outs))
    assert lost.value.lost == [0]

    scores = RewardWorker([RewardSpec("a", f"{__name__}:starts_with_a")]).score(batch_of(outs))
    assert scores.lost == [True, True, False, False] and scores.lost_groups(G) == [0]
    assert all(math.isnan(v) for v in scores.scores[0][:2]) and scores.scores[0][2:] == [1.0, 1.0]

    resolved, flags = resolve_available(batch_of(outs))  # a judge's or the teacher's view of the chunk
    assert flags == [True, True, False, False] and resolved.completions == [None, None, "ax", "ay"]
    assert resolved.prompt_ids is None and resolved.completion_ids == [[], [], [10], [11]]

    train = TrainBatch([], [], [], [0.5, -0.5, 0.5, -0.5], [False] * 4, payloads=[o.payload for o in outs],
                       group_size=G)
    with pytest.raises(PayloadLost) as lost:
        resolve_training(train)  # the learner answers TrainResult(lost=[0]) and trains nothing
    assert lost.value.lost == [0]
    survivor = resolve_training(TrainBatch([], [], [], [0.5, -0.5], [False] * 2, payloads=[outs[1].payload],
                                           group_size=G))
    assert survivor.completion_ids == [[10], [11]] and survivor.prompt_ids == [[1, 2], [1, 2]]

    rows = with_completions([{"step": 1, "prompt": "p"} for _ in range(4)], [o.payload for o in outs], G)
    assert [r.get("payload_lost", False) for r in rows] == [True, True, False, False]
    assert [r["completion"] for r in rows] == [None, None, "ax", "ay"]
