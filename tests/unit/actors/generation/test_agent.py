"""The agent loop's state machine on a real EngineLoop over a scripted engine (tests/fixtures/engines.py) and
in-process environments (tests/fixtures/envs.py), with the tool model's real tokenizer: every stop reason, the
budgets and cuts, failing tools (raising, unknown, malformed, hanging, a lost session), the deadline while a
tool runs and while a turn decodes, interleaving across trajectories, versions across a weight load, seeds.

Tests that need something to happen at a point act on gates (a tool held until the test opens it, the engine
held at a step): no test waits for time to pass except through a trajectory deadline, which ends it, and no
test asserts on how long anything took."""

from __future__ import annotations

import json
import math
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from actors.agents import chat
from actors.agents.loop import (
    CLOSE_GRACE_S,
    AgentLoop,
    AgentSettings,
    Phase,
    SampledTurn,
    TrajectoryRecord,
    TurnSettings,
    _Trajectory,
    scaffold_budget,
    submit_turn,
    turn_budget,
    turn_seed,
)
from actors.envs.client import EnvSessionLost
from actors.types import EnvClosed, EnvOpened, EnvRequest, Sample, ToolCall, ToolResult
from tests.fixtures.engines import TOKEN_LOGPROB, by_turn, scripted_loop, turn_params
from tests.fixtures.envs import WAIT_S, LocalEnvironments, ToolTestEnv, tool_schemas
from tests.fixtures.waiting import wait_until

SCHEMAS = tool_schemas(ToolTestEnv)
MODEL_LEN = 2048
DONE = "Done.<|im_end|>"


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call><|im_end|>"


def settings(**kw: Any) -> AgentSettings:
    return AgentSettings(**{"tools": {None: SCHEMAS}, "max_tool_tokens": 1000, "trajectory_timeout_s": WAIT_S, **kw})


def turns(**kw: Any) -> TurnSettings:
    return TurnSettings(**{"n": 1, "max_tokens": 200, "max_model_len": MODEL_LEN, "params": turn_params, **kw})


def row(text: str = "Echo hi.", **columns: Any) -> dict[str, Any]:
    return {"prompt": [{"role": "user", "content": text}], **columns}


@pytest.fixture
def envs():
    ToolTestEnv.release.clear()
    ToolTestEnv.gate.clear()
    ToolTestEnv.held.clear()
    e = LocalEnvironments({None: ToolTestEnv})
    yield e
    e.shutdown()


class Rig:
    """One engine loop and the environments; `rollout` runs an AgentLoop over them."""

    def __init__(self, tokenizer: Any, envs: LocalEnvironments, replies: Any) -> None:
        self.tokenizer, self.envs = tokenizer, envs
        self.loop, self.engine = scripted_loop(by_turn(tokenizer, replies))

    def agent_loop(self, agent: AgentSettings | None = None, clock: Callable[[], float] = time.monotonic,
                   **kw: Any) -> AgentLoop:
        """kw: TurnSettings' fields, over one trajectory per row within the test's budgets."""
        return AgentLoop(self.loop, self.envs, self.tokenizer, agent or settings(), turns(**kw), clock=clock)

    def rollout(self, rows: list[dict[str, Any]], agent: AgentSettings | None = None, seeds: list[int] | None = None,
                **kw: Any) -> list[list[Sample]]:
        out: dict[int, list[Sample]] = {}
        for piece in self.agent_loop(agent, **kw).run(rows, seeds or list(range(len(rows)))):
            for g, samples in piece:
                assert g not in out
                out[g] = samples
        return [out[g] for g in range(len(rows))]

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture
def rig(tool_tokenizer, envs):
    made: list[Rig] = []

    def make(replies: Any) -> Rig:
        made.append(Rig(tool_tokenizer, envs, replies))
        return made[-1]

    yield make
    for r in made:
        r.loop.close(WAIT_S)


def segments(sample: Sample) -> list[tuple[int, list[int]]]:
    """The completion cut where turn_ids change: (turn or -1, ids)."""
    out: list[tuple[int, list[int]]] = []
    for tok, turn in zip(sample.completion_ids, sample.trajectory.turn_ids, strict=True):
        if out and out[-1][0] == turn:
            out[-1][1].append(tok)
        else:
            out.append((turn, [tok]))
    return out


def test_a_tool_round_then_an_answer_token_in_token_out(rig, envs, tool_tokenizer) -> None:
    r = rig([call("echo", text="hi"), DONE])
    (sample,) = r.rollout([row()], seeds=[7])[0]
    t = sample.trajectory
    assert (sample.finish_reason, t.stop_reason, t.turns) == ("stop", "stop", 2)
    assert t.prompt_ids == chat.render_prompt(tool_tokenizer, t.prompt, SCHEMAS)
    tool_message = {"role": "tool", "name": "echo", "content": "hi"}
    suffix = chat.tool_suffix_ids(tool_tokenizer, [tool_message])
    assert segments(sample) == [(0, r.ids(call("echo", text="hi"))), (-1, suffix), (1, r.ids(DONE))]
    assert t.messages == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "echo", "arguments": {"text": "hi"}}}]},
        tool_message,
        {"role": "assistant", "content": "Done."},
    ]
    # Token in, token out: the second turn's prompt is the first prompt + the sampled ids + the suffix.
    prompts = [prompt for _, prompt, _, _ in r.engine.added]
    assert prompts == [t.prompt_ids, t.prompt_ids + r.ids(call("echo", text="hi")) + suffix]
    assert t.prompt_ids + sample.completion_ids == prompts[1] + r.ids(DONE)
    assert chat.template_check(tool_tokenizer, t.prompt, t.messages, SCHEMAS,
                               t.prompt_ids + sample.completion_ids).match
    assert t.template_match is True  # the loop's own check, the run's multiturn/template_mismatch_frac
    # Per token: sampling logprobs and versions where the model sampled, NaN and -1 elsewhere.
    for lp, version, turn in zip(sample.logprobs, sample.versions, t.turn_ids, strict=True):
        assert (lp == TOKEN_LOGPROB and version == 0) if turn >= 0 else (math.isnan(lp) and version == -1)
    assert t.mask == [int(turn >= 0) for turn in t.turn_ids]
    assert (t.tool_calls, t.tool_failures, t.tool_tokens, t.truncated_tool_results) == (1, 0, len(suffix), 0)
    assert t.env_reward == 1.0 and t.env_state is None and t.env is None and t.env_s > 0
    assert sample.text == tool_tokenizer.decode(sample.completion_ids, skip_special_tokens=True)
    # The environment: opened with the group's seed and the row without the driver's prompt_ids; closed once.
    (request,) = envs.requests
    assert request.seed == 7 and request.row == {"prompt": row()["prompt"]} and request.env is None
    assert envs.closed == [0]


def test_resets_text_joins_the_prompt_and_the_group_shares_a_seed_with_its_own_turn_seeds(rig, envs) -> None:
    r = rig([call("echo", text="x"), DONE])
    group = r.rollout([row("Q.", observation=" Obs.")], seeds=[11], n=3)[0]
    assert len(group) == 3 and len(envs.requests) == 3 and {q.seed for q in envs.requests} == {11}
    assert all(s.trajectory.prompt[-1]["content"] == "Q. Obs." for s in group)
    seeds = sorted(params.seed for _, _, params, _ in r.engine.added)
    assert seeds == sorted(turn_seed(11, j, turn) for j in range(3) for turn in range(2))
    assert len(set(seeds)) == 6
    assert turn_seed(11, 0, 0) == turn_seed(11, 0, 0) != turn_seed(12, 0, 0)


def test_max_turns_stops_a_model_that_keeps_calling_without_running_the_last_calls(rig, envs) -> None:
    r = rig([call("echo", text="again")])
    (sample,) = r.rollout([row()], settings(max_tool_calling_iterations=2))[0]
    t = sample.trajectory
    assert (t.stop_reason, t.turns, t.tool_calls) == ("max_turns", 3, 3)
    assert len(envs.calls) == 2 and t.env_reward == 2.0
    assert t.messages[-1]["tool_calls"] and [m["role"] for m in t.messages].count("tool") == 2
    (zero,) = r.rollout([row()], settings(max_tool_calling_iterations=0))[0]
    assert (zero.trajectory.stop_reason, zero.trajectory.turns) == ("max_turns", 1)


def test_the_model_token_budget_spans_the_whole_trajectory(rig) -> None:
    first = call("echo", text="hi")
    r = rig([first, "A long answer that will not fit.<|im_end|>"])
    budget = len(r.ids(first)) + 3
    (sample,) = r.rollout([row()], max_tokens=budget)[0]
    t = sample.trajectory
    assert t.stop_reason == "length"
    assert sum(turn >= 0 for turn in t.turn_ids) == budget  # 3 tokens of the second turn
    assert r.engine.added[1][2].max_tokens == 3
    assert chat.template_check(r.tokenizer, t.prompt, t.messages, SCHEMAS, t.prompt_ids + sample.completion_ids).match


def test_the_context_bounds_each_turn_and_a_full_context_ends_in_length(rig) -> None:
    r = rig([call("echo", text="hi"), DONE])
    prompt_len = len(chat.render_prompt(r.tokenizer, row()["prompt"], SCHEMAS))
    (sample,) = r.rollout([row()], max_model_len=prompt_len + 5)[0]
    assert sample.trajectory.stop_reason == "length" and len(sample.completion_ids) == 5
    (none,) = r.rollout([row()], max_model_len=prompt_len)[0]
    assert none.trajectory.stop_reason == "length" and none.completion_ids == [] and none.trajectory.turns == 0


def test_a_huge_tool_output_is_cut_to_the_tool_token_budget_and_counted(rig) -> None:
    r = rig([call("huge", words=2000), DONE])
    (sample,) = r.rollout([row()], settings(max_tool_tokens=120))[0]
    t = sample.trajectory
    assert (t.stop_reason, t.truncated_tool_results) == ("stop", 1)
    assert 100 < t.tool_tokens <= 120 and t.turn_ids.count(-1) == t.tool_tokens
    assert t.messages[1]["content"].endswith(chat.TRUNCATION_MARK)
    assert chat.template_check(r.tokenizer, t.prompt, t.messages, SCHEMAS, t.prompt_ids + sample.completion_ids).match


def test_a_tool_budget_too_small_for_any_result_ends_in_length_after_running_the_tool(rig, envs) -> None:
    r = rig([call("echo", text="hi"), DONE])
    (sample,) = r.rollout([row()], settings(max_tool_tokens=5))[0]
    t = sample.trajectory
    assert (t.stop_reason, t.truncated_tool_results, t.tool_tokens, t.turns) == ("length", 1, 0, 1)
    assert len(envs.calls) == 1 and t.env_reward == 1.0  # the call ran: its effect counts


@pytest.mark.parametrize(("tool", "status_text"), [("boom", "boom"), ("no_such_tool", "not found")])
def test_a_raising_or_unknown_tool_is_an_error_the_model_reads(rig, tool, status_text) -> None:
    r = rig([call(tool), DONE])
    (sample,) = r.rollout([row()])[0]
    t = sample.trajectory
    assert (t.stop_reason, t.tool_calls, t.tool_failures, t.turns) == ("stop", 1, 1, 2)
    assert t.messages[1]["role"] == "tool" and status_text in t.messages[1]["content"]
    assert status_text in r.tokenizer.decode(r.engine.added[1][1])  # in the second turn's prompt


def test_a_malformed_call_is_answered_with_an_error_and_counted(rig, envs) -> None:
    bad = '<tool_call>\n{"name": "echo", "arguments": {"text": "hi"}\n</tool_call><|im_end|>'
    r = rig([bad, DONE])
    (sample,) = r.rollout([row()])[0]
    t = sample.trajectory
    assert (t.stop_reason, t.tool_calls, t.tool_failures) == ("stop", 1, 1)
    assert envs.calls == []  # nothing ran
    assert t.messages[0]["content"].startswith("<tool_call>") and "Malformed tool call" in t.messages[1]["content"]
    assert chat.template_check(r.tokenizer, t.prompt, t.messages, SCHEMAS, t.prompt_ids + sample.completion_ids).match


def test_a_hanging_tool_times_out_into_an_error_message(tool_tokenizer) -> None:
    ToolTestEnv.release.clear()
    envs = LocalEnvironments({None: ToolTestEnv}, tool_timeout_s=0.05)
    r = Rig(tool_tokenizer, envs, [call("hang"), DONE])
    try:
        (sample,) = r.rollout([row()])[0]
    finally:
        r.loop.close(WAIT_S)
        envs.shutdown()
    t = sample.trajectory
    assert (t.stop_reason, t.tool_failures) == ("stop", 1) and "timed out" in t.messages[1]["content"]


def test_the_deadline_ends_a_trajectory_waiting_on_its_tool_and_its_session_is_closed(rig, envs) -> None:
    r = rig([call("hang"), DONE])
    (sample,) = r.rollout([row()], settings(trajectory_timeout_s=0.2))[0]
    t = sample.trajectory
    assert (t.stop_reason, t.turns, t.tool_calls) == ("timeout", 1, 1)
    assert t.messages[-1]["tool_calls"] and sample.completion_ids == r.ids(call("hang"))
    assert envs.closed == [0] and t.env_reward == 0.0


def test_the_deadline_aborts_a_turn_the_engine_is_still_decoding(rig, envs) -> None:
    r = rig([DONE])
    r.engine.hold_next()  # armed for the first turn's first step
    done: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: done.update(out=r.rollout([row()], settings(trajectory_timeout_s=0.2))))
    thread.start()
    r.engine.wait_held()
    thread.join(WAIT_S)  # the deadline passes with the engine held
    (sample,) = done["out"][0]
    assert sample.trajectory.stop_reason == "timeout" and sample.completion_ids == [] and envs.closed == [0]
    r.engine.release()
    r.loop.exclusive(lambda: None)  # one more turn of the loop: the abort applied
    assert [rid for rid, _, _, _ in r.engine.added] == r.engine.aborted and not r.engine.live


def test_a_lost_session_ends_in_env_error_without_a_reward(rig, envs) -> None:
    r = rig([call("die"), DONE])
    (sample,) = r.rollout([row()])[0]
    t = sample.trajectory
    assert (t.stop_reason, t.turns, t.env_reward) == ("env_error", 1, None)


def test_a_reset_that_raises_ends_in_env_error_before_any_turn(rig, envs) -> None:
    r = rig([DONE])
    (sample,) = r.rollout([row(reset_fails=True)])[0]
    t = sample.trajectory
    assert (t.stop_reason, sample.completion_ids, t.turns) == ("env_error", [], 0)
    assert t.prompt_ids == chat.render_prompt(r.tokenizer, row()["prompt"], SCHEMAS) and r.engine.added == []
    assert envs.closed == [0]  # its session is still released


def test_a_session_lost_at_close_loses_the_reward(rig, envs) -> None:
    r = rig([DONE])
    loop = r.agent_loop()
    pieces = loop.run([row()], [0])
    original = envs.close

    def close_lost(sessions: list[int], *, keep_state: bool):
        envs.lose(sessions[0])
        return original(sessions, keep_state=keep_state)

    envs.close = close_lost
    ((_, (sample,)),) = next(pieces)
    assert (sample.trajectory.stop_reason, sample.trajectory.env_reward) == ("env_error", None)


def test_trajectories_interleave_one_waits_on_its_tool_while_others_finish(rig, envs) -> None:
    def reply(turn: int, prompt: str) -> str:
        if turn == 0:
            # Fast's tool answers once a Slow tool is held, so the order below owes nothing to timing.
            return call("gated_echo", text="slow") if "Slow" in prompt else call("after_held")
        return DONE

    r = rig(reply)
    order: list[int] = []
    for piece in r.agent_loop(n=2).run([row("Slow."), row("Fast.")], [0, 1]):
        order += [g for g, _ in piece]
        if order == [1]:  # the fast group finished while the slow one's tool is still held
            assert ToolTestEnv.held.is_set() and not ToolTestEnv.gate.is_set()
            ToolTestEnv.gate.set()
    assert order == [1, 0]
    assert len([c for c in envs.calls if c[1][0].name == "gated_echo"]) == 2
    firsts = [step for _, prompt, _, step in r.engine.added if "Fast" in r.tokenizer.decode(prompt)]
    assert len(firsts) == 4  # both fast trajectories' two turns, beside the slow ones in the same engine


def test_a_weight_load_between_turns_splits_the_versions_and_min_version_holds_the_first_turn(rig, envs) -> None:
    r = rig([call("gated_echo", text="x"), DONE])
    pieces = r.agent_loop(min_version=3).run([row()], [0])
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(pieces=list(pieces)))
    thread.start()
    r.loop.exclusive(lambda: None, version=3)  # the first turn was waiting for it (or is submitted after it)
    wait_until(ToolTestEnv.held.is_set, "the first turn done, its tool held")
    r.loop.exclusive(lambda: None, version=4)
    ToolTestEnv.gate.set()
    thread.join(WAIT_S)
    ((_, (sample,)),) = result["pieces"][0]
    by_turn_versions = {turn: {v for v, tt in zip(sample.versions, sample.trajectory.turn_ids, strict=True)
                               if tt == turn} for turn in (-1, 0, 1)}
    assert by_turn_versions == {-1: {-1}, 0: {3}, 1: {4}}


def test_a_consumer_that_stops_early_leaves_no_turn_running_and_no_session_open(rig, envs) -> None:
    def reply(turn: int, prompt: str) -> str:
        if "Fast" in prompt:  # its tool answers once Slow's is held: Fast's group ends with Slow in its tool
            return call("after_held") if turn == 0 else DONE
        return call("gated_echo", text="x")

    r = rig(reply)
    pieces = r.agent_loop().run([row("Fast."), row("Slow.")], [0, 1])
    assert [g for g, _ in next(pieces)] == [0]
    assert ToolTestEnv.held.is_set() and not r.engine.live
    pieces.close()
    assert sorted(envs.closed) == [0, 1]  # Slow's session too, without waiting for its tool
    assert not r.engine.live


def test_rows_pick_their_environment_and_its_tools(rig, tool_tokenizer) -> None:
    class Other(ToolTestEnv):
        def extra(self) -> str:
            """Another tool."""
            return "extra"

    envs = LocalEnvironments({"plain": ToolTestEnv, "other": Other})
    r = Rig(tool_tokenizer, envs, [call("extra"), DONE])
    agent = settings(tools={"plain": SCHEMAS, "other": tool_schemas(Other)})
    try:
        plain, other = r.rollout([row(environment="plain"), row(environment="other")], agent)
        with pytest.raises(ValueError, match="'environment' is 'nope'"):
            r.rollout([row(environment="nope")], agent)
    finally:
        r.loop.close(WAIT_S)
        envs.shutdown()
    assert (plain[0].trajectory.env, other[0].trajectory.env) == ("plain", "other")
    assert "not found" in plain[0].trajectory.messages[1]["content"]  # plain has no `extra`
    assert other[0].trajectory.messages[1]["content"] == "extra"
    assert '"extra"' in tool_tokenizer.decode(other[0].trajectory.prompt_ids)
    assert '"extra"' not in tool_tokenizer.decode(plain[0].trajectory.prompt_ids)
    assert [q.row for q in envs.requests] == [{"prompt": row()["prompt"]}] * 2  # `environment` not passed to reset


def test_keep_env_state_returns_the_environment_pickled(rig) -> None:
    r = rig([call("echo", text="kept"), DONE])
    (sample,) = r.rollout([row()], settings(keep_env_state=True))[0]
    assert pickle.loads(sample.trajectory.env_state).calls == ["kept"]


def test_bad_settings_and_prompts_are_named() -> None:
    with pytest.raises(ValueError, match="trajectory_timeout_s"):
        settings(trajectory_timeout_s=0)
    with pytest.raises(ValueError, match="max_tool_calling_iterations"):
        settings(max_tool_calling_iterations=-1)
    with pytest.raises(ValueError, match="either one environment"):
        settings(tools={None: SCHEMAS, "x": SCHEMAS})
    with pytest.raises(ValueError, match="need chat prompts: column 'prompt' holds str"):
        settings().messages({"prompt": "plain text"})
    assert settings().messages({}) == [{"role": "user", "content": ""}]
    with pytest.raises(ValueError, match=r"TurnSettings: n \(0\) and max_tokens \(200\) must be >= 1"):
        turns(n=0)
    with pytest.raises(ValueError, match=r"max_tokens \(0\)"):
        turns(max_tokens=0)


def test_an_engine_error_ends_the_call_with_it_and_closes_every_session(rig, envs) -> None:
    def reply(turn: int, prompt: str) -> str:
        if "Bad" in prompt:
            raise RuntimeError("the engine rejects this prompt")
        return call("gated_echo", text="x")

    r = rig(reply)
    with pytest.raises(RuntimeError, match="rejects this prompt"):
        r.rollout([row("Fine."), row("Bad.")])
    assert sorted(envs.closed) == [0, 1]


def test_a_pinned_rollout_holds_a_weight_load_back_between_its_turns(rig, envs) -> None:
    r = rig([call("gated_echo", text="x"), DONE])
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(out=r.rollout([row()], pin=True)))
    thread.start()
    wait_until(ToolTestEnv.held.is_set, "its first turn done, its tool held: nothing of it in the engine")
    load = threading.Thread(target=lambda: r.loop.exclusive(lambda: None, version=9))
    load.start()
    wait_until(lambda: r.loop._jobs or not load.is_alive(), "the load queued (or, wrongly, run already)")
    ToolTestEnv.gate.set()
    thread.join(WAIT_S)
    load.join(WAIT_S)
    (sample,) = result["out"][0]
    assert sample.trajectory.turns == 2 and {v for v in sample.versions if v >= 0} == {0}
    assert r.loop.version == 9  # the load ran once the rollout ended


# --- the state machine's transitions, on environments the test answers and a clock it moves ------------------


class Clock:
    """The loop's clock: a deadline passes when the test moves it there, not with time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def answered(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def failed(err: Exception) -> Future:
    future: Future = Future()
    future.set_exception(err)
    return future


class AnsweredEnvironments:
    """Environments whose answers the test writes: open, call and close run `on_open`/`on_call`/`on_close` (on
    the loop's thread) and return their futures. By default every session opens (ids 0, 1, ...), every tool
    answers "ok" and every close rewards 1."""

    def __init__(self) -> None:
        self.closed: list[int] = []
        self.calls: list[list[ToolCall]] = []
        self.on_open: Callable[[list[EnvRequest]], Future] = lambda requests: answered(
            [EnvOpened(i, None) for i in range(len(requests))])
        self.on_call: Callable[[list[ToolCall]], Future] = lambda calls: answered(
            [ToolResult("ok", "ok") for _ in calls])
        self.on_close: Callable[[list[int]], Future] = lambda sessions: answered(
            [EnvClosed(1.0, None) for _ in sessions])

    def open(self, requests: list[EnvRequest]) -> Future:
        return self.on_open(requests)

    def call(self, session: int, calls: list[ToolCall]) -> Future:
        self.calls.append(calls)
        return self.on_call(calls)

    def close(self, sessions: list[int], *, keep_state: bool) -> Future:
        self.closed += sessions
        return self.on_close(sessions)


DEADLINE = WAIT_S  # settings()' trajectory_timeout_s, from the clock's 0


@pytest.fixture
def answering(tool_tokenizer):
    """(rig, its environments, the loop's clock): rig.rollout runs on them."""
    envs, clock = AnsweredEnvironments(), Clock()
    r = Rig(tool_tokenizer, envs, [call("echo", text="hi"), DONE])
    r.agent_loop = lambda agent=None, **kw: Rig.agent_loop(r, agent, clock=clock, **kw)
    yield r, envs, clock
    r.loop.close(WAIT_S)


def test_a_trajectory_in_done_or_closing_cannot_go_back() -> None:
    t = _Trajectory(0, 0, 0, None, [], DEADLINE, TrajectoryRecord(None, []))
    t.enter(Phase.SAMPLING)
    t.enter(Phase.CALLING)
    t.enter(Phase.CLOSING)
    for phase in (Phase.OPENING, Phase.SAMPLING, Phase.CALLING, Phase.CLOSING):
        with pytest.raises(RuntimeError, match=f"from CLOSING to {phase.name}"):
            t.enter(phase)
    t.enter(Phase.DONE)
    for phase in Phase:
        with pytest.raises(RuntimeError, match=f"from DONE to {phase.name}"):
            t.enter(phase)
    assert t.phase is Phase.DONE


def test_a_tool_result_that_comes_after_the_deadline_is_stale_and_ignored(answering) -> None:
    r, envs, clock = answering
    late: Future = Future()

    def call_past_the_deadline(calls: list[ToolCall]) -> Future:
        clock.now = DEADLINE
        return late

    def close_then_answer_the_call(sessions: list[int]) -> Future:
        late.set_result([ToolResult("late", "error")])  # its event is queued before the close's
        return answered([EnvClosed(0.5, None)])

    envs.on_call, envs.on_close = call_past_the_deadline, close_then_answer_the_call
    (sample,) = r.rollout([row()])[0]
    t = sample.trajectory
    assert (t.stop_reason, t.turns, t.tool_calls, t.tool_failures, t.tool_tokens) == ("timeout", 1, 1, 0, 0)
    assert [m["role"] for m in t.messages] == ["assistant"] and sample.completion_ids == r.ids(call("echo", text="hi"))
    assert len(r.engine.added) == 1 and envs.closed == [0] and t.env_reward == 0.5


def _lost_while_calling(envs: AnsweredEnvironments, clock: Clock) -> None:
    envs.on_call = lambda calls: failed(EnvSessionLost("its worker died"))
    # the pool closes a lost session with its error, and no reward
    envs.on_close = lambda sessions: answered([EnvClosed(None, None, error="EnvSessionLost: its worker died")])


def _lost_at_close(envs: AnsweredEnvironments, clock: Clock) -> None:
    envs.on_close = lambda sessions: failed(EnvSessionLost("its worker died"))


def _never_closed(envs: AnsweredEnvironments, clock: Clock) -> None:
    def close(sessions: list[int]) -> Future:
        clock.now = DEADLINE + CLOSE_GRACE_S
        return Future()

    envs.on_close = close


def _past_the_deadline_in_a_tool(envs: AnsweredEnvironments, clock: Clock) -> None:
    def call_past_the_deadline(calls: list[ToolCall]) -> Future:
        clock.now = DEADLINE
        return Future()

    envs.on_call = call_past_the_deadline


ANSWERED = ["assistant", "tool", "assistant"]  # the tool answered, then the model: it stopped
IN_ITS_TOOL = ["assistant"]  # no tool result: lost, or not back by the deadline


@pytest.mark.parametrize(("lose", "stop", "roles"), [
    pytest.param([_lost_while_calling], "env_error", IN_ITS_TOOL, id="lost while calling"),
    pytest.param([_lost_at_close], "env_error", ANSWERED, id="lost at close"),
    pytest.param([_never_closed], "env_error", ANSWERED, id="close never answered"),
    pytest.param([_past_the_deadline_in_a_tool, _lost_at_close], "timeout", IN_ITS_TOOL,
                 id="timeout, then lost at close"),
    pytest.param([_past_the_deadline_in_a_tool, _never_closed], "timeout", IN_ITS_TOOL,
                 id="timeout, close never answered"),
])
def test_a_lost_session_ends_in_env_error_unless_the_deadline_stopped_it_first(answering, lose, stop, roles) -> None:
    r, envs, clock = answering
    for how in lose:
        how(envs, clock)
    (sample,) = r.rollout([row()])[0]
    t = sample.trajectory
    assert (t.stop_reason, sample.finish_reason, t.env_reward) == (stop, stop, None)
    assert [m["role"] for m in t.messages] == roles and t.turns == roles.count("assistant")
    assert envs.closed == [0] and len(envs.calls) == 1


def test_a_trajectory_stopped_while_it_opened_closes_the_session_it_then_gets(answering) -> None:
    r, envs, clock = answering
    opening: Future = Future()

    def open_past_the_deadline(requests: list[EnvRequest]) -> Future:
        clock.now = DEADLINE  # its close grace not yet spent
        return opening

    envs.on_open = open_past_the_deadline
    loop = r.agent_loop()
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(pieces=list(loop.run([row()], [0]))))
    thread.start()
    wait_until(lambda: 0 in loop._groups and loop._groups[0][0].phase is Phase.CLOSING,
               "its deadline passed while it opened")
    assert envs.closed == []
    opening.set_result([EnvOpened(7, " Obs.")])
    thread.join(WAIT_S)
    ((_, (sample,)),) = result["pieces"][0]
    t = sample.trajectory
    assert (t.stop_reason, t.turns, sample.completion_ids, t.env_reward) == ("timeout", 0, [], 1.0)
    assert envs.closed == [7] and r.engine.added == []
    assert t.prompt == row()["prompt"]  # the row's: reset's text never reached the model


def test_a_trajectory_whose_open_never_answers_ends_at_its_grace_keeping_timeout(answering) -> None:
    r, envs, clock = answering

    def open_never_answered(requests: list[EnvRequest]) -> Future:
        clock.now = DEADLINE + CLOSE_GRACE_S
        return Future()

    envs.on_open = open_never_answered
    (sample,) = r.rollout([row()])[0]
    t = sample.trajectory
    assert (t.stop_reason, t.turns, sample.completion_ids, t.env_reward) == ("timeout", 0, [], None)
    assert envs.closed == [] and r.engine.added == []
    # Never opened: its prompt as the model would have seen it (the learner takes the group's prompt from it).
    assert t.prompt == row()["prompt"] and t.prompt_ids == chat.render_prompt(r.tokenizer, t.prompt, SCHEMAS)


# --- the pieces a second driver reuses ----------------------------------------------------------------------


def test_a_record_built_turn_by_turn_is_the_sample_token_in_token_out(tool_tokenizer) -> None:
    tok = tool_tokenizer
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    record = TrajectoryRecord(tok, SCHEMAS)
    assert not record.started
    record.start(row()["prompt"])
    assert record.started and record.ids == record.prompt_ids == chat.render_prompt(tok, row()["prompt"], SCHEMAS)
    first, answer = ids(call("echo", text="hi")), ids(DONE)
    turn = record.append_turn(SampledTurn(first, [-0.5] * len(first), [3] * len(first), "stop"))
    assert turn.calls == [ToolCall("echo", {"text": "hi"})] and turn.malformed is None
    tool = {"role": "tool", "name": "echo", "content": "hi"}
    suffix = chat.tool_suffix_ids(tok, [tool])
    record.append_scaffold(suffix, [tool])
    record.append_turn(SampledTurn(answer, [-0.25] * len(answer), [4] * len(answer), "stop"))
    assert record.ids == record.prompt_ids + first + suffix + answer
    assert (record.counts.turns, record.counts.model_tokens, record.counts.tool_tokens) == (
        2, len(first) + len(answer), len(suffix))
    sample = record.to_sample("stop", env="box", closed=EnvClosed(0.75, b"state"))
    t = sample.trajectory
    assert sample.completion_ids == first + suffix + answer and sample.finish_reason == t.stop_reason == "stop"
    assert t.turn_ids == [0] * len(first) + [-1] * len(suffix) + [1] * len(answer)
    assert sample.versions == [3] * len(first) + [-1] * len(suffix) + [4] * len(answer)
    assert sample.logprobs[: len(first)] == [-0.5] * len(first) and all(math.isnan(lp) for lp in
                                                                          sample.logprobs[len(first):-len(answer)])
    assert t.messages == [turn.message, tool, {"role": "assistant", "content": "Done."}]
    assert (t.env, t.env_reward, t.env_state, t.tool_tokens, t.template_match) == ("box", 0.75, b"state",
                                                                                     len(suffix), True)
    # A record whose ids disagree with its conversation is a template mismatch.
    record.messages[1] = {"role": "user", "content": "hi"}
    assert record.to_sample("stop").trajectory.template_match is False


def test_a_records_routes_keep_the_first_request_that_computed_each_position(tool_tokenizer) -> None:
    """Routing replay across turns: a model token keeps the routing of the turn that sampled it, a prompt or tool
    token the prefill of the first turn whose prompt held it; the last token, never computed, has none."""
    import numpy as np

    tok = tool_tokenizer
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    record = TrajectoryRecord(tok, SCHEMAS)
    record.start(row()["prompt"])
    p = len(record.prompt_ids)
    first, answer = ids(call("echo", text="hi")), ids(DONE)

    def routes(n: int, value: int) -> np.ndarray:  # a request that computed positions 0..n-1 with expert `value`
        return np.full((n, 2, 2), value, dtype=np.int16)

    record.append_turn(SampledTurn(first, [-0.5] * len(first), [3] * len(first), "stop",
                                   routes(p + len(first) - 1, 1)))
    tool = {"role": "tool", "name": "echo", "content": "hi"}
    suffix = chat.tool_suffix_ids(tok, [tool])
    record.append_scaffold(suffix, [tool])
    k = p + len(first) + len(suffix)  # the second turn's prompt
    record.append_turn(SampledTurn(answer, [-0.25] * len(answer), [4] * len(answer), "stop",
                                   routes(k + len(answer) - 1, 2)))
    got = record.to_sample("stop").routes
    assert got.shape == (k + len(answer), 2, 2) and got.dtype == np.int16
    assert (got[: p + len(first) - 1] == 1).all()  # the first prompt and the first turn: the first request's
    assert (got[p + len(first) - 1 : k + len(answer) - 1] == 2).all()  # first turn's last token, tool, answer
    assert (got[-1] == -1).all()


def test_the_budgets_of_a_turn_and_of_a_scaffold_and_submit_turn(rig) -> None:
    r = rig([DONE])
    record = TrajectoryRecord(r.tokenizer, SCHEMAS)
    record.start(row()["prompt"])
    prompt = len(record.ids)
    record.append_turn(SampledTurn([5] * 10, [0.0] * 10, [0] * 10, "length"))
    assert turn_budget(turns(max_tokens=15, max_model_len=MODEL_LEN), record) == 5  # the model-token budget
    assert turn_budget(turns(max_model_len=prompt + 13), record) == 3  # the context
    assert scaffold_budget(20, MODEL_LEN, record) == 20
    assert scaffold_budget(20, prompt + 13, record) == 2  # room for one more model token
    record.append_scaffold([6] * 8, [])
    assert scaffold_budget(20, MODEL_LEN, record) == 12
    assert submit_turn(r.loop, turns(max_tokens=10), record, seed=1) is None
    request = submit_turn(r.loop, turns(max_tokens=12, min_version=0), record, seed=1)
    sampled = SampledTurn.of(request)
    assert sampled.ids == r.ids(DONE)[:2] and sampled.finish_reason == "length"
    assert sampled.logprobs == [TOKEN_LOGPROB] * 2 and sampled.versions == [0, 0]
    ((_, prompt_ids, params, _),) = r.engine.added
    assert prompt_ids == record.ids and (params.max_tokens, params.seed) == (2, 1)


def test_a_groups_records_share_its_first_prompt_rendering_only_when_it_is_theirs(tool_tokenizer) -> None:
    """A group's G records usually start from the same prompt (reset's text drawn from the group's seed): the first
    one's ids are taken, copied; a record whose prompt or tools differ renders its own."""
    first = TrajectoryRecord(tool_tokenizer, SCHEMAS)
    first.start(row("Echo hi.")["prompt"])
    same, other, fewer_tools = (TrajectoryRecord(tool_tokenizer, SCHEMAS), TrajectoryRecord(tool_tokenizer, SCHEMAS),
                                TrajectoryRecord(tool_tokenizer, SCHEMAS[:1]))
    same.start(row("Echo hi.")["prompt"], like=first)
    other.start(row("Echo ho.")["prompt"], like=first)
    fewer_tools.start(row("Echo hi.")["prompt"], like=first)
    assert same.prompt_ids == same.ids == first.prompt_ids and same.ids is not first.ids
    for r in (other, fewer_tools):
        assert r.prompt_ids == chat.render_prompt(tool_tokenizer, r.prompt, r.tools) != first.prompt_ids
    same.ids.append(5)  # its own list: the first record's ids are untouched
    assert first.ids == first.prompt_ids


def test_the_tool_suffix_prefix_is_rendered_once_per_tool_and_template(tool_tokenizer, monkeypatch) -> None:
    import copy

    tok = copy.deepcopy(tool_tokenizer)
    message = {"role": "tool", "name": "echo", "content": "hi"}
    want = chat.tool_suffix_ids(tok, [message])
    renders: list[int] = []
    render = chat._render
    monkeypatch.setattr(chat, "_render", lambda *a, **kw: renders.append(1) or render(*a, **kw))
    assert chat.tool_suffix_ids(tok, [message]) == want and len(renders) == 1  # the full rendering only
    # Another template: its own prefix, not the cached one.
    tok.chat_template = tok.chat_template.replace("<|im_start|>", "<|im_start|> ")
    renders.clear()
    fresh = chat.tool_suffix_ids(tok, [message])
    assert len(renders) == 2 and fresh != want
