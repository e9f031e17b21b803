"""A run whose tool calls mostly fail says so on the terminal (orchestrator/telemetry/tool_calls.py): TRL's
grpo_agent.py tool in a thread pool answered {'error': 'signal only works in main thread ...'} to 100 % of its calls
and the run exited 0 with nothing on the terminal."""

from __future__ import annotations

from actors.payloads import error_message, info_of
from actors.types import Sample, SampleInfo, Trajectory
from orchestrator.telemetry.tool_calls import ToolCallWatch, error_counts

SIGNAL = "signal only works in main thread of the main interpreter"


def trajectory(results: list[str]) -> SampleInfo:
    """A sample whose conversation's calls got these tool messages (an error message as TRL writes it, or an
    answer), as the driver holds it (its SampleInfo)."""
    messages: list[dict] = []
    for r in results:
        messages += [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "query", "arguments": {}}}]}, {"role": "tool", "name": "query", "content": r}]
    failed = sum(error_message(r) is not None for r in results)
    t = Trajectory([1], [], messages, [0], "stop", tool_calls=len(results), tool_failures=failed)
    return info_of(Sample([1], [0.0], "", "stop", trajectory=t))


def failed(message: str) -> str:
    return str({"error": message})


def test_error_messages_are_read_as_trl_writes_them():
    assert error_message(failed(SIGNAL)) == SIGNAL
    assert error_message("[(1, 'BRCA1')]") is None and error_message("{'error': 1, 'data': 2}") is None
    assert error_message("{'error': 'Tool open_box timed out after 5 s. [truncated]") == (
        "Tool open_box timed out after 5 s. [truncated]")  # cut to the tool-token budget: as far as it goes
    ts = [trajectory([failed(SIGNAL), failed(SIGNAL), "[]"]), trajectory([failed("Tool x not found.")])]
    assert error_counts(ts) == {SIGNAL: 2, "Tool x not found.": 1}


def test_a_line_when_calls_mostly_fail_one_when_they_recover_and_the_runs_total():
    said: list[str] = []
    watch = ToolCallWatch(said.append)
    watch.observe(1, [trajectory(["[(1,)]", "[(2,)]"])])  # all answered: nothing
    watch.observe(2, [trajectory([failed(SIGNAL)] * 3), trajectory(["[]"])])
    watch.observe(3, [trajectory([failed(SIGNAL)] * 2)])  # still failing: said once
    watch.observe(4, [trajectory(["[]", failed(SIGNAL)])])  # half: not mostly
    assert said == [
        f"rayward: step 2: 3 of 4 tool calls failed; most often (3x): {SIGNAL!r} (completions.jsonl has the "
        "conversations)",
        "rayward: step 4: tool calls answer again (1 of 2 failed)",
    ]
    assert watch.summary() == (f"rayward: tool calls: 6 of 10 failed over the run (60%; 2 step(s) with most "
                               f"failing); most often (6x): {SIGNAL!r} (completions.jsonl has the conversations)")


def test_a_run_whose_calls_answer_says_nothing():
    watch = ToolCallWatch(lambda text: (_ for _ in ()).throw(AssertionError(text)))
    for step in range(1, 4):
        watch.observe(step, [trajectory(["ok", failed("box 9 does not exist")])])
    watch.observe(4, [info_of(Sample([1], [0.0], "", "stop", trajectory=Trajectory([1], [], [], [0], "stop")))])
    assert watch.summary() is None
