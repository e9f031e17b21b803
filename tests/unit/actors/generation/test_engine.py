"""EngineLoop's logic on a fake engine that obeys LLMEngine's interface (add_request, step,
has_unfinished_requests, abort_request, set_weight_version): ordering, interleaving, exclusive sections,
version stamps, aborts, finished queues, errors and shutdown. The real engine is in tests/integration/actors/generation.

A gated fake holds the loop at the start of every step until the test lets it go (`hold`, `release`): what the
test submits while the loop is held reaches the engine right after that step, so the tests say exactly which step
a thing happens at, with no timing."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from actors.generation.engine import EngineError, EngineLoop, FinishedQueue, token_versions
from tests.fixtures.waiting import wait_until

# Bounds every blocking wait in these tests, so a loop bug fails a test instead of hanging the suite.
WAIT_S = 10


@dataclass
class Span:  # vLLM's WeightVersionSpan
    version: str
    start: int
    end: int


@dataclass
class _Live:
    prompt: Any
    params: Any
    tokens: list[int] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)


class FakeEngine:
    """Each step gives every request one token (its step number), labelled like vLLM's engine core with the
    weight version set when the step ran; a request finishes after params.max_tokens tokens. Every call must
    come from one thread, and step() only while it has requests (a loop that steps an idle engine spins)."""

    def __init__(self, gate: bool = False) -> None:
        self.gated = gate
        self._entered = threading.Semaphore(0)
        self._go = threading.Semaphore(0)
        self.version = "default"
        self.live: dict[str, _Live] = {}
        self.prompts: dict[str, Any] = {}  # every request's prompt as it reached the engine
        self.steps = 0
        self.log: list[tuple[str, Any, int]] = []  # (call, argument, steps before it)
        self.fail_step: BaseException | None = None
        self.in_step = False
        self.thread: threading.Thread | None = None

    def _call(self, name: str, arg: Any) -> None:
        self.thread = self.thread or threading.current_thread()
        assert threading.current_thread() is self.thread, f"{name} from a second thread"
        self.log.append((name, arg, self.steps))

    def set_weight_version(self, version: str) -> None:
        self._call("version", version)
        self.version = version

    def add_request(self, request_id: str, prompt: Any, params: Any) -> str:
        self._call("add", request_id)
        if prompt == "bad":
            raise ValueError("prompt too long")
        self.live[request_id] = _Live(prompt, params)
        self.prompts[request_id] = prompt
        return request_id + "-internal"

    def abort_request(self, request_ids: list[str]) -> None:
        self._call("abort", list(request_ids))
        for rid in request_ids:
            self.live.pop(rid, None)

    # The test's side of the gate.
    def hold(self) -> None:
        """Return once the loop is waiting at the start of its next step (its inbox already taken)."""
        assert self._entered.acquire(timeout=WAIT_S), "the loop never reached a step"

    def release(self) -> None:
        """Let the held step run."""
        self._go.release()

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.hold()
            self.release()

    def free(self) -> None:
        """No more holding; lets a held step go too."""
        self.gated = False
        self._go.release()

    def has_unfinished_requests(self) -> bool:
        return bool(self.live)

    def step(self) -> list[Any]:
        assert self.live, "step() on an engine without requests"
        if self.gated:
            self._entered.release()
            assert self._go.acquire(timeout=WAIT_S), "the test never released this step"
        self._call("step", None)
        if self.fail_step is not None:
            raise self.fail_step
        self.in_step = True
        outputs = []
        for rid, req in list(self.live.items()):
            if not req.spans or req.spans[-1].version != self.version:
                req.spans.append(Span(self.version, len(req.tokens), len(req.tokens)))
            req.tokens.append(self.steps)
            req.spans[-1].end += 1
            if len(req.tokens) == req.params.max_tokens:
                del self.live[rid]
                completion = SimpleNamespace(token_ids=list(req.tokens), weight_versions=req.spans)
                outputs.append(SimpleNamespace(request_id=rid, finished=True, outputs=[completion]))
        self.steps += 1
        self.in_step = False
        return outputs


def tokens(n: int) -> SimpleNamespace:
    return SimpleNamespace(max_tokens=n)


def start(engine: FakeEngine, **kwargs: Any) -> EngineLoop:
    return EngineLoop(lambda: engine, render=lambda ids, params: ids, **kwargs)


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def gated() -> FakeEngine:
    return FakeEngine(gate=True)


def run_in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=target)
    t.start()
    return t, box


def test_a_request_comes_back_with_its_tokens_under_the_starting_version(engine: FakeEngine) -> None:
    loop = start(engine, version=3)
    out = loop.submit([1, 2], tokens(4)).result(WAIT_S)
    assert out.outputs[0].token_ids == [0, 1, 2, 3]
    assert token_versions(out.outputs[0]) == [3, 3, 3, 3]
    assert loop.steps == 4 and loop.version == 3
    loop.close(WAIT_S)


def test_a_batch_reaches_the_engine_whole_in_order_before_its_next_step(engine: FakeEngine) -> None:
    loop = start(engine)
    handles = loop.submit_batch([[1], [2], [3]], [tokens(1), tokens(2), tokens(3)])
    assert [len(h.result(WAIT_S).outputs[0].token_ids) for h in handles] == [1, 2, 3]
    adds = [(arg, steps) for name, arg, steps in engine.log if name == "add"]
    assert [rid for rid, _ in adds] == [h.request_id for h in handles]
    assert {steps for _, steps in adds} == {0}
    with pytest.raises(ValueError, match="2 sampling params for 3 prompts"):
        loop.submit_batch([[1], [2], [3]], [tokens(1), tokens(1)])
    loop.close(WAIT_S)


def test_a_request_submitted_mid_decode_finishes_without_waiting_for_the_others(gated: FakeEngine) -> None:
    loop = start(gated)
    long = loop.submit([1], tokens(10))
    gated.run(3)
    gated.hold()  # at the start of step 3
    short = loop.submit([2], tokens(2))
    gated.release()
    gated.run(2)
    out = short.result(WAIT_S)
    assert out.outputs[0].token_ids == [4, 5]  # decoded in steps 4 and 5, beside the long one
    assert not long.done()
    gated.free()
    assert long.result(WAIT_S).outputs[0].token_ids == list(range(10))
    loop.close(WAIT_S)


def test_exclusive_runs_between_steps_and_moves_the_version_of_later_tokens(gated: FakeEngine) -> None:
    loop = start(gated)
    request = loop.submit([1], tokens(6))
    gated.run(1)
    gated.hold()  # at the start of step 1
    seen: dict[str, Any] = {}

    def load() -> str:
        seen.update(thread=threading.current_thread(), in_step=gated.in_step, steps=gated.steps)
        return "loaded"

    t, box = run_in_thread(lambda: loop.exclusive(load, version=1))
    gated.release()
    t.join(WAIT_S)
    assert box == {"result": "loaded"}
    assert seen == {"thread": gated.thread, "in_step": False, "steps": 2}  # after step 1, before step 2
    assert loop.version == 1
    gated.free()
    assert token_versions(request.result(WAIT_S).outputs[0]) == [0, 0, 1, 1, 1, 1]
    loop.close(WAIT_S)


def test_a_failing_exclusive_section_reaches_its_caller_and_keeps_the_version(engine: FakeEngine) -> None:
    loop = start(engine)

    def broken() -> None:
        raise OSError("bucket 3 never arrived")

    with pytest.raises(OSError, match="bucket 3"):
        loop.exclusive(broken, version=7)
    assert loop.version == 0
    assert loop.exclusive(lambda: 42) == 42  # the loop still serves
    assert token_versions(loop.submit([1], tokens(2)).result(WAIT_S).outputs[0]) == [0, 0]
    loop.close(WAIT_S)


def test_an_exclusive_section_that_exits_stops_the_loop_and_fails_the_jobs_behind_it(gated: FakeEngine) -> None:
    loop = start(gated)
    request = loop.submit([1], tokens(50))
    gated.hold()  # at the start of step 0: both jobs queue behind it, in this order

    def leave() -> None:
        raise SystemExit(3)

    first, first_box = run_in_thread(lambda: loop.exclusive(leave))
    wait_until(lambda: len(loop._jobs) >= 1, "the first job queued")
    second, second_box = run_in_thread(lambda: loop.exclusive(lambda: "never"))
    wait_until(lambda: len(loop._jobs) >= 2, "the second job queued")
    gated.release()
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert isinstance(first_box["error"], SystemExit)
    assert isinstance(second_box["error"], EngineError)
    assert second_box["error"].__cause__ is first_box["error"]
    with pytest.raises(EngineError, match="SystemExit"):
        request.result(WAIT_S)


def test_exclusive_from_a_done_callback_runs_inline(engine: FakeEngine) -> None:
    loop = start(engine)
    ran = threading.Event()
    first = loop.submit([1], tokens(1))
    first.add_done_callback(lambda f: loop.exclusive(ran.set, version=1))
    first.result(WAIT_S)
    assert ran.wait(WAIT_S)
    assert token_versions(loop.submit([1], tokens(1)).result(WAIT_S).outputs[0]) == [1]
    loop.close(WAIT_S)


def test_the_loop_only_steps_an_engine_with_requests(engine: FakeEngine) -> None:
    """FakeEngine.step asserts it has requests: an idle loop must sleep, not step."""
    loop = start(engine)
    for _ in range(3):
        loop.submit([1], tokens(2)).result(WAIT_S)
        loop.exclusive(lambda: None)  # wakes the loop with no request in flight
    assert engine.steps == 6
    loop.close(WAIT_S)
    assert [name for name, _, _ in engine.log].count("step") == 6


def test_a_finished_queue_hands_back_each_steps_finished_requests_together(engine: FakeEngine) -> None:
    loop = start(engine)
    finished = FinishedQueue()
    handles = loop.submit_batch([[1], [2], [3], [4]], [tokens(2), tokens(1), tokens(2), tokens(3)], finished=finished)
    pieces = [[h.request_id for h in piece] for piece in finished]
    ids = [h.request_id for h in handles]
    assert pieces == [[ids[1]], [ids[0], ids[2]], [ids[3]]]
    assert all(h.done() for h in handles)
    loop.close(WAIT_S)


def test_cancel_aborts_in_the_engine_and_the_finished_queue_still_ends(gated: FakeEngine) -> None:
    loop = start(gated)
    finished = FinishedQueue()
    keep, drop = loop.submit_batch([[1], [2]], [tokens(3), tokens(50)], finished=finished)
    gated.run(1)
    gated.hold()  # at the start of step 1
    assert drop.cancel()
    gated.release()
    gated.run(1)
    handed = [h for piece in finished for h in piece]
    assert sorted(h.request_id for h in handed) == sorted([keep.request_id, drop.request_id])
    with pytest.raises(CancelledError):
        drop.result(WAIT_S)
    assert len(keep.result(WAIT_S).outputs[0].token_ids) == 3
    assert ("abort", [drop.request_id], 2) in gated.log  # right after step 1
    assert not gated.live
    assert not keep.cancel()  # done already
    loop.close(WAIT_S)


def test_an_exclusive_job_sees_every_earlier_cancel_and_submission_applied(gated: FakeEngine) -> None:
    loop = start(gated)
    drop = loop.submit([1], tokens(50))
    gated.hold()  # at the start of step 0
    drop.cancel()
    keep = loop.submit([2], tokens(50))
    t, box = run_in_thread(lambda: loop.exclusive(lambda: sorted(gated.live)))
    gated.release()
    t.join(WAIT_S)
    assert box == {"result": [keep.request_id]}
    gated.free()
    loop.close(WAIT_S)


def test_a_request_the_engine_refuses_fails_alone(engine: FakeEngine) -> None:
    loop = start(engine)
    good, bad = loop.submit_batch([[1], "bad"], tokens(2))
    with pytest.raises(ValueError, match="prompt too long"):
        bad.result(WAIT_S)
    assert len(good.result(WAIT_S).outputs[0].token_ids) == 2
    loop.close(WAIT_S)


def test_a_failed_step_reaches_every_waiter_with_its_cause(gated: FakeEngine) -> None:
    loop = start(gated)
    finished = FinishedQueue()
    a, b = loop.submit_batch([[1], [2]], tokens(5), finished=finished)
    gated.fail_step = RuntimeError("CUDA error: an illegal memory access")
    gated.hold()  # at the start of step 0, which fails
    t, box = run_in_thread(lambda: loop.exclusive(lambda: None))
    gated.release()
    for request in (a, b):
        with pytest.raises(EngineError, match="engine loop failed: RuntimeError: CUDA error") as info:
            request.result(WAIT_S)
        assert info.value.__cause__ is gated.fail_step
    assert sorted(h.request_id for piece in finished for h in piece) == sorted([a.request_id, b.request_id])
    t.join(WAIT_S)
    assert isinstance(box["error"], EngineError)  # it waited for the failed step
    with pytest.raises(EngineError, match="CUDA error"):
        loop.submit([1], tokens(1))
    with pytest.raises(EngineError, match="CUDA error"):
        loop.exclusive(lambda: None)
    assert ("abort", sorted([a.request_id, b.request_id]), 0) in [
        (n, sorted(arg), s) for n, arg, s in gated.log if n == "abort"
    ]


def test_close_fails_what_is_in_flight_and_refuses_more(gated: FakeEngine) -> None:
    loop = start(gated)
    request = loop.submit([1], tokens(5))
    gated.run(1)
    gated.hold()
    loop.close(0)  # asks; the loop stops after the held step
    gated.release()
    loop.close(WAIT_S)
    with pytest.raises(EngineError, match="closed"):
        request.result(WAIT_S)
    with pytest.raises(EngineError, match="closed"):
        loop.submit([1], tokens(1))
    assert not gated.live  # aborted in the engine


def test_the_engine_is_built_on_the_stepping_thread_after_the_start_hook(engine: FakeEngine) -> None:
    seen = []

    def build() -> FakeEngine:
        seen.append(("build", threading.current_thread()))
        return engine

    loop = EngineLoop(build, render=lambda ids, params: ids,
                      on_thread_start=lambda: seen.append(("hook", threading.current_thread())))
    assert loop.engine is engine
    loop.submit([1], tokens(1)).result(WAIT_S)
    assert seen == [("hook", engine.thread), ("build", engine.thread)]
    assert engine.thread is not threading.current_thread()
    assert engine.log[0] == ("version", "0", 0)
    loop.close(WAIT_S)


def test_a_failing_build_raises_from_the_constructor() -> None:
    def build() -> None:
        raise OSError("no such model: /nowhere")

    with pytest.raises(OSError, match="no such model"):
        EngineLoop(build, render=lambda ids, params: ids)


def test_requests_can_be_awaited_from_asyncio(engine: FakeEngine) -> None:
    loop = start(engine)

    async def conversation(turns: int) -> list[int]:
        ids: list[int] = [1]
        for _ in range(turns):
            out = await asyncio.wrap_future(loop.submit(ids, tokens(2)))
            ids = ids + list(out.outputs[0].token_ids) + [99]  # + the tool's reply
        return ids

    async def main() -> list[list[int]]:
        return await asyncio.gather(*(conversation(t) for t in (1, 2, 3)))

    results = asyncio.run(main())
    assert [len(r) for r in results] == [4, 7, 10]
    loop.close(WAIT_S)


def test_token_versions_expands_spans_and_checks_they_cover_the_tokens() -> None:
    completion = SimpleNamespace(token_ids=[5, 6, 7], weight_versions=[Span("2", 0, 1), Span("3", 1, 3)])
    assert token_versions(completion) == [2, 3, 3]
    assert token_versions(SimpleNamespace(token_ids=[], weight_versions=None)) == []
    with pytest.raises(ValueError, match="cover 1 of 3 tokens"):
        token_versions(SimpleNamespace(token_ids=[5, 6, 7], weight_versions=[Span("2", 0, 1)]))


def test_a_request_with_a_min_version_waits_outside_the_engine_for_the_load_that_brings_it(gated: FakeEngine) -> None:
    loop = start(gated)
    other = loop.submit([1], tokens(4))
    waiting = loop.submit([2], tokens(2), min_version=1)
    gated.run(2)
    assert [arg for name, arg, _ in gated.log if name == "add"] == [other.request_id]  # only the other one
    gated.hold()  # at the start of step 2
    t, box = run_in_thread(lambda: loop.exclusive(lambda: "loaded", version=1))
    gated.release()
    t.join(WAIT_S)
    assert box == {"result": "loaded"}
    gated.free()
    assert token_versions(waiting.result(WAIT_S).outputs[0]) == [1, 1]
    assert ("add", waiting.request_id, 3) in gated.log  # right after the load, before step 3
    assert token_versions(other.result(WAIT_S).outputs[0]) == [0, 0, 0, 1]
    # Already held: no wait.
    assert token_versions(loop.submit([3], tokens(1), min_version=0).result(WAIT_S).outputs[0]) == [1]
    loop.close(WAIT_S)


@pytest.mark.parametrize("isolate", [True, False])
def test_isolated_versions_salt_each_request_with_the_version_it_enters_the_engine_under(engine: FakeEngine,
                                                                                        isolate: bool) -> None:
    """kv_after_update keep: vLLM's cache_salt keeps a request off prefix-cache blocks of other weights; a request
    waiting for its min_version enters under (and is salted with) the version of the load it waited for."""
    loop = EngineLoop(lambda: engine, render=lambda ids, params: {"prompt_token_ids": ids}, isolate_versions=isolate)
    before = loop.submit([1], tokens(1))
    before.result(WAIT_S)
    waiting = loop.submit([2], tokens(1), min_version=1)
    loop.exclusive(lambda: None, version=1)
    waiting.result(WAIT_S)
    salts = [engine.prompts[r.request_id].get("cache_salt") for r in (before, waiting)]
    assert salts == (["policy-v0", "policy-v1"] if isolate else [None, None])
    assert [engine.prompts[r.request_id]["prompt_token_ids"] for r in (before, waiting)] == [[1], [2]]
    loop.close(WAIT_S)


def test_a_pinned_request_holds_version_changes_back_until_it_finishes(gated: FakeEngine) -> None:
    loop = start(gated)
    pinned = loop.submit([1], tokens(4), pin=True)
    gated.run(1)
    gated.hold()  # at the start of step 1
    t0, box0 = run_in_thread(lambda: loop.exclusive(lambda: "no version change"))
    gated.release()
    t0.join(WAIT_S)
    assert box0 == {"result": "no version change"}  # not held back
    gated.hold()  # at the start of step 2
    t, box = run_in_thread(lambda: loop.exclusive(lambda: gated.steps, version=1))
    wait_until(lambda: loop._jobs, "the job queued")
    gated.release()
    gated.run(1)  # step 3: the pinned request's last token
    t.join(WAIT_S)
    assert box == {"result": 4}  # after the pinned request's 4th step
    assert token_versions(pinned.result(WAIT_S).outputs[0]) == [0, 0, 0, 0]
    gated.free()
    assert token_versions(loop.submit([2], tokens(1)).result(WAIT_S).outputs[0]) == [1]
    loop.close(WAIT_S)


def test_a_pinned_request_waiting_for_its_version_lets_that_load_run_then_holds_the_next(gated: FakeEngine) -> None:
    """An eval named after step 1, submitted before the step-1 sync landed: the sync runs, the eval enters right
    after it, and the step-2 sync waits for the eval."""
    loop = start(gated)
    busy = loop.submit([1], tokens(20))
    evaluation = loop.submit([2], tokens(3), min_version=1, pin=True)
    gated.hold()  # at the start of step 0
    first, first_box = run_in_thread(lambda: loop.exclusive(lambda: None, version=1))
    wait_until(lambda: len(loop._jobs) >= 1, "the first job queued")
    second, second_box = run_in_thread(lambda: loop.exclusive(lambda: gated.steps, version=2))
    wait_until(lambda: len(loop._jobs) >= 2, "the second job queued")
    gated.release()
    first.join(WAIT_S)
    assert first_box == {"result": None}
    gated.free()
    assert token_versions(evaluation.result(WAIT_S).outputs[0]) == [1, 1, 1]
    second.join(WAIT_S)
    assert second_box == {"result": 4}  # the eval entered after step 0 and decoded in steps 1..3
    assert token_versions(busy.result(WAIT_S).outputs[0]) == [0] + [1] * 3 + [2] * 16
    loop.close(WAIT_S)


def test_a_held_pin_lets_its_own_version_in_then_holds_version_changes_back_with_no_request_in_flight(
    engine: FakeEngine,
) -> None:
    """A multi-turn eval between two turns: nothing of it in the engine, yet the next load waits for its end."""
    loop = start(engine)
    with loop.pinned(min_version=1):
        assert loop.exclusive(lambda: "brings the pin's version", version=1) == "brings the pin's version"
        held, box = run_in_thread(lambda: loop.exclusive(lambda: "next", version=2))
        wait_until(lambda: loop._jobs or box, "the load queued (or, wrongly, run already)")
        # Requests still run (in the pinned version) while the load waits behind the pin.
        assert token_versions(loop.submit([1], tokens(2)).result(WAIT_S).outputs[0]) == [1, 1]
        assert not box and loop.version == 1
    held.join(WAIT_S)
    assert box == {"result": "next"} and loop.version == 2
    loop.close(WAIT_S)


def test_a_waiting_request_can_be_cancelled_and_close_fails_the_others(engine: FakeEngine) -> None:
    loop = start(engine)
    finished = FinishedQueue()
    drop, keep = loop.submit_batch([[1], [2]], tokens(2), min_version=5, finished=finished)
    assert drop.cancel()
    (piece,) = [next(iter(finished))]
    assert [r.request_id for r in piece] == [drop.request_id]
    assert not engine.live and not keep.done()
    loop.close(WAIT_S)
    with pytest.raises(EngineError, match="closed"):
        keep.result(WAIT_S)
    assert [name for name, _, _ in engine.log] == ["version"]  # neither ever reached the engine


def test_the_counters_sum_the_running_requests_over_the_steps(engine: FakeEngine) -> None:
    """A batch of lengths 1, 2 and 5 runs 3 sequences at step 1, 2 at step 2, then 1 for three steps: 5 steps,
    8 sequence-steps (its tokens), an occupancy of 8 / 5 (what a long tail does to an engine)."""
    loop = start(engine)
    for h in loop.submit_batch([[1], [2], [3]], [tokens(1), tokens(2), tokens(5)]):
        h.result(WAIT_S)
    c = loop.counters
    assert (c.steps, c.running) == (5, 8) and c.busy_s >= 0
    loop.close(WAIT_S)
