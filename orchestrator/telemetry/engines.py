"""The generators' engines per step, from the counters each stream item carries (actors/types.py EngineCounters):
how full they ran, how busy they were and how fast they sampled, whatever loop fed them."""

from __future__ import annotations

from actors.types import EngineCounters

NONE = EngineCounters(0, 0, 0.0)


class EngineMeter:
    """`observe` each stream item's counters (per generator); `step_metrics` once per step: the differences since
    the last step, over the engines heard from. A generator whose counters went back (restarted, or a new engine
    under a removed one's index) counts from zero."""

    def __init__(self) -> None:
        self._last: dict[int, EngineCounters] = {}
        self._steps = 0
        self._running = 0
        self._busy_s = 0.0

    def observe(self, member: int, counters: EngineCounters | None) -> None:
        if counters is None:
            return
        prev = self._last.get(member, NONE)
        if counters.steps < prev.steps:
            prev = NONE
        self._steps += counters.steps - prev.steps
        self._running += counters.running - prev.running
        self._busy_s += counters.busy_s - prev.busy_s
        self._last[member] = counters

    def remove(self, member: int) -> None:
        """A generator left the group and the ones after it were renumbered (phases.go_on_without)."""
        self._last = {(m - 1 if m > member else m): c for m, c in self._last.items() if m != member}

    def step_metrics(self, wall_s: float, engines: int) -> dict[str, float]:
        """This step's: `generators/occupancy`, running sequences per engine step (how full the engines ran);
        `generators/busy`, the share of the step's wall time an engine spent stepping (mean over `engines`);
        `generators/tokens_per_s_per_engine`, sequences advanced per second of wall time per engine (a decode step
        samples one token for each running sequence). Empty where no counters came (the sync loop's calls)."""
        if not self._steps or wall_s <= 0 or engines <= 0:
            return {}
        out = {"generators/occupancy": self._running / self._steps,
               "generators/busy": min(self._busy_s / (wall_s * engines), 1.0),
               "generators/tokens_per_s_per_engine": self._running / (wall_s * engines)}
        self._steps, self._running, self._busy_s = 0, 0, 0.0
        return out
