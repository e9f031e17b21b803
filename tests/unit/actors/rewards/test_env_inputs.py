"""What environments hand the reward workers (RewardBatch.env_rewards / env_classes / environments): an environment's
get_reward() as a reward named after its class, and the instances for reward functions that declare
`environments`, as TRL passes them."""

import math

import pytest
from ray import cloudpickle

from actors.envs.spec import EnvSpec
from actors.envs.worker import EnvWorker
from actors.payloads import resolve_rewards
from actors.rewards.worker import RewardFunctionError, RewardSpec, RewardWorker
from actors.types import EnvRequest, RewardBatch, Sample, ToolCall, Trajectory
from tests.fixtures.envs import CounterEnv


async def async_counts(completions, environments, **kw):
    return [float(e.count) * 10 for e in environments]


def no_envs(completions, **kw):
    assert "environments" not in kw  # not declared: not sent (no unpickling for it)
    return [1.0] * len(completions)


def env_spec(name="CounterEnv", fallback=0.0):
    return RewardSpec(name, env_reward=True, on_error="fallback", fallback=fallback)


def batch(n, env_rewards=None, env_classes=None, environments=None, g=2):
    return RewardBatch(["p"] * n, ["c"] * n, [[1]] * n, {}, g, env_rewards=env_rewards, env_classes=env_classes,
                       environments=environments)


def test_environment_reward_scores_its_own_samples_and_falls_back_where_missing():
    w = RewardWorker([env_spec(fallback=-1.0)])
    b = batch(4, env_rewards=[1.0, None, math.nan, 5.0],
              env_classes=["CounterEnv", "CounterEnv", "CounterEnv", "Other"])
    out = w.score(b)
    s = out.scores[0]
    assert s[0] == 1.0 and s[1] == -1.0 and math.isnan(s[2]) and math.isnan(s[3])  # lost -> fallback; other env: NaN
    assert out.errors == {"CounterEnv": 1}


def test_environment_reward_without_environment_outputs_is_a_wiring_error():
    with pytest.raises(RewardFunctionError, match="batch carries no environment rewards"):
        RewardWorker([env_spec()]).score(batch(2))


def test_environments_reach_only_the_functions_that_declare_them():
    envs = []
    for count in (1, 2):
        e = CounterEnv()
        e.count = count
        envs.append(cloudpickle.dumps(e))
    w = RewardWorker([RewardSpec("c", "tests.fixtures.envs:env_counts"), RewardSpec("a", f"{__name__}:async_counts"),
                      RewardSpec("n", f"{__name__}:no_envs")])
    out = w.score(batch(2, environments=envs))
    assert out.scores == [[1.0, 2.0], [10.0, 20.0], [1.0, 1.0]]


def test_a_lost_state_reaches_the_function_as_none():
    e = CounterEnv()
    e.count = 4
    out = RewardWorker([RewardSpec("c", "tests.fixtures.envs:env_counts")]).score(
        batch(2, environments=[cloudpickle.dumps(e), None]))
    assert out.scores[0][0] == 4.0 and math.isnan(out.scores[0][1])


def test_unpicklable_state_names_the_reward():
    with pytest.raises(RewardFunctionError, match=r"reward 'c': cannot unpickle the environments of samples 0\.\.1"):
        RewardWorker([RewardSpec("c", "tests.fixtures.envs:env_counts")]).score(batch(2, environments=[b"junk", None]))


def test_env_worker_to_reward_worker_end_to_end():
    """The env worker's close -> the Trajectory fields -> the generator's payload and SampleInfo -> the driver's
    reward batch by reference (Agentic.reward_batch) -> the reward worker, which resolves it."""
    from actors.payloads import group_out, keep
    from orchestrator.data.sources import Prompt, to_rollouts
    from orchestrator.loop.rollout import Agentic

    ew = EnvWorker(EnvSpec(environments={None: "tests.fixtures.envs:CounterEnv"}))
    ew.open([(0, EnvRequest(None, {"start": 2}, 0)), (1, EnvRequest(None, {"start": 5}, 0))])
    ew.call(0, [ToolCall("add", {"n": 1})])
    closed = ew.close([0, 1], keep_state=True)
    trajs = [Trajectory([1], [], [{"role": "assistant", "content": ""}], [0], "stop", env_reward=c.reward,
                        env_state=c.state) for c in closed]
    samples = [Sample([1], [-0.1], "", "stop", trajectory=t) for t in trajs]
    r = to_rollouts([Prompt({"prompt": [{"role": "user", "content": "count"}]}, [1])], [group_out(0, samples, keep)],
                    0, prompt_column="prompt", group_size=2)

    def kind(keep_state: bool) -> Agentic:
        return Agentic(prompt_column="prompt", env_classes={None: "CounterEnv"}, keep_state=keep_state)

    b = kind(True).reward_batch(r)
    assert b.env_classes == ["CounterEnv", "CounterEnv"] and b.env_rewards == [3.0, 5.0]
    out = RewardWorker([env_spec(), RewardSpec("c", "tests.fixtures.envs:env_counts")]).score(b)
    assert out.scores == [[3.0, 5.0], [3.0, 5.0]]
    assert resolve_rewards(kind(False).reward_batch(r)).environments is None
    assert resolve_rewards(b).environments == [c.state for c in closed]


def test_chunks_slice_the_environment_fields():
    b = batch(4, env_rewards=[0.0, 1.0, 2.0, 3.0], env_classes=["A"] * 4, environments=[b"0", b"1", b"2", b"3"])
    lo, hi = b.chunks(2)
    assert (hi.env_rewards, hi.env_classes, hi.environments, hi.offset) == ([2.0, 3.0], ["A", "A"], [b"2", b"3"], 2)
    assert batch(4).chunks(2)[1].env_rewards is None
