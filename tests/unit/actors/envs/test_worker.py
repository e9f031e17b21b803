"""EnvWorker as a plain class (no Ray): sessions, seeding, tool calls and every way they fail, get_reward, the
pickled state, hung threads. The tools and environments are TRL-style fixtures (tests/fixtures/envs.py). What the
worker reports is counted by the pool: tests/unit/actors/envs/test_pool.py."""

import math
import pickle

import pytest

import actors.envs.worker as worker_module
from actors.envs.spec import EnvSpec
from actors.envs.worker import EnvWorker, tool_error
from actors.types import EnvRequest, ToolCall
from tests.fixtures import envs

F = "tests.fixtures.envs"


@pytest.fixture(autouse=True)
def release_held_calls():
    envs.RELEASE.clear()
    yield
    envs.RELEASE.set()  # held tools and resets return, their threads end


def worker(env="CounterEnv", tools=(), timeout=5.0, reward_timeout=5.0, routed=False):
    if env is None:
        environments = {}
    elif routed:
        environments = {name: f"{F}:{cls}" for name, cls in env.items()}
    else:
        environments = {None: f"{F}:{env}"}
    spec = EnvSpec(tools=tuple(f"{F}:{t}" for t in tools), environments=environments, tool_timeout_s=timeout,
                   reward_timeout_s=reward_timeout)
    return EnvWorker(spec)


def open_one(w, sid=0, env=None, group_seed=0, **row):
    (opened,) = w.open([(sid, EnvRequest(env, row, group_seed))])
    return opened


def call(w, sid, *calls):
    return w.call(sid, [ToolCall(name, args) for name, args in calls])


# --- sessions ----------------------------------------------------------------------------------------------


def test_a_session_is_one_instance_for_the_whole_trajectory():
    w = worker()
    opened = open_one(w, 7, start=3, task="t")
    assert (opened.session, opened.observation, opened.error) == (7, "The counter starts at 3.", None)
    assert w.sessions[7].instance.row == {"task": "t"}  # every column reaches reset, as TRL passes the row
    assert [r.content for r in call(w, 7, ("add", {"n": 2}))] == ["5"]
    assert [r.content for r in call(w, 7, ("add", {"n": 1}), ("double", {"n": 4}))] == ["6", "8"]  # one turn
    (closed,) = w.close([7], keep_state=False)
    assert (closed.reward, closed.state, closed.error) == (6.0, None, None)
    assert 7 not in w.sessions


def test_sessions_do_not_share_state():
    w = worker()
    open_one(w, 0, start=0)
    open_one(w, 1, start=100)
    call(w, 0, ("add", {"n": 1}))
    assert [c.reward for c in w.close([0, 1], keep_state=False)] == [1.0, 100.0]


def test_tools_only_sessions_hold_the_functions():
    w = worker(env=None, tools=("echo", "async_echo"))
    opened = open_one(w, 0, prompt="hi")
    assert (opened.observation, opened.error) == (None, None)
    out = call(w, 0, ("echo", {"text": "a"}), ("async_echo", {"text": "b"}))
    assert [(r.content, r.status) for r in out] == [("a", "ok"), ("b", "ok")]
    (closed,) = w.close([0], keep_state=True)
    assert (closed.reward, closed.state, closed.error) == (None, None, None)  # no environment: no reward, no state
    assert 0 not in w.sessions


def test_standalone_tools_and_methods_together_and_private_methods_are_not_tools():
    w = worker(tools=("shout",))
    open_one(w, 0)
    assert set(w.sessions[0].tools) == {"shout", "add", "async_add", "boom", "own_timeout", "big", "hold", "double"}
    out = call(w, 0, ("shout", {"text": "a"}), ("async_add", {"n": 2}), ("_private", {}))
    assert [(r.content, r.status) for r in out] == [
        ("A", "ok"), ("2", "ok"), (tool_error("Tool _private not found."), "unknown_tool")]


def test_dict_environment_factory_routes_and_drops_the_environment_column():
    w = worker(env={"count": "CounterEnv", "seeded": "SeededEnv"}, routed=True)
    assert open_one(w, 0, env="count", environment="count", start=2).observation == "The counter starts at 2."
    assert w.sessions[0].instance.row == {}  # the routing column is not reset's, as in TRL
    assert open_one(w, 1, env="seeded", group_seed=5, environment="seeded").observation == "5"
    bad = open_one(w, 2, env="maze", environment="maze")
    assert bad.error.startswith("KeyError: unknown environment 'maze'") and 2 not in w.sessions


def test_async_reset_is_awaited():
    assert open_one(worker("AsyncResetEnv"), start=4).observation == "async start 4"


# --- seeding -------------------------------------------------------------------------------------------------


def test_a_group_starts_from_the_same_state_and_the_global_generators_are_restored():
    import random

    import numpy

    w = worker("RandomEnv")
    random.seed(123)
    before = random.random()
    random.seed(123)
    same = [open_one(w, i, group_seed=42).observation for i in range(3)]
    other = open_one(w, 3, group_seed=43).observation
    assert same[0] == same[1] == same[2] != other
    assert random.random() == before  # the caller's generator is where it was
    numpy.random.seed(7)
    x = numpy.random.random()
    numpy.random.seed(7)
    open_one(w, 4, group_seed=42)
    assert numpy.random.random() == x


def test_reset_that_declares_seed_gets_the_group_seed_unless_the_row_has_one():
    w = worker("SeededEnv")
    assert open_one(w, 0, group_seed=11).observation == "11"
    assert open_one(w, 1, group_seed=11, seed=99).observation == "99"  # the row's own column wins (TRL's row)
    assert call(w, 0, ("draw", {}))[0].content == str(__import__("random").Random(11).randrange(10**6))


# --- what goes wrong -----------------------------------------------------------------------------------------


def test_reset_errors_end_the_session_before_it_starts():
    w = worker("FailingResetEnv")
    opened = open_one(w, 0, task="x")
    assert opened.error == "ValueError: no such task: x" and opened.observation is None and 0 not in w.sessions
    opened = open_one(worker("ListResetEnv"), 1)
    assert opened.error == ("TypeError: ListResetEnv.reset returned list; it must return text (appended to the last "
                            "user message) or None")
    w = worker("HeldResetEnv", timeout=0.3)
    opened = open_one(w, 2)
    assert opened.error == "TimeoutError: HeldResetEnv() and reset() took more than 0.3 s (agent.tool_timeout_s)"
    assert 2 not in w.sessions and w.calls.abandoned == 1  # the reset's thread is held until it returns
    envs.RELEASE.set()
    assert open_one(w, 3).error is None  # the hung reset kept its seeding lock; later resets took a new one


def test_a_tool_that_raises_is_an_error_the_model_reads_as_trl_writes_it():
    w = worker()
    open_one(w)
    (r,) = call(w, 0, ("boom", {}))
    assert (r.content, r.status) == ("{'error': 'the counter exploded'}", "error")
    (r,) = call(w, 0, ("own_timeout", {}))  # the tool's own TimeoutError is its error, not our timeout
    assert (r.content, r.status) == ("{'error': 'upstream took too long'}", "error")
    assert w.calls.abandoned == 0  # nothing was cut at the deadline


def test_unknown_tools_and_bad_arguments_are_not_run():
    w = worker()
    open_one(w)
    out = call(w, 0, ("ad", {"n": 1}), ("add", {"m": 1}), ("add", {}), ("add", {"n": 1, "x": 2}), ("add", "1"))
    assert [(r.content, r.status) for r in out] == [
        ("{'error': 'Tool ad not found.'}", "unknown_tool"),
        ('{\'error\': "add() missing a required argument: \'n\'"}', "error"),
        ('{\'error\': "add() missing a required argument: \'n\'"}', "error"),
        ('{\'error\': "add() got an unexpected keyword argument \'x\'"}', "error"),
        ("{'error': 'add() arguments must be a JSON object, got str'}", "error"),
    ]
    assert w.sessions[0].instance.count == 0  # none of them ran


@pytest.mark.parametrize("tool", ["held", "async_held"])
def test_a_hung_tool_times_out_and_its_turn_neighbours_still_answer(tool):
    w = worker(env=None, tools=(tool, "echo"), timeout=0.3)
    open_one(w)
    out = call(w, 0, (tool, {}), ("echo", {"text": "still here"}))
    assert [(r.content, r.status) for r in out] == [
        (f"{{'error': 'Tool {tool} timed out after 0.3 s.'}}", "timeout"), ("still here", "ok")]
    assert w.calls.abandoned == (1 if tool == "held" else 0)  # a coroutine is cancelled; a thread is not


def test_a_huge_result_is_passed_on_whole():
    w = worker()
    open_one(w)
    (r,) = call(w, 0, ("big", {"n": 5_000_000}))
    assert r.status == "ok" and len(r.content) == 5_000_000  # the agent loop budgets tool tokens, not the worker


def test_calls_on_a_session_that_is_not_open_raise():
    with pytest.raises(KeyError):
        worker().call(3, [ToolCall("add", {"n": 1})])
    (closed,) = worker().close([3], keep_state=False)
    assert closed.reward is None and "session 3 is not open" in closed.error


def test_hung_sync_calls_are_capped_by_a_fresh_thread_pool(monkeypatch):
    monkeypatch.setattr(worker_module, "ENV_CALL_THREADS", 4)
    w = worker(env=None, tools=("held", "echo"), timeout=0.2)
    open_one(w)
    for _ in range(2):  # half the pool's threads held
        assert call(w, 0, ("held", {}))[0].status == "timeout"
    assert call(w, 0, ("echo", {"text": "ok"}))[0].content == "ok"  # went to a fresh pool
    assert w.calls.abandoned == 2 and w.calls.fresh_pools == 1


# --- close: reward and state ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "reward", "error"), [
    ("AsyncRewardEnv", 3.5, None),
    ("NoOpinionEnv", math.nan, None),
    ("FailingRewardEnv", None, "RuntimeError: FailingRewardEnv.get_reward() raised: judge unavailable"),
    ("StringRewardEnv", None, "TypeError: StringRewardEnv.get_reward() returned 'high' (str), expected a number or None"),
    ("HeldRewardEnv", None, "TimeoutError: HeldRewardEnv.get_reward() took more than 0.3 s"),
])
def test_get_reward(env, reward, error):
    w = worker(env, reward_timeout=0.3)
    open_one(w, start=3)
    (closed,) = w.close([0], keep_state=False)
    assert closed.error == error
    if reward is None:
        assert closed.reward is None
    elif math.isnan(reward):
        assert math.isnan(closed.reward)  # get_reward() returned None: no opinion
    else:
        assert closed.reward == reward


def test_the_pickled_state_is_the_instance_at_the_end():
    w = worker()
    open_one(w, start=1)
    call(w, 0, ("add", {"n": 2}))
    (closed,) = w.close([0], keep_state=True)
    env = pickle.loads(closed.state)
    assert isinstance(env, envs.CounterEnv) and env.count == 3 and closed.reward == 3.0


def test_an_unpicklable_environment_is_named():
    w = worker("UnpicklableEnv")
    open_one(w)
    (closed,) = w.close([0], keep_state=True)
    assert closed.state is None and closed.reward == 0.0
    assert closed.error.startswith("PicklingError: cannot pickle the UnpicklableEnv environment for the reward "
                                   "functions that declare `environments`")


def test_worker_is_a_threaded_actor_not_an_async_one():
    """An `async def` method would make Ray run EnvWorker as an async actor, where its sync methods block the event
    loop and the calls of different sessions run one at a time."""
    from ray._private.async_compat import has_async_methods

    assert not has_async_methods(EnvWorker)
