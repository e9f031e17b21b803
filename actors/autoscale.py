"""A worker pool's autoscaling policy (the reward pool's and the environment pool's, through actors/pool.py):
samples of the pool's load in, a target number of workers out (pure).

Modelled on Ray Serve's autoscaler (`target_ongoing_requests`, `upscale_delay_s`, `downscale_delay_s`,
`look_back_period_s`), with the load measured the way a batch-driven pool sees it:

* **Load** is the average number of *busy* workers (a worker is busy while it holds at least one chunk) over a
  look-back window. The pool integrates busy workers over time; the policy takes differences.
* **Desired workers** = busy workers / `target_utilization`, rounded up: the count at which the same work
  would keep each worker busy that fraction of the time (Serve: ongoing requests / target_ongoing_requests).
  It is capped by the most chunks that were waiting or running at once in the window (one chunk per worker is
  all the parallelism the work offers) and clamped to [min_workers, max_workers].
* **Delays**: the pool grows only after the desired count has stayed above the current target (live and
  starting workers) for `upscale_delay_s`, and shrinks only after it has stayed below the live workers for
  `downscale_delay_s`; either way it moves to the desired count of that moment. While added workers are still
  starting, the load was measured without them: it may want fewer than the target, but the workers asked for
  are kept until they have been measured (or the load wants fewer than those already live).

Why busy workers and not queue wait or chunks per worker: the synchronous loop sends the pool one batch per
step, a burst followed by idle time (generation, training). Queue wait and chunks in flight per worker depend
on the batch size and drop to zero once there are as many workers as chunks, so a rule built on them
oscillates between "too few" and "none needed". Busy workers averaged over whole steps is the work rate; at
the fixed point the reward phase takes `target / (1 - target)` of the rest of the step whatever the reward's
latency, so an eightfold slower reward settles at about eight times the workers and the same reward time.
A busy-worker count can never exceed the live workers, so the desired count never runs ahead of what was
measured by more than a factor 1 / target, even while added workers are still waiting for a node.

**Windows of whole batches.** A time window shorter than a step would see 100% load during the burst and none
after it. So the window is aligned to batch arrivals: whole arrival-to-arrival cycles, starting at the newest
arrival at least `look_back_s` ago; in the synchronous loop it holds whole steps, in the pipelined loop (a batch
per finished group) it is about `look_back_s` long. The cycle in progress counts only when it already holds
more work than an average whole cycle (a step whose reward just became slower shows up while it runs) or when
it lowers the load (a long pause); otherwise a step half-way through, its batch scored and the rest to come,
would look busier than it is, and a pool that just shrank would grow straight back. No decision is taken
before one whole cycle has been seen (the pool idles while the generators start).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# Float noise below one worker: 2.0000000001 busy-worker units must not round up to 3 workers.
_ROUND_SLACK = 1e-6
# The cycle in progress counts as "more work than usual" once it holds this much more than an average whole
# cycle: a step with the usual work ends a little above or below the average (stragglers, dispatch), and
# counting those would flip the pool between two sizes; a reward that became markedly slower passes it early.
MORE_WORK = 1.25


@dataclass(frozen=True)
class AutoscaleSettings:
    """Bounds, target and delays: the config's `cluster.reward_autoscale` (which owns the defaults), or
    `rayward scale --min/--max` (the same defaults, from the config)."""

    min_workers: int
    max_workers: int
    target_utilization: float  # busy fraction each worker should settle at
    look_back_s: float  # seconds of history a decision averages over (stretched to whole batch cycles)
    upscale_delay_s: float  # the load must call for more workers this long before the pool grows
    downscale_delay_s: float  # ... for fewer workers this long before it shrinks

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValueError(
                f"autoscaling needs 1 <= min_workers <= max_workers, got {self.min_workers}..{self.max_workers}"
            )
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"target_utilization must be in (0, 1], got {self.target_utilization}")
        if self.look_back_s <= 0 or self.upscale_delay_s < 0 or self.downscale_delay_s < 0:
            raise ValueError("look_back_s must be > 0 and the delays >= 0")

    def clamp(self, n: int) -> int:
        return min(max(n, self.min_workers), self.max_workers)


@dataclass(frozen=True)
class PoolSample:
    """The pool's cumulative counters at time `t` (the policy differences them over its window)."""

    t: float  # monotonic seconds
    batches: int  # batches received so far: their arrivals delimit the window's cycles
    worker_s: float  # integral of live workers over time
    busy_s: float  # integral of busy workers (live workers holding at least one chunk) over time
    peak_outstanding: int  # the most chunks queued or being scored at once since the previous sample
    target: int  # workers alive or starting, not retiring: the count the pool is heading to
    live: int  # of those, the ones alive (the load was measured on them)


@dataclass(frozen=True)
class Load:
    """One evaluation of the window."""

    t: float
    span_s: float  # seconds of history used (whole cycles + the one in progress)
    cycles: int  # whole arrival-to-arrival cycles in it
    busy_workers: float  # average busy workers
    utilization: float  # busy / live worker-seconds
    peak_outstanding: int
    wanted: int  # busy workers / target utilisation, rounded up
    desired: int  # `wanted` capped by peak_outstanding and clamped to [min_workers, max_workers]


@dataclass(frozen=True)
class Decision:
    t: float
    before: int
    after: int
    reason: str

    @property
    def direction(self) -> str:
        return "up" if self.after > self.before else "down"


@dataclass
class _Mark:
    """A sample taken right after a batch arrived: where a window may start. `peak` is the most chunks
    outstanding at once from this mark until the next."""

    sample: PoolSample
    peak: int


class AutoscalePolicy:
    """Feed it `observe(sample)` periodically (the pool does, every AUTOSCALE_TICK_S); it returns a Decision
    when the target worker count should change, with its reason, and None otherwise."""

    def __init__(self, settings: AutoscaleSettings):
        self.settings = settings
        self._marks: deque[_Mark] = deque()
        self._last: PoolSample | None = None
        self._above_since: float | None = None
        self._below_since: float | None = None
        self.load: Load | None = None  # the latest evaluation (for stats and gauges)

    def set_bounds(self, settings: AutoscaleSettings, target: int, now: float) -> Decision | None:
        """New settings (e.g. `rayward scale --min/--max`); a target outside the new bounds moves at once."""
        self.settings = settings
        self._above_since = self._below_since = None
        clamped = settings.clamp(target)
        if clamped == target:
            return None
        return Decision(now, target, clamped, f"bounds changed to {settings.min_workers}..{settings.max_workers}")

    def observe(self, s: PoolSample) -> Decision | None:
        if self._last is not None and s.batches > self._last.batches:
            self._marks.append(_Mark(s, s.peak_outstanding))
        elif self._marks:
            self._marks[-1].peak = max(self._marks[-1].peak, s.peak_outstanding)
        self._last = s
        self._prune(s.t)
        load = self._evaluate(s)
        self.load = load
        if load is None:
            return None
        return self._decide(s, load)

    # --- the window ---------------------------------------------------------------------------------------

    def _prune(self, now: float) -> None:
        """Keep the marks a window may still start at: the newest one at least look_back_s old, and later ones
        (never fewer than two, so a whole cycle is always there)."""
        cutoff = now - self.settings.look_back_s
        while len(self._marks) > 2 and self._marks[1].sample.t <= cutoff:
            self._marks.popleft()

    def _evaluate(self, s: PoolSample) -> Load | None:
        if len(self._marks) < 2:
            return None  # not one whole cycle yet
        first, newest = self._marks[0].sample, self._marks[-1].sample
        cycles = len(self._marks) - 1
        whole_s, whole_busy, whole_live = (newest.t - first.t, newest.busy_s - first.busy_s,
                                           newest.worker_s - first.worker_s)
        if whole_s <= 0:
            return None
        span, busy, live = s.t - first.t, s.busy_s - first.busy_s, s.worker_s - first.worker_s
        # The cycle in progress is front-loaded (its batch is scored first, then the pool waits for the next),
        # so half-way through it looks busier than it will be. It counts only when it already holds more work
        # than an average whole cycle (the reward got slower, the batch bigger: the pool reacts while that batch
        # is still being scored) or when counting it lowers the load (a long pause).
        if not (busy - whole_busy > MORE_WORK * whole_busy / cycles or busy / span < whole_busy / whole_s):
            span, busy, live = whole_s, whole_busy, whole_live
        busy_workers = busy / span
        peak = max(m.peak for m in self._marks)
        want = math.ceil(busy_workers / self.settings.target_utilization - _ROUND_SLACK)
        desired = self.settings.clamp(min(want, peak))
        return Load(s.t, span, cycles, busy_workers, busy / live if live > 0 else 0.0, peak, want, desired)

    # --- delays -------------------------------------------------------------------------------------------

    def _decide(self, s: PoolSample, load: Load) -> Decision | None:
        st, target = self.settings, s.target
        if load.desired > target:
            self._below_since = None
            self._above_since = s.t if self._above_since is None else self._above_since
            held, delay = s.t - self._above_since, st.upscale_delay_s
        elif load.desired < s.live:
            self._above_since = None
            self._below_since = s.t if self._below_since is None else self._below_since
            held, delay = s.t - self._below_since, st.downscale_delay_s
        else:
            self._above_since = self._below_since = None
            return None
        if held < delay:
            return None
        self._above_since = self._below_since = None
        side = f"above {target}" if load.desired > target else f"below {s.live} live"
        why = (
            f"{load.busy_workers:.2f} busy workers on average over {load.span_s:.1f} s ({load.cycles} batch "
            f"cycles, utilisation {load.utilization:.2f}) want {load.wanted} at target utilisation "
            f"{st.target_utilization:g}"
        )
        if load.wanted > load.peak_outstanding and load.desired == max(load.peak_outstanding, st.min_workers):
            why += f", capped at {load.peak_outstanding}: never more chunks outstanding at once"
        elif load.desired != load.wanted:
            why += f", bounded to {st.min_workers}..{st.max_workers}"
        return Decision(s.t, target, load.desired, f"{why}; {side} for {held:.1f} s")


__all__ = [
    "AutoscalePolicy",
    "AutoscaleSettings",
    "Decision",
    "Load",
    "PoolSample",
]
