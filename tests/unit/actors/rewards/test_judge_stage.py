"""The reward pool's judge stage in milliseconds: real RewardWorkers (in this process, behind handles that obey an
actor handle's interface) score the functions, a stand-in judge pool answers the judge rewards. What is checked:
a lazily gated judge is asked about the open samples only and the run's advantages equal asking it everywhere; a
judge gated on another judge waits for it; timeouts and errors follow the reward's policy, counted; a raise names
the reward and the sample; the judge's text reaches the completions log. The judge pool itself (routing, dead
engines) is tests/integration/actors/engines/test_judge_pool.py; a judge on a real engine in a run is
tests/integration/runs/test_judge_run.py."""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import actors.runtime.pool as base_module
from actors.engines.judge import JudgeAnswer, JudgeSpec, template_fields
from actors.rewards.pool import RewardPool
from actors.rewards.worker import LazyGate, RewardFunctionError, RewardSpec, RewardWorker
from actors.types import JudgePoolStats, RewardBatch
from orchestrator.algo.aggregation import RewardAggregator, advantage_batch
from orchestrator.config import RewardConfig
from tests.fixtures.records import make_rollouts

TEMPLATE = "Letter: {letter}\nAnswer: {completion}\nCorrect?"
JUDGE = {"model": "stand-in", "template": TEMPLATE, "labels": {"yes": 1.0, "no": 0.0}}


class _Method:
    def __init__(self, call):
        self.call = call

    def remote(self, *args, **kwargs):
        return asyncio.get_running_loop().run_in_executor(None, lambda: self.call(*args, **kwargs))


class WorkerHandle:
    """An in-process RewardWorker behind an actor handle's interface."""

    def __init__(self, specs, index):
        self.worker = RewardWorker(specs, index=index)
        self.dead = False

    def __getattr__(self, name):
        return _Method(getattr(self.worker, name))


class StandInJudge:
    """A judge pool's interface: answers from the request's fields (yes where the completion starts with the
    letter); a completion "!" gets an unparseable answer, "~" no answer in time. Every request is recorded."""

    def __init__(self, name: str):
        self.name, self.asked, self.batches, self.parts = name, [], 0, []

    def _judge(self, requests, part=False):
        self.parts.append(part)
        out = []
        for r in requests:
            self.asked.append(r.fields)
            answer = r.fields["completion"].split("\n")[-1]
            if answer == "!":
                out.append(JudgeAnswer("error", text="maybe", error="the judge's answer 'maybe' starts with none of "
                                       "the labels ['no', 'yes']"))
            elif answer == "~":
                out.append(JudgeAnswer("timeout", error="no answer within 5 s", seconds=5.0))
            else:
                yes = answer.startswith(r.fields["letter"])
                out.append(JudgeAnswer("ok", float(yes), text="yes" if yes else "no", seconds=0.01))
        return out

    def __getattr__(self, name):
        if name == "judge":
            return _Method(self._judge)
        if name == "begin_batch":
            return _Method(lambda: setattr(self, "batches", self.batches + 1))
        if name == "stats":
            return _Method(lambda: JudgePoolStats(1, 1, 0, 0, 0, 0, 0.0, math.nan, 0, "off", requests=len(self.asked)))
        raise AttributeError(name)


class InProcessPool(RewardPool):
    def _new_worker(self, index, name):
        return WorkerHandle(self.specs, index)


@pytest.fixture(autouse=True)
def in_process_kill(monkeypatch):
    monkeypatch.setattr(base_module.ray, "kill", lambda handle, no_restart=True: setattr(handle, "dead", True))


def judge_spec(name: str, **kw) -> RewardSpec:
    lazy = kw.pop("lazy_gate", None)
    return RewardSpec(name, lazy_gate=lazy, judge=JudgeSpec(reward=name, **JUDGE), **kw)


def score(specs, judges, batch, chunk_groups=1):
    async def main():
        pool = InProcessPool(specs, run_name="t", num_workers=2, worker_options={}, judges=judges)
        for _ in range(10_000):
            if pool.size() == 2:
                break
            await asyncio.sleep(0.001)
        return await pool.score(batch, chunk_groups)

    with ThreadPoolExecutor(8):
        return asyncio.run(main())


def letters_batch(completions, letters, g=4):
    n = len(completions)
    return RewardBatch(["Write the letter:"] * n, completions, [[1]] * n, {"letter": letters}, g)


COMPLETIONS = ["abc", "b", "ax", "cc", "bb", "b", "ba", "bbbb"]
LETTERS = ["a"] * 4 + ["b"] * 4


def test_a_lazy_judge_is_asked_about_the_open_samples_only_and_the_advantages_are_the_eager_ones():
    """The issue's lazy gating for judges: the gate (the letter reward below 0.5) closes on 3 of 8 samples, the judge
    hears the other 5; advantages, totals and gated columns are equal to the bit to asking it about all 8."""
    rewards = [RewardConfig(name="letter", function="starts_with_letter"),
               RewardConfig(name="judged", judge=JUDGE, weight=0.5, gate={"reward": "letter", "threshold": 0.5})]
    assert rewards[1].lazy
    letter = RewardSpec("letter", "actors.rewards.builtin:starts_with_letter")
    out, asked = {}, {}
    for lazy in (False, True):
        judge = StandInJudge("judged")
        spec = judge_spec("judged", lazy_gate=LazyGate("letter", 0.5) if lazy else None)
        out[lazy] = score([letter, spec], {"judged": judge}, letters_batch(COMPLETIONS, LETTERS))
        asked[lazy] = [f["completion"] for f in judge.asked]
    open_ = [c for c, w in zip(COMPLETIONS, LETTERS, strict=True) if c.startswith(w)]
    assert sorted(asked[False]) == sorted(COMPLETIONS) and sorted(asked[True]) == sorted(open_)
    lazy, eager = out[True], out[False]
    assert lazy.skipped == {"judged": [not c.startswith(w) for c, w in zip(COMPLETIONS, LETTERS, strict=True)]}
    assert eager.skipped == {} and sum(lazy.skipped["judged"]) == len(COMPLETIONS) - len(open_)
    assert lazy.extra["judge/judged"] == ["yes", None, "yes", None, "yes", "yes", "yes", "yes"]
    assert eager.scores[1] == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert lazy.judge_pools["judged"].requests == len(open_)
    assert judge.batches == 1 and judge.parts and all(judge.parts)  # one batch for its autoscaler, sent in parts

    rollouts = make_rollouts(COMPLETIONS, 4)
    agg = RewardAggregator(rewards)
    a, b = (advantage_batch(agg, rollouts, s, scale_rewards="group", aggregation="sum_then_normalize")
            for s in (eager, lazy))
    assert torch.equal(torch.tensor(a.batch.advantages), torch.tensor(b.batch.advantages))
    assert a.table["total"] == b.table["total"] and a.table["gated/judged"] == b.table["gated/judged"]
    assert torch.tensor(a.batch.advantages).abs().sum() > 0


def test_a_judge_gated_on_a_judge_waits_for_it():
    """Two judges, the second lazily gated on the first: it hears only the samples the first said yes to."""
    first, second = StandInJudge("first"), StandInJudge("second")
    specs = [judge_spec("first"), judge_spec("second", lazy_gate=LazyGate("first", 0.5))]
    out = score(specs, {"first": first, "second": second}, letters_batch(COMPLETIONS, LETTERS), chunk_groups=2)
    assert len(first.asked) == 8
    assert sorted(f["completion"] for f in second.asked) == sorted(
        c for c, w in zip(COMPLETIONS, LETTERS, strict=True) if c.startswith(w))
    assert not any(math.isnan(v) for v in out.scores[0])  # the first judge scored every sample
    assert out.skipped["second"] == [v < 0.5 for v in out.scores[0]]


def test_timeouts_and_errors_follow_the_rewards_policy_and_are_counted():
    judge = StandInJudge("judged")
    spec = judge_spec("judged", on_error="fallback", fallback=-1.0)
    out = score([spec], {"judged": judge}, letters_batch(["a", "!", "~", "b"], ["a"] * 4))
    assert out.scores[0] == [1.0, -1.0, -1.0, 0.0]
    assert out.errors == {"judged": 1} and out.timeouts == {"judged": 1}
    assert out.extra["judge/judged"] == ["yes", "maybe", None, "no"]


def test_an_unparseable_answer_under_on_error_raise_names_the_reward_and_sample():
    judge = StandInJudge("judged")
    with pytest.raises(RewardFunctionError, match=r"reward 'judged' \(judge stand-in\) on sample 5: the judge's answer "
                                                  r"'maybe' starts with none of the labels") as info:
        score([judge_spec("judged")], {"judged": judge}, letters_batch(["a"] * 5 + ["!"] + ["a"] * 2, ["a"] * 8))
    assert info.value.reward == "judged" and info.value.sample == 5 and info.value.completion == "!"


def test_a_judge_reward_without_a_judge_pool_is_refused():
    with pytest.raises(ValueError, match=r"judge rewards \['judged'\] have no judge pool"):
        RewardPool.__init__(RewardPool.__new__(RewardPool), [judge_spec("judged")], run_name="t", num_workers=1,
                            worker_options={})


def test_template_fields_are_what_the_requests_carry():
    assert template_fields(TEMPLATE) == ["letter", "completion"]
