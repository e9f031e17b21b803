"""Schedules: a value that follows the optimizer step (curriculum): reward weights, gate thresholds,
the curriculum's pool weights."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.config.base import _Section


class ConstantSchedule(_Section):
    type: Literal["constant"] = "constant"
    """Always `value`."""
    value: float
    """The value at every step."""

    def at(self, step: int) -> float:
        return self.value

    def breakpoints(self) -> tuple[int, ...]:
        """The steps where the value changes how it moves (between two of them it is constant or monotone)."""
        return ()


class _Ramp(_Section):
    start: float
    """Value at and before `start_step`."""
    end: float
    """Value at and after `end_step`."""
    start_step: int = Field(0, ge=0)
    """First step of the ramp."""
    end_step: int = Field(ge=0)
    """Last step of the ramp."""

    @model_validator(mode="after")
    def _ordered(self) -> _Ramp:
        if self.end_step <= self.start_step:
            raise ValueError(f"end_step ({self.end_step}) must be greater than start_step ({self.start_step})")
        return self

    def _shape(self, frac: float) -> float:
        """How far along the ramp (0 -> 1) the value is at `frac` of its steps."""
        return frac

    def at(self, step: int) -> float:
        frac = min(max((step - self.start_step) / (self.end_step - self.start_step), 0.0), 1.0)
        return self.start + (self.end - self.start) * self._shape(frac)

    def breakpoints(self) -> tuple[int, ...]:
        return (self.start_step, self.end_step)


class LinearSchedule(_Ramp):
    type: Literal["linear"] = "linear"
    """`start` until `start_step`, a straight line to `end` at `end_step`, then `end`."""


class CosineSchedule(_Ramp):
    type: Literal["cosine"] = "cosine"
    """Half a cosine from `start` (at `start_step`) to `end` (at `end_step`), constant outside."""

    def _shape(self, frac: float) -> float:
        return (1 - math.cos(math.pi * frac)) / 2  # 0 -> 1 along half a cosine


class PiecewiseSchedule(_Section):
    type: Literal["piecewise"] = "piecewise"
    """Steps: `[[0, 0.0], [20, 1.0]]` means 0.0 for steps 0-19 and 1.0 from step 20 on."""
    steps: list[tuple[int, float]] = Field(min_length=1)
    """`[step, value]` pairs, steps strictly increasing; the value holds from its step until the next one.
    Before the first step the first value holds."""

    @field_validator("steps")
    @classmethod
    def _increasing(cls, v: list[tuple[int, float]]) -> list[tuple[int, float]]:
        starts = [s for s, _ in v]
        if any(b <= a for a, b in zip(starts, starts[1:], strict=False)) or starts[0] < 0:
            raise ValueError(f"steps must be non-negative and strictly increasing, got {starts}")
        return v

    def at(self, step: int) -> float:
        current = self.steps[0][1]
        for start, v in self.steps:
            if step >= start:
                current = v
        return current

    def breakpoints(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self.steps)


Schedule = Annotated[
    ConstantSchedule | LinearSchedule | CosineSchedule | PiecewiseSchedule, Field(discriminator="type")
]
ScheduledFloat = float | Schedule


def scheduled(value: ScheduledFloat, step: int) -> float:
    """The value of a number or a schedule at optimizer step `step`."""
    return float(value) if isinstance(value, (int, float)) else value.at(step)


def steps_that_decide(values: list[ScheduledFloat]) -> list[int]:
    """The steps at which checking `values` decides a property of every step: each schedule is constant or
    monotone between its breakpoints, so the extremes of each (and the steps where several are zero together)
    are at 0, a breakpoint or a step next to one."""
    steps = {0}
    for v in values:
        if not isinstance(v, (int, float)):
            steps.update(s + d for s in v.breakpoints() for d in (-1, 0, 1) if s + d >= 0)
    return sorted(steps)
