"""The reward pool's teacher stage in milliseconds (on-policy distillation): real RewardWorkers in this process
score the functions, a stand-in teacher pool answers log-probs. What is checked: every sample goes to the teacher
once, with the ids the engine saw (prompt + completion), as its chunk arrives, while the rewards run; the answers
come back in batch order whatever the chunking; a sample the teacher failed on keeps its rewards and has no
log-probs (counted); the teacher's log-probs follow the selected groups into the learner's batch. The teacher pool
itself is the judge pool's machinery (tests/integration/actors/engines/test_judge_pool.py); a teacher on a real
engine: tests/integration/actors/engines/test_teacher_engine.py and tests/integration/orchestrator/
test_distill_run.py."""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from actors.engines.teacher import TeacherAnswer
from actors.payloads import resolve_rewards, resolve_training
from actors.rewards.worker import RewardSpec
from actors.types import RewardBatch, TeacherPoolStats
from orchestrator.algo.aggregation import RewardAggregator, advantage_batch
from orchestrator.config import RewardConfig
from tests.fixtures.records import make_rollouts, teacher_logprobs
from tests.unit.actors.rewards.test_judge_stage import COMPLETIONS, LETTERS, InProcessPool, _Method

FAIL = 99  # a completion holding this id: the teacher times out on it


class StandInTeacher:
    """A teacher pool's interface: the log-prob of a completion token is -(its id)/100 - (its prompt's length)/1000
    (checkable per request, and proof it read the prompt); a completion holding FAIL gets no answer in time."""

    def __init__(self):
        self.asked, self.batches, self.parts = [], 0, []

    def _logprobs(self, requests, part=False):
        self.parts.append(part)
        out = []
        for r in requests:
            self.asked.append((tuple(r.prompt_ids), tuple(r.completion_ids)))
            if FAIL in r.completion_ids:
                out.append(TeacherAnswer("timeout", error="no answer within 1 s", seconds=1.0))
            else:
                out.append(TeacherAnswer("ok", [expected(r.prompt_ids, t) for t in r.completion_ids], seconds=0.01))
        return out

    def __getattr__(self, name):
        if name == "logprobs":
            return _Method(self._logprobs)
        if name == "begin_batch":
            return _Method(lambda: setattr(self, "batches", self.batches + 1))
        if name == "stats":
            return _Method(lambda: TeacherPoolStats(1, 1, 0, 0, 0, 0, 0.0, math.nan, 0, "off",
                                                    requests=len(self.asked)))
        raise AttributeError(name)


def expected(prompt_ids, token):
    return -token / 100 - len(prompt_ids) / 1000


def score(batch, teacher, chunk_groups=1):
    async def main():
        pool = InProcessPool([RewardSpec("letter", "actors.rewards.builtin:starts_with_letter")], run_name="t",
                             num_workers=2, worker_options={}, teacher=teacher)
        for _ in range(10_000):
            if pool.size() == 2:
                break
            await asyncio.sleep(0.001)
        return await pool.score(batch, chunk_groups)

    with ThreadPoolExecutor(8):
        return asyncio.run(main())


def batch_with_ids(completion_ids):
    n = len(COMPLETIONS)
    return RewardBatch(["Write the letter:"] * n, COMPLETIONS, completion_ids, {"letter": LETTERS}, 4,
                       prompt_ids=[[1] * (1 + i % 3) for i in range(n)])


@pytest.mark.parametrize("chunk_groups", [1, 2])
def test_every_sample_is_scored_once_in_batch_order_and_failures_keep_their_rewards(chunk_groups):
    ids = [[10 + i, 20 + i] for i in range(len(COMPLETIONS))]
    ids[5] = [FAIL]
    batch = batch_with_ids(ids)
    teacher = StandInTeacher()
    scores = score(batch, teacher, chunk_groups)
    assert sorted(teacher.asked) == sorted((tuple(p), tuple(c)) for p, c in zip(batch.prompt_ids, ids, strict=True))
    # float32, as the learner computes them (the teacher's objects hold float32 arrays)
    want = [[float(np.float32(expected(p, t))) for t in c] for p, c in zip(batch.prompt_ids, ids, strict=True)]
    want[5] = []
    assert teacher_logprobs(scores.teacher) == want and len(scores.teacher) == len(ids) // 4  # one object a group
    assert scores.teacher_failures == 1 and scores.teacher_pool.requests == len(ids)
    assert scores.scores[0] == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]  # sample 5 is scored as ever
    assert teacher.batches == 1 and all(teacher.parts) and len(teacher.parts) == len(ids) // (4 * chunk_groups)

    # into the learner's batch, through a selection of groups (dynamic sampling keeps group 1 only)
    rollouts = make_rollouts(COMPLETIONS, 4, completion_ids=ids, columns={"letter": LETTERS})
    agg = RewardAggregator([RewardConfig(name="letter", function="starts_with_letter")])
    full = advantage_batch(agg, rollouts, scores, scale_rewards="group", aggregation="sum_then_normalize")
    assert resolve_training(full.batch).teacher_logprobs == want  # as the learner fetches them
    kept = advantage_batch(agg, rollouts.take_groups([1]), scores.take_groups([1], 4), scale_rewards="group",
                           aggregation="sum_then_normalize")
    assert resolve_training(kept.batch).teacher_logprobs == want[4:]


def test_an_eval_batch_is_not_sent_to_the_teacher():
    """An eval's batch carries no prompt ids (its sampler is built without them): the teacher is not asked, and the
    scores carry no teacher log-probs."""
    from orchestrator.run.build import rollout_kind

    rollouts = make_rollouts(COMPLETIONS, 4, columns={"letter": LETTERS})
    batch = rollout_kind(None, teacher=True).reward_batch(rollouts)
    assert resolve_rewards(batch).prompt_ids == [[1]] * len(COMPLETIONS)
    teacher = StandInTeacher()
    scores = score(rollout_kind(None).reward_batch(rollouts), teacher)
    assert scores.teacher is None and teacher.asked == [] and teacher.batches == 0
