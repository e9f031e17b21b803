"""EnvWorker as a plain class (no Ray): sessions, instance reuse, factories that are not classes, seeding, tool calls
and every way they fail, get_reward, the pickled state. pytest runs tests on the main thread, so a worker runs its
sync user code there as in a Ray actor (sync_on="main": TRL's SIGALRM-bound tools work, rayward's deadline is a
SIGALRM too); `sync_on="threads"` workers show what the thread pool does instead. The tools and environments are
TRL-style fixtures (tests/fixtures/envs.py). What the worker reports is counted by the pool:
tests/unit/actors/envs/test_pool.py."""

import functools
import math
import pickle
import signal

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


def worker(env="CounterEnv", tools=(), timeout=5.0, reward_timeout=5.0, routed=False, sync_on="main"):
    if env is None:
        environments = {}
    elif routed:
        environments = {name: f"{F}:{cls}" for name, cls in env.items()}
    else:
        environments = {None: f"{F}:{env}"}
    spec = EnvSpec(tools=tuple(f"{F}:{t}" for t in tools), environments=environments, tool_timeout_s=timeout,
                   reward_timeout_s=reward_timeout)
    return EnvWorker(spec, sync_on=sync_on)


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


@pytest.mark.parametrize(("sync_on", "abandoned"), [("main", 0), ("threads", 1)])
def test_reset_errors_end_the_session_before_it_starts(sync_on, abandoned):
    w = worker("FailingResetEnv")
    opened = open_one(w, 0, task="x")
    assert opened.error == "ValueError: no such task: x" and opened.observation is None and 0 not in w.sessions
    opened = open_one(worker("ListResetEnv"), 1)
    assert opened.error == ("TypeError: ListResetEnv.reset returned list; it must return text (appended to the last "
                            "user message) or None")
    w = worker("HeldResetEnv", timeout=0.3, sync_on=sync_on)
    opened = open_one(w, 2)
    assert opened.error == "TimeoutError: HeldResetEnv() and reset() took more than 0.3 s (agent.tool_timeout_s)"
    # main: cut by SIGALRM; threads: the reset's thread is held until it returns
    assert 2 not in w.sessions and w.calls.abandoned == abandoned and w.free[None] == []
    envs.RELEASE.set()
    assert open_one(w, 3).error is None  # threads: the hung reset kept its seeding lock; later resets took a new one


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


@pytest.mark.parametrize(("tool", "sync_on", "abandoned"), [
    ("held", "main", 0), ("async_held", "main", 0), ("held", "threads", 1),
])
def test_a_hung_tool_times_out_and_its_turn_neighbours_still_answer(tool, sync_on, abandoned):
    w = worker(env=None, tools=(tool, "echo"), timeout=0.3, sync_on=sync_on)
    open_one(w)
    out = call(w, 0, (tool, {}), ("echo", {"text": "still here"}))
    assert [(r.content, r.status) for r in out] == [
        (f"{{'error': 'Tool {tool} timed out after 0.3 s.'}}", "timeout"), ("still here", "ok")]
    assert w.calls.abandoned == abandoned  # a coroutine is cancelled, a sync call on the main thread cut; a thread not


def test_a_huge_result_is_passed_on_whole():
    w = worker()
    open_one(w)
    (r,) = call(w, 0, ("big", {"n": 5_000_000}))
    assert r.status == "ok" and len(r.content) == 5_000_000  # the agent loop budgets tool tokens, not the worker


def test_a_tool_returning_trls_content_blocks_keeps_them_with_its_images_decoded():
    """TRL's multimodal tool responses: the blocks pass on as a list, each image an RGB PIL image (pickled to the
    generator as it is), an image that cannot be decoded is an error result naming the tool."""
    w = worker(env=None, tools=("picture", "broken_picture"))
    open_one(w, 0)
    ok, broken = call(w, 0, ("picture", {"color": "red"}), ("broken_picture", {}))
    assert ok.status == "ok" and ok.content[0] == {"type": "text", "text": "A red picture:"}
    image = pickle.loads(pickle.dumps(ok.content))[1]["image"]
    assert (image.mode, image.size, image.getpixel((0, 0))) == ("RGB", (28, 14), (255, 0, 0))
    assert broken.status == "error" and broken.content.startswith("{'error': 'tool broken_picture result block 0: "
                                                                  "cannot decode the image")


def test_calls_on_a_session_that_is_not_open_raise():
    with pytest.raises(KeyError):
        worker().call(3, [ToolCall("add", {"n": 1})])
    (closed,) = worker().close([3], keep_state=False)
    assert closed.reward is None and "session 3 is not open" in closed.error


def test_hung_sync_calls_are_capped_by_a_fresh_thread_pool(monkeypatch):
    monkeypatch.setattr(worker_module, "ENV_CALL_THREADS", 4)
    w = worker(env=None, tools=("held", "echo"), timeout=0.2, sync_on="threads")
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
    ("StringRewardEnv", None,
     "TypeError: StringRewardEnv.get_reward() returned 'high' (str), expected a number or None"),
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


# --- where the user's code runs: the main thread, as in TRL ------------------------------------------------------


def test_a_tool_that_bounds_itself_with_sigalrm_works_as_in_trl():
    """TRL's grpo_agent.py tool: answers, and its own alarm cuts a slow query with its own message; rayward's
    SIGALRM handler is put back after each call (TRL's pattern leaves its own installed)."""
    before = signal.getsignal(signal.SIGALRM)
    w = worker("SqlEnv", timeout=30.0)
    open_one(w)
    out = call(w, 0, ("query", {"sql_command": "SELECT count(*) FROM numbers"}), ("opened", {}))
    assert [r.status for r in out] == ["ok", "ok"] and out[0].content == "[(3,)]"
    assert out[1].content.endswith(" MainThread")
    (r,) = call(w, 0, ("query", {"sql_command": envs.ENDLESS_QUERY}))
    assert (r.content, r.status) == ("{'error': 'Operation timed out after 1 seconds'}", "error")
    assert signal.getsignal(signal.SIGALRM) is before


def test_in_threads_the_same_tool_fails_on_every_call():
    """What rayward did before it ran sync tools on the main thread (and what sync_on="threads" still does)."""
    w = worker("SqlEnv", sync_on="threads")
    open_one(w)
    (r,) = call(w, 0, ("query", {"sql_command": "SELECT 1"}))
    assert r.status == "error" and "signal only works in main thread" in r.content


def test_a_tool_that_hangs_in_pure_python_is_cut_and_the_session_lives_on():
    w = worker("SqlEnv", timeout=0.3)
    open_one(w)
    (r,) = call(w, 0, ("spin", {}))
    assert (r.content, r.status) == ("{'error': 'Tool spin timed out after 0.3 s.'}", "timeout")
    assert call(w, 0, ("query", {"sql_command": "SELECT 7"}))[0].content == "[(7,)]"
    (closed,) = w.close([0], keep_state=False)
    assert closed.reward == 1.0 and len(w.free[None]) == 1  # a tool cut at its deadline leaves the instance usable


# --- instances are reused, TRL's contract ------------------------------------------------------------------------


def test_instances_are_reused_across_trajectories_and_reset_between():
    envs.CountingEnv.made = envs.CountingEnv.resets = 0
    w = worker("CountingEnv")
    first = w.open([(0, EnvRequest(None, {"start": 1}, 0)), (1, EnvRequest(None, {"start": 2}, 0))])
    assert [o.created for o in first] == [True, True] and envs.CountingEnv.made == 2  # one per concurrent session
    a, b = w.sessions[0].instance, w.sessions[1].instance
    call(w, 0, ("add", {"n": 10}))
    assert [c.reward for c in w.close([0, 1], keep_state=False)] == [11.0, 2.0]
    assert w.free[None] == [a, b]
    for sid in range(2, 8):  # six more trajectories, one at a time: no factory call
        opened = open_one(w, sid, start=sid)
        assert opened.created is False and opened.observation == f"The counter starts at {sid}."
        assert w.sessions[sid].instance in (a, b) and w.sessions[sid].instance.count == sid  # reset between
        (closed,) = w.close([sid], keep_state=False)
        assert closed.reward == float(sid)
    assert (envs.CountingEnv.made, envs.CountingEnv.resets) == (2, 8)
    third = w.open([(8 + i, EnvRequest(None, {}, 0)) for i in range(3)])
    assert [o.created for o in third] == [False, False, True] and envs.CountingEnv.made == 3


def test_an_instance_whose_reset_or_get_reward_failed_is_dropped():
    envs.CountingEnv.made = 0
    w = worker("ResetFailsOnceEnv")
    open_one(w, 0)
    w.close([0], keep_state=False)
    assert len(w.free[None]) == 1
    assert open_one(w, 1, fail=True).error == "ValueError: reset failed"
    assert w.free[None] == []  # its state is unknown
    assert open_one(w, 2).created is True and envs.CountingEnv.made == 2

    w = worker("RewardFailsEnv")
    open_one(w, 0)
    call(w, 0, ("add", {"n": -1}))
    assert w.close([0], keep_state=False)[0].error == "RuntimeError: RewardFailsEnv.get_reward() raised: negative count"
    assert w.free[None] == []
    open_one(w, 1)
    assert w.close([1], keep_state=True)[0].error is None and len(w.free[None]) == 1  # a clean close keeps it

    w = worker("HeldRewardEnv", reward_timeout=0.3)
    open_one(w, 0)
    assert w.close([0], keep_state=False)[0].error.startswith("TimeoutError")
    assert w.free[None] == []


def test_an_init_that_opens_a_client_runs_once_per_instance():
    """TRL's OpenEnv pattern: the client is opened in __init__; eight trajectories, two at a time, open two."""
    before = envs.SqlEnv.connections
    w = worker("SqlEnv")
    for step in range(4):
        sids = [2 * step, 2 * step + 1]
        assert all(o.error is None for o in w.open([(s, EnvRequest(None, {}, step)) for s in sids]))
        assert call(w, sids[0], ("query", {"sql_command": "SELECT 1"}))[0].content == "[(1,)]"
        w.close(sids, keep_state=False)
    assert envs.SqlEnv.connections - before == 2


@pytest.mark.parametrize(("factory", "rows"), [("make_sql_env", 3), ("sql_env_of_five", 5)])
def test_a_factory_may_be_any_callable(factory, rows):
    """A plain function and a functools.partial, as TRL takes them: the tools are read from what they return."""
    assert isinstance(getattr(envs, factory), (functools.partial, type(envs.make_sql_env)))
    w = worker(factory)
    opened = open_one(w)
    assert opened.error is None and opened.created is True
    assert {"query", "spin", "opened"} <= set(w.sessions[0].tools)
    assert call(w, 0, ("query", {"sql_command": "SELECT count(*) FROM numbers"}))[0].content == f"[({rows},)]"
    w.close([0], keep_state=False)
    assert open_one(w, 1).created is False


def test_a_factory_that_raises_or_returns_no_environment_is_a_reset_error():
    w = EnvWorker(EnvSpec(environments={None: "tests.fixtures.bad_envs:failing_factory"}))
    opened = open_one(w)
    assert (opened.error, opened.created) == ("RuntimeError: no sandbox available", True)
    w = EnvWorker(EnvSpec(environments={"x": "tests.fixtures.bad_envs:make_no_reset"}))
    opened = open_one(w, env="x", environment="x")
    assert opened.error == ("TypeError: make_no_reset() (environment_factory[x]) returned a NoReset, which has no "
                            "`reset` method")
    assert w.free["x"] == []


def test_the_factory_runs_under_the_group_seed_too():
    drawn = [open_one(worker("RandomInitEnv"), group_seed=s).observation for s in (42, 42, 43)]
    assert drawn[0] == drawn[1] != drawn[2]
