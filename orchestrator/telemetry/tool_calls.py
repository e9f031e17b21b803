"""A run whose tool calls mostly fail says so on the terminal.

A failed tool call is a tool message the model reads (`{'error': ...}`, as TRL writes it: actors/envs/worker.py),
never an error of the run: a run whose every call fails (a tool that needs a resource the workers lack, a tool
written for the main thread) trains to the end and exits 0. The metrics record it (`multiturn/tool_failures`),
but nobody reads metrics.jsonl during a run. So: one line when a step's calls mostly fail, naming the most common
answer; one when they answer again; and at the end of a run that had such steps, the run's total.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from actors.types import SampleInfo

# More than this share of a step's tool calls failed: the line. Half: a model learning a tool fails some calls
# (a wrong argument, a box that does not exist), but most of them failing points at the tool or its setup.
MOSTLY_FAILING = 0.5
# An error message quoted on the terminal is cut to this many characters.
QUOTED_CHARS = 160


def error_counts(infos: list[SampleInfo]) -> Counter[str]:
    """The error messages of failed calls in these samples (their tool messages `{'error': '<message>'}`, kept in
    each SampleInfo), each with its count."""
    return Counter(m for i in infos for m in i.tool_errors)


@dataclass
class ToolCallWatch:
    """Watches a run's tool calls step by step (`observe`) and says when they mostly fail (module docstring)."""

    say: Callable[[str], None]
    calls: int = 0  # over the run
    failures: int = 0
    failing: bool = False  # the last step's calls mostly failed
    steps_failing: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def observe(self, step: int, infos: list[SampleInfo]) -> None:
        calls = sum(i.tool_calls for i in infos)
        failures = sum(i.tool_failures for i in infos)
        errors = error_counts(infos)
        self.calls, self.failures = self.calls + calls, self.failures + failures
        self.errors.update(errors)
        failing = calls > 0 and failures > MOSTLY_FAILING * calls
        if failing and not self.failing:
            self.say(f"rayward: step {step}: {failures} of {calls} tool calls failed; {_most_common(errors)}")
        elif self.failing and not failing:
            self.say(f"rayward: step {step}: tool calls answer again ({failures} of {calls} failed)")
        self.failing = failing
        self.steps_failing += failing

    def summary(self) -> str | None:
        """The run's line at its end, if any step's calls mostly failed."""
        if not self.steps_failing:
            return None
        share = self.failures / self.calls if self.calls else 0.0
        return (f"rayward: tool calls: {self.failures} of {self.calls} failed over the run ({share:.0%}; "
                f"{self.steps_failing} step(s) with most failing); {_most_common(self.errors)}")


def _most_common(errors: Counter[str]) -> str:
    if not errors:
        return "their error messages are not in the conversations"
    message, count = errors.most_common(1)[0]
    quoted = message if len(message) <= QUOTED_CHARS else message[:QUOTED_CHARS] + "..."
    return f"most often ({count}x): {quoted!r} (completions.jsonl has the conversations)"
